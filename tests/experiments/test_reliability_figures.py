"""figures on tables that lack optional or needed columns, hold only NaN accuracies, or hold diverged runs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from experiments.figures import draw_figures, main, main_table, load_sweep_with_diverged
from tests.experiments.test_figures import write_synthetic


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


def test_table_without_test_accuracy_names_the_file_and_column_writing_nothing(tmp_path, capsys):
    """The header check named neither (two identical 6-name prefixes: 'has columns [...]..., expected [...]...')."""
    root = _edit(tmp_path, lambda runs: runs.drop(columns=["test_accuracy"]))
    runs = root / "synthetic" / "runs.csv"
    assert main(["synthetic", "--results-root", str(root)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {runs} lacks column 'test_accuracy', and 58 of its 58 rows have no result.json")
    assert "expected" not in err and len(err.strip().splitlines()) == 1
    assert not (root / "synthetic" / "figures").exists()
    # a hand-made table (figures' columns only, plus one of its own) lacking two of them
    pd.read_csv(runs)[["run_id", "implementation", "matmul", "seed", "status"]].assign(notes="x").to_csv(runs, index=False)
    assert main(["synthetic", "--results-root", str(root)]) == 2
    assert capsys.readouterr().err.startswith(f"error: {runs} lacks columns ['target_sparsity', 'test_accuracy'], and 58 of")


def test_table_without_test_accuracy_is_restored_from_result_files_drawing_the_same_figures(tmp_path, capsys):
    root = write_synthetic(tmp_path / "results", bench=False)
    folder = root / "synthetic"
    runs = pd.read_csv(folder / "runs.csv", dtype=str, keep_default_na=False)
    points = pd.read_csv(folder / "curves.csv", dtype=str, keep_default_na=False)
    for record in runs.to_dict("records"):  # each run's own record, as the runner writes it
        run_dir = folder / "runs" / record["run_id"]
        run_dir.mkdir(parents=True)
        mine = points[points["run_id"] == record["run_id"]].to_dict("records")
        (run_dir / "result.json").write_text(json.dumps({"row": record, "curves": mine}))
    assert main(["synthetic", "--results-root", str(root), "--out", str(tmp_path / "whole")]) == 0
    runs.drop(columns=["test_accuracy"]).to_csv(folder / "runs.csv", index=False)
    lacking = (folder / "runs.csv").read_bytes()
    capsys.readouterr()
    assert main(["synthetic", "--results-root", str(root), "--out", str(tmp_path / "restored")]) == 0
    assert capsys.readouterr().err.splitlines()[0] == (
        f"note: {folder / 'runs.csv'} lacked column 'test_accuracy': restored for its 58 rows from their "
        "runs/<run_id>/result.json (in memory; `run` rewrites the file)"
    )
    files = sorted(p.name for p in (tmp_path / "whole").iterdir())
    assert files == sorted(p.name for p in (tmp_path / "restored").iterdir()) and "main_table.tex" in files
    for name in files:
        assert (tmp_path / "whole" / name).read_bytes() == (tmp_path / "restored" / name).read_bytes(), name
    assert (folder / "runs.csv").read_bytes() == lacking  # figures writes no table
