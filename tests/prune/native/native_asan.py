"""The native tests under AddressSanitizer and UBSan: ``make test-native-asan`` (``.ci/run`` runs it).

Each build below is compiled with the sanitizers (``PRUNE_NATIVE_CXXFLAGS``, into a cache of its own) and runs
the native test files in a fresh interpreter with the ASan runtime preloaded (Python and TensorFlow are not
instrumented; the kernels are, and TensorFlow's tensors come from the intercepted allocator, so a write past an
op's output is reported). Any sanitizer report fails the run.

Builds: this CPU's own (``-march=native``) and the portable 16-lane build (SSE2 with ``PRUNE_VEC_BYTES=64``), so
the lane logic that AVX-512 CPUs take is checked on every x86-64 machine; elsewhere, the CPU's own build alone.

Then a canary: a copy of the source with the small-batch dispatch made to overrun its output (as batch 8 did on
16-lane builds before issue 31's fix) must make the sanitized build report a heap-buffer-overflow. A sanitizer
run that cannot see that bug is not a check, so the target fails if the canary passes.

Usage: ``python tests/prune/native/native_asan.py [--keep CACHE_ROOT]``.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

# absl's headers bundled with TensorFlow do not compile with UBSan's null and nonnull-attribute checks (g++ 12: "is
# not a constant expression" in hash_policy_traits.h); ASan reports a null dereference as a SEGV all the same.
SANITIZE = ("-fsanitize=address,undefined -fno-sanitize=null,nonnull-attribute,returns-nonnull-attribute "
            "-fno-sanitize-recover=all -fno-omit-frame-pointer -g -O1")

TESTS = ["tests/prune/native/test_native_batches.py", "tests/prune/native/test_native.py", "tests/prune/native/test_native_blocks.py",
         "tests/prune/native/test_native_panels.py", "tests/prune/native/test_native_conv.py",
         "tests/prune/native/test_native_nm.py",
         "tests/prune/deploy/test_litert_kernels.py"]  # the LiteRT delegate (C), built with the same flags
# The subprocess tests of test_native.py (concurrent builds, thread counts, fallbacks) start interpreters of their own
# without the runtime preloaded: they run in `make test`, not here.
SELECT = "not concurrent and not bitwise and not import_prune and not deadlock and not fresh_build"

CANARY = """
import sys
from pathlib import Path
import numpy as np
from prune import native
native.SOURCE = Path(sys.argv[1])
native.HEADERS = (Path(sys.argv[1]).with_name("block_ops.h"), Path(sys.argv[1]).with_name("nm_ops.h"))
lib = native.load()
assert lib is not None, native.status().reason
rng = np.random.default_rng(0)
mask = rng.random((64, 32)) < 0.3
idx = np.argwhere(mask)
x = rng.standard_normal((3, 64)).astype("f4")
print("CANARY-RAN", lib.prune_spmm(x, np.ones(len(idx), "f4"), native.structure(idx, 64, 32, block=0),
                                   n_in=64, n_out=32).numpy().sum())
