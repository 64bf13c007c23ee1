"""The native kernels build for every common CPU: a compile matrix, an aarch64 cross compile, and
builds of every vector width (4, 8 and 16 lanes) made on this machine and run against the dense reference.

The x86-64 targets compile here whatever this CPU is (g++ compiles for any ``-march=``), so the
AVX-512 and AVX512-FP16 builds are checked on an AVX2 machine and the other way round. The
aarch64 case needs Debian's ``g++-aarch64-linux-gnu`` (``.ci/run`` installs it) and is skipped,
with that reason, without it.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from prune import native

ROOT = Path(__file__).resolve().parents[3]
CXX = native._compiler()
X86_HOST = native._machine() == "x86_64"
_MACROS = native._predefined_macros(CXX, []) if CXX else set()
needs_x86_gxx = pytest.mark.skipif(
    not (X86_HOST and "__GNUC__" in _MACROS and "__clang__" not in _MACROS),
    reason="the x86-64 compile matrix needs g++ on an x86-64 host",
)

# -march target -> the vector path its build must compile (the literal in sparse_ops.cc's PRUNE_ISA)
X86_TARGETS = {
    "x86-64-v2": "sse2",
    "haswell": "avx2+fma",
    "znver3": "avx2+fma",
    "skylake-avx512": "avx512",
    "icelake-server": "avx512",
    "sapphirerapids": "avx512",  # AVX512-FP16: builds only with -mno-avx512fp16 (native.UNBUILDABLE)
    "znver4": "avx512",  # g++ 13 and newer; skipped where the compiler does not know it
}
ISAS = ("avx512", "avx2+fma", "avx", "neon", "sse2", "generic")


def _knows(cxx: str, march: str) -> bool:
    return subprocess.run([cxx, f"-march={march}", "-E", "-x", "c++", os.devnull], capture_output=True).returncode == 0


def _compile(cxx: str, isa: list[str], out: Path) -> bytes:
    cmd = native.build_command(cxx, str(out), isa, compile_only=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    errors = [ln for ln in proc.stderr.splitlines() if "error" in ln][:5]
    assert proc.returncode == 0, f"{' '.join(isa)}: " + "\n".join(errors or [proc.stderr[-2000:]])
    return out.read_bytes()


def _compiled_isa(obj: bytes) -> list[str]:
    """The PRUNE_ISA literals present in an object file (exactly one for a good build)."""
    return [isa for isa in ISAS if b"prune-isa:" + isa.encode() + b"\0" in obj]


@needs_x86_gxx
@pytest.mark.parametrize("march", list(X86_TARGETS))
def test_source_compiles_for_x86_64_target(march, tmp_path, monkeypatch):
    monkeypatch.delenv(native.EXTRA_FLAGS_ENV, raising=False)
    if not _knows(CXX, march):
        pytest.skip(f"{CXX} does not know -march={march}")
    isa = native.target_flags(CXX, march)
    assert ("-mno-avx512fp16" in isa) == (march in ("sapphirerapids",)), isa  # the exclusion, only where needed
    assert _compiled_isa(_compile(CXX, isa, tmp_path / "ops.o")) == [X86_TARGETS[march]]


def test_source_cross_compiles_for_aarch64(tmp_path, monkeypatch):
    monkeypatch.delenv(native.EXTRA_FLAGS_ENV, raising=False)
    cross = shutil.which("aarch64-linux-gnu-g++")
    if cross is None:
        pytest.skip("no aarch64 cross compiler: apt-get install g++-aarch64-linux-gnu (Debian; .ci/run does)")
    for march in ("armv8-a", "armv8.2-a+fp16"):  # the baseline (NEON), and a CPU with half floats (Graviton 2+)
        isa = native.target_flags(cross, march)
        assert _compiled_isa(_compile(cross, isa, tmp_path / f"ops-{march}.o")) == ["neon"], march


def test_target_flags_drop_only_what_tensorflow_cannot_compile():
    if not (X86_HOST and CXX):
        pytest.skip("x86-64 targets")
    assert native.target_flags(CXX, "x86-64-v2") == ["-march=x86-64-v2"]
    if _knows(CXX, "sapphirerapids"):
        assert native.target_flags(CXX, "sapphirerapids") == ["-march=sapphirerapids", "-mno-avx512fp16"]


CHILD = """
import json, sys
import pytest
from prune import native
code = pytest.main(["-q", "-p", "no:cacheprovider", "-n", "0", "tests/prune/native/test_native.py", "tests/prune/native/test_native_blocks.py",
                    "tests/prune/native/test_native_batches.py", "tests/prune/native/test_native_panels.py",
                    "tests/prune/native/test_native_conv.py", "tests/prune/native/test_native_nm.py",
                    "-k", "matches_dense_reference or corrupt or path_is_the_one or block_ops or every_batch or fuzz "
                          "or fit_at_batch or panel"])
