"""The Fashion-MNIST study's parts: intervals and paired tests (exact values), the Debian data files, the
validation split, the dense output layer for every method, and RigL's gradient from the batch being trained."""

from __future__ import annotations

import gzip
import math
import types
from pathlib import Path

import keras
import numpy as np
import pandas as pd
import pytest

from experiments import data as data_mod
from experiments.config import ConfigError, DatasetConfig, ImplementationConfig, MethodConfig, ModelConfig, RunConfig
from experiments.stats import holm, mean_ci, paired, paired_table, welch

# -- intervals: exact values on tiny inputs ------------------------------------------------------------------


def test_mean_ci_is_the_student_t_interval():
    ci = mean_ci([1.0, 2.0, 3.0])
    # sd 1, se 1/sqrt(3), t(0.975, 2 dof) = 4.302652729...
    assert ci.mean == 2.0 and ci.n == 3
    assert ci.half_width == pytest.approx(4.302652729749462 / math.sqrt(3), rel=1e-12)
    assert ci.excludes(-0.5) and not ci.excludes(0.0)
    one = mean_ci([0.7])
    assert one.mean == 0.7 and math.isnan(one.low) and not one.excludes(0.0)
    with pytest.raises(ValueError, match="values must be finite.*nan"):
        mean_ci([1.0, float("nan")])
    with pytest.raises(ValueError, match="confidence must be in \\(0, 1\\), got 1.5"):
        mean_ci([1.0, 2.0], confidence=1.5)


def test_paired_differences_pair_by_seed_and_count_wins_and_ties():
    a = pd.Series([0.90, 0.80, 0.85, 0.70], index=[0, 1, 2, 9])  # seed 9 has no partner
    b = pd.Series([0.88, 0.80, 0.80], index=[2, 1, 0])
    r = paired(a, b)
    # differences by seed: 0: 0.90-0.80=0.10, 1: 0, 2: 0.85-0.88=-0.03
    assert r.n == 3 and r.wins == 1 and r.ties == 1
    assert r.mean == pytest.approx((0.10 + 0.0 - 0.03) / 3, abs=1e-15)
    assert 0.0 < r.p_value < 1.0 and not r.excludes(0.0)
    assert paired(pd.Series([1.0, 1.0]), pd.Series([1.0, 1.0])).p_value == 1.0
    with pytest.raises(ValueError, match="share no index"):
        paired(pd.Series([1.0], index=[0]), pd.Series([1.0], index=[1]))


def test_paired_table_one_row_per_sparsity():
    runs = pd.DataFrame(
        {"method": ["rigl", "set"] * 4, "seed": [0, 0, 1, 1] * 2, "target_sparsity": [0.9] * 4 + [0.95] * 4,
         "test_accuracy": [0.90, 0.89, 0.91, 0.89, 0.80, 0.81, 0.82, 0.80]}
    )
    t = paired_table(runs, "method", "rigl", "set")
    assert list(t["target_sparsity"]) == [0.9, 0.95]
    assert t["diff"].tolist() == pytest.approx([0.015, 0.005], abs=1e-12)
    assert t["wins"].tolist() == [2, 1]


def test_welch_matches_its_formula_and_scipy():
    from scipy import stats

    a, b = [0.90, 0.91, 0.93], [0.88, 0.89, 0.885, 0.87]
    r = welch(a, b)
    va, vb = np.var(a, ddof=1) / 3, np.var(b, ddof=1) / 4
    dof = (va + vb) ** 2 / (va**2 / 2 + vb**2 / 3)
    assert r.mean == pytest.approx(np.mean(a) - np.mean(b), abs=1e-15)
    assert r.half_width == pytest.approx(stats.t.ppf(0.975, dof) * math.sqrt(va + vb), rel=1e-12)
    assert r.p_value == pytest.approx(stats.ttest_ind(a, b, equal_var=False).pvalue, rel=1e-12)
    assert r.excludes(0.0)
    with pytest.raises(ValueError, match="at least 2 values on each side, got 1 and 4"):
        welch([0.9], b)


def test_holm_adjusts_step_down_in_the_given_order():
    # sorted: 0.005 x 4 = 0.02, 0.01 x 3 = 0.03, 0.03 x 2 = 0.06, 0.04 x 1 = 0.04 -> 0.06 (monotone)
    np.testing.assert_allclose(holm([0.01, 0.04, 0.03, 0.005]), [0.03, 0.06, 0.06, 0.02], rtol=0, atol=1e-15)
    np.testing.assert_array_equal(holm([0.6, 0.5]), [1.0, 1.0])  # capped at 1
    assert holm([0.02]).tolist() == [0.02]  # one test: unchanged
    for bad, shown in (([0.1, float("nan")], "nan"), ([1.5], "1.5"), ([-0.1], "-0.1")):
        with pytest.raises(ValueError, match=rf"p_values must each be in \[0, 1\], got \[{shown}\]"):
            holm(bad)
    with pytest.raises(ValueError, match="at least one p-value"):
        holm([])


