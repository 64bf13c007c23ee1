"""Native (C++) sparse kernels for :class:`prune.layers.SparseDense`: building, loading, fallback.

The ops live in ``sparse_ops.cc`` beside this file (see its header for the
algorithms): ``PruneSpmm`` (``y = x @ W`` and, with ``transpose=True``, the
input gradient ``dy @ W^T``) and ``PruneSddmm`` (the values gradient). They
read ``W`` from its row-major ``values`` and an int32 structure vector built
by :func:`structure` when the sparsity pattern changes.

Building follows ``torch.utils.cpp_extension.load``: nothing is compiled at
``import prune``; the first call of :func:`load` (made when the first
``SparseDense`` with ``matmul="native"`` or ``"auto"`` is traced) compiles the
source with the C++ compiler (``$CXX``, else ``c++``/``g++``) against the
installed TensorFlow's headers and flags (``tf.sysconfig``), with
``-O3 -march=native``, into a cache directory, and loads it with
``tf.load_op_library``. The file name is a hash of the source, the TensorFlow
version, the compiler and its version, the flags and the CPU's instruction set
flags, so nodes of a cluster that share a home directory but not a CPU type
get separate builds. Concurrent processes take an exclusive lock on
``<name>.lock`` before building; the library is written to a temporary file
and renamed into place, so no process ever loads a half-written file.

Cache directory: ``$PRUNE_NATIVE_CACHE``, else ``$XDG_CACHE_HOME/prune/native``
(``~/.cache/prune/native``).

Fallback: with ``PRUNE_NATIVE=0``, without a compiler, or when the build or
the load fails, :func:`load` returns ``None``, ``prune`` uses TensorFlow's own
kernels (``matmul="auto"`` among ``dense``/``coo``/``csr``), and a
``RuntimeWarning`` gives the reason once per process. A failed build leaves
``<name>.failed`` (with the compiler's output) so that later processes do not
retry it; delete that file to retry.
"""

from __future__ import annotations

import os
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["NativeStatus", "SOURCE", "cache_dir", "enabled", "load", "status", "structure", "structure_tf"]

SOURCE = Path(__file__).with_name("sparse_ops.cc")
"""The C++ source of the ops."""

_OPT_FLAGS = ("-O3", "-march=native", "-ffp-contract=fast", "-shared", "-fPIC", "-w")


@dataclass(frozen=True)
class NativeStatus:
    """Outcome of :func:`load`: whether the native ops are in use, why not, and from where."""

    available: bool
    reason: str
    path: str | None = None
    built: bool = False  # this process compiled the library (False: loaded from the cache)


_lock = threading.Lock()
_state: dict[str, Any] = {}


def enabled() -> bool:
    """False when ``PRUNE_NATIVE=0`` forces TensorFlow's kernels."""
    return os.environ.get("PRUNE_NATIVE", "1").strip() != "0"


