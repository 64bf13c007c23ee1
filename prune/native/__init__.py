"""Native (C++) sparse kernels for :class:`prune.layers.SparseDense` and ``SparseConv2D``: building, loading, fallback.

The ops live in ``sparse_ops.cc`` beside this file (see its header for the
algorithms): ``PruneSpmm`` (``y = x @ W`` and, with ``transpose=True``, the
input gradient ``dy @ W^T``), ``PruneSddmm`` (the values gradient), and for
k x k convolutions ``PruneConv2d`` (implicit im2col over the kernel's patch
matrix) and ``PruneCol2im`` (its input gradient's scatter). They
read ``W`` from its row-major ``values`` and an int32 structure vector built
by :func:`structure` when the sparsity pattern changes.

N:M structures (issue 36; ``prune.NByM``: at most ``n`` stored entries of every output in every
group of ``m`` consecutive inputs, for ``(n, m)`` in :data:`NM_SHAPES`) whose padded slots are at
least :data:`NM_MIN_FILL` filled get an N:M section in the structure (:func:`nm_section`; told
from the structure's length by :func:`has_nm_section`, which ``SparseDense`` passes to ``"auto"``'s
cost model as ``native_nm``). The forward op then runs its N:M kernel (``nm_ops.h``: outputs in
the vector lanes, each lane's input picked from a group's ``m`` inputs by its code with an
in-register permute, one FMA per slot) from batch 2 until the panel kernel takes over (more panel
tiles than threads, about 256 rows and up), and the values gradient its N:M kernel (the batch as
the reduction; 5.5-6.1 ms at 256 rows against 10-11 for the general kernel and 6.1-7.7 for a dense
``x^T @ dy``); the input gradient runs the general kernel. Measured under
load (2 cores shared with other jobs, interleaved medians, +-30%), 2:4 and 4:8 at 512x2048 and
2048x512, 2 threads: 16 rows 0.74-0.93 ms against 0.94-1.34 for the general kernels and 0.61-0.83
for ``tf.matmul`` on the dense weight; 64 rows 1.76-2.21 against 2.04-2.56 and 1.52-1.60; from 256
rows the panel kernel, 0.75-0.8x dense's time (``sparse_ops.cc``'s header has the rest). A
feed-forward pair (512 -> 2048 -> 512, ``SparseDense`` pruned with ``prune.NByM(2, 4)``, ``"auto"``,
against ``keras.layers.Dense``; ``tf.function``, 2 threads, under load): 256 tokens forward 9.5 against
11.9 ms, training step 28.6 against 30.9; 1 token forward 1.61 against 1.57, training step 5.4 against 3.9.

Building follows ``torch.utils.cpp_extension.load``: nothing is compiled at
``import prune`` (which only loads a library already in the cache, :func:`load_if_built`,
so that saved graphs holding the ops load); the first call of :func:`load` (made when the first
``SparseDense`` with ``matmul="native"`` or ``"auto"`` is traced) compiles the
source with the C++ compiler (``$CXX``, else ``c++``/``g++``) against the
installed TensorFlow's headers and flags (``tf.sysconfig``) into a cache
directory, and loads it with ``tf.load_op_library``.

Instruction set (:func:`build_attempts`): first for the machine it runs on,
``-march=native`` (x86-64 and aarch64), minus the extensions that
TensorFlow's bundled Eigen headers cannot compile (:data:`UNBUILDABLE`:
AVX512-FP16 with g++ 12, in ``PacketMathFP16.h``); if that build fails, once
more with a conservative set (AVX2 and FMA on an x86-64 CPU that has them,
else the compiler's baseline), and only then the fallback below. Flags in
``$PRUNE_NATIVE_CXXFLAGS`` are added after these (so ``-march=...`` there
overrides). :func:`status` names the flags that built the loaded library and
the vector path compiled into it (:func:`vector_path`).

The file name is a hash of the source, the TensorFlow version, the compiler
and its version, the whole command (flags included) and the CPU's instruction
set flags, so nodes of a cluster that share a home directory but not a CPU
type get separate builds. Concurrent processes take an exclusive lock on
``<name>.lock`` before building; the library is written to a temporary file
and renamed into place, then its size and SHA-256 go into ``<name>.json``
beside it. A library is loaded only when that record matches it
(:func:`verify`): a torn or foreign file under the library's name (a partial
copy of a cache, a crash before the data reached the disk) would kill the
process with SIGBUS inside ``dlopen``, so it is moved aside to
``<name>.so.bad``, with a warning, and rebuilt; ``import prune`` never loads
nor rebuilds it. A cache that cannot take a build (a file in its place, a
read-only folder) is reported once, naming ``PRUNE_NATIVE_CACHE``
(:func:`cache_problem`), also at import, when a SavedModel holding the ops
could not load.

Cache directory: ``$PRUNE_NATIVE_CACHE``, else ``$XDG_CACHE_HOME/prune/native``
(``~/.cache/prune/native``).

Fallback: with ``PRUNE_NATIVE=0``, without a compiler, or when every build
attempt or the load fails, :func:`load` returns ``None``, ``prune`` uses TensorFlow's own
kernels (``matmul="auto"`` among ``dense``/``coo``/``csr``), and a
``RuntimeWarning`` gives the reason once per process. A failed build leaves
``<name>.failed`` (with the compiler's output) so that later processes do not
retry it (one per flag set tried); delete it to retry.
"""