# -- data -------------------------------------------------------------------------------------------------


def _idx(path: Path, array: np.ndarray, magic: int) -> None:
    header = magic.to_bytes(4, "big") + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    with gzip.open(path, "wb") as fh:
        fh.write(header + array.astype(np.uint8).tobytes())


def test_fashion_mnist_is_found_where_debian_installs_it(tmp_path, monkeypatch):
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "empty_keras_home"))
    system = tmp_path / "usr-share-datasets"
    folder = system / "fashion-mnist"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    x_tr, x_te = rng.integers(0, 256, (5, 28, 28)), rng.integers(0, 256, (3, 28, 28))
    _idx(folder / "train-images-idx3-ubyte.gz", x_tr, 2051)
    _idx(folder / "t10k-images-idx3-ubyte.gz", x_te, 2051)
    _idx(folder / "train-labels-idx1-ubyte.gz", np.array([0, 1, 2, 3, 4]), 2049)
    _idx(folder / "t10k-labels-idx1-ubyte.gz", np.array([9, 8, 7]), 2049)
    monkeypatch.setattr(data_mod, "SYSTEM_DATA_DIR", system)
    data_mod.load.cache_clear()
    try:
        d = data_mod.load(DatasetConfig("fashion_mnist", validation=2))
    finally:
        data_mod.load.cache_clear()
    assert d.x_train.shape == (3, 28, 28, 1) and d.x_val.shape == (2, 28, 28, 1) and d.x_test.shape == (3, 28, 28, 1)
    np.testing.assert_array_equal(d.y_test, [9, 8, 7])
    # the split is a partition of the 5 training images, exact in value
    both = np.concatenate([d.x_train, d.x_val])[..., 0]
    got = sorted(map(bytes, (both * 255).round().astype(np.uint8)))
    assert got == sorted(map(bytes, x_tr.astype(np.uint8)))
    assert sorted(np.concatenate([d.y_train, d.y_val]).tolist()) == [0, 1, 2, 3, 4]


def test_missing_fashion_mnist_names_the_debian_package(tmp_path, monkeypatch):
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "empty_keras_home"))
    monkeypatch.setattr(data_mod, "SYSTEM_DATA_DIR", tmp_path / "nothing")
    with pytest.raises(data_mod.DataUnavailable, match="apt-get install dataset-fashion-mnist"):
        data_mod.check_available(DatasetConfig("fashion_mnist"))


def test_validation_split_is_held_out_of_training_and_fixed_by_split_seed():
    data_mod.load.cache_clear()
    plain = data_mod.load(DatasetConfig("digits"))
    held = data_mod.load(DatasetConfig("digits", validation=100))
    again = data_mod.load(DatasetConfig("digits", validation=100, split_seed=0))
    assert plain.x_val is None and held.x_val.shape[0] == 100
    assert held.x_train.shape[0] == plain.x_train.shape[0] - 100
    np.testing.assert_array_equal(held.x_test, plain.x_test)  # the test set is untouched
    rows = {bytes(r) for r in plain.x_train.reshape(len(plain.x_train), -1)}
    split = [bytes(r) for r in np.concatenate([held.x_train, held.x_val]).reshape(len(plain.x_train), -1)]
    assert sorted(split) == sorted(bytes(r) for r in plain.x_train.reshape(len(plain.x_train), -1)) and len(rows) > 0
    np.testing.assert_array_equal(again.x_val, held.x_val)
    with pytest.raises(ConfigError, match="validation.*not below train_limit 50"):
        DatasetConfig("digits", validation=50, train_limit=50)


@pytest.mark.skipif(
    data_mod._find_cache("fashion_mnist") is None,
    reason="Fashion-MNIST is not installed: apt-get install dataset-fashion-mnist (Debian), or Keras's cache",
)
def test_the_real_fashion_mnist_has_its_published_sizes_and_classes():
    d = data_mod.load(DatasetConfig("fashion_mnist", validation=6000))
    assert (len(d.x_train), len(d.x_val), len(d.x_test)) == (54000, 6000, 10000)
    assert np.bincount(d.y_test).tolist() == [1000] * 10
    assert np.bincount(np.concatenate([d.y_train, d.y_val])).tolist() == [6000] * 10
    assert 0.0 <= d.x_train.min() and d.x_train.max() == 1.0


