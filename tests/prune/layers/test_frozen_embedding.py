"""PartiallyFrozenEmbedding: exact frozen rows, agreement of the methods, sparsity, saving, bad input."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from prune.layers.frozen import METHODS, PartiallyFrozenEmbedding
from prune.layers.optimizer_state import slots_for

V, D, T = 23, 4, 5


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def _pretrained(seed=0):
    rng = np.random.default_rng(seed)
    pre = rng.normal(size=(V, D)).astype("float32")
    frozen = np.zeros(V, bool)
    frozen[rng.permutation(V)[:14]] = True
    row = int(np.flatnonzero(frozen)[0])
    pre[row, 0] = -0.0  # signed zero in a frozen row
    return pre, frozen


def _data(n=64, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, V, size=(n, T)).astype("int32")
    y = (x % 3 == 0).sum(axis=1).astype("float32") / T
    return x, y


def _model(method, pre, frozen, seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((T,), dtype="int32"),
            PartiallyFrozenEmbedding(pre, frozen, method=method, name="emb"),
            keras.layers.GlobalAveragePooling1D(),
            keras.layers.Dense(1, name="head"),
        ]
    )


@pytest.mark.parametrize("method", METHODS)
def test_frozen_rows_bitwise_under_every_optimizer_and_mid_training_change(method, optimizer_factory):
    pre, frozen = _pretrained()
    x, y = _data()
    model = _model(method, pre, frozen)
    opt = optimizer_factory()
    model.compile(opt, "mse")
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
    layer = model.get_layer("emb")
    after = layer.get_embeddings()
    assert np.array_equal(bits(after[frozen]), bits(pre[frozen]))
    assert not np.array_equal(after[~frozen], pre[~frozen])

    # Swap two rows between the parts after optimizer state exists (same count, so split works too).
    new = frozen.copy()
    thaw, freeze = int(np.flatnonzero(frozen)[0]), int(np.flatnonzero(~frozen)[0])
    new[thaw], new[freeze] = False, True
    layer.set_frozen(new, opt)
    snapshot = layer.get_embeddings()
    model.fit(x, y, batch_size=16, epochs=2, verbose=0, shuffle=False)
    final = layer.get_embeddings()
    assert np.array_equal(bits(final[new]), bits(snapshot[new]))
    assert not np.array_equal(final[thaw], snapshot[thaw])
    assert np.array_equal(layer.get_frozen(), new)


def _custom_loop(method, opt, steps=6, seed=0):
    pre, frozen = _pretrained()
    x, y = _data()
    model = _model(method, pre, frozen, seed=seed)
    layer = model.get_layer("emb")

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(xb)[:, 0] - yb) ** 2)
        grads = tape.gradient(loss, model.trainable_variables)
        pairs = layer.mask_gradients(zip(grads, model.trainable_variables))
        opt.apply_gradients(pairs)
        return pairs[0][0]

    grad = None
    for i in range(steps):
        j = i % 4
        grad = step(x[j * 16 : (j + 1) * 16], y[j * 16 : (j + 1) * 16])
    return layer, frozen, pre, grad


@pytest.mark.parametrize("make_opt", [lambda: keras.optimizers.SGD(0.1), lambda: keras.optimizers.Adam(0.02)], ids=["sgd", "adam"])
def test_three_methods_agree_on_trainable_rows(make_opt):
    results = {m: _custom_loop(m, make_opt()) for m in METHODS}
    ref_layer, frozen, pre, _ = results["stop_gradient"]
    ref = ref_layer.get_embeddings()
    assert not np.array_equal(ref[~frozen], pre[~frozen])
    for method in ("split", "gradient_mask"):
        emb = results[method][0].get_embeddings()
        np.testing.assert_allclose(emb[~frozen], ref[~frozen], rtol=1e-6, atol=1e-7)
        assert np.array_equal(bits(emb[frozen]), bits(pre[frozen]))


@pytest.mark.parametrize("method", METHODS)
def test_gradient_stays_indexed_slices_and_sgd_moves_only_looked_up_rows(method):
    pre, frozen = _pretrained()
    layer = PartiallyFrozenEmbedding(pre, frozen, method=method)
    ids = tf.constant([[int(np.flatnonzero(~frozen)[0]), int(np.flatnonzero(~frozen)[1]), int(np.flatnonzero(frozen)[0])]])
    opt = keras.optimizers.SGD(0.5)

    @tf.function
    def step(ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(ids) ** 2)
        var = layer.trainable_variable
        pairs = layer.mask_gradients([(tape.gradient(loss, var), var)])
        opt.apply_gradients(pairs)
        return pairs[0][0]

    before = layer.get_embeddings()
    grad = step(ids)
    assert isinstance(grad, tf.IndexedSlices)
    graph = step.get_concrete_function(tf.TensorSpec(ids.shape, tf.int32)).graph
    shape = tuple(layer.trainable_variable.shape)
    assert not any(op.type == "UnsortedSegmentSum" and tuple(op.outputs[0].shape) == shape for op in graph.get_operations())
    changed = np.flatnonzero((layer.get_embeddings() != before).any(axis=1))
    assert sorted(changed) == sorted(ids.numpy()[0, :2].tolist())


def _optimizer_bytes(opt, layer):
    return sum(int(np.prod(s.shape)) * 4 for s in slots_for(opt, layer.trainable_variable))


def test_split_allocates_optimizer_state_only_for_trainable_rows():
    sizes = {}
    for method in METHODS:
        pre, frozen = _pretrained()
        layer = PartiallyFrozenEmbedding(pre, frozen, method=method)
        opt = keras.optimizers.Adam()
        opt.build([layer.trainable_variable])
        sizes[method] = _optimizer_bytes(opt, layer)
    n_train = int((~frozen).sum())
    assert sizes["split"] == 2 * n_train * D * 4  # Adam: m and v, trainable rows only
    assert sizes["stop_gradient"] == sizes["gradient_mask"] == 2 * V * D * 4


@pytest.mark.parametrize("method", METHODS)
def test_save_and_load_keras_with_frozen_mask(method, tmp_path):
    pre, frozen = _pretrained()
    x, y = _data()
    model = _model(method, pre, frozen)
    model.compile(keras.optimizers.Adam(0.02), "mse")
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    layer = model.get_layer("emb")
    new = frozen.copy()
    a, b = int(np.flatnonzero(frozen)[0]), int(np.flatnonzero(~frozen)[0])
    new[a], new[b] = False, True  # a non-trivial layout for split
    layer.set_frozen(new, model.optimizer)
    path = tmp_path / f"{method}.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    other = loaded.get_layer("emb")
    assert isinstance(other, PartiallyFrozenEmbedding) and other.method == method
    assert np.array_equal(other.get_frozen(), new)
    assert np.array_equal(bits(other.get_embeddings()), bits(layer.get_embeddings()))
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), model.predict(x, verbose=0))
    # Training the loaded model keeps the loaded frozen rows fixed.
    loaded.fit(x, y, batch_size=16, epochs=1, verbose=0)
    assert np.array_equal(bits(other.get_embeddings()[new]), bits(layer.get_embeddings()[new]))


def test_split_rejects_changed_frozen_count():
    pre, frozen = _pretrained()
    layer = PartiallyFrozenEmbedding(pre, frozen, method="split")
    more = frozen.copy()
    more[np.flatnonzero(~frozen)[0]] = True
    with pytest.raises(ValueError, match=r"split.*14 frozen rows.*15"):
        layer.set_frozen(more)
    assert np.array_equal(layer.get_frozen(), frozen)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"frozen": np.zeros(V - 1, bool)}, r"frozen must have shape \(23,\).*\(22,\)"),
        ({"frozen": np.zeros(V, np.int64)}, r"frozen must be a boolean array.*int64"),
        ({"pretrained": np.zeros(V)}, r"pretrained must be a 2-D array.*\(23,\)"),
        ({"method": "concat"}, r"unknown method 'concat'.*stop_gradient.*split.*gradient_mask"),
        ({"pretrained": np.array([["a"] * D] * V)}, r"pretrained must be numeric"),
    ],
)
def test_bad_input_raises_before_variables_exist(kwargs, message):
    pre, frozen = _pretrained()
    args = {"pretrained": pre, "frozen": frozen, "method": "split"} | kwargs
    seen = []
    with tf.variable_creator_scope(lambda next_creator, **kw: seen.append(kw.get("name")) or next_creator(**kw)):
        with pytest.raises(ValueError, match=message):
            PartiallyFrozenEmbedding(**args)
        PartiallyFrozenEmbedding(pre, frozen)  # the scope does see variables of a valid layer
    assert seen and all(name is not None for name in seen)
    assert len(seen) == 3  # frozen_mask, embeddings, frozen_reference: none from the rejected call
