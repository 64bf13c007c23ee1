"""The results tables' crash repair and the per-weight report, in-process and small."""

from __future__ import annotations

import csv

import pytest

import keras
import numpy as np

import prune
from experiments.config import DatasetConfig, ImplementationConfig, ModelConfig, RunConfig, ScheduleConfig
from experiments.models import build, initial_weights, layer_positions
from experiments.store import CURVE_COLUMNS, RUN_COLUMNS, Store, config_columns
from experiments.train import weight_report


def row(run_id: str, status: str = "ok") -> dict:
    run = RunConfig(ImplementationConfig("masked"), DatasetConfig("digits"), ModelConfig("lenet300"), 0, sparsity=0.5,
                    schedule=ScheduleConfig())
    return {**config_columns(run, "s"), "run_id": run_id, "status": status, "test_accuracy": 0.5}


def curves(run_id: str) -> list[dict]:
    return [dict(run_id=run_id, epoch=1, metric="test_accuracy", value=0.5)]


def test_open_drops_a_torn_row_and_orphan_curves(tmp_path):
    store = Store(tmp_path)
    store.open()
    store.add(row("a"), curves("a"))
    store.add(row("b"), curves("b"))
    # A crash: run c's curves are written, its row only half.
    with open(store.curves_path, "a") as fh:
        fh.write("c,1,test_accuracy,0.5\n")
    with open(store.runs_path, "a") as fh:
        fh.write("c,deadbeef,s,mas")
    again = Store(tmp_path)
    again.open()
    assert sorted(again.rows) == ["a", "b"]
    with open(store.runs_path, newline="") as fh:
        assert [r["run_id"] for r in csv.DictReader(fh)] == ["a", "b"]
    with open(store.curves_path, newline="") as fh:
        kept = list(csv.DictReader(fh))
    assert [c["run_id"] for c in kept] == ["a", "b"] and list(kept[0]) == CURVE_COLUMNS
    # Redoing c now appends cleanly; replacing a failed row keeps one row per run.
    again.add(row("c", "failed"), [])
    again.add(row("c"), curves("c"))
    with open(store.runs_path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["run_id"] for r in rows] == ["a", "b", "c"] and rows[-1]["status"] == "ok"
    assert list(rows[0]) == RUN_COLUMNS


def test_weight_report_matches_prune_sparsity_report():
    plain = build(ModelConfig("lenet5"), (8, 8, 1), 10, keras)
    plain.set_weights(initial_weights(plain, 0))
    positions = layer_positions(plain)
    assert positions["conv_0"] == 64.0 and positions["conv_1"] == 16.0 and positions["dense_0"] == 1.0
    masked = prune.prune_low_magnitude(plain, prune.ConstantSparsity(0.75, 0))
    prune.update_masks(masked, 0)
    expected = prune.sparsity_report(masked).sort_values("layer").reset_index(drop=True)
    stripped = prune.strip_pruning(masked)
    ours = weight_report(
        [(lyr.name, "kernel", lyr.kernel.numpy(), positions[lyr.name], "pruned") for lyr in stripped.layers
         if hasattr(lyr, "kernel")]
    ).sort_values("layer").reset_index(drop=True)
    assert list(ours.columns) == list(expected.columns)
    for col in ("layer", "nnz", "size", "dense_flops", "nonzero_flops", "dense_bytes"):
        assert list(ours[col]) == list(expected[col]), col
    assert np.allclose(ours["sparsity"], 0.75, atol=0.01)


def test_cnn_is_lenet5_with_the_dense_widths_given():
    """``cnn`` (the small-dense baseline of a conv study) keeps lenet5's convolutions and narrows its Dense layers."""
    lenet5 = build(ModelConfig("lenet5"), (28, 28, 1), 10, keras)
    same = build(ModelConfig("cnn", (120, 84)), (28, 28, 1), 10, keras)
    narrow = build(ModelConfig("cnn", (11, 8)), (28, 28, 1), 10, keras)
    shapes = lambda m: [tuple(w.shape) for w in m.get_weights()]  # noqa: E731
    assert shapes(same) == shapes(lenet5)
    assert shapes(narrow)[:4] == shapes(lenet5)[:4]  # the two convolutions
    assert shapes(narrow)[4::2] == [(784, 11), (11, 8), (8, 10)]
    assert ModelConfig("cnn", (11, 8)).label == "cnn-11-8"
    with pytest.raises(ValueError, match="widths"):
        ModelConfig("cnn")