from __future__ import annotations

import os
import platform
import shlex
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "NativeStatus",
    "SOURCE",
    "UNBUILDABLE",
    "build_attempts",
    "build_command",
    "cache_dir",
    "cache_problem",
    "enabled",
    "extra_flags",
    "kernel_label",
    "load",
    "load_if_built",
    "status",
    "structure",
    "structure_tf",
    "target_flags",
    "vector_path",
    "verify",
    "BLOCK_WIDTHS",
    "HEADERS",
    "block_width",
    "panel_section",
    "panels_pay",
    "has_block_section",
    "has_nm_section",
    "nm_shape",
    "nm_section",
    "NM_SHAPES",
    "NM_MIN_FILL",
    "NM_WIDTH",
    "nm_section_length",
    "PANEL_WIDTH",
    "PANEL_MIN_SEGMENT",
]

SOURCE = Path(__file__).with_name("sparse_ops.cc")
"""The C++ source of the ops (it includes :data:`HEADERS`)."""

HEADERS = (Path(__file__).with_name("block_ops.h"), Path(__file__).with_name("nm_ops.h"))
"""Sources that ``sparse_ops.cc`` includes (the block-sparse and N:M kernels); part of the build's cache key."""

BLOCK_WIDTHS = (32, 16, 8, 4)
"""Tile widths (outputs per 1 x C tile) the block kernels take, widest first (see :func:`block_width`)."""

_BLOCK_MAGIC = 0x6B6C4231  # kBlockMagic in block_ops.h

PANEL_WIDTH = 128
"""Inputs per panel of the panel section (see :func:`structure`): 128 columns of a 64-row transposed input
tile are 32 KB, which stays in L1 while the forward kernel adds that panel's entries."""

PANEL_MIN_SEGMENT = 10
"""Mean stored entries per (panel, output) segment from which :func:`structure` adds a panel section: each
segment also loads and stores its output's accumulators, so sparser layers keep the plain tiled kernel. At 6.4
entries per segment (95% sparse) the panels measured slower than the plain kernel at 4096 x 4096; at 12.8 (90%)
and 25.6 (80%) faster (``benchmarks/panel_speed.py``, ``docs/kernels.md``)."""

_PANEL_MAGIC = 0x6C6E5031  # kPanelMagic in sparse_ops.cc

NM_SHAPES = ((2, 4), (1, 4), (4, 8), (2, 8), (1, 8))
"""``(n, m)`` shapes the N:M kernels take (``nm_ops.h``), in :func:`nm_shape`'s order of preference on ties."""

NM_MIN_FILL = 0.9
"""Least fraction of an N:M section's slots (``groups * n * n_out``) that hold a stored entry for :func:`structure`
to add one: the N:M kernels multiply every slot, padding included, so a 90%-sparse unstructured layer (which
happens to hold at most 4 of every 8 inputs per output) stays on the general kernels."""

_NM_MAGIC = 0x4D4E3A31  # kNmMagic in nm_ops.h

_OPT_FLAGS = ("-O3", "-ffp-contract=fast", "-fPIC", "-w")

UNBUILDABLE = {"__AVX512FP16__": "-mno-avx512fp16"}
"""Instruction-set extensions TensorFlow's headers cannot be compiled with, by the macro that
``-march`` defines for them, and the flag that turns each off. AVX512-FP16 (Sapphire Rapids
and newer Xeons): with g++ 12, TensorFlow 2.21's bundled Eigen fails in
``Eigen/src/Core/arch/AVX512/PacketMathFP16.h`` ("expected initializer before '<' token");
the kernels use no half-precision vectors, so nothing is lost."""

EXTRA_FLAGS_ENV = "PRUNE_NATIVE_CXXFLAGS"
"""Environment variable whose flags (split as a shell would) are added after prune's own."""


