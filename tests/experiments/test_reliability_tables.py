"""Issue 24's reproductions: every table read by run, status, figures and the notebooks is checked, repaired
from what restores it (result.json, levels/NN/level.json) or refused naming the file, line and column."""

from __future__ import annotations

import json
import types
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from experiments import figures, tables
from experiments.store import Store
from experiments.summary import summarize
from tests.experiments.test_figures import write_synthetic
from tests.experiments.test_reliability_store import finished, read_csv, row


def _runs(root: Path) -> Path:
    return root / "synthetic" / "runs.csv"


def test_duplicated_tables_give_the_clean_table(tmp_path):
    clean = figures.main_table(figures.load_sweep("synthetic", write_synthetic(tmp_path / "a", bench=False))[0])
    root = write_synthetic(tmp_path / "b", bench=False)
    for name in ("runs.csv", "curves.csv"):  # a bad merge or a copy: every row twice
        path = root / "synthetic" / name
        text = path.read_text()
        path.write_text(text + text.split("\n", 1)[1])
    notes: list[str] = []
    runs, curves = figures.load_sweep("synthetic", root, notes)
    pd.testing.assert_frame_equal(figures.main_table(runs), clean)
    assert len(curves) == len(figures.load_sweep("synthetic", tmp_path / "a")[1])
    assert any("repeats line 2 (run dense-0001); dropped" in n for n in notes)


def test_duplicates_that_differ_without_a_result_are_refused_naming_both_lines(tmp_path):
    root = write_synthetic(tmp_path, bench=False)
    lines = _runs(root).read_text().splitlines()
    _runs(root).write_text("\n".join([*lines, lines[1].replace(",0.2,0.99,", ",0.3,0.99,")]) + "\n")
    with pytest.raises(ValueError, match=rf"{_runs(root)}: lines 2 and {len(lines) + 1} both hold run 'dense-0001'"):
        figures.load_sweep("synthetic", root)


def test_a_damaged_cell_is_restored_from_result_json_and_seeds_counts_the_averaged_rows(tmp_path):
    finished(tmp_path, ["a", "b"])
    path = tmp_path / "runs.csv"
    path.write_text(path.read_text().replace(",ok,,0.5,", ",ok,,abc,", 1))
    store = Store(tmp_path)
    store.open()  # what `run` does first
    assert [r["test_accuracy"] for r in read_csv(path)] == ["0.5", "0.5"]
    assert any("line 2 (run a): test_accuracy='abc' restored from its result.json" in n for n in store.repairs)
    frame = pd.DataFrame(read_csv(path)).assign(seed=[0, 1])
    assert summarize(frame)["seeds"].tolist() == [2]
    # a row whose accuracy is missing is not averaged, so it is not counted either
    assert summarize(frame.assign(test_accuracy=["0.5", ""]))["seeds"].tolist() == [1]


def test_a_damaged_cell_without_result_json_is_refused_naming_file_line_and_column(tmp_path, capsys):
    root = write_synthetic(tmp_path, bench=False)
    runs = pd.read_csv(_runs(root)).astype({"seed": object})
    runs.loc[3, "seed"] = "x1"  # a non-numeric seed
    runs.to_csv(_runs(root), index=False)
    assert figures.main(["synthetic", "--results-root", str(root)]) == 2
    err = capsys.readouterr().err
    assert f"{_runs(root)}: line 5 (run 'masked-0004'): column 'seed' holds 'x1', not an integer" in err
    assert not (root / "synthetic" / "figures").exists()


@pytest.mark.parametrize("content, match", [(b"", r"empty file \(0 bytes\)"), (b"\x89PNG\r\n\x1a\n\x00\x00", "NUL byte at offset 8")])
def test_empty_and_binary_runs_csv_are_named(tmp_path, capsys, content, match):
    root = write_synthetic(tmp_path, bench=False)
    _runs(root).write_bytes(content)
    assert figures.main(["synthetic", "--results-root", str(root)]) == 2
    err = capsys.readouterr().err
    assert str(_runs(root)) in err and pytest.approx(1) == len(err.strip().splitlines())
    with pytest.raises(ValueError, match=match):
        figures.load_sweep("synthetic", root)


def test_figure_without_its_column_is_skipped_with_one_line(tmp_path, capsys):
    root = write_synthetic(tmp_path, bench=False)
    pd.read_csv(_runs(root)).drop(columns=["nonzero_flops"]).to_csv(_runs(root), index=False)
    assert figures.main(["synthetic", "--results-root", str(root)]) == 0
    err = capsys.readouterr().err
    assert "skipped accuracy_vs_flops: runs.csv has no value in column 'nonzero_flops'" in err
    assert not (root / "synthetic" / "figures" / "accuracy_vs_flops.png").exists()


# -- IMP's levels -------------------------------------------------------------------------------------


def _imp_run(root: Path, run_id: str = "masked-imp") -> Path:
    """A finished IMP run (row, levels/NN/level.json, levels.csv), written by hand: two levels."""
    store = Store(root)
    store.open()
    imp_row = {**row(run_id), "method": "imp", "target_sparsity": 0.5}
    store.add(imp_row, [])
    run_dir = root / "runs" / run_id
    run_dir.mkdir(parents=True)
    (run_dir / "result.json").write_text(json.dumps({"row": imp_row, "curves": []}))
    rows = []
    for level, sparsity in enumerate((0.0, 0.5)):
        level_rows = [dict(level=level, variant=v, sparsity=sparsity, remaining=1 - sparsity, test_accuracy=0.9 - level / 10 - i / 100,
                           test_loss=0.3, train_accuracy=0.95, train_loss=0.2, status="ok")
                      for i, v in enumerate(["ticket"] if level == 0 else ["ticket", "reinit", "random"])]
        (run_dir / "levels" / f"{level:02d}").mkdir(parents=True)
        (run_dir / "levels" / f"{level:02d}" / "level.json").write_text(json.dumps({"rows": level_rows, "target_sparsity": sparsity}))
        rows += level_rows
    (run_dir / "levels.csv").write_text(tables.levels_text(rows))
    return run_dir


