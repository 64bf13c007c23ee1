"""benchmarks/structure_speed.py under the benchmark protocol, on a tiny layer at equal density per pattern
(no timing asserted): the columns other code reads, min-max beside them, the header, no negative time; a busy
machine is refused."""

import re
import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))


SCRIPT = ROOT / "benchmarks" / "structure_speed.py"
TINY = ["--size", "16x8", "--batch", "2", "--sparsities", "0.5", "--rounds", "1", "--min-ms", "1", "--k-max", "8"]
NEGATIVE = re.compile(r"(^|[\s(|])-\d")  # "-0.01" as a value; "0.1-0.2" is a range


def test_structure_speed_compares_patterns_at_equal_density(tmp_path):
    out = tmp_path / "structure_speed.csv"
    proc = subprocess.run([sys.executable, str(SCRIPT), *TINY, "--allow-loaded", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = out.with_suffix(".md").read_text()
    for line in ("- CPU:", "- Load:", "- Threads:", "- Dense calibration:"):
        assert f"\n{line}" in report, line
    assert "TF_ENABLE_ONEDNN_SPMM=" in report and "inter_op=1" in report  # settings stated
    assert not NEGATIVE.search(report), NEGATIVE.search(report)
    df = pd.read_csv(out)
    kept = ["size", "batch", "impl", "pattern", "sparsity", "nnz", "median_ms", "threads", "rounds",
            "vs_unstructured", "vs_dense"]
    assert set(kept + ["ms_min", "ms_max", "k"]) <= set(df.columns)
    sparse = df[df["impl"] != "dense"]
    assert set(sparse["pattern"]) == {"unstructured", "2:4", "block4x4", "channel"}
    assert set(sparse["impl"]) == {"coo", "csr"}
    assert (sparse["nnz"] == 64).all()
    times = df[["median_ms", "ms_min", "ms_max"]]
    assert (times.dropna() > 0).all().all()  # unresolved: empty, never negative or zero
    ok = df.dropna(subset=["median_ms"])
    assert (ok["ms_min"] <= ok["median_ms"]).all() and (ok["median_ms"] <= ok["ms_max"]).all()
    assert (df[["vs_unstructured", "vs_dense"]].dropna() > 0).all().all()


def test_a_busy_machine_is_refused_with_exit_code_3(tmp_path, busy_machine):
    out = tmp_path / "structure_speed.csv"
    proc = subprocess.run([sys.executable, str(SCRIPT), *TINY, "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert proc.stderr.startswith("refused: the machine is busy") and "--allow-loaded" in proc.stderr
    assert not out.exists() and not out.with_suffix(".md").exists()
