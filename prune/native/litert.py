"""prune's sparse kernels inside LiteRT (TFLite): the external delegate library, built on first use (issue 38).

``litert_delegate.c`` beside this file is a plain C shared library exposing
the documented external-delegate entry points
(``tflite_plugin_create_delegate`` / ``tflite_plugin_destroy_delegate``). It
claims the CUSTOM operators named :data:`OP_NAME` ("PruneSparseFC": a
fully-connected layer whose weight is stored as CSR) that
:func:`prune.deploy.export.to_tflite` writes with ``kernels="prune"``, and runs
them (vectorised with AVX-512 or AVX2 where compiled for them, and split across threads for large layers:
see the C file's header). It links no TFLite symbol: the stable C ABI it uses is
declared by hand in ``litert_abi.h`` (from upstream's ``tflite/core/c/common.h``;
tested with ai-edge-litert 2.3.0 and TensorFlow 2.21's ``tf.lite``).

:func:`delegate_path` compiles it on first use into :func:`prune.native.cache_dir`
with the C++ compiler that :mod:`prune.native` finds (``$CXX``, else
``c++``/``g++``/``clang++``), in C mode (``-x c``, ``-O2 -pthread``), for the
machine's own instruction set (:func:`build_attempts`: ``-march=native`` on
x86-64 and aarch64; TensorFlow's Eigen headers, which cannot take AVX512-FP16
there, are not involved in this C file), and if that build fails with the
conservative set of :mod:`prune.native` (AVX2 + FMA, else the compiler's
baseline). ``$PRUNE_NATIVE_CXXFLAGS`` is added after these (so a ``-march=``
there overrides). :func:`delegate_vector_path` names the vector path compiled
in. The file name is a hash of the sources, the compiler, its
version, the command and the CPU's instruction-set flags; the library is written to a temporary file, renamed
into place and recorded (size and SHA-256) so that :func:`prune.native.verify`
checks it before every load, as for the TensorFlow op library. A failed build
raises, naming the compiler's first error and the log file with its output (no ``.failed`` marker: the next call retries).

Threads: a layer whose work (``nnz`` x passes over the entries: its rows, or on the tile path
its groups of 8 rows) reaches 32768 is split across the interpreter's threads
(``Interpreter(num_threads=N)``), or across the delegate's own ``num_threads``
option when given::

    from ai_edge_litert.interpreter import Interpreter, load_delegate
    delegate = load_delegate(str(delegate_path()), delegate_options(num_threads=2))
    interpreter = Interpreter(model_content=content, experimental_delegates=[delegate])
"""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess
import tempfile
import threading
from pathlib import Path

from prune import native

__all__ = ["OP_NAME", "SOURCE", "HEADERS", "FLAGS", "KERNELS", "delegate_path", "delegate_vector_path",
           "delegate_options", "build_attempts", "build_command"]

OP_NAME = "PruneSparseFC"
"""Custom name of the sparse fully-connected operator the delegate claims."""

SOURCE = Path(__file__).with_name("litert_delegate.c")
"""The delegate's C source."""

HEADERS = (Path(__file__).with_name("litert_abi.h"),)
"""Headers the source includes (part of the build's cache key)."""

FLAGS = ("-x", "c", "-std=c11", "-O2", "-pthread", "-shared", "-fPIC", "-Wall")
"""Compiler flags: C mode, optimisation, POSIX threads, a shared library (the instruction set: :func:`build_attempts`)."""

_lock = threading.Lock()


def build_attempts() -> list[list[str]]:
    """The instruction-set flag sets tried in order: ``-march=native`` (x86-64, aarch64), then
    :mod:`prune.native`'s conservative set (AVX2 + FMA where the CPU has both), then none; duplicates dropped.

    Unlike the TensorFlow op library, no extension is turned off: the AVX512-FP16 problem of
    :data:`prune.native.UNBUILDABLE` is in TensorFlow's C++ Eigen headers, which this C file does not include.
    """
    attempts: list[list[str]] = []
    for isa in (["-march=native"] if native._machine() in ("x86_64", "aarch64") else [],
                native._conservative_flags(), []):
        if isa not in attempts:
            attempts.append(isa)
    return attempts


def build_command(compiler: str, output: str | os.PathLike[str], extra: tuple[str, ...] = (),
                  isa: tuple[str, ...] | list[str] = ()) -> list[str]:
    """The command that compiles :data:`SOURCE` into the shared library ``output``.

    Args:
        compiler: The compiler (a C++ driver is fine: ``-x c`` compiles C).
        output: The library to write.
        extra: Flags added after :data:`FLAGS` and ``$PRUNE_NATIVE_CXXFLAGS`` (:func:`prune.native.extra_flags`,
            which the sanitizer run sets for the TensorFlow op library and this library alike).
        isa: Instruction-set flags (one of :func:`build_attempts`), before ``$PRUNE_NATIVE_CXXFLAGS`` (whose
            ``-march=`` then wins).
    """
    return [compiler, *FLAGS, *isa, *native.extra_flags(), *extra, f"-I{SOURCE.parent}", str(SOURCE), "-o",
            str(output)]


KERNELS = ("auto", "gather", "dot", "scatter", "tile")
"""The kernel's paths (the delegate's ``kernel`` option; see the C file's header): ``auto`` picks per step and call."""


