"""benchmarks/panel_speed.py under the benchmark protocol, on a tiny weight (no timing asserted): the header, the
columns, no negative time, which points carry panels by default; bad --points are refused before any work."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "panel_speed.py"
NEGATIVE = re.compile(r"(^|[\s(|])-\d")  # "-0.01" as a value; "0.1-0.2" is a range


@pytest.mark.skipif(os.environ.get("PRUNE_NATIVE", "1").strip() == "0", reason="PRUNE_NATIVE=0 forces the fallback")
def test_panel_speed_pairs_the_op_with_and_without_panels(tmp_path):
    out = tmp_path / "panel_speed.csv"
    # 300 inputs: 3 panels; 50%: 50 entries per segment (panels by default), 98%: 2 (none by default)
    proc = subprocess.run([sys.executable, str(SCRIPT), "--points", "300:160:0.5,300:160:0.98", "--rounds", "2",
                           "--min-ms", "1", "--allow-loaded", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = out.with_suffix(".md").read_text()
    for line in ("- CPU:", "- Load:", "- Threads:", "- Dense calibration:"):
        assert f"\n{line}" in report, line
    assert not NEGATIVE.search(report), NEGATIVE.search(report)
    df = pd.read_csv(out)
    assert list(df["panels"]) == [True, False]
    assert (df[["with_ms", "without_ms", "ratio"]].dropna() > 0).all().all()  # unresolved: empty, never negative


def test_bad_points_are_refused_naming_the_argument(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--points", "1024:256", "--out", str(tmp_path / "x.csv")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--points: '1024:256' is not n:batch:sparsity" in proc.stderr
    assert not (tmp_path / "x.csv").exists()
