"""convert(): whole-model round trips dense <-> masked <-> sparse keep structure and outputs."""

import warnings

import numpy as np
import pytest
import tensorflow as tf
import keras

import prune
from prune.deploy.convert import ConversionWarning, convert, unconvertible_layers
from prune.layers.masked import MaskedDense, PrunableLayer
from prune.layers.sparse import SparseDense

N_IN = 12
X = np.random.default_rng(0).standard_normal((6, N_IN)).astype(np.float32)


class Subclassed(keras.Model):
    def __init__(self):
        super().__init__()
        self.hidden = keras.layers.Dense(16, activation="relu")
        self.norm = keras.layers.LayerNormalization()
        self.out = keras.layers.Dense(3)

    def call(self, x):
        return self.out(self.norm(self.hidden(x)))


def sequential():
    return keras.Sequential(
        [keras.Input((N_IN,)), keras.layers.Dense(16, activation="relu"), keras.layers.BatchNormalization(), keras.layers.Dense(3)]
    )


def functional():
    inp = keras.Input((N_IN,))
    h = keras.layers.Dense(16, activation="tanh")(inp)
    skip = keras.layers.Dense(16, use_bias=False)(inp)
    return keras.Model(inp, keras.layers.Dense(2)(keras.layers.Add()([h, skip])))


def subclassed():
    model = Subclassed()
    model(X)
    return model


BUILDERS = {"sequential": sequential, "functional": functional, "subclassed": subclassed}


def _kernel_layers(model):
    return [l for l in prune.core.targets.iter_layers(model) if isinstance(l, (keras.layers.Dense, SparseDense))]


def _masks(model):
    out = []
    for layer in _kernel_layers(model):
        if isinstance(layer, SparseDense):
            out.append(layer.get_mask())
        elif isinstance(layer, PrunableLayer):
            out.append(layer.get_masks()["kernel"])
        else:
            out.append(layer.kernel.numpy() != 0)
    return out


def _pruned(kind):
    """A model of ``kind`` with masks at 70% (every kernel), as a masked model."""
    model = BUILDERS[kind]()
    masked = prune.prune_low_magnitude(model, prune.ConstantSparsity(0.7, 0))
    for layer in prune.prunable_layers(masked):
        weight, _ = layer.weight_and_mask("kernel")
        scores = np.abs(weight.numpy())
        layer.set_mask("kernel", scores >= np.quantile(scores, 0.7))
    return masked


@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_round_trip_keeps_outputs_and_structure(kind):
    masked = _pruned(kind)
    reference = masked(X).numpy()
    ref_masks = _masks(masked)
    assert 0.25 < np.mean(np.concatenate([m.ravel() for m in ref_masks])) < 0.35

    chain = [("sparse", SparseDense), ("dense", keras.layers.Dense), ("sparse", SparseDense), ("masked", MaskedDense), ("dense", keras.layers.Dense), ("masked", MaskedDense)]
    model = masked
    for to, cls in chain:
        model = convert(model, to)
        layers = _kernel_layers(model)
        assert layers and all(type(l) is cls for l in layers), (to, [type(l).__name__ for l in layers])
        np.testing.assert_allclose(model(X).numpy(), reference, rtol=1e-5, atol=1e-6)
        for got, want in zip(_masks(model), ref_masks):
            np.testing.assert_array_equal(got, want)
        if to == "sparse":
            assert [l.nnz for l in layers] == [int(m.sum()) for m in ref_masks]


def test_graph_models_are_cloned_and_subclassed_converted_in_place():
    for kind in ("sequential", "functional"):
        model = BUILDERS[kind]()
        out = convert(model, "sparse")
        assert out is not model and all(type(l) is keras.layers.Dense for l in _kernel_layers(model))
    model = subclassed()
    assert convert(model, "sparse") is model
    assert isinstance(model.hidden, SparseDense) and isinstance(model.out, SparseDense)


def test_unconverted_layers_are_copied_not_shared():
    model = sequential()
    out = convert(model, "sparse")
    assert out.layers[1] is not model.layers[1]
    np.testing.assert_array_equal(out.layers[1].moving_variance.numpy(), model.layers[1].moving_variance.numpy())