def delegate_options(num_threads: int | None = None, parallel_min_work: int | None = None,
                     kernel: str | None = None) -> dict[str, str]:
    """Options for ``load_delegate(str(delegate_path()), options)``.

    Args:
        num_threads: Threads for a large layer (1 to 64); ``None`` uses the interpreter's
            (``Interpreter(num_threads=N)``; 1 when it sets none).
        parallel_min_work: The work (``nnz`` x passes: rows, or groups of 8 rows on the tile path) from which a
            layer is split across the threads (the kernel's default:
            32768; 0 splits every layer, which only tests want).
        kernel: One of :data:`KERNELS`: the path every step takes (``None``/``"auto"``: the tile path from 2 rows,
            at 1 row the faster of the scalar dot and vector-gather paths, or the scatter path when enough inputs
            are zero). Forcing one is for tests and measurements.
    """
    options = {}
    if num_threads is not None:
        options["num_threads"] = str(int(num_threads))
    if parallel_min_work is not None:
        options["parallel_min_work"] = str(int(parallel_min_work))
    if kernel is not None:
        if kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {list(KERNELS)}, got {kernel!r}")
        options["kernel"] = kernel
    return options


def delegate_vector_path(path: str | os.PathLike[str] | None = None) -> str:
    """The vector path compiled into the delegate: ``"avx512 (16 lanes)"``, ``"avx2 (8 lanes)"`` or
    ``"scalar (1 lane)"`` (read from its ``prune_litert_delegate_path`` symbol).

    Args:
        path: The library; ``None``: :func:`delegate_path` (built on first use).
    """
    import ctypes

    fn = ctypes.CDLL(str(path if path is not None else delegate_path())).prune_litert_delegate_path
    fn.restype = ctypes.c_char_p
    return fn().decode()


@functools.lru_cache(maxsize=None)
def _version(compiler: str) -> str:
    """``compiler --version``'s output (part of the cache key), asked once per process."""
    try:
        return subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as err:
        return f"unknown ({err})"


def _name(compiler: str, isa: list[str], version: str) -> str:
    key = hashlib.sha256()
    for part in (SOURCE.read_bytes(), *(h.read_bytes() for h in HEADERS), compiler.encode(), version.encode(),
                 " ".join(build_command(compiler, "OUT", isa=isa)).encode(), native._cpu_isa().encode()):
        key.update(part)
        key.update(b"\0")
    return f"prune_litert_delegate-{key.hexdigest()[:20]}"


def delegate_path() -> Path:
    """The delegate library for this machine, compiled into :func:`prune.native.cache_dir` on first use.

    Safe to call from several threads and processes at once (a lock file guards the build).

    Returns:
        The path of the shared library, to give to ``load_delegate``.

    Raises:
        RuntimeError: ``PRUNE_NATIVE=0`` is set; no compiler was found; the cache cannot take the library;
            or the build failed (the message holds the compiler's first error line and the file with its output).
    """
    if not native.enabled():
        raise RuntimeError("prune's LiteRT kernels are off: PRUNE_NATIVE=0 is set (unset it, or export with "
                           "to_tflite(model, kernels='builtin'))")
    compiler = native._compiler()
    if compiler is None:
        raise RuntimeError("prune's LiteRT kernels need a C compiler: none found (set CXX, or install gcc/g++)")
    directory = native.cache_dir()
    version = _version(compiler)
    attempts = [(isa, _name(compiler, isa, version)) for isa in build_attempts()]
    with _lock:
        for _, name in attempts:  # a library already built (the machine's own, else a fallback's)
            lib = directory / f"{name}.so"
            if lib.exists() and native.verify(lib) is None:
                return lib
        reasons = []
        for isa, name in attempts:
            try:
                return _build(directory, compiler, isa, name)
            except _BuildFailed as err:
                reasons.append(f"with {' '.join(isa) or 'the default instruction set'}: {err}")
        raise RuntimeError(f"building prune's LiteRT delegate failed: {'; '.join(reasons)}")


class _BuildFailed(Exception):
    """The compiler failed (the next flag set is tried)."""


def _build(directory: Path, compiler: str, isa: list[str], name: str) -> Path:
    """Builds the library ``name`` with ``isa`` (under a lock file), or returns it when another process did."""
    import fcntl

    lib = directory / f"{name}.so"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        lock = open(directory / f"{name}.lock", "w")
    except OSError as err:
        raise RuntimeError(f"the native build cache {directory} is not usable ({type(err).__name__}: {err}); "
                           f"set PRUNE_NATIVE_CACHE to a writable directory") from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if lib.exists() and native.verify(lib) is None:  # built by another process while we waited
            return lib
        fd, tmp = tempfile.mkstemp(prefix=f"{name}.", suffix=".tmp.so", dir=directory)
        os.close(fd)
        try:
            command = build_command(compiler, tmp, isa=isa)
            proc = subprocess.run(command, capture_output=True, text=True)
            if proc.returncode != 0:
                log = directory / f"{name}.log"
                log.write_text(" ".join(command) + "\n\n" + proc.stdout + proc.stderr)
                first = next((ln for ln in proc.stderr.splitlines() if "error" in ln), proc.stderr.strip()[:200])
                raise _BuildFailed(f"{first} (compiler output in {log})")
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            size, sha = native._digest(Path(tmp))
            os.replace(tmp, lib)
            native._write_record(lib, size, sha)  # the record prune.native.verify reads
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    why = native.verify(lib)
    if why is not None:
        raise RuntimeError(f"prune's LiteRT delegate {lib} cannot be loaded: {why}")
    return lib
