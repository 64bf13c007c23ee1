"""The structure benchmark runs end to end on a tiny layer, at equal density per pattern (no timing asserted)."""

import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]


def test_structure_speed_compares_patterns_at_equal_density(tmp_path):
    out = tmp_path / "structure_speed.csv"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "structure_speed.py"), "--size", "16x8", "--batch", "2",
           "--sparsities", "0.5", "--rounds", "2", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "TF_ENABLE_ONEDNN_SPMM=" in proc.stdout and "intra_op=2" in proc.stdout  # settings stated
    df = pd.read_csv(out)
    sparse = df[df["impl"] != "dense"]
    assert set(sparse["pattern"]) == {"unstructured", "2:4", "block4x4", "channel"}
    assert set(sparse["impl"]) == {"coo", "csr"}
    assert (sparse["nnz"] == 64).all() and (df["median_ms"] > 0).all()
