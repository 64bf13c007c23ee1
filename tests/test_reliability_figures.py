"""figures on tables that lack optional columns, hold only NaN accuracies, or hold diverged runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from experiments.figures import draw_figures, main, main_table, load_sweep_with_diverged
from tests.test_figures import write_synthetic


def _edit(root: Path, fn) -> Path:
    write_synthetic(root, bench=False)
    path = root / "synthetic" / "runs.csv"
    fn(pd.read_csv(path)).to_csv(path, index=False)
    return root


def test_table_without_step_time_draws_the_rest_and_names_the_skipped_figure(tmp_path, capsys):
    root = _edit(tmp_path, lambda runs: runs.drop(columns=["step_time_ms"]))
    assert main(["synthetic", "--results-root", str(root)]) == 0
    captured = capsys.readouterr()
    assert "skipped step_time_vs_sparsity: runs: no finished dense run with a step_time_ms" in captured.err
    names = sorted(p.name for p in (root / "synthetic" / "figures").iterdir())
    assert "accuracy_vs_sparsity.png" in names and not any(n.startswith("step_time") for n in names)
    with pytest.raises(ValueError, match="step_time_ms"):  # the API without skipped= still refuses
        draw_figures("synthetic", tmp_path / "out", root)


def test_table_without_dataset_and_model_is_one_unknown_pair(tmp_path):
    root = _edit(tmp_path, lambda runs: runs.drop(columns=["dataset", "model"]))
    written = draw_figures("synthetic", results_root=root, skipped=[])
    assert "accuracy_vs_sparsity.png" in {p.name for p in written}
    assert "unknown on unknown" in (root / "synthetic" / "figures" / "main_table.tex").read_text()


def test_all_nan_accuracy_is_a_one_line_error_writing_nothing(tmp_path, capsys):
    root = _edit(tmp_path, lambda runs: runs.assign(test_accuracy=np.nan))
    assert main(["synthetic", "--results-root", str(root)]) == 2
    err = capsys.readouterr().err
    assert f"{root / 'synthetic' / 'runs.csv'}: line 2 (run 'dense-0001'): column 'test_accuracy' holds ''" in err
    assert "status 'ok' needs a number" in err and len(err.strip().splitlines()) == 1
    assert not (root / "synthetic" / "figures").exists()


def test_diverged_runs_are_counted_in_the_table_and_kept_out_of_the_means(tmp_path):
    def diverge(runs):
        pick = runs.index[(runs["implementation"] == "masked") & (runs["target_sparsity"] == 0.5)][0]
        runs.loc[pick, ["status", "test_accuracy"]] = ["diverged", 0.1]
        return runs

    root = _edit(tmp_path, diverge)
    ok, _, diverged = load_sweep_with_diverged("synthetic", root)
    assert len(diverged) == 1 and diverged["label"].tolist() == ["masked"]
    table = main_table(ok, diverged).set_index(["implementation", "sparsity_pct"])
    assert table.loc[("masked", 50.0), "diverged"] == 1 and table["diverged"].sum() == 1
    clean = ok[(ok["label"] == "masked") & (ok["target"] == 0.5)]["test_accuracy"]
    assert table.loc[("masked", 50.0), "accuracy_pct_mean"] == pytest.approx(clean.mean() * 100)
    draw_figures("synthetic", results_root=root)
    assert "Diverged" in (root / "synthetic" / "figures" / "main_table.tex").read_text()