# -- the output layer and RigL's batch ----------------------------------------------------------------------


def _run(method: MethodConfig, output_layer: str = "dense") -> RunConfig:
    from experiments.config import TrainingConfig

    return RunConfig(
        implementation=ImplementationConfig("masked"), dataset=DatasetConfig("digits", validation=100),
        model=ModelConfig("mlp", widths=(24,)), seed=3, training=TrainingConfig(epochs=1, batch_size=32),
        sparsity=0.75, method=method, output_layer=output_layer,
    )


def test_output_layer_dense_keeps_every_output_weight_for_every_method(tmp_path):
    from experiments.axes import RiglParams
    from experiments.implementations import train_keras3

    data_mod.load.cache_clear()
    run = _run(MethodConfig("rigl", RiglParams(update_every=5, gradient_batch="current")))
    out = train_keras3(run, data_mod.load(run.dataset), tmp_path, lambda line: None)
    report = out["report"].set_index("layer")
    assert report.loc["dense_1", "sparsity"] == 0.0 and report.loc["dense_0", "sparsity"] == 0.75
    assert "val_accuracy" in out["final"] and 0.0 < out["final"]["val_accuracy"] <= 1.0
    with pytest.raises(ConfigError, match="output_layer: unknown output_layer 'half' \\(valid: pruned, dense\\)"):
        _run(MethodConfig("static"), output_layer="half")
    with pytest.raises(ConfigError, match="dense runs prune no layer"):
        RunConfig(ImplementationConfig("dense"), DatasetConfig("digits"), ModelConfig("lenet300"), 0, output_layer="dense")


def test_current_batch_hands_the_gradient_the_examples_of_the_step_being_taken():
    from experiments.train import current_batch, train

    n, b = 40, 8
    x = np.arange(n, dtype=np.float32).reshape(n, 1)
    y = np.zeros(n, np.int32)
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(2)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    cursor = current_batch(keras, b)
    seen: list[np.ndarray] = []

    class Probe(keras.callbacks.Callback):  # stands where DynamicSparsity stands: after the cursor
        def on_train_batch_begin(self, batch, logs=None):
            seen.append(cursor()[0][:, 0].copy())

    run = types.SimpleNamespace(seed=5, training=types.SimpleNamespace(epochs=2, batch_size=b))
    data = types.SimpleNamespace(x_train=x, y_train=y, x_test=x[:8], y_test=y[:8])
    train(model, data, run, keras, [cursor, Probe()], lambda line: None)
    rng = np.random.default_rng([5, 99])  # train()'s data order
    expected = [o[i : i + b].astype(np.float32) for o in (rng.permutation(n), rng.permutation(n)) for i in range(0, n, b)]
    assert len(seen) == len(expected) == 10
    for got, want in zip(seen, expected):
        np.testing.assert_array_equal(got, want)


def test_deployed_sparse_form_is_sparse_only_where_pruned_and_computes_the_same_function():
    """benchmarks/deployed_latency times pruned Dense layers as SparseDense, the dense output layer as Dense and
    convolutions as plain Conv2D with their zeros; outputs equal the masked model's."""
    import sys

    import prune
    from prune.layers.sparse import SparseDense

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import deployed_latency

    plain = keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(4, 3, padding="same", name="conv_0"),
        keras.layers.Flatten(name="flatten"),
        keras.layers.Dense(12, activation="relu", name="dense_0"),
        keras.layers.Dense(5, activation="softmax", name="dense_1"),
    ])
    masked = prune.prune_low_magnitude(
        plain, prune.ConstantSparsity(0.75, 0), pruning_policy=prune.KeepDense(["dense_1"]), seed=0
    )
    prune.update_masks(masked, 0)
    deployed = deployed_latency._sparse_deployed(masked, keras)
    kinds = [type(layer).__name__ for layer in deployed.layers]
    assert kinds == ["Conv2D", "Flatten", "SparseDense", "Dense"]
    conv = deployed.layers[0]
    assert float(np.mean(np.asarray(conv.kernel) == 0.0)) == 0.75  # 27 of 36 conv weights are the stored zeros
    assert isinstance(deployed.layers[2], SparseDense) and deployed_latency._kernel(deployed) == "SparseDense auto"
    assert deployed_latency._weights(deployed) == 9 + 768 + 60  # conv 36/4, dense_0 3,072/4, dense_1 all 60
    x = np.random.default_rng(0).standard_normal((3, 8, 8, 1)).astype("float32")
    np.testing.assert_allclose(np.asarray(deployed(x)), np.asarray(masked(x)), rtol=1e-5, atol=1e-6)
    # the LiteRT forms the script times beside it: the same weights, plain layers, the same function
    plain_form = deployed_latency._plain(deployed, "unstructured")
    assert [type(layer).__name__ for layer in plain_form.layers] == ["Conv2D", "Flatten", "Dense", "Dense"]
    for sparsity in (False, True):
        call = deployed_latency._litert(prune.export.to_tflite(plain_form, sparsity=sparsity), x, 1)
        np.testing.assert_allclose(call(), np.asarray(masked(x)), rtol=1e-5, atol=1e-6)
    assert deployed_latency._plain(plain, "dense") is plain  # dense, small dense and shrunk models are plain already