def cache_dir() -> Path:
    """The build cache: ``$PRUNE_NATIVE_CACHE``, else ``$XDG_CACHE_HOME/prune/native``."""
    explicit = os.environ.get("PRUNE_NATIVE_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "prune" / "native"


def _compiler() -> str | None:
    import shutil

    cxx = os.environ.get("CXX")
    if cxx:
        return shutil.which(cxx) or (cxx if os.path.isfile(cxx) else None)
    return shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")


def _cpu_isa() -> str:
    """The CPU's instruction-set flags (what ``-march=native`` compiles for)."""
    import platform

    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return " ".join(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return f"{platform.machine()} {platform.processor()}"


def _build_command(cxx: str, output: str) -> list[str]:
    import tensorflow as tf

    return [cxx, *_OPT_FLAGS, *tf.sysconfig.get_compile_flags(), str(SOURCE), "-o", output,
            *tf.sysconfig.get_link_flags()]


def _library_name(cxx: str) -> str:
    import hashlib
    import subprocess

    import tensorflow as tf

    try:
        version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as err:
        version = f"unknown ({err})"
    key = hashlib.sha256()
    for part in (SOURCE.read_bytes(), tf.__version__.encode(), cxx.encode(), version.encode(),
                 " ".join(_build_command(cxx, "OUT")).encode(), _cpu_isa().encode()):
        key.update(part)
        key.update(b"\0")
    return f"prune_sparse_ops-{key.hexdigest()[:20]}"


def _build(directory: Path) -> tuple[Path, bool]:
    """Path of the compiled library in ``directory``, compiling it if absent; and whether it was compiled now."""
    import fcntl  # the build machinery is imported at first use, never by ``import prune``
    import subprocess
    import tempfile

    cxx = _compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler found (set CXX, or install g++)")
    name = _library_name(cxx)
    lib, failed = directory / f"{name}.so", directory / f"{name}.failed"
    if lib.exists():
        return lib, False
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # held until the file closes; another builder waits here
        if lib.exists():  # built by another process while we waited
            return lib, False
        if failed.exists():
            raise RuntimeError(f"an earlier build failed (compiler output in {failed}; delete it to retry)")
        fd, tmp = tempfile.mkstemp(prefix=f"{name}.", suffix=".tmp.so", dir=directory)
        os.close(fd)
        try:
            proc = subprocess.run(_build_command(cxx, tmp), capture_output=True, text=True)
            if proc.returncode != 0:
                failed.write_text(" ".join(_build_command(cxx, tmp)) + "\n\n" + proc.stdout + proc.stderr)
                first = next((ln for ln in proc.stderr.splitlines() if "error" in ln), proc.stderr.strip()[:200])
                raise RuntimeError(f"the build failed: {first} (full output in {failed})")
            os.replace(tmp, lib)  # atomic: readers see no file or the whole file
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return lib, True


def load() -> Any | None:
    """The loaded op library, building it on first use; ``None`` when falling back (warned once).

    Safe to call from several threads and processes at once; the result is
    cached for the process.
    """
    with _lock:
        if "status" in _state:
            return _state.get("module")
        module, path, built = None, None, False
        if not enabled():
            reason = "PRUNE_NATIVE=0"
        else:
            try:
                import tensorflow as tf

                path, built = _build(cache_dir())
                module = tf.load_op_library(str(path))
                reason = "built now" if built else "loaded from the cache"
            except Exception as err:  # no compiler, failed build, unloadable library: fall back
                module, reason = None, f"{type(err).__name__}: {err}"
        _state["module"] = module
        _state["status"] = NativeStatus(module is not None, reason, None if path is None else str(path), built)
        if module is None:
            warnings.warn(
                f"prune: native sparse kernels unavailable ({reason}); SparseDense uses TensorFlow's kernels",
                RuntimeWarning,
                stacklevel=2,
            )
        return module


def status() -> NativeStatus:
    """Whether the native ops are in use (calls :func:`load` if nobody has yet)."""
    load()
    return _state["status"]


def structure(indices: Any, n_in: int, n_out: int) -> np.ndarray:
    """The int32 structure vector the native ops read, from row-major sorted ``[nnz, 2]`` indices of ``W``.

    Layout ``[rp (n_in + 1) | cols (nnz) | trp (n_out + 1) | tcols (nnz) | tperm (nnz)]``:
    CSR of ``W``, CSR of ``W^T`` and the position in ``values`` of each
    entry of ``W^T`` (see ``sparse_ops.cc``).

    Raises:
        ValueError: more entries or a larger dimension than int32 can index.
    """
    idx = np.asarray(indices, dtype=np.int64).reshape(-1, 2)
    nnz = len(idx)
    if max(nnz, n_in, n_out) >= 2**31 - 1:
        raise ValueError(f"native kernels index with int32: nnz={nnz}, n_in={n_in}, n_out={n_out} is too large")
    rp = np.searchsorted(idx[:, 0], np.arange(n_in + 1))
    perm = np.argsort(idx[:, 1] * n_in + idx[:, 0], kind="stable")
    t = idx[perm]
    trp = np.searchsorted(t[:, 1], np.arange(n_out + 1))
    return np.concatenate([rp, idx[:, 1], trp, t[:, 0], perm]).astype(np.int32)


def structure_tf(indices: Any, n_in: int, n_out: int) -> Any:
    """:func:`structure` as TensorFlow ops, for callers that keep no precomputed structure."""
    import tensorflow as tf

    idx = tf.cast(indices, tf.int64)
    rp = tf.searchsorted(idx[:, 0], tf.range(n_in + 1, dtype=tf.int64), side="left")
    perm = tf.argsort(idx[:, 1] * n_in + idx[:, 0], stable=True)
    t = tf.gather(idx, perm)
    trp = tf.searchsorted(t[:, 1], tf.range(n_out + 1, dtype=tf.int64), side="left")
    parts = [rp, idx[:, 1], trp, t[:, 0], perm]
    return tf.concat([tf.cast(p, tf.int32) for p in parts], 0)