st = native.status()
print("STATUS " + json.dumps(dict(code=int(code), available=st.available, reason=st.reason, flags=st.flags,
                                  vector=st.vector, path=st.path)))
"""

# Builds of every vector width, selected with PRUNE_NATIVE_CXXFLAGS, each running the dense-reference, every-batch,
# fuzz, corrupt-structure and proof-of-use tests, whatever this CPU's own width is. The width sets the batch
# thresholds (the small-batch paths take batches below one vector; the tiles take up to four vectors of rows), so
# each width runs batch logic the others never reach: batch 8 exactly crashed only 16-lane builds (issue 31).
# - 4 lanes: what aarch64 (NEON) and plain x86-64 compile.
# - 8 lanes: the AVX2 register transposes and batch-1 gathers where the CPU has AVX2 and FMA; else the same
#   width on SSE2 (PRUNE_VEC_BYTES=32: GCC splits each 32-byte vector into two 16-byte ones).
# - 16 lanes: what AVX-512 CPUs run, built for SSE2 with PRUNE_VEC_BYTES=64 so that it runs on any x86-64 CPU
#   (the lane logic, not the AVX-512 intrinsics: those run where the CPU's own build is AVX-512).
VARIANTS = {
    "sse2-4-lanes": ("-march=x86-64-v2", "sse2 (4 lanes)", None),
    "avx2-8-lanes": ("-march=haswell", "avx2+fma (8 lanes)", {"avx2", "fma"}),
    "sse2-8-lanes": ("-march=x86-64-v2 -DPRUNE_VEC_BYTES=32", "sse2 (8 lanes)", "no avx2-8-lanes"),
    "sse2-16-lanes": ("-march=x86-64-v2 -DPRUNE_VEC_BYTES=64", "sse2 (16 lanes)", None),
}


def _variants(cpu: set[str]) -> list[str]:
    """The VARIANTS this CPU runs: one per width (the AVX2 8-lane build where it can, else the SSE2 one)."""
    avx2 = VARIANTS["avx2-8-lanes"][2] <= cpu
    return [name for name, (_, _, needs) in VARIANTS.items()
            if needs is None or (needs == "no avx2-8-lanes" and not avx2) or (isinstance(needs, set) and avx2)]


def test_every_width_runs_on_this_cpu():
    names = _variants(set(native._cpu_isa().split()))
    lanes = sorted(int(VARIANTS[n][1].split("(")[1].split()[0]) for n in names)
    assert lanes == [4, 8, 16], names
    assert "sse2-8-lanes" in _variants(set()) and "avx2-8-lanes" not in _variants(set())


@pytest.mark.slow
@needs_x86_gxx
def test_every_vector_width_matches_the_dense_reference(tmp_path):
    cpu = set(native._cpu_isa().split())
    procs = {}
    for name in _variants(cpu):
        flags = VARIANTS[name][0]
        env = {k: v for k, v in os.environ.items() if k not in ("PRUNE_NATIVE", "CXX", "PYTEST_XDIST_WORKER")}
        env.update(PYTHONPATH=str(ROOT), PRUNE_NATIVE_CACHE=str(tmp_path / name), TF_CPP_MIN_LOG_LEVEL="3",
                   **{native.EXTRA_FLAGS_ENV: flags})
        procs[name] = subprocess.Popen([sys.executable, "-c", CHILD], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True)
    for name, proc in procs.items():
        out, _ = proc.communicate(timeout=900)
        lines = [ln for ln in out.splitlines() if ln.startswith("STATUS ")]
        assert lines, out[-3000:]
        st = json.loads(lines[-1][len("STATUS "):])
        flags, vector, _ = VARIANTS[name]
        assert st["available"], st
        assert st["vector"] == vector, st  # the variant's own build ran the tests, not this CPU's
        assert st["flags"].endswith(flags) and Path(st["path"]).parent == tmp_path / name, st
        assert st["code"] == 0, out[-4000:]
