"""``benchmarks/nm_parts.py``: a smoke run times every part of both structures, and bad arguments are refused."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "nm_parts.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300, cwd=ROOT)


@pytest.mark.parametrize("args, words", [
    (["--shapes", "512"], "--shapes takes N_INxN_OUT, e.g. 512x2048, got '512'"),
    (["--shapes", "3x8"], "--shapes needs n_in >= 4 and n_out >= 1, got '3x8'"),
    (["--batches", "0"], "--batches and --rounds take positive integers, got '0'"),
])
def test_bad_arguments_are_refused_naming_the_value(tmp_path, args, words):
    proc = run(*args, "--out", str(tmp_path / "np"))
    assert proc.returncode == 2 and words in proc.stderr, proc.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(os.environ.get("PRUNE_NATIVE", "1").strip() == "0", reason="PRUNE_NATIVE=0: the script times the native ops")
def test_a_smoke_run_checks_and_times_every_part_of_both_structures(tmp_path):
    proc = run("--shapes", "37x53", "--batches", "1", "5", "--rounds", "1", "--min-ms", "1", "--allow-loaded",
               "--out", str(tmp_path / "np"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = pd.read_csv(tmp_path / "np.csv")
    assert len(table) == 2 * 2 * 3  # batches x structures x parts
    assert set(table.part) == {"forward", "input grad", "values grad"} and set(table.structure) == {"2:4", "90%"}
    assert table.loc[table.structure == "2:4", "nm_section"].all() and not table.loc[table.structure == "90%", "nm_section"].any()
    assert (table.max_rel_err < 1e-3).all() and (table.ms > 0).all() and (table.x_dense > 0).all()
    text = (tmp_path / "np.md").read_text()
    assert "NOT A RESULT" in text or "Load: quiet" in text