"""
BUG = ("const int64_t n = std::min<int64_t>(8, batch - b0);\n    const float* xb = x + b0 * m.n_rows;",
       "const int64_t n = 8;  // canary: overruns y\n    const float* xb = x + b0 * m.n_rows;")


def runtime(cxx: str) -> str:
    """``LD_PRELOAD`` for the sanitized library: the ASan runtime, then libstdc++ (whose ``__cxa_throw`` ASan must
    find at start-up, or it aborts when a pybind11 module throws)."""
    libs = [subprocess.run([cxx, f"-print-file-name={name}"], capture_output=True, text=True).stdout.strip()
            for name in ("libasan.so", "libstdc++.so.6")]
    missing = [lib for lib in libs if not os.path.isabs(lib) or not os.path.exists(lib)]
    if missing:
        raise SystemExit(f"native_asan: {cxx} has no runtime {missing[0]!r} (install g++'s libasan: Debian's libasan8)")
    return " ".join(libs)


def environment(cache: Path, flags: str, preload: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PRUNE_NATIVE", "PYTEST_XDIST_WORKER")}
    env.update(PRUNE_NATIVE_CACHE=str(cache), PRUNE_NATIVE_CXXFLAGS=flags, LD_PRELOAD=preload,
               ASAN_OPTIONS="detect_leaks=0:abort_on_error=0:exitcode=86", UBSAN_OPTIONS="print_stacktrace=1",
               TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return env


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="cache root to keep the sanitized builds in (default: a temporary one)")
    args = parser.parse_args()
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        raise SystemExit("native_asan: no C++ compiler (set CXX, or install g++)")
    preload = runtime(cxx)
    root = args.keep or Path(tempfile.mkdtemp(prefix="prune-asan-"))
    builds = {"native": SANITIZE}
    if platform.machine().lower() in ("x86_64", "amd64"):
        builds["sse2-16-lanes"] = f"-march=x86-64-v2 -DPRUNE_VEC_BYTES=64 {SANITIZE}"
    failed = []
    # -s: a sanitizer report ends the process, and pytest's captured output would go with it
    cmd = [sys.executable, "-m", "pytest", "-q", "-s", "-n", "0", "-p", "no:cacheprovider", *TESTS, "-k", SELECT]
    start = time.monotonic()
    procs = {name: subprocess.Popen(cmd, env=environment(root / name, flags, preload), cwd=ROOT, text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for name, flags in builds.items()}  # one per core of the 2-core reference machine
    for name, proc in procs.items():
        out = proc.communicate()[0]
        vector = subprocess.run(  # the build the tests ran (now in the cache: no compile)
            [sys.executable, "-c", "from prune import native; native.load(); s = native.status(); print(s.vector or s.reason)"],
            env=environment(root / name, builds[name], preload), cwd=ROOT, capture_output=True, text=True).stdout.strip()
        summary = next((ln for ln in reversed(out.splitlines()) if " passed" in ln or " failed" in ln), "no summary")
        reports = [ln for ln in out.splitlines() if "Sanitizer" in ln or "runtime error:" in ln]
        print(f"native_asan: {name} [{vector}]: rc {proc.returncode}, {summary.strip()} "
              f"({time.monotonic() - start:.0f} s since the start)")
        if proc.returncode != 0 or reports or not vector.endswith("lanes)"):
            failed.append(name)
            print("\n".join(reports[:20]) or out[-6000:])
    # The canary: the sanitized build of a source that overruns y at batch 3 must be caught.
    canary_dir = root / "canary-src"
    canary_dir.mkdir(parents=True, exist_ok=True)
    src = (ROOT / "prune/native/sparse_ops.cc").read_text()
    assert src.count(BUG[0]) == 1, "native_asan: the canary's mutation no longer applies; update BUG"
    (canary_dir / "sparse_ops.cc").write_text(src.replace(BUG[0], BUG[1]))
    for header in ("block_ops.h", "nm_ops.h"):
        shutil.copy(ROOT / "prune/native" / header, canary_dir / header)
    proc = subprocess.run([sys.executable, "-c", CANARY, str(canary_dir / "sparse_ops.cc")],
                          env=environment(root / "canary", SANITIZE, preload), cwd=ROOT, capture_output=True, text=True)
    caught = proc.returncode != 0 and "AddressSanitizer: heap-buffer-overflow" in proc.stderr
    print(f"native_asan: canary (small-batch dispatch overrunning y): {'caught' if caught else 'NOT CAUGHT'}, "
          f"rc {proc.returncode}")
    if not caught:
        failed.append("canary")
        print(proc.stdout[-2000:] + proc.stderr[-4000:])
    if args.keep is None:
        shutil.rmtree(root, ignore_errors=True)
    print(f"native_asan: {len(builds) - len([f for f in failed if f != 'canary'])} of {len(builds)} builds clean"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
