"""experiments/oneshot_study.py: a stage 2 over a tiny real stage 1 (the runner on digits) that resumes, keeps the
one-shot masks through fine-tuning and refuses another config's rows; the claims' arithmetic on fixed values."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from experiments.oneshot_study import FAMILY, OneShotStudy, comparisons, prune_run, source_runs, table

ROOT = Path(__file__).resolve().parents[2]

TINY = """name = "tiny_dense"
implementations = ["dense"]
sparsities = [0.0]
seeds = [0]
models = [{name = "vit", patch = 4, dim = 16, depth = 1, heads = 2}]
datasets = [{name = "digits", validation = 200}]
[training]
epochs = 1
batch_size = 64
learning_rate = 0.003
"""


@pytest.mark.slow
def test_stage_two_prunes_each_trained_run_keeps_its_masks_through_fine_tuning_and_resumes(tmp_path):
    (tmp_path / "tiny.toml").write_text(TINY)
    proc = subprocess.run([sys.executable, "-m", "experiments", "run", str(tmp_path / "tiny.toml"), "--workers", "1",
                           "--results", str(tmp_path / "results")], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    study = OneShotStudy(name="tiny_oneshot", source="tiny_dense", methods=("magnitude", "sparsegpt"), sparsities=(0.5,),
                         nm=((2, 4),), calibration=64)
    runs = source_runs(study, tmp_path / "results")
    assert runs["model"].tolist() == ["vit-p4-d16-b1-h2"]
    for _, row in runs.iterrows():
        prune_run(row, study, tmp_path / "results", log=lambda line: None)
    rows = table(study, tmp_path / "results")
    assert len(rows) == 2 + 2 * 2 * 2  # dense and its control, 2 methods x 2 settings x (0, 1 epoch)
    pruned = rows[rows["method"] != "dense"]
    assert np.allclose(pruned["pruned_sparsity"], 0.5, atol=1e-9), pruned  # kept exactly through the fine-tune
    assert (rows.loc[rows["method"] == "dense", "pruned_sparsity"] == 0).all()
    dense = rows[(rows["method"] == "dense") & (rows["finetuned"] == 0)].set_index("run_id")["test_accuracy"]
    for _, row in runs.iterrows():  # the reloaded weights give the recorded accuracy
        assert abs(dense[row["run_id"]] - row["test_accuracy"]) <= 3e-4
    before = {f: f.read_text() for f in (tmp_path / "results" / "tiny_oneshot" / "rows").glob("*.csv")}
    prune_run(runs.iloc[0], study, tmp_path / "results", log=lambda line: None)  # finished: nothing is redone
    assert {f: f.read_text() for f in before} == before
    cut = dataclasses.replace(study, finetune_at=("2:4",))  # fewer fine-tuned settings: the same rows, still done
    prune_run(runs.iloc[0], cut, tmp_path / "results", log=lambda line: None)
    assert {f: f.read_text() for f in before} == before
    other = OneShotStudy(name="tiny_oneshot", source="tiny_dense", methods=("magnitude",), sparsities=(0.5,), nm=(),
                         calibration=32)
    with pytest.raises(ValueError, match=r"holds rows of another study config"):
        prune_run(runs.iloc[0], other, tmp_path / "results")
    fresh = tmp_path / "fresh"  # a study that fine-tunes at 2:4 only writes no fine-tuned 50% row
    (fresh / "tiny_dense").parent.mkdir(parents=True)
    import shutil

    shutil.copytree(tmp_path / "results" / "tiny_dense", fresh / "tiny_dense")
    prune_run(runs.iloc[0], cut, fresh, log=lambda line: None)
    got = table(cut, fresh)
    assert set(got.loc[got["finetuned"] == 1, "setting"]) == {"0%", "2:4"} and len(got) == 2 + 2 * 2 + 2


def _rows(acc):
    """A table of 2 models x 3 seeds from ``{(method, setting, finetuned): accuracy by pair index}``."""
    out = []
    for (method, setting, ft), values in acc.items():
        for k, v in enumerate(values):
            out.append(dict(model=f"m{k // 3}", seed=k % 3, method=method, setting=setting, finetuned=ft, test_accuracy=v))
    return pd.DataFrame(out)


def test_claims_are_paired_by_model_and_seed_and_hold_only_in_their_direction():
    base = np.array([0.80, 0.81, 0.79, 0.70, 0.72, 0.71])
    acc = {("dense", "0%", 0): base + 0.10}
    for setting, drop in (("50%", 0.0), ("60%", 0.02), ("70%", 0.04), ("80%", 0.08), ("2:4", 0.03), ("4:8", 0.02)):
        acc[("magnitude", setting, 0)] = base - drop - 0.05
        acc[("wanda", setting, 0)] = base - drop - 0.01 * (1 + (setting == "80%"))
        acc[("sparsegpt", setting, 0)] = base - drop + np.array([0.002, -0.001, 0.0, 0.001, 0.0, 0.001])
        for method in ("magnitude", "wanda", "sparsegpt"):
            acc[(method, setting, 1)] = acc[(method, setting, 0)] + 0.01
    frame = comparisons(_rows(acc)).set_index("claim")
    assert len(frame) == len(FAMILY) and (frame["n"] == 6).all()
    assert frame.loc["Wanda above magnitude at 50%, no fine-tune", "diff"] == pytest.approx(4.0)
    assert frame.loc["Wanda above magnitude at 50%, no fine-tune", "holds"]  # a constant 4 points: p ~ 0
    # SparseGPT's gap over magnitude is 5 points at 50% and at 80%: no growth
    assert frame.loc["SparseGPT's gap over magnitude larger at 80% than at 50%", "diff"] == pytest.approx(0.0, abs=1e-9)
    # Wanda's gap shrinks from 4 to 3 points: a constant -1, significant but in the wrong direction
    wanda_gap = frame.loc["Wanda's gap over magnitude larger at 80% than at 50%"]
    assert wanda_gap["diff"] == pytest.approx(-1.0) and not wanda_gap["holds"]
    # one epoch gains 1 point of SparseGPT's gap to dense at 70%, 14 points less its mean offset of 0.05:
    # 1 - 0.5 * 13.95 = -5.975, so the claim fails
    closes = frame.loc["one epoch closes most of SparseGPT's gap at 70%"]
    assert closes["diff"] == pytest.approx(-5.975) and not closes["holds"]
    assert frame["holm_p"].ge(frame["p"] - 1e-12).all()


def test_claims_refuse_a_table_missing_a_pair():
    acc = {(m, s, ft): np.full(6, 0.5) for m in ("dense", "magnitude", "wanda", "sparsegpt")
           for s in ("0%", "50%", "60%", "70%", "80%", "2:4", "4:8") for ft in (0, 1)}
    rows = _rows(acc)
    rows = rows.drop(rows.index[(rows["method"] == "wanda") & (rows["setting"] == "60%") & (rows["seed"] == 2)
                                & (rows["model"] == "m1")])
    with pytest.raises(ValueError, match=r"claim 'SparseGPT above Wanda at 60%, no fine-tune': no rows for the pairs \['m1/2'\]"):
        comparisons(rows)
