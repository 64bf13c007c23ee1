"""benchmarks/transformer_speed.py (issue 36, item 3): bad arguments refused before any work, naming the flag and the
value; the targets judged from the table's ratios; and one tiny end-to-end run (an encoder block of width 16, one
round) whose table has every form at every tokens count in both modes, each checked against its reference and timed.
No timing is asserted."""

import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(BENCH))

import transformer_speed  # noqa: E402

HEADER_LINES = ("- CPU: ", "- Native kernels: ", "- Load: ", "- Threads: ", "- Dense calibration: ")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--models", "tiny", "bert"], "--models: unknown ['bert']"),
        (["--models", ","], "--models: unknown"),
        (["--forms", "dense", "80%"], "--forms: unknown ['80%']"),
        (["--forms", "2:4,1:4"], "--forms: unknown ['1:4']"),
        (["--modes", "backward"], "--modes: unknown ['backward']"),
        (["--tokens", "1", "0"], "--tokens: every entry must be a positive integer, got '1,0'"),
        (["--tokens", "-16"], "--tokens: every entry must be a positive integer, got '-16'"),
        (["--tokens", "x"], "--tokens: 'x' is not a comma-separated list of integers"),
        (["--rounds", "0"], "--rounds must be at least 1, got 0"),
        (["--min-ms", "0"], "--min-ms must be above 0, got 0.0"),
        (["--threads", "-2"], "--threads must be 0 (the usable cores) or more, got -2"),
    ],
)
def test_bad_arguments_are_refused_naming_the_flag_and_value(args, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_:
        transformer_speed.main([*args, "--out", str(tmp_path / "x"), "--allow-loaded"])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_a_bad_argument_is_refused_before_tensorflow_is_imported(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", "import sys; sys.path.insert(0, 'benchmarks'); import transformer_speed\n"
         "try:\n    transformer_speed.main(['--models', 'nope', '--out', sys.argv[1]])\n"
         "except SystemExit as e:\n    print('tf' if 'tensorflow' in sys.modules else 'no tf', e.code)",
         str(tmp_path / "x")], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "no tf 2", proc.stdout + proc.stderr[-2000:]
    assert "--models: unknown ['nope']" in proc.stderr
    assert list(tmp_path.iterdir()) == []


def _rows(ratios):
    """Rows as ``measure`` makes them: ``x_dense`` of (model, tokens, mode, form)."""
    return [dict(model=m, tokens=t, mode=mode, form=f, x_dense=x) for (m, t, mode, f), x in ratios.items()]


def test_targets_are_judged_from_the_table_only_on_a_result_run():
    args = transformer_speed.parse(["--allow-loaded"])  # the defaults: every target measured
    ratios = {(m, t, mode, f): 1.0 for m in transformer_speed.DEFAULT_MODELS for t in (1, 16, 256, 4096)
              for mode in ("forward", "train") for f in transformer_speed.FORMS}
    ratios.update({("ffn256", 256, "forward", "2:4"): 1.4, ("ffn512", 256, "forward", "2:4"): 1.5,
                   ("ffn256", 4096, "forward", "2:4"): 1.31, ("ffn512", 4096, "forward", "2:4"): 1.29,
                   ("ffn256", 1, "forward", "2:4"): 0.1,  # below 256 tokens: not the target's
                   ("block256", 1, "forward", "2:4"): 1.0, ("block512", 1, "forward", "2:4"): 1.2})
    lines = transformer_speed.judge(_rows(ratios), args, judged=True)
    assert len(lines) == len(transformer_speed.TARGETS)
    assert lines[0].endswith("-- MISSED (needs >= 1.3x at each).") and "ffn512 4096 tokens: 1.29x" in lines[0]
    assert "ffn256 1 tokens" not in lines[0]
    assert lines[3].endswith("-- MET (needs >= 1x at each).")  # training step at 1.0x: no slower than dense
    assert lines[5].startswith("- feed-forward pair and encoder block, 2:4, forward, 1 token")
    assert lines[5].endswith("-- MISSED (needs >= 1x at each).") and "ffn256 1 tokens: 0.10x" in lines[5]
    smoke = transformer_speed.judge(_rows(ratios), args, judged=False)
    assert all("MET" not in line and "MISSED" not in line and "NOT JUDGED (not a result run)" in line for line in smoke)
    few = transformer_speed.parse(["--models", "ffn256", "--tokens", "1", "16", "--allow-loaded"])
    assert "not measured (needs" in transformer_speed.judge(_rows(ratios), few, judged=True)[0]
    ratios[("ffn512", 256, "forward", "4:8")] = math.nan  # refused or not timed
    missing = transformer_speed.judge(_rows(ratios), args, judged=True)[1]
    assert "not measured (4:8 or dense not timed at ffn512 256" in missing


def test_tiny_run_checks_and_times_every_form_in_both_modes(tmp_path):
    out = tmp_path / "transformer_speed"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "transformer_speed.py"), "--models", "tiny", "--tokens", "1", "5", "--rounds", "1",
         "--min-ms", "1", "--allow-loaded", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    text = out.with_suffix(".md").read_text()
    lines = text.splitlines()
    for start in HEADER_LINES:
        assert any(line.startswith(start) for line in lines), f"no line starting {start!r}:\n{text[:2000]}"
    assert "under `benchmarks/protocol.py`" in text and "NOT A RESULT" in text  # one round is never a result
    assert "## Targets" in text and "MET" not in text and "MISSED" not in text
    targets = text.split("## Targets", 1)[1]
    assert "not judged" in text and targets.count("not measured (needs") == len(transformer_speed.TARGETS)
    df = pd.read_csv(out.with_suffix(".csv"))
    assert list(df.columns) == transformer_speed.COLUMNS
    expected = [(t, mode, f) for t in (1, 5) for mode in transformer_speed.MODES for f in transformer_speed.FORMS]
    assert list(zip(df["tokens"], df["mode"], df["form"])) == expected  # the table's order: dense first in each group
    assert (df["model"] == "tiny").all()
    assert (df["status"] == "timed").all(), df[["tokens", "mode", "form", "status"]].to_string()
    assert (df["max_abs_diff"] <= transformer_speed.ATOL + transformer_speed.RTOL).all()  # checked before timing
    assert (df["ms_min"] <= df["ms"]).all() and (df["ms"] <= df["ms_max"]).all() and (df["ms"] > 0).all()
    assert (df["calls_per_round"] >= 1).all() and (df["rounds"] == 1).all()
    assert (df[df["form"] == "dense"]["x_dense"] == 1.0).all() and (df["x_dense"] > 0).all()
    pruned = df[df["form"] != "dense"]
    # the feed-forward pair always runs sparse; the attention projections do once convert makes them sparse
    assert pruned["sparse_layers"].str.contains("SparseDense: ffn_in, ffn_out").all()
    assert ((pruned["sparse_share"] > 0) & (pruned["sparse_share"] <= 1)).all()
    assert (df[df["form"] == "dense"]["sparse_layers"] == "none (plain Keras)").all()
    assert (df[df["form"] == "90%"]["sparsity"].round(2) == 0.9).all()
    table = [line for line in lines if line.startswith("| tiny |")]
    assert len(table) == len(expected) and all(line.endswith("| timed |") for line in table)


def test_a_busy_machine_is_refused_before_any_work(tmp_path, busy_machine):
    proc = subprocess.run(
        [sys.executable, str(BENCH / "transformer_speed.py"), "--models", "tiny", "--rounds", "1", "--busy-threshold",
         "0.01", "--out", str(tmp_path / "transformer_speed")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "refused: the machine is busy" in proc.stderr
    assert list(tmp_path.iterdir()) == []
