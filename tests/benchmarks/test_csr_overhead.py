"""benchmarks/csr_overhead.py under the benchmark protocol, on a tiny layer (no timing asserted): the header
states the machine, threads and load; no time, part or ratio comes out negative; a busy machine is refused."""

import re
import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))


SCRIPT = ROOT / "benchmarks" / "csr_overhead.py"
# scatter (batch 1) and tiled with the values gathered first (batch 256: more tiles than 2 threads)
TINY = ["--n", "32", "--batch", "16", "--sparsities", "0.9", "--points", "1:0.9,256:0.9", "--rounds", "1",
        "--min-ms", "1", "--k-max", "8"]
NEGATIVE = re.compile(r"(^|[\s(|])-\d")  # "-0.01" as a value; "0.1-0.2" is a range


def test_every_operation_and_part_is_positive_or_below_the_floor(tmp_path):
    out = tmp_path / "csr_overhead.csv"
    proc = subprocess.run([sys.executable, str(SCRIPT), *TINY, "--allow-loaded", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = out.with_suffix(".md").read_text()
    for line in ("- CPU:", "- Load:", "- Threads:", "- Dense calibration:"):
        assert f"\n{line}" in report, line
    assert "## Per operation, 32x32 weight, batch 16" in report
    assert "## The native forward op by part" in report
    assert not NEGATIVE.search(report), NEGATIVE.search(report)
    df = pd.read_csv(out)
    ops = df[df["section"] == "operation"]
    assert {"dense", "csr kernel", "to CSR", "gather", "transpose", "layer"} <= set(ops["name"])
    times = df[["ms", "ms_min", "ms_max"]]
    assert (times.dropna() > 0).all().all()  # unresolved: empty, never negative or zero
    resolved = df[df["resolved"]]
    assert (resolved["ms_min"] <= resolved["ms"]).all() and (resolved["ms"] <= resolved["ms_max"]).all()
    assert df.loc[~df["resolved"], "ms"].isna().all()
    if "native op" in set(ops["name"]):  # the native kernels loaded: the breakdown ran at both points
        parts = df[df["section"] == "part"]
        assert set(parts[parts["batch"] == 1]["name"]) == {"fixed", "multiply-adds"}
        assert set(parts[parts["batch"] == 256]["name"]) == {"fixed", "value gather", "transposes", "multiply-adds"}
        assert "| scatter |" in report and "| tiled, gathered |" in report


def test_a_busy_machine_is_refused_with_exit_code_3(tmp_path, busy_machine):
    out = tmp_path / "csr_overhead.csv"
    proc = subprocess.run([sys.executable, str(SCRIPT), *TINY, "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert proc.stderr.startswith("refused: the machine is busy") and "--allow-loaded" in proc.stderr
    assert not out.exists() and not out.with_suffix(".md").exists()