def test_unconvertible_layers_are_left_and_reported():
    inp = keras.Input((6, 1))  # Conv1D has no sparse form (Conv2D has: SparseConv2D, tests/prune/layers/test_sparse_conv.py)
    conv = keras.layers.Conv1D(2, 3, name="conv")(inp)
    out = keras.layers.Dense(2, name="head")(keras.layers.Flatten()(conv))
    model = keras.Model(inp, out)
    assert unconvertible_layers(model, "sparse") == ["conv"]
    assert unconvertible_layers(model, "masked") == []
    with pytest.warns(ConversionWarning, match=r"left 1 layer\(s\) unconverted: \['conv'\]"):
        sparse = convert(model, "sparse")
    assert type(sparse.get_layer("conv")) is keras.layers.Conv1D
    assert isinstance(sparse.get_layer("head"), SparseDense)
    x = np.random.default_rng(1).standard_normal((2, 6, 1)).astype(np.float32)
    np.testing.assert_allclose(sparse(x).numpy(), model(x).numpy(), rtol=1e-5, atol=1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        convert(model, "masked")  # every layer converts: no warning


def test_matmul_and_pruning_params_carry_over():
    masked = prune.prune_low_magnitude(sequential(), prune.PolynomialDecay(0.1, 0.8, 0, 50), criterion="random", seed=7)
    sparse = convert(masked, "sparse", matmul="coo")
    layers = _kernel_layers(sparse)
    assert all(l.matmul == "coo" and l.criterion == "random" and l.seed == 7 for l in layers)
    assert layers[0].pruning_schedule == prune.PolynomialDecay(0.1, 0.8, 0, 50)
    back = convert(sparse, "masked")
    assert all(l.pruning_schedule == prune.PolynomialDecay(0.1, 0.8, 0, 50) for l in _kernel_layers(back))


def test_converted_sparse_model_trains():
    sparse = convert(_pruned("functional"), "sparse")
    sparse.compile(keras.optimizers.Adam(0.01), "mse")
    y = np.ones((6, 2), np.float32)
    first = sparse.evaluate(X, y, verbose=0)
    sparse.fit(X, y, epochs=5, verbose=0, callbacks=[prune.UpdatePruningStep()])  # the schedule came along
    assert sparse.evaluate(X, y, verbose=0) < first
    for layer, mask in zip(_kernel_layers(sparse), _masks(sparse)):
        assert layer.nnz == int(mask.sum())  # structure unchanged by training


@pytest.mark.parametrize("to, matmul, match", [("csr", "auto", r"to must be one of .* got 'csr'"), ("sparse", "blas", r"matmul must be one of .* got 'blas'")])
def test_bad_arguments(to, matmul, match):
    model = sequential()
    with pytest.raises(ValueError, match=match):
        convert(model, to, matmul=matmul)


def test_single_layer():
    dense = keras.layers.Dense(4)
    dense.build((None, 3))
    dense.kernel.assign(np.array([[0, 1, 0, 2], [3, 0, 0, 0], [0, 0, 0, 4]], np.float32))
    sparse = convert(dense, "sparse")
    assert isinstance(sparse, SparseDense) and sparse.nnz == 4
    np.testing.assert_array_equal(sparse.values.numpy(), np.float32([1, 2, 3, 4]))
    x = tf.constant([[1.0, 2.0, 3.0]])
    np.testing.assert_array_equal(sparse(x).numpy(), dense(x).numpy())


def test_report_and_step_counter_cover_sparse_layers():
    import prune as _prune

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(5, name="a"), keras.layers.Dense(2, name="b")])
    masked = _prune.prune_low_magnitude(model, _prune.OneShot(0.6, 0))
    _prune.update_masks(masked, 0)
    sparse = _prune.convert(masked, to="sparse")
    report = _prune.sparsity_report(sparse)
    assert list(report.status) == ["sparse", "sparse"]
    assert list(report.nnz) == [12, 4] and list(report["size"]) == [30, 10]
    assert _prune.unsupported_layers(sparse) == []
    x = np.random.default_rng(0).normal(size=(8, 6)).astype("float32")
    sparse.compile("sgd", "mse")
    sparse.fit(x, x[:, :2], batch_size=4, epochs=1, verbose=0, callbacks=[_prune.UpdatePruningStep()])
    assert _prune.get_step(sparse) == 2