def test_torn_levels_csv_is_rebuilt_from_the_level_folders(tmp_path):
    run_dir = _imp_run(tmp_path)
    clean = (run_dir / "levels.csv").read_text()
    (run_dir / "levels.csv").write_text(clean[:-30])  # cut the last 30 bytes
    frame = pd.DataFrame([{"run_id": run_dir.name, "method": "imp", "target": 0.5}])
    notes: list[str] = []
    levels, _ = figures.method_tables(frame, tmp_path / "runs", notes)
    pd.testing.assert_frame_equal(levels, pd.read_csv(pd.io.common.StringIO(clean)).assign(run_id=run_dir.name))
    assert notes and "rebuilt from" in notes[0]
    store = Store(tmp_path)
    store.open()  # `run` rewrites it
    assert (run_dir / "levels.csv").read_text() == clean


def test_damaged_levels_nothing_restores_are_named_and_redone_by_run(tmp_path):
    run_dir = _imp_run(tmp_path)
    (run_dir / "levels.csv").write_text("garbage\x01,\n1,2\n")
    (run_dir / "levels" / "01" / "level.json").write_text('{"rows": [')  # half-written
    frame = pd.DataFrame([{"run_id": run_dir.name, "method": "imp", "target": 0.5}])
    with pytest.raises(ValueError, match=rf"{run_dir / 'levels.csv'} has columns \['garbage\\x01', ''\].*; and .*01/level.json: not a complete level record"):
        figures.method_tables(frame, tmp_path / "runs")
    store = Store(tmp_path)
    store.open()
    assert run_dir.name not in store.rows and (run_dir / "result.json.redo").exists()
    assert any("will be redone from its first damaged level" in w for w in store.warnings)


def test_half_written_level_json_is_named_and_the_level_redone(tmp_path):
    from experiments.data import load
    from experiments.imp_runs import train_imp
    from prune.training.imp import ImpParams
    from tests.experiments.test_imp_runs import _run

    run, params = _run(sparsity=0.5, distribution="global"), ImpParams(rate=0.5, controls=())
    data = load(run.dataset)
    train_imp(run, data, tmp_path, lambda line: None, params)
    clean = (tmp_path / "levels.csv").read_bytes()
    level = tmp_path / "levels" / "01" / "level.json"
    level.write_text(level.read_text()[:40])
    lines: list[str] = []
    train_imp(run, data, tmp_path, lines.append, params)
    assert any(f"{level}: not a complete level record (JSONDecodeError" in line for line in lines)
    assert (tmp_path / "levels.csv").read_bytes() == clean


# -- IMP's rewind step, divergence ----------------------------------------------------------------------


def test_rewind_step_past_level_0_is_refused_when_validating(tmp_path, capsys):
    from experiments.__main__ import main

    config = tmp_path / "imp.toml"
    config.write_text(
        'name = "imp"\nimplementations = ["masked"]\nsparsities = [0.5]\nmodels = [{name = "mlp", widths = [8]}]\n'
        'datasets = ["digits"]\nmethods = [{name = "imp", rewind_step = 1000}]\n'
        "[training]\nepochs = 2\nbatch_size = 64\n"
    )
    assert main(["run", str(config), "--dry-run", "--results", str(tmp_path / "results")]) == 2
    err = capsys.readouterr().err
    assert "method.rewind_step: is 1000, past the 46 steps of level-0 training (2 epochs of 1438 examples" in err
    assert not (tmp_path / "results").exists()


class _History:
    def __init__(self, loss: float) -> None:
        self.history = {"loss": [loss], "accuracy": [0.1]}


class _ExplodingModel:
    """A fit whose first batch's loss is 2.3 and whose epochs end at ``losses``, finite throughout."""

    def __init__(self, losses: list[float]) -> None:
        self.losses = list(losses)

    def fit(self, x, y, callbacks, **kw):
        for cb in callbacks:
            cb.on_train_begin()
            cb.on_train_batch_end(0, {"loss": 2.3})
        return _History(self.losses.pop(0))

    def evaluate(self, x, y, **kw):
        return 1.0, 0.1


@pytest.mark.parametrize("final, diverged", [(8e23, True), (23.5, True), (22.9, False)])
def test_finite_exploding_loss_is_diverged(final, diverged):
    from experiments.config import DatasetConfig, ImplementationConfig, ModelConfig, RunConfig, TrainingConfig
    from experiments.train import Diverged, train

    class Callback:
        def on_train_begin(self, logs=None):
            pass

        def on_train_batch_end(self, batch, logs=None):
            pass

    keras = types.SimpleNamespace(callbacks=types.SimpleNamespace(Callback=Callback))
    data = types.SimpleNamespace(x_train=np.zeros((4, 2)), y_train=np.zeros(4), x_test=np.zeros((2, 2)), y_test=np.zeros(2))
    run = RunConfig(ImplementationConfig("dense"), DatasetConfig("digits"), ModelConfig("mlp", (4,)), 0,
                    training=TrainingConfig(epochs=2))
    model = _ExplodingModel([3.0, final])
    if not diverged:
        train(model, data, run, keras, [], lambda line: None)
        return
    with pytest.raises(Diverged, match=r"final train_loss .* is more than 10 x the first batch's loss 2.3") as e:
        train(model, data, run, keras, [], lambda line: None)
    assert e.value.final["train_loss"] == final and len(e.value.curves) == 8
