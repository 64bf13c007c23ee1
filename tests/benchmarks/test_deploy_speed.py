"""benchmarks/deploy_speed.py (issue 38, item 4): bad arguments refused before any work, naming the flag and the
value; the targets judged from the table's ratios; and one tiny end-to-end run (37-53-11, one round, three calls per
form) whose table has every form at every batch, each checked against the Keras model. No timing is asserted."""

import math
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(BENCH))

import deploy_speed  # noqa: E402

HEADER_LINES = ("- CPU: ", "- Load: ", "- Threads: ", "- Dense calibration: ")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--models", "lenet300,resnet"], "--models: unknown ['resnet']"),
        (["--models", ","], "--models: unknown"),
        (["--sparsity", "0"], "--sparsity must be in (0, 1), got 0.0"),
        (["--sparsity", "1"], "--sparsity must be in (0, 1), got 1.0"),
        (["--sparsity", "-0.5"], "--sparsity must be in (0, 1), got -0.5"),
        (["--batches", "1,0"], "--batches: every entry must be a positive integer, got '1,0'"),
        (["--batches", "1,x"], "--batches: '1,x' is not a comma-separated list of integers"),
        (["--tokens", "-16"], "--tokens: every entry must be a positive integer, got '-16'"),
        (["--rounds", "0"], "--rounds must be at least 1, got 0"),
        (["--min-ms", "0"], "--min-ms must be above 0, got 0.0"),
        (["--calls", "-1"], "--calls must be 0 (scaled) or more, got -1"),
        (["--threads", "-2"], "--threads must be 0 (the usable cores) or more, got -2"),
    ],
)
def test_bad_arguments_are_refused_naming_the_flag_and_value(args, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_:
        deploy_speed.main([*args, "--out", str(tmp_path / "x"), "--allow-loaded"])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_a_bad_argument_is_refused_before_tensorflow_is_imported(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", "import sys; sys.path.insert(0, 'benchmarks'); import deploy_speed\n"
         "try:\n    deploy_speed.main(['--sparsity', '1.5', '--out', sys.argv[1]])\n"
         "except SystemExit as e:\n    print('tf' if 'tensorflow' in sys.modules else 'no tf', e.code)",
         str(tmp_path / "x")], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "no tf 2", proc.stdout + proc.stderr[-2000:]
    assert "--sparsity must be in (0, 1), got 1.5" in proc.stderr


def _rows(ratios):
    """Rows of the table as ``measure`` makes them, with ``litert prune``'s speed-up over LiteRT dense given."""
    return [dict(model=m, size=s, form="litert prune", x_litert_dense=x) for (m, s), x in ratios.items()]


def test_targets_are_judged_from_the_table_only_on_a_result_run():
    args = deploy_speed.parse(["--models", "lenet300,mlp1024,ffn512", "--allow-loaded"])
    rows = _rows({("mlp1024", 1): 2.5, ("mlp1024", 8): 0.5, ("ffn512", 1): 1.9, ("ffn512", 16): 3.0,
                  ("lenet300", 1): 1.2, ("lenet300", 8): 0.99})
    lines = deploy_speed.judge(rows, args, judged=True)
    assert lines[0].endswith("batch 1: 2.50x -- MET (needs >= 2x).")  # batch 8 is not the target's
    assert lines[1].endswith("tokens 1: 1.90x -- MISSED (needs >= 2x).")
    assert lines[2].endswith("batch 1: 1.20x, batch 8: 0.99x -- MISSED (needs >= 1x).")  # every batch must hold
    assert "not measured here" in lines[3]  # MobileNet
    smoke = deploy_speed.judge(rows, args, judged=False)
    assert all("MET" not in line and "MISSED" not in line for line in smoke)
    assert "NOT JUDGED (not a result run)" in smoke[0]
    other = deploy_speed.judge(rows, deploy_speed.parse(["--sparsity", "0.8"]), judged=True)
    assert "NOT JUDGED (sparsity 0.8, target at 0.9)" in other[0]
    missing = deploy_speed.judge(_rows({("mlp1024", 1): math.nan}), args, judged=True)
    assert "not measured (litert prune or litert dense not timed" in missing[0]


@pytest.mark.skipif(os.environ.get("PRUNE_NATIVE", "1").strip() == "0",
                    reason="PRUNE_NATIVE=0 turns prune's LiteRT delegate off: the 'litert prune' form is refused")
def test_tiny_run_times_every_form_checked_against_keras(tmp_path):
    out = tmp_path / "deploy_speed"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "deploy_speed.py"), "--models", "tiny", "--batches", "1,3", "--rounds", "1",
         "--calls", "3", "--min-ms", "1", "--allow-loaded", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    text = out.with_suffix(".md").read_text()
    lines = text.splitlines()
    for start in HEADER_LINES:
        assert any(line.startswith(start) for line in lines), f"no line starting {start!r}:\n{text[:2000]}"
    assert "under `benchmarks/protocol.py`" in text and "NOT A RESULT" in text  # one round is never a result
    assert "## Targets" in text and "MET" not in text and "MISSED" not in text
    df = pd.read_csv(out.with_suffix(".csv"))
    assert list(df.columns) == deploy_speed.COLUMNS
    assert sorted(zip(df["size"], df["form"])) == sorted((b, f) for b in (1, 3) for f in deploy_speed.FORMS)
    assert (df["status"] == "timed").all(), df[["size", "form", "status"]].to_string()
    assert (df["max_abs_diff"] <= deploy_speed.ATOL + deploy_speed.RTOL).all()  # outputs agree with Keras
    assert (df["ms_min"] <= df["ms"]).all() and (df["ms"] <= df["ms_max"]).all() and (df["ms"] > 0).all()
    assert (df["calls_per_round"] == 3).all()
    assert (df[df["form"] == "litert dense"]["x_litert_dense"] == 1.0).all()
    litert = df[df["form"].str.startswith("litert")]
    assert (litert["flatbuffer_bytes"] > 0).all() and df[df["form"].str.startswith("tf")]["flatbuffer_bytes"].isna().all()
    assert (df[df["form"] == "litert prune"]["prune_ops"] == 1).all()  # the hidden layer; the output layer stays dense
    assert (df[df["form"] == "litert dense"]["prune_ops"] == 0).all()