def test_deployed_latency_runs_mobilenet_pointwise_convolutions_as_sparse_conv2d():
    """--study mobilenet deploys every pruned layer sparse (SparseConv2D for the 1x1 convolutions), the kept ones
    plain; its weight count and kernel label see the convolution, and LiteRT runs the same function."""
    import sys

    import prune
    from experiments.implementations import sparse_where_pruned

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import deployed_latency

    assert deployed_latency.SPARSE_CONVOLUTIONS == {"mobilenet": "native"}
    assert deployed_latency.BATCHES["mobilenet"] == (1, 32)
    assert set(deployed_latency.STUDIES["mobilenet"].values()) == {"fmnist_mobilenet_gmp", "fmnist_mobilenet_small_dense"}
    plain = keras.Sequential([
        keras.Input((6, 6, 1)),
        keras.layers.Conv2D(8, 3, padding="same", use_bias=False, name="conv_0"),
        keras.layers.Conv2D(16, 1, use_bias=False, name="conv_1"),
        keras.layers.GlobalAveragePooling2D(name="flatten"),
        keras.layers.Dense(5, activation="softmax", name="dense_0"),
    ])
    masked = prune.prune_low_magnitude(
        plain, prune.ConstantSparsity(0.75, 0), pruning_policy=prune.KeepDense(["conv_0", "dense_0"]), seed=0
    )
    prune.update_masks(masked, 0)
    deployed = sparse_where_pruned(masked, "auto")  # "native" in the study; auto runs under PRUNE_NATIVE=0 too
    assert [type(layer).__name__ for layer in deployed.layers] == ["Conv2D", "SparseConv2D", "GlobalAveragePooling2D",
                                                                   "Dense"]
    assert deployed_latency._kernel(deployed) == "SparseConv2D auto"
    assert deployed_latency._weights(deployed) == 72 + 32 + 80  # conv_0 all 72, conv_1 128 / 4, dense_0 all 80
    x = np.random.default_rng(0).standard_normal((3, 6, 6, 1)).astype("float32")
    np.testing.assert_allclose(np.asarray(deployed(x)), np.asarray(masked(x)), rtol=1e-5, atol=1e-6)
    plain_form = deployed_latency._plain(deployed, "unstructured")
    assert [type(layer).__name__ for layer in plain_form.layers] == ["Conv2D", "Conv2D", "GlobalAveragePooling2D", "Dense"]
    call = deployed_latency._litert(prune.export.to_tflite(plain_form, sparsity=True), x, 1)
    np.testing.assert_allclose(call(), np.asarray(masked(x)), rtol=1e-5, atol=1e-6)


def test_deployed_latency_markdown_gives_each_runtime_its_spread_and_the_ratio_to_litert():
    import sys

    import pandas as pd

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import deployed_latency

    row = dict(family="unstructured", target_sparsity=0.9, run_id="masked-x", weights=26520, batch=1,
               latency_ms=0.5, latency_low_ms=0.4, latency_high_ms=0.75, litert_ms=0.02, litert_low_ms=0.019,
               litert_high_ms=0.03, litert_sparse_ms=np.nan, litert_sparse_low_ms=np.nan, litert_sparse_high_ms=np.nan,
               rounds=15, min_ms=20.0, kernel="SparseDense auto", accuracy=0.8812, accuracy_low=0.875,
               accuracy_high=0.8874, seeds=5, intra_op_threads=2, inter_op_threads=1, litert_threads=2,
               cpu_model="cpu", native_vector="avx2")
    text = deployed_latency.markdown(pd.DataFrame([row], columns=deployed_latency.COLUMNS))
    assert text.splitlines()[2] == ("| unstructured | 0.9 | 26520 | 88.12 (87.50-88.74, 5 seeds) | 1 | 0.500 (0.400-0.750) "
                                    "| 0.020 (0.019-0.030) | - | 25.00x |")
