"""The one pruning engine on real Keras models: every layer kind, scope, criterion and pattern."""

import keras
import numpy as np
import pytest

import prune
from prune.core import distributions, masks
from prune.layers import SparseDense
from tests.helpers import mlp, mlp_data


def _weights(seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(6, 5)).astype("float32"), rng.normal(size=(5, 3)).astype("float32")


def _masked_model(scope, schedule, **kw):
    w1, w2 = _weights()
    model = keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(5, activation="tanh", name="a"), keras.layers.Dense(3, name="b")]
    )
    model.layers[0].kernel.assign(w1)
    model.layers[1].kernel.assign(w2)
    return prune.prune_low_magnitude(model, schedule, scope=scope, **kw)


def _sparse_model(scope, schedule, **kw):
    w1, w2 = _weights()
    return keras.Sequential(
        [
            keras.Input((6,)),
            SparseDense.from_dense(w1, np.ones_like(w1), activation="tanh", name="a", pruning_schedule=schedule, scope=scope, **kw),
            SparseDense.from_dense(w2, np.ones_like(w2), name="b", pruning_schedule=schedule, scope=scope, **kw),
        ]
    )


@pytest.mark.parametrize(
    "scope, pattern", [("global", prune.Unstructured()), ("erk", prune.Unstructured()), ("layer", prune.NByM(1, 3))]
)
def test_masked_and_sparse_models_select_the_same_masks(scope, pattern):
    schedule = prune.OneShot(0.6, 0)
    masked = _masked_model(scope, schedule, pattern=pattern)
    sparse = _sparse_model(scope, schedule, pattern=pattern)
    assert prune.update_masks(masked, 0) == prune.update_masks(sparse, 0) == ["a/kernel", "b/kernel"]
    w1, w2 = _weights()
    if scope == "global":
        expected = masks.global_masks({"a": np.abs(w1), "b": np.abs(w2)}, 0.6)
        assert sum((~k).sum() for k in expected.values()) == round(0.6 * 45)
    elif scope == "erk":
        zeros = distributions.erk_zeros({"a": (6, 5), "b": (5, 3)}, 0.6)
        expected = {"a": masks.topk_mask(np.abs(w1), zeros["a"] / 30), "b": masks.topk_mask(np.abs(w2), zeros["b"] / 15)}
        assert sum(zeros.values()) == round(0.6 * 45)
    else:
        expected = {"a": pattern.select(np.abs(w1)), "b": pattern.select(np.abs(w2))}
    for m_layer, s_layer in zip(masked.layers, sparse.layers):
        np.testing.assert_array_equal(m_layer.get_masks()["kernel"], expected[m_layer.name])
        np.testing.assert_array_equal(s_layer.get_mask(), expected[m_layer.name])
        assert s_layer.nnz == int(expected[m_layer.name].sum())


def test_masked_and_sparse_models_select_the_same_snip_masks():
    schedule = prune.OneShot(0.5, 0)
    masked = _masked_model("global", schedule, criterion="snip")
    sparse = _sparse_model("global", schedule, criterion="snip")
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(8, 6)).astype("float32"), rng.normal(size=(8, 3)).astype("float32")
    mse = keras.losses.MeanSquaredError()
    g_masked = prune.compute_gradients(masked, x, y, loss=mse)
    g_sparse = prune.compute_gradients(sparse, x, y, loss=mse)
    for key in ("a/kernel", "b/kernel"):
        np.testing.assert_allclose(g_sparse[key], g_masked[key], rtol=1e-5, atol=1e-7)
    prune.update_masks(masked, 0, gradients=g_masked)
    prune.update_masks(sparse, 0, gradients=g_masked)  # same gradients: the same selection, bit for bit
    w1, w2 = _weights()
    w64 = {"a": w1.astype(np.float64), "b": w2.astype(np.float64)}
    expected = masks.global_masks({k: np.abs(w64[k] * g_masked[f"{k}/kernel"]) for k in w64}, 0.5)
    for m_layer, s_layer in zip(masked.layers, sparse.layers):
        np.testing.assert_array_equal(m_layer.get_masks()["kernel"], expected[m_layer.name])
        np.testing.assert_array_equal(s_layer.get_mask(), expected[m_layer.name])


def test_nan_weight_is_refused_before_any_change():
    model = _masked_model("layer", prune.OneShot(0.5, 0))
    w = model.layers[1].kernel.numpy()
    w[0, 0] = np.nan
    model.layers[1].kernel.assign(w)
    with pytest.raises(ValueError, match=r"weight 'b/kernel' \(layer 'b'\) has 1 NaN or infinite entries; no mask was changed"):
        prune.update_masks(model, 0)
    assert all(m.all() for layer in model.layers for m in layer.get_masks().values())


def test_groups_must_share_a_pattern():
    w1, w2 = _weights()
    model = keras.Sequential(
        [
            keras.Input((6,)),
            prune.prune_low_magnitude(keras.layers.Dense(5, name="a"), prune.OneShot(0.5, 0), scope="global"),
            prune.prune_low_magnitude(keras.layers.Dense(3, name="b"), prune.OneShot(0.5, 0), scope="global", pattern=prune.Channel()),
        ]
    )
    with pytest.raises(ValueError, match=r"scope='global' must share one pattern"):
        prune.update_masks(model, 0)


