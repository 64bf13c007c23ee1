"""prune's sparse kernels inside LiteRT (TFLite): the external delegate library, built on first use (issue 38).

``litert_delegate.c`` beside this file is a plain C shared library exposing
the documented external-delegate entry points
(``tflite_plugin_create_delegate`` / ``tflite_plugin_destroy_delegate``). It
claims the CUSTOM operators named :data:`OP_NAME` ("PruneSparseFC": a
fully-connected layer whose weight is stored as CSR) that
:func:`prune.deploy.export.to_tflite` writes with ``kernels="prune"``, and runs
them, single-threaded. It links no TFLite symbol: the stable C ABI it uses is
declared by hand in ``litert_abi.h`` (from upstream's ``tflite/core/c/common.h``;
tested with ai-edge-litert 2.3.0 and TensorFlow 2.21's ``tf.lite``).

:func:`delegate_path` compiles it on first use into :func:`prune.native.cache_dir`
with the C++ compiler that :mod:`prune.native` finds (``$CXX``, else
``c++``/``g++``/``clang++``), in C mode (``-x c``), with conservative flags
(``-O2``, no ``-march``). The file name is a hash of the sources, the compiler, its
version and the command; the library is written to a temporary file, renamed
into place and recorded (size and SHA-256) so that :func:`prune.native.verify`
checks it before every load, as for the TensorFlow op library. A failed build
raises, naming the compiler's first error and the log file with its output (no ``.failed`` marker: the next call retries).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
import threading
from pathlib import Path

from prune import native

__all__ = ["OP_NAME", "SOURCE", "HEADERS", "FLAGS", "delegate_path", "build_command"]

OP_NAME = "PruneSparseFC"
"""Custom name of the sparse fully-connected operator the delegate claims."""

SOURCE = Path(__file__).with_name("litert_delegate.c")
"""The delegate's C source."""

HEADERS = (Path(__file__).with_name("litert_abi.h"),)
"""Headers the source includes (part of the build's cache key)."""

FLAGS = ("-x", "c", "-std=c11", "-O2", "-shared", "-fPIC", "-Wall")
"""Compiler flags: C mode, portable optimisation (no ``-march``), a shared library."""

_lock = threading.Lock()


def build_command(compiler: str, output: str | os.PathLike[str], extra: tuple[str, ...] = ()) -> list[str]:
    """The command that compiles :data:`SOURCE` into the shared library ``output``.

    Args:
        compiler: The compiler (a C++ driver is fine: ``-x c`` compiles C).
        output: The library to write.
        extra: Flags added after :data:`FLAGS` and ``$PRUNE_NATIVE_CXXFLAGS`` (:func:`prune.native.extra_flags`,
            which the sanitizer run sets for the TensorFlow op library and this library alike).
    """
    return [compiler, *FLAGS, *native.extra_flags(), *extra, f"-I{SOURCE.parent}", str(SOURCE), "-o", str(output)]


def _name(compiler: str) -> str:
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as err:
        version = f"unknown ({err})"
    key = hashlib.sha256()
    for part in (SOURCE.read_bytes(), *(h.read_bytes() for h in HEADERS), compiler.encode(), version.encode(),
                 " ".join(build_command(compiler, "OUT")).encode()):
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
    import fcntl

    if not native.enabled():
        raise RuntimeError("prune's LiteRT kernels are off: PRUNE_NATIVE=0 is set (unset it, or export with "
                           "to_tflite(model, kernels='builtin'))")
    compiler = native._compiler()
    if compiler is None:
        raise RuntimeError("prune's LiteRT kernels need a C compiler: none found (set CXX, or install gcc/g++)")
    directory = native.cache_dir()
    name = _name(compiler)
    lib = directory / f"{name}.so"
    with _lock:
        if lib.exists() and native.verify(lib) is None:
            return lib
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
                command = build_command(compiler, tmp)
                proc = subprocess.run(command, capture_output=True, text=True)
                if proc.returncode != 0:
                    log = directory / f"{name}.log"
                    log.write_text(" ".join(command) + "\n\n" + proc.stdout + proc.stderr)
                    first = next((ln for ln in proc.stderr.splitlines() if "error" in ln), proc.stderr.strip()[:200])
                    raise RuntimeError(f"building prune's LiteRT delegate failed: {first} (compiler output in {log})")
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