@dataclass(frozen=True)
class NativeStatus:
    """Outcome of :func:`load`: whether the native ops are in use, why not, and from where."""

    available: bool
    reason: str
    path: str | None = None
    built: bool = False  # this process compiled the library (False: loaded from the cache)
    flags: str = ""  # the instruction-set and extra flags the loaded library was built with
    vector: str = ""  # the vector path compiled into it (see vector_path), e.g. "avx512 (16 lanes)"


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
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return " ".join(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return f"{platform.machine()} {platform.processor()}"


def _machine() -> str:
    m = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(m, m)


def extra_flags() -> list[str]:
    """Flags from ``$PRUNE_NATIVE_CXXFLAGS``, split as a shell would (empty when unset).

    Raises:
        ValueError: the variable cannot be split (an unbalanced quote, a trailing backslash); the message names it.
    """
    value = os.environ.get(EXTRA_FLAGS_ENV, "")
    try:
        return shlex.split(value)
    except ValueError as err:
        raise ValueError(f"{EXTRA_FLAGS_ENV}={value!r} cannot be split into flags as a shell would ({err}); "
                         f"fix or unset {EXTRA_FLAGS_ENV}") from None


def _predefined_macros(cxx: str, flags: list[str]) -> set[str]:
    """Macros the compiler predefines with ``flags`` (empty if it cannot be asked)."""
    import subprocess

    try:
        out = subprocess.run([cxx, *flags, "-dM", "-E", "-x", "c++", os.devnull], capture_output=True, text=True,
                             timeout=120).stdout
    except (OSError, subprocess.SubprocessError):
        return set()
    return {ln.split()[1] for ln in out.splitlines() if ln.startswith("#define ") and len(ln.split()) > 1}


def target_flags(cxx: str, march: str = "native") -> list[str]:
    """``-march=<march>`` minus the extensions in :data:`UNBUILDABLE` that it would turn on.

    Args:
        cxx: The compiler (asked which macros ``-march=<march>`` defines).
        march: A ``-march=`` target: ``native`` (the CPU it runs on), or a named one for
            compile-only checks of other CPUs (``sapphirerapids``, ``armv8-a``, ...).
    """
    flags = [f"-march={march}"]
    macros = _predefined_macros(cxx, flags)
    return flags + [off for macro, off in UNBUILDABLE.items() if macro in macros]


def _conservative_flags() -> list[str]:
    """The retry's instruction set: AVX2 and FMA on an x86-64 CPU that has both, else the compiler's baseline."""
    if _machine() == "x86_64" and {"avx2", "fma"} <= set(_cpu_isa().split()):
        return ["-mavx2", "-mfma"]
    return []


def build_attempts(cxx: str) -> list[list[str]]:
    """The instruction-set flag sets :func:`load` tries in order (each followed by :func:`extra_flags`).

    First the machine's own (``-march=native`` on x86-64 and aarch64, minus
    :data:`UNBUILDABLE`; the compiler's default elsewhere), then a conservative
    set (:func:`_conservative_flags`) if it differs.
    """
    first = target_flags(cxx) if _machine() in ("x86_64", "aarch64") else []
    attempts = [first]
    if _conservative_flags() != first:
        attempts.append(_conservative_flags())
    return attempts


def build_command(cxx: str, output: str, isa: list[str], *, compile_only: bool = False) -> list[str]:
    """The compiler command for ``sparse_ops.cc``: prune's optimisation flags, ``isa``, :func:`extra_flags`.

    Args:
        cxx: The compiler.
        output: The file to write.
        isa: Instruction-set flags (one of :func:`build_attempts`, or :func:`target_flags` of a named CPU).
        compile_only: ``-c`` (an object file, for compile checks) instead of a linked shared library.
    """
    import tensorflow as tf

    link = [] if compile_only else tf.sysconfig.get_link_flags()
    return [cxx, *_OPT_FLAGS, "-c" if compile_only else "-shared", *isa, *extra_flags(),
            *tf.sysconfig.get_compile_flags(), str(SOURCE), "-o", output, *link]


def _library_name(cxx: str, isa: list[str]) -> str:
    import hashlib
    import subprocess

    import tensorflow as tf

    try:
        version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as err:
        version = f"unknown ({err})"
    key = hashlib.sha256()
    for part in (SOURCE.read_bytes(), *(h.read_bytes() for h in HEADERS), tf.__version__.encode(), cxx.encode(), version.encode(),
                 " ".join(build_command(cxx, "OUT", isa)).encode(), _cpu_isa().encode()):
        key.update(part)
        key.update(b"\0")
    return f"prune_sparse_ops-{key.hexdigest()[:20]}"


def _digest(path: Path) -> tuple[int, str]:
    """Size and SHA-256 of the file at ``path``."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return path.stat().st_size, h.hexdigest()


def _record_path(lib: Path) -> Path:
    return lib.with_suffix(".json")


def verify(lib: str | os.PathLike[str]) -> str | None:
    """Why the cached library at ``lib`` must not be loaded, or ``None`` when it is the file its build recorded.

    Every build writes, after the library is in place, a record beside it (``<name>.json``: size and SHA-256).
    A library without its record, or whose size or hash differ from it (a torn copy of a cache, a file cut
    short by a crash before it reached the disk, a foreign file under the library's name), is refused: loading
    such a file maps pages past its end, and the process dies with SIGBUS (issue 31).
    """
    import json

    lib = Path(lib)
    record = _record_path(lib)
    try:
        want = json.loads(record.read_text())
        size, sha = int(want["size"]), str(want["sha256"])
    except FileNotFoundError:
        return f"no record of its build ({record.name})"
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"its build record {record.name} is unreadable ({type(err).__name__}: {err})"
    try:
        st = lib.stat()
        if st.st_size != size:
            return f"{st.st_size} bytes where its build wrote {size}"
        seen = (str(lib), st.st_size, st.st_mtime_ns, sha)
        if seen not in _VERIFIED:  # import and first use both ask: hash the file once per process
            if _digest(lib)[1] != sha:
                return "its SHA-256 differs from the one its build recorded"
            _VERIFIED.add(seen)
    except OSError as err:
        return f"it cannot be read ({type(err).__name__}: {err})"
    return None


_VERIFIED: set[tuple[str, int, int, str]] = set()
"""Libraries :func:`verify` hashed and accepted in this process: (path, size, mtime, recorded SHA-256)."""


def _write_record(lib: Path, size: int, sha: str) -> None:
    """The build record, written after the library, atomically (a temporary file renamed into place)."""
    import json
    import tempfile

    fd, tmp = tempfile.mkstemp(prefix=f"{lib.stem}.", suffix=".tmp.json", dir=lib.parent)
    os.fchmod(fd, 0o644)  # readable by whoever may load the library (mkstemp makes it 0600)
    with os.fdopen(fd, "w") as f:
        json.dump({"size": size, "sha256": sha}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, _record_path(lib))


def _set_aside(lib: Path, why: str) -> None:
    """Renames a refused library (and its record) out of the way, with a warning; the caller rebuilds."""
    bad = lib.with_name(lib.name + ".bad")
    os.replace(lib, bad)
    record = _record_path(lib)
    if record.exists():
        os.replace(record, bad.with_name(record.name + ".bad"))
    warnings.warn(f"prune: the cached native library {lib} was not loaded ({why}); it was moved to {bad.name} "
                  f"and is rebuilt now", RuntimeWarning, stacklevel=4)


def _unusable(directory: Path, err: OSError) -> RuntimeError:
    return RuntimeError(f"the native build cache {directory} is not usable ({type(err).__name__}: {err}); "
                        f"set PRUNE_NATIVE_CACHE to a writable directory")


def _build_one(directory: Path, cxx: str, isa: list[str]) -> tuple[Path, bool]:
    """Path of the library built with ``isa`` in ``directory``, compiling it if absent; and whether it was compiled now.

    A library already there is used only when :func:`verify` accepts it; else it is set aside and rebuilt.
    """
    import fcntl  # the build machinery is imported at first use, never by ``import prune``
    import subprocess
    import tempfile

    name = _library_name(cxx, isa)
    lib, failed = directory / f"{name}.so", directory / f"{name}.failed"
    refused = verify(lib) if lib.exists() else None
    if lib.exists() and refused is None:  # no lock needed: a read-only cache that holds the library works
        return lib, False
    try:
        directory.mkdir(parents=True, exist_ok=True)
        lock = open(directory / f"{name}.lock", "w")
    except OSError as err:
        if refused is not None:
            raise RuntimeError(f"{lib} was not loaded ({refused}), and the cache cannot take a rebuild "
                               f"({type(err).__name__}: {err}); delete it, or set PRUNE_NATIVE_CACHE to a writable "
                               f"directory") from None
        raise _unusable(directory, err) from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # held until the file closes; another builder waits here
        if lib.exists():  # built by another process while we waited, or refused above
            why = verify(lib)
            if why is None:
                return lib, False
            _set_aside(lib, why)
        if failed.exists():
            raise RuntimeError(f"an earlier build failed (compiler output in {failed}; delete it to retry)")
        try:
            fd, tmp = tempfile.mkstemp(prefix=f"{name}.", suffix=".tmp.so", dir=directory)
        except OSError as err:
            raise _unusable(directory, err) from None
        os.close(fd)
        try:
            command = build_command(cxx, tmp, isa)
            proc = subprocess.run(command, capture_output=True, text=True)
            if proc.returncode != 0:
                failed.write_text(" ".join(command) + "\n\n" + proc.stdout + proc.stderr)
                first = next((ln for ln in proc.stderr.splitlines() if "error" in ln), proc.stderr.strip()[:200])
                raise RuntimeError(f"the build failed: {first} (full output in {failed})")
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())  # on disk before its name and record say it is there
            size, sha = _digest(Path(tmp))
            os.replace(tmp, lib)  # atomic: readers see no file or the whole file
            _write_record(lib, size, sha)  # after the library: a library without one is refused, never loaded
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return lib, True


def _build(directory: Path) -> tuple[Path, bool, list[str]]:
    """The library for this machine: each of :func:`build_attempts` in turn until one builds.

    Returns:
        The library's path, whether this process compiled it, and the flags it was built with.

    Raises:
        RuntimeError: no compiler, or every attempt failed (the message gives each attempt's reason).
    """
    cxx = _compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler found (set CXX, or install g++)")
    reasons = []
    for isa in build_attempts(cxx):
        try:
            lib, built = _build_one(directory, cxx, isa)
            return lib, built, isa + extra_flags()
        except RuntimeError as err:
            reasons.append(f"with {' '.join(isa + extra_flags()) or 'default flags'}: {err}")
    raise RuntimeError("; ".join(reasons))


def vector_path(path: str | os.PathLike[str]) -> str:
    """The vector path compiled into the library at ``path``, e.g. ``"avx512 (16 lanes)"``, ``"neon (4 lanes)"``.

    Read from the library's ``prune_native_vector_path`` symbol, which the
    preprocessor sets from the instruction set it was compiled for.
    """
    import ctypes

    fn = ctypes.CDLL(str(path)).prune_native_vector_path
    fn.restype = ctypes.c_char_p
    return fn().decode()


def kernel_label(matmul: str = "auto") -> str:
    """What runs a ``SparseDense`` with ``matmul``, for result tables: ``native <vector path>`` or ``tensorflow ...``.

    ``coo``/``csr``/``dense`` run TensorFlow's kernels by choice
    (``"tensorflow"``); ``native``/``auto`` run the native ops when the library
    loads, else TensorFlow's, with the reason (``"tensorflow (fallback: ...)"``).
    """
    if matmul not in ("auto", "native"):
        return "tensorflow"
    st = status()
    return f"native {st.vector}".strip() if st.available else f"tensorflow (fallback: {st.reason})"


def load() -> Any | None:
    """The loaded op library, building it on first use; ``None`` when falling back (warned once).

    Safe to call from several threads and processes at once; the result is
    cached for the process.
    """
    if "status" not in _state and enabled():
        # TensorFlow is imported before the lock is taken: its import runs prune's post-import hook
        # (prune/_lazy.py), which calls load_if_built() and so load() again. Inside the lock that
        # re-entry waited on the lock held below it, and the process hung (a cached library, and
        # TensorFlow not yet imported; tests/prune/native/test_native.py).
        import tensorflow  # noqa: F401
    with _lock:
        if "status" in _state:
            return _state.get("module")
        module, path, built, flags, vector = None, None, False, [], ""
        if not enabled():
            reason = "PRUNE_NATIVE=0"
        else:
            try:
                import tensorflow as tf

                path, built, flags = _build(cache_dir())
                module = tf.load_op_library(str(path))
                vector = vector_path(path)
                reason = "built now" if built else "loaded from the cache"
            except Exception as err:  # no compiler, failed build, unloadable library: fall back
                module, reason = None, f"{type(err).__name__}: {err}"
        _state["module"] = module
        _state["status"] = NativeStatus(
            module is not None, reason, None if path is None else str(path), built, " ".join(flags), vector
        )
        if module is None:
            warnings.warn(
                f"prune: native sparse kernels unavailable ({reason}); SparseDense uses TensorFlow's kernels",
                RuntimeWarning,
                stacklevel=2,
            )
        return module


def load_if_built() -> Any | None:
    """:func:`load`, but only when the library for this machine is already in the cache; never compiles.

    ``import prune`` calls this, so that a SavedModel or graph holding the
    native ops (``PruneSpmm``, ``PruneSddmm``) loads in a fresh process after
    ``import prune`` without first tracing a ``SparseDense``. Costs two short
    compiler queries (its version and the macros of ``-march=native``) when
    nothing is loaded yet. On a machine where nothing was built, call
    :func:`load` (it compiles) before loading such a model.
    """
    if "status" in _state or not enabled():
        return _state.get("module")
    cxx = _compiler()
    if cxx is None:
        return None
    try:
        names = [_library_name(cxx, isa) for isa in build_attempts(cxx)]
    except Exception:  # noqa: BLE001 - a broken toolchain is load()'s to report, when someone asks for the kernels
        return None
    directory = cache_dir()
    libs = [directory / f"{name}.so" for name in names]
    if any(lib.exists() and verify(lib) is None for lib in libs):
        return load()
    if not any(lib.exists() for lib in libs):
        problem = cache_problem(directory)
        if problem is not None:  # nothing to load, and nothing can be built there: say so once, now
            reason = f"the native build cache {directory} is not usable ({problem}); set PRUNE_NATIVE_CACHE to a " \
                     f"writable directory"
            with _lock:
                if "status" not in _state:
                    _state["module"] = None
                    _state["status"] = NativeStatus(False, reason)
                    warnings.warn(f"prune: {reason}. SparseDense uses TensorFlow's kernels, and a SavedModel holding "
                                  f"prune's native ops (PruneSpmm, PruneSddmm) cannot be loaded in this process",
                                  RuntimeWarning, stacklevel=2)
    return None  # a library that verify() refuses is load()'s to set aside and rebuild: importing never compiles


def cache_problem(directory: str | os.PathLike[str] | None = None) -> str | None:
    """Why the build cache cannot take a new library (a file in its place, a read-only or unwritable folder), or ``None``.

    Args:
        directory: The cache (default :func:`cache_dir`); the nearest existing folder on its path is checked.
    """
    path = Path(cache_dir() if directory is None else directory)
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        return f"{probe} is not a directory"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{probe} is not writable"
    return None


def status() -> NativeStatus:
    """Whether the native ops are in use (calls :func:`load` if nobody has yet)."""
    load()
    return _state["status"]


def structure(indices: Any, n_in: int, n_out: int, block: int | None = None, panels: bool | None = None,
              nm: bool | None = None) -> np.ndarray:
    """The int32 structure vector the native ops read, from row-major sorted ``[nnz, 2]`` indices of ``W``.

    Layout ``[rp (n_in + 1) | cols (nnz) | trp (n_out + 1) | tcols (nnz) | tperm (nnz)]``:
    CSR of ``W``, CSR of ``W^T`` and the position in ``values`` of each
    entry of ``W^T`` (see ``sparse_ops.cc``); then, when the entries form whole
    1 x C tiles along the output axis (:func:`block_width`), a block section
    (block-CSR and block-CSC of the tiles, ``block_ops.h``) with which the ops
    run the block kernels; else, for N:M entries (:func:`nm_shape`), an N:M section
    (:func:`nm_section`, ``nm_ops.h``) with which the forward op runs its N:M kernel;
    then, for a layer dense enough (:data:`PANEL_MIN_SEGMENT`),
    a panel section: ``W^T``'s entries ordered by panel of :data:`PANEL_WIDTH` inputs, then
    by output (:func:`panel_section`), which the forward op's large-batch kernel reads.

    Args:
        block: The tile width C of the block section: ``None`` (default) the
            widest that fits, ``0`` none (the general kernels).
        panels: Whether to add the panel section: ``None`` (default) when the mean
            segment holds at least :data:`PANEL_MIN_SEGMENT` entries and there are
            two panels or more, ``True`` whenever there are two panels or more, ``False`` never.
        nm: Whether to add an N:M section (:func:`nm_section`, before any panel section): ``None`` (default)
            when there is no block section and :func:`nm_shape` finds a shape of :data:`NM_SHAPES` of two groups
            or more filled to :data:`NM_MIN_FILL`, ``True`` whenever the entries are N:M for some shape (any
            fill, any number of groups), ``False`` never.

    Raises:
        ValueError: more entries or a larger dimension than int32 can index; a
            ``block`` width the entries do not tile.
    """
    idx = np.asarray(indices, dtype=np.int64).reshape(-1, 2)
    nnz = len(idx)
    if max(nnz, n_in, n_out) >= 2**31 - 1:
        raise ValueError(f"native kernels index with int32: nnz={nnz}, n_in={n_in}, n_out={n_out} is too large")
    rp = np.searchsorted(idx[:, 0], np.arange(n_in + 1))
    perm = np.argsort(idx[:, 1] * n_in + idx[:, 0], kind="stable")
    t = idx[perm]
    trp = np.searchsorted(t[:, 1], np.arange(n_out + 1))
    parts = [rp, idx[:, 1], trp, t[:, 0], perm]
    width = block_width(idx, n_out) if block is None else int(block)
    if width and (width not in BLOCK_WIDTHS or not _is_blocked(idx, n_out, width)):
        raise ValueError(f"block={block}: the entries do not form whole 1 x {block} tiles (widths {BLOCK_WIDTHS})")
    if width:
        parts.append(_block_section(idx, n_in, n_out, width))
    shape = nm_shape(idx, n_in, n_out) if (nm is None and not width) else None
    if nm:
        shape = nm_shape(idx, n_in, n_out, min_fill=0.0, min_groups=1)
        if shape is None:
            raise ValueError(f"nm=True: the entries are not N:M for any (n, m) of {NM_SHAPES}")
    if shape is not None:
        parts.append(nm_section(idx, n_in, n_out, *shape))
    if -(-n_in // PANEL_WIDTH) >= 2 and (panels or (panels is None and panels_pay(nnz, n_in, n_out))):
        parts.append(panel_section(idx, n_in, n_out))
    return np.concatenate(parts).astype(np.int32)


def nm_shape(indices: Any, n_in: int, n_out: int, min_fill: float = NM_MIN_FILL,
             min_groups: int = 2) -> tuple[int, int] | None:
    """The ``(n, m)`` of :data:`NM_SHAPES` for which the entries are N:M with the fewest slots, or ``None``.

    N:M: for every output ``j`` and group ``g`` of ``m`` consecutive inputs (rows ``[g m, g m + m)``
    of ``W``), at most ``n`` stored entries (``prune.NByM(z, m)`` prunes ``z`` of every ``m``, leaving
    ``m - z``: ``NByM(2, 4)`` is 2:4). Only shapes with at least ``min_groups`` groups (a layer
    narrower than two groups is N:M by accident, as a 2 x 2 diagonal is 1:4) whose slots
    (``ceil(n_in / m) * n * n_out``) are at least ``min_fill`` filled count; ties go to the earlier shape.
    """
    idx = np.asarray(indices, dtype=np.int64).reshape(-1, 2)
    nnz = len(idx)
    if nnz == 0 or n_in < 1 or n_out < 1:
        return None
    best = None
    for m in sorted({m for _, m in NM_SHAPES}):
        groups = -(-n_in // m)
        if groups < min_groups:
            continue
        most = int(np.bincount(idx[:, 0] // m * n_out + idx[:, 1], minlength=groups * n_out).max())
        for n, mm in NM_SHAPES:
            slots = groups * n * n_out
            if mm == m and n >= most and nnz >= min_fill * slots and (best is None or slots < best[0]):
                best = (slots, (n, m))
    return None if best is None else best[1]


NM_WIDTH = 64
"""Outputs per block of the N:M section (``kNmWidth`` in ``nm_ops.h``): the slots are stored block by block."""


def nm_section_length(n: int, m: int, n_in: int, n_out: int) -> int:
    """Number of int32 entries of the N:M section of shape ``(n, m)``."""
    slots = -(-n_out // NM_WIDTH) * -(-n_in // m) * n * NM_WIDTH
    return 4 + slots // 4 + slots


def nm_section(indices: Any, n_in: int, n_out: int, n: int, m: int) -> np.ndarray:
    """The N:M section of :func:`structure`, from row-major sorted ``[nnz, 2]`` N:M indices of ``W``.

    Layout ``[MAGIC | n | m | groups | codes (slots / 4) | slots (slots)]`` (``nm_ops.h``) for
    ``slots = ceil(n_out / 64) * groups * n * 64``: slot ``t = ((J groups + g) n + s) 64 + l`` is the ``s``-th
    entry of output ``j = 64 J + l`` among inputs ``[g m, g m + m)``; its code (one byte, four to an int32 in the
    machine's byte order) is the input's offset in the group, its slot entry the position in ``values``; unused
    slots (and outputs past ``n_out``) have code 0 and slot ``-1``.

    Raises:
        ValueError: more than ``n`` entries of some output in some group.
    """
    idx = np.asarray(indices, dtype=np.int64).reshape(-1, 2)
    groups, blocks = -(-n_in // m), -(-n_out // NM_WIDTH)
    key = idx[:, 0] // m * n_out + idx[:, 1]  # (group, output)
    order = np.argsort(key, kind="stable")  # within a key, by input (row-major indices)
    k = key[order]
    rank = np.arange(len(k)) - np.searchsorted(k, k, side="left")  # s: the entry's rank within its (group, output)
    if len(rank) and rank.max() >= n:
        raise ValueError(f"the entries are not {n}:{m}: some output has more than {n} entries in a group of {m}")
    g, j = k // n_out, k % n_out
    t = ((j // NM_WIDTH * groups + g) * n + rank) * NM_WIDTH + j % NM_WIDTH
    total = blocks * groups * n * NM_WIDTH
    codes = np.zeros(total, np.uint8)
    codes[t] = idx[order, 0] - g * m
    slots = np.full(total, -1, np.int64)
    slots[t] = order
    head = np.array([_NM_MAGIC, n, m, groups], np.int64)
    return np.concatenate([head, codes.view(np.int32).astype(np.int64), slots])


def has_nm_section(length: int, nnz: int, n_in: int, n_out: int) -> bool:
    """Whether a structure of ``length`` entries built by :func:`structure` (default ``block``, ``panels``, ``nm``)
    has an N:M section, told from the length alone (as :func:`has_block_section`): what follows the base parts
    is exactly :func:`nm_section_length` of a shape of
    :data:`NM_SHAPES` whose slots ``nnz`` fills to :data:`NM_MIN_FILL` (after the panel section's length, when
    :func:`panels_pay`). (A block section of exactly that length is
    possible in principle; the layer uses this only to price ``"auto"``'s choice, never for the kernels, which
    read the section's magic.)
    """
    extra = length - (3 * nnz + n_in + n_out + 2)
    if panels_pay(nnz, n_in, n_out):
        extra -= 3 + -(-n_in // PANEL_WIDTH) * n_out + 1 + 2 * nnz
    if extra <= 0 or nnz == 0:
        return False
    for n, m in NM_SHAPES:
        slots = -(-n_in // m) * n * n_out
        if nnz <= slots and nnz >= NM_MIN_FILL * slots and extra == nm_section_length(n, m, n_in, n_out):
            return True
    return False


def panels_pay(nnz: int, n_in: int, n_out: int) -> bool:
    """Whether :func:`structure` adds a panel section by default: two panels or more, and a mean segment of at
    least :data:`PANEL_MIN_SEGMENT` entries."""
    count = -(-n_in // PANEL_WIDTH)
    return count >= 2 and nnz >= PANEL_MIN_SEGMENT * n_out * count


def has_block_section(length: int, nnz: int, n_in: int, n_out: int) -> bool:
    """Whether a structure of ``length`` entries built by :func:`structure` (default ``panels``) has a block section.

    Told from the length alone, so that a layer can decide it while tracing: the base parts take
    ``3 * nnz + n_in + n_out + 2`` entries, and a panel section is there exactly when :func:`panels_pay`,
    with a length that depends only on ``nnz``, ``n_in`` and ``n_out``; whatever else follows is a block section.
    """
    if has_nm_section(length, nnz, n_in, n_out):
        return False
    extra = length - (3 * nnz + n_in + n_out + 2)
    if panels_pay(nnz, n_in, n_out):
        extra -= 3 + -(-n_in // PANEL_WIDTH) * n_out + 1 + 2 * nnz
    return extra > 0


def panel_section(indices: Any, n_in: int, n_out: int, width: int = PANEL_WIDTH) -> np.ndarray:
    """The panel section of :func:`structure`, from row-major sorted ``[nnz, 2]`` indices of ``W``.

    Layout ``[MAGIC | width | count | starts (count * n_out + 1) | pcols (nnz) | pperm (nnz)]``
    (``sparse_ops.cc``): the entries of ``W^T`` ordered by panel ``i // width`` of their input,
    then by output ``j``, then by input; segment ``(p, j)`` is ``starts[p * n_out + j]`` to
    ``starts[p * n_out + j + 1]``, ``pcols`` holds each entry's input and ``pperm`` its position
    in ``values``.
    """
    idx = np.asarray(indices, dtype=np.int64).reshape(-1, 2)
    count = -(-n_in // width)
    panel = idx[:, 0] // width
    key = panel * n_out + idx[:, 1]
    order = np.argsort(key, kind="stable")  # row-major indices: a stable sort keeps each segment in input order
    starts = np.searchsorted(key[order], np.arange(count * n_out + 1))
    head = np.array([_PANEL_MAGIC, width, count], np.int64)
    return np.concatenate([head, starts, idx[order, 0], order])


def block_width(indices: Any, n_out: int) -> int:
    """The widest C of :data:`BLOCK_WIDTHS` for which the entries form whole 1 x C tiles along the output axis, or 0.

    Tile ``(i, jb)`` covers columns ``[jb * C, jb * C + C)`` of row ``i`` (fewer in the
    last column block when C does not divide ``n_out``); the structure is blocked when
    every tile it touches is stored whole. A ``Block((r, C))`` pattern leaves such a
    structure. 0 for an empty structure.
    """
    idx = np.asarray(indices, dtype=np.int64).reshape(-1, 2)
    return next((c for c in BLOCK_WIDTHS if c <= n_out and _is_blocked(idx, n_out, c)), 0)


def _is_blocked(idx: np.ndarray, n_out: int, c: int) -> bool:
    """Whether row-major sorted, unique ``idx`` store whole 1 x ``c`` tiles only (False when empty)."""
    if len(idx) == 0:
        return False
    key = idx[:, 0] * (-(-n_out // c)) + idx[:, 1] // c
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    counts = np.diff(np.r_[starts, len(key)])
    return bool(np.array_equal(counts, np.minimum(c, n_out - idx[starts, 1] // c * c)))


def _block_section(idx: np.ndarray, n_in: int, n_out: int, c: int) -> np.ndarray:
    """The block section the native ops read after the structure (layout in ``block_ops.h``)."""
    n_cb = -(-n_out // c)
    key = idx[:, 0] * n_cb + idx[:, 1] // c
    boff = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])  # first entry of each tile, row-major = block-CSR order
    brow, bcol = idx[boff, 0], idx[boff, 1] // c
    brp = np.searchsorted(brow, np.arange(n_in + 1))
    order = np.argsort(bcol * n_in + brow, kind="stable")
    tcp = np.searchsorted(bcol[order], np.arange(n_cb + 1))
    head = np.array([_BLOCK_MAGIC, c, len(boff)], np.int64)
    return np.concatenate([head, brp, bcol, boff, tcp, brow[order], boff[order]])


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