def test_snip_uses_the_gradient_of_the_given_batch():
    x, y = mlp_data(16)
    model = prune.prune_low_magnitude(mlp(), prune.OneShot(0.5, 0), criterion="snip")
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.raises(ValueError, match=r"criterion 'snip' needs the gradient of 'fc1/kernel'"):
        prune.update_masks(model, 0)
    grads = prune.compute_gradients(model, x, y)
    before = {layer.name: layer.kernel.numpy() for layer in model.layers}
    prune.update_masks(model, 0, gradients=grads)
    for layer in model.layers:
        scores = np.abs(before[layer.name].astype(np.float64) * grads[f"{layer.name}/kernel"])
        np.testing.assert_array_equal(layer.get_masks()["kernel"], masks.topk_mask(scores, 0.5))
        # and not the magnitude mask (the gradient mattered)
        assert not np.array_equal(layer.get_masks()["kernel"], masks.topk_mask(np.abs(before[layer.name]), 0.5))


def test_callback_computes_gradients_from_gradient_data():
    x, y = mlp_data(32)
    model = prune.prune_low_magnitude(mlp(), prune.PolynomialDecay(0.0, 0.5, 0, 4, frequency=2), criterion="taylor")
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.raises(ValueError, match=r"criteria \['taylor'\] need gradients: pass gradient_data"):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[prune.UpdatePruningStep()])
    model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[prune.UpdatePruningStep(gradient_data=(x[:16], y[:16]))])
    for layer in model.layers:
        mask = layer.get_masks()["kernel"]
        assert (~mask).sum() == round(0.5 * mask.size)
        assert np.all(layer.kernel.numpy()[~mask] == 0)


class _Scale(keras.layers.Layer):
    """A custom layer ported from tfmot: it names its prunable weight, nothing more."""

    def build(self, input_shape):
        self.w = self.add_weight(shape=(input_shape[-1], 4), initializer="glorot_uniform", name="w")
        self.b = self.add_weight(shape=(4,), initializer="ones", name="b")

    def call(self, x):
        return keras.ops.matmul(x, self.w) + self.b

    def get_prunable_weights(self):
        return [self.w]


class _ScaleSubclass(_Scale, prune.PrunableLayer):
    """The same, subclassing prune.PrunableLayer as tfmot's guide subclasses tfmot's."""


def test_custom_layer_with_get_prunable_weights(optimizer_factory):
    _check_custom_layer(_Scale, optimizer_factory)


def test_custom_layer_subclassing_prunable_layer():
    _check_custom_layer(_ScaleSubclass, lambda: keras.optimizers.SGD(0.05, momentum=0.9))
    assert not prune.is_pruned(keras.Sequential([keras.Input((6,)), _ScaleSubclass()]))


def _check_custom_layer(cls, optimizer_factory):
    x, y = mlp_data(32, inputs=6)
    original = keras.Sequential([keras.Input((6,)), cls(name="custom"), keras.layers.Dense(3, name="out")])
    before = original.layers[0].w.numpy().copy()
    model = prune.prune_low_magnitude(original, prune.PolynomialDecay(0.0, 0.75, 2, 6, frequency=2))
    wrapper = model.layers[0]
    assert isinstance(wrapper, prune.PruneLowMagnitude) and wrapper.prunable_weight_names == ("w",)
    model.compile(optimizer_factory(), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[prune.UpdatePruningStep()])
    np.testing.assert_array_equal(original.layers[0].w.numpy(), before)  # shares nothing with the original
    w, mask = wrapper.weight_and_mask("w")
    pruned = mask.numpy() == 0
    assert pruned.sum() == round(0.75 * 24)
    assert np.array_equal(w.numpy()[pruned], np.zeros(pruned.sum())) and not np.signbit(w.numpy()[pruned]).any()
    assert wrapper.layer.b.numpy().ravel().tolist() != [1.0] * 4  # the other weight trained
    stripped = prune.strip_pruning(model)
    assert type(stripped.layers[0]) is cls
    np.testing.assert_allclose(stripped.predict(x, verbose=0), model.predict(x, verbose=0), rtol=1e-6, atol=1e-6)


def test_pattern_is_saved_with_the_model(tmp_path):
    model = prune.prune_low_magnitude(mlp(), prune.OneShot(0.5, 0), block_size=(2, 2), block_pooling_type="MAX")
    prune.update_masks(model, 0)
    path = tmp_path / "m.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    assert loaded.layers[0].pattern == prune.Block((2, 2), "MAX")
    np.testing.assert_array_equal(loaded.layers[0].get_masks()["kernel"], model.layers[0].get_masks()["kernel"])
    units, alive = prune.Block((2, 2)).units(np.zeros((12, 16)), loaded.layers[0].get_masks()["kernel"])
    assert (~alive).sum() == round(0.5 * units.size)