def test_layer_sparsity_is_a_tidy_long_table_beside_runs_csv_and_rebuilt_when_damaged(tmp_path):
    """layer_sparsity.csv has one row per run and weight (not JSON in a cell); it is derived, so open() rebuilds it."""
    from experiments.store import LAYER_COLUMNS, layer_rows

    store = Store(tmp_path)
    store.open()
    store.add({**row("a"), "layer_sparsity": {"fc2/kernel": 0.5, "fc1/kernel": 0.25}}, curves("a"))
    store.add({**row("b", "failed")}, [])
    store.add({**row("c"), "layer_sparsity": {"fc1/kernel": 0.75}}, curves("c"))
    want = [["a", "fc1", "kernel", "0.25"], ["a", "fc2", "kernel", "0.5"], ["c", "fc1", "kernel", "0.75"]]

    def table():
        with open(store.layers_path, newline="") as fh:
            rows = list(csv.reader(fh))
        return rows[0], rows[1:]

    assert table() == (LAYER_COLUMNS, want)
    store.layers_path.write_text("garbage\n")  # damaged or stale: the next open rebuilds it from runs.csv
    Store(tmp_path).open()
    assert table() == (LAYER_COLUMNS, want)
    again = Store(tmp_path)
    again.open()
    again.remove(["a"])
    assert table() == (LAYER_COLUMNS, want[2:])
    with pytest.raises(ValueError, match=r"run 'x': layer_sparsity 'abc' is not an object of numbers"):
        layer_rows([{"run_id": "x", "layer_sparsity": "abc"}])


def test_mobilenet_is_depthwise_separable_blocks_scaled_by_alpha():
    from experiments.models import MOBILENET_BLOCKS

    for alpha, stem in ((1.0, 32), (0.5, 16), (0.25, 8)):
        model = build(ModelConfig("mobilenet", alpha=alpha), (28, 28, 1), 10, keras)
        assert model.get_layer("conv_0").kernel.shape == (3, 3, 1, stem)
        c = stem
        for i, (stride, filters) in enumerate(MOBILENET_BLOCKS, start=1):
            width = max(8, round(alpha * filters))
            dw, pw = model.get_layer(f"dw_{i}"), model.get_layer(f"conv_{i}")
            assert type(dw) is keras.layers.DepthwiseConv2D and dw.kernel.shape == (3, 3, c, 1) and dw.strides == (stride, stride)
            assert pw.kernel.shape == (1, 1, c, width) and pw.bias is None
            c = width
        assert model.get_layer("conv_5").output.shape == (None, 7, 7, c)  # 28 -> 28 -> 14 -> 14 -> 7 -> 7
        assert tuple(model(np.zeros((2, 28, 28, 1), "float32")).shape) == (2, 10)
    weights = initial_weights(model, 0)
    by_name = {"/".join(v.path.split("/")[-2:]): w for v, w in zip(model.weights, weights)}
    assert (by_name["bn_0/gamma"] == 1).all() and (by_name["bn_0/moving_variance"] == 1).all()
    assert (by_name["bn_0/beta"] == 0).all() and (by_name["bn_0/moving_mean"] == 0).all()


def test_mobilenet_runs_keep_the_first_and_depthwise_convolutions_dense_and_run_pointwise_ones_sparse(tmp_path):
    from experiments.config import TrainingConfig
    from experiments.data import load
    from experiments.implementations import sparse_model, train_keras3
    from experiments.models import seeded_model
    from prune.layers.sparse_conv import SparseConv2D

    def run(impl):
        return RunConfig(ImplementationConfig(impl), DatasetConfig("digits"), ModelConfig("mobilenet", alpha=0.25), 0,
                         training=TrainingConfig(epochs=2, batch_size=64, learning_rate=0.003), sparsity=0.75,
                         schedule=ScheduleConfig("one_shot", begin=0.0))

    data = load(run("masked").dataset)
    plain, _ = seeded_model(run("sparse_tensor"), data, keras)
    sparse = sparse_model(run("sparse_tensor"), data, plain, 10)
    kinds = {layer.name: type(layer) for layer in sparse.layers}
    assert kinds["conv_0"] is keras.layers.Conv2D and kinds["dw_1"] is keras.layers.DepthwiseConv2D
    assert all(kinds[f"conv_{i}"] is SparseConv2D for i in range(1, 6))
    for impl in ("masked", "sparse_tensor"):
        (tmp_path / impl).mkdir()
        out = train_keras3(run(impl), data, tmp_path / impl, lambda line: None)
        zeros = {name: float(np.mean(k == 0.0)) for name, k in out["kernels"].items()}
        assert zeros["conv_0"] == 0.0 and all(zeros[f"dw_{i}"] == 0.0 for i in range(1, 6)), zeros
        for name in [f"conv_{i}" for i in range(1, 6)] + ["dense_0"]:
            assert abs(zeros[name] - 0.75) < 0.01, (impl, name, zeros[name])
        assert out["final"]["train_accuracy"] > 0.3, out["final"]  # it learns (chance is 0.1)
