"""benchmarks/loop_limit.py: the loop it times is the one in prune/native/sparse_ops.cc, and the harness runs."""

import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import loop_limit  # noqa: E402

SOURCE = (ROOT / "prune" / "native" / "sparse_ops.cc").read_text()


def test_the_loop_is_cut_from_the_kernel_source_itself():
    inc = loop_limit.kernel_include(SOURCE)
    start = SOURCE.index("template <int NV, bool kPerm>\ninline void AddEntries(")
    # The function's end found by counting braces, not by the marker kernel_include cuts at, so a cut that
    # stopped at an inner closing brace fails here.
    depth, end = 0, None
    for i in range(SOURCE.index("{", start), len(SOURCE)):
        depth += {"{": 1, "}": -1}.get(SOURCE[i], 0)
        if depth == 0:
            end = i + 1
            break
    body = SOURCE[start:end]
    assert body.count("{") == body.count("}") > 1
    assert body + "\n" in inc and "typedef float vec" in inc and "constexpr int64_t kPrefetchAhead" in inc


def test_a_source_without_the_loop_is_named():
    with pytest.raises(ValueError, match=r"sparse_ops.cc: AddEntries not found"):
        loop_limit.kernel_include(SOURCE.replace("inline void AddEntries(", "inline void Renamed("))


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None, reason="no C++ compiler")
def test_the_harness_builds_and_reports_a_positive_rate_per_round(tmp_path):
    exe = loop_limit.build(tmp_path)
    for mode, shape in (("peak", ()), ("entries", (128, 13, 64))):
        got = loop_limit.run(exe, mode, 1, 1000, *shape)
        assert len(got.values) == 7 and min(got.values) > 0, (mode, got)


def test_segment_lengths_are_a_panel_times_the_density():
    assert [loop_limit.segment(1024, s) for s in (0.8, 0.9, 0.95, 0.99)] == [26, 13, 6, 1]
    assert loop_limit.segment(4096, 0.9) == 13 and loop_limit.segment(100, 0.5) == 50


def test_each_target_uses_the_loop_the_op_runs_there():
    # 99% at 1024 inputs: one entry per panel segment, below PANEL_MIN_SEGMENT, so the op runs the plain tiled loop
    # over whole output rows of 10 entries; 90% runs the panels at 13 entries per segment.
    assert loop_limit.op_loop(1024, 0.99) == ("l2", 10)
    assert loop_limit.op_loop(1024, 0.90) == ("panel", 13) and loop_limit.op_loop(4096, 0.90) == ("panel", 13)
