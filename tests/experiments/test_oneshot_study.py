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

from experiments.oneshot_study import (FAMILY, GMP_FAMILY, OneShotStudy, comparisons, gmp_rows, prune_run, source_runs,
                                       table)

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


def _gmp_runs(tmp_path, layers):
    """A stage-3 ``runs.csv`` of 2 models x 3 seeds x (50%, 70%) whose runs pruned ``layers`` (name: sparsity)."""
    import json

    out = []
    for k in range(6):
        for target in (0.5, 0.7):
            sparsity = {name: (target if v is None else v) for name, v in layers.items()}
            out.append(dict(run_id=f"masked-{k}-{target}", model=f"m{k // 3}", seed=k % 3, target_sparsity=target,
                            status="ok", test_accuracy=0.6 + 0.01 * k - 0.1 * target, val_accuracy=0.6,
                            test_loss=1.0, fit_seconds=10.0, layer_sparsity=json.dumps(sparsity)))
    folder = tmp_path / "gmp"
    folder.mkdir(parents=True)
    pd.DataFrame(out).to_csv(folder / "runs.csv", index=False)
    return tmp_path


def test_gmp_runs_become_rows_and_are_compared_two_sided_paired_by_model_and_seed(tmp_path):
    results = _gmp_runs(tmp_path, {"block_0_attn/query_kernel": None, "block_0_mlp_0/kernel": None,
                                   "conv_0/kernel": 0.0, "dense_head/kernel": 0.0})
    gmp = gmp_rows(results=results, source="gmp")
    assert len(gmp) == 12 and set(gmp["setting"]) == {"50%", "70%"} and (gmp["method"] == "gmp").all()
    assert np.allclose(gmp.groupby("setting")["pruned_sparsity"].mean(), [0.5, 0.7])
    base = np.array([0.55, 0.56, 0.57, 0.58, 0.59, 0.60])  # GMP at 50%, pair by pair
    acc = {("dense", "0%", 0): base + 0.1,
           ("magnitude", "50%", 0): base - 0.02,  # a constant 2 points below GMP: established, though negative
           ("wanda", "50%", 0): base + np.array([0.01, -0.01, 0.0, 0.01, -0.01, 0.0]),  # mean 0: not established
           ("sparsegpt", "50%", 0): base + 0.001 * np.arange(6)}
    for method in ("magnitude", "wanda", "sparsegpt"):
        acc[(method, "70%", 1)] = base - 0.02 + 0.01  # 1 point above GMP at 70% (0.53 + k/100)
    rows = pd.concat([_rows(acc), gmp], ignore_index=True)
    frame = comparisons(rows, GMP_FAMILY, signed=False).set_index("claim")
    assert len(frame) == 6 and (frame["n"] == 6).all()
    mag = frame.loc["magnitude (one shot, no fine-tune) against GMP at 50%"]
    assert mag["diff"] == pytest.approx(-2.0) and mag["holds"]
    wanda = frame.loc["Wanda (one shot, no fine-tune) against GMP at 50%"]
    assert wanda["diff"] == pytest.approx(0.0, abs=1e-9) and not wanda["holds"]
    assert frame.loc["SparseGPT (one shot, one epoch) against GMP at 70%", "diff"] == pytest.approx(1.0)
    assert not comparisons(rows, GMP_FAMILY).loc[0, "holds"]  # signed: a negative difference never holds


def test_gmp_rows_refuse_a_run_that_pruned_a_layer_stage_two_keeps_dense(tmp_path):
    results = _gmp_runs(tmp_path, {"block_0_mlp_0/kernel": None, "conv_0/kernel": 0.5})
    with pytest.raises(ValueError, match=r"pruned \['conv_0/kernel'\], which stage 2 keeps dense"):
        gmp_rows(results=results, source="gmp")
    short = _gmp_runs(tmp_path / "short", {"block_0_mlp_0/kernel": None, "block_0_attn/query_kernel": 0.0})
    with pytest.raises(ValueError, match=r"left \['block_0_attn/query_kernel'\] below its target 0.5"):
        gmp_rows(results=short, source="gmp")
    with pytest.raises(FileNotFoundError, match="run stage 3 first"):
        gmp_rows(results=tmp_path, source="nothing")
