"""General entry freezing, entry_stop_gradients, the slices hook and LazyAdam."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from prune.layers.freezing import CapRowNorm, DropRows, FrozenEntries, LazyAdam, entry_stop_gradients, freeze_entries, transform_slices
from prune.layers.masked import MaskedDense


def bits(a: np.ndarray) -> np.ndarray:
    """Raw float32 bit patterns, so -0.0 and +0.0 differ."""
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


# -- entry_stop_gradients ------------------------------------------------------


@pytest.mark.parametrize("compiled", [False, True])
def test_entry_stop_gradients_value_and_row_gradient(compiled):
    # Square target: a row mask must freeze rows, not columns (numpy broadcasting would pick columns).
    target = tf.Variable(np.arange(9, dtype=np.float32).reshape(3, 3) - 4.0)
    mask = np.array([1.0, 0.0, 1.0])  # 1 = trainable

    def fn():
        with tf.GradientTape() as tape:
            out = entry_stop_gradients(target, mask)
            loss = tf.reduce_sum(out * tf.constant([[1.0, 2.0, 3.0]] * 3))
        return out, tape.gradient(loss, target)

    out, grad = tf.function(fn)() if compiled else fn()
    assert np.array_equal(out.numpy(), target.numpy())
    assert np.array_equal(grad.numpy(), np.array([[1, 2, 3], [0, 0, 0], [1, 2, 3]], np.float32))


def test_entry_stop_gradients_full_mask_and_bool():
    target = tf.Variable([[1.0, -2.0], [3.0, 4.0]])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(entry_stop_gradients(target, np.array([[True, False], [False, True]])))
    assert np.array_equal(tape.gradient(loss, target).numpy(), [[1.0, 0.0], [0.0, 1.0]])


def test_entry_stop_gradients_rejects_non_binary_mask():
    with pytest.raises(ValueError, match=r"only 0 and 1.*\[0\.5\]"):
        entry_stop_gradients(tf.ones((2, 2)), np.array([1.0, 0.5]))


# -- general entry freezing ----------------------------------------------------


def _dense_model(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, name="hidden", activation="tanh"), keras.layers.Dense(2, name="out")])


def _data(n=64, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 6)).astype("float32"), rng.normal(size=(n, 2)).astype("float32")


def _first_units_frozen(shape=(6, 16), units=10):
    frozen = np.zeros(shape, bool)
    frozen[:, :units] = True
    return frozen


def test_freeze_first_units_bitwise_in_fit_and_after_set_change(optimizer_factory):
    x, y = _data()
    model = _dense_model()
    opt = optimizer_factory()
    model.compile(opt, "mse")
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)  # optimizer state now exists for every entry
    kernel = model.get_layer("hidden").kernel
    value = kernel.numpy().copy()
    value[0, 0] = -0.0  # a signed zero must survive too (x + 0.0 would flip it)
    kernel.assign(value)
    freezer = freeze_entries(model, {"hidden/kernel": _first_units_frozen()}, opt)
    model.fit(x, y, batch_size=16, epochs=2, verbose=0)
    after = kernel.numpy()
    assert np.array_equal(bits(after[:, :10]), bits(value[:, :10]))
    assert np.any(value[:, :10] != 0)  # frozen entries are nonzero, unlike pruned ones
    assert not np.array_equal(after[:, 10:], value[:, 10:])  # the rest trains
    assert freezer.frozen_mask(kernel)[:, :10].all()

    # Change the frozen set mid-training: units 0-7 thaw, 10-15 freeze after they have optimizer state.
    new = np.zeros((6, 16), bool)
    new[:, 8:] = True
    freezer.set_frozen(kernel, new, opt)
    snapshot = kernel.numpy().copy()
    model.fit(x, y, batch_size=16, epochs=2, verbose=0)
    final = kernel.numpy()
    assert np.array_equal(bits(final[:, 8:]), bits(snapshot[:, 8:]))
    assert not np.array_equal(final[:, :8], snapshot[:, :8])


def test_freeze_custom_loop_masks_gradients_and_slots(optimizer_factory):
    x, y = _data()
    model = _dense_model()
    opt = optimizer_factory()
    kernel = model.get_layer("hidden").kernel
    freezer = FrozenEntries()
    freezer.freeze(kernel, _first_units_frozen(), opt)

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(xb) - yb) ** 2)
        grads = tape.gradient(loss, model.trainable_variables)
        freezer.apply_gradients(opt, zip(grads, model.trainable_variables))

    before = kernel.numpy().copy()
    for i in range(4):
        step(x[i * 16 : (i + 1) * 16], y[i * 16 : (i + 1) * 16])
    assert np.array_equal(bits(kernel.numpy()[:, :10]), bits(before[:, :10]))
    assert not np.array_equal(kernel.numpy()[:, 10:], before[:, 10:])
    from prune.layers.optimizer_state import slots_for

    slots = slots_for(opt, kernel)
    stateless = isinstance(opt, keras.optimizers.SGD) and opt.momentum == 0
    assert bool(slots) != stateless, "every optimizer but plain SGD keeps state for the kernel"
    for slot in slots:  # gradients were masked, so no state was built for frozen entries
        s = slot.numpy()
        initial = s[0, 0] if type(opt).__name__ == "Adagrad" else 0.0  # Adagrad accumulators start at 0.1
        assert np.all(s[:, :10] == initial)


def test_zero_gradient_alone_does_not_freeze_under_adamw():
    """The trap: recipe 3 without the write-back lets weight decay and old state move frozen entries."""
    x, y = _data()
    model = _dense_model()
    opt = keras.optimizers.AdamW(0.01, weight_decay=0.1)
    kernel = model.get_layer("hidden").kernel
    trainable = ~_first_units_frozen()
    before = kernel.numpy().copy()
    for i in range(2):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x[i * 16 : (i + 1) * 16]) - y[i * 16 : (i + 1) * 16]) ** 2)
        grads = tape.gradient(loss, model.trainable_variables)
        grads = [g * trainable if v is kernel else g for g, v in zip(grads, model.trainable_variables)]
        opt.apply_gradients(zip(grads, model.trainable_variables))
    assert not np.array_equal(kernel.numpy()[:, :10], before[:, :10])


def test_frozen_and_pruned_are_separate_masks():
    keras.utils.set_random_seed(0)
    layer = MaskedDense(8)
    model = keras.Sequential([keras.Input((6,)), layer, keras.layers.Dense(2)])
    opt = keras.optimizers.AdamW(0.01, weight_decay=0.1)
    model.compile(opt, "mse")
    keep = np.ones((6, 8), bool)
    keep[:, 0] = False  # unit 0 pruned
    layer.set_mask("kernel", keep)
    frozen = np.zeros((6, 8), bool)
    frozen[:, 1] = True  # unit 1 frozen at its nonzero value
    FrozenEntries().freeze(layer.kernel, frozen, opt)
    before = layer.kernel.numpy().copy()
    x, y = _data()
    model.fit(x, y, batch_size=16, epochs=2, verbose=0)
    after = layer.kernel.numpy()
    assert np.array_equal(bits(after[:, 0]), bits(np.zeros(6, np.float32)))
    assert np.array_equal(bits(after[:, 1]), bits(before[:, 1])) and np.all(before[:, 1] != 0)
    assert not np.array_equal(after[:, 2:], before[:, 2:])
    assert np.array_equal(layer.get_masks()["kernel"], keep)  # the pruning mask is untouched


def test_freeze_bad_input_names_argument_before_changes():
    model = _dense_model()
    kernel = model.get_layer("hidden").kernel
    with pytest.raises(ValueError, match=r"unknown variable path.*'nope/kernel'.*hidden/kernel"):
        freeze_entries(model, {"nope/kernel": np.zeros((6, 16), bool)})
    with pytest.raises(ValueError, match=r"frozen mask for .*hidden/kernel.*shape \(6, 16\).*\(6, 15\)"):
        freeze_entries(model, {"hidden/kernel": np.zeros((6, 16), bool), "out/kernel": np.zeros((16, 2), bool)} | {"hidden/kernel": np.zeros((6, 15), bool)})
    with pytest.raises(ValueError, match=r"only 0 and 1.*\[2\]"):
        FrozenEntries().freeze(kernel, np.full((6, 16), 2))
    assert kernel.constraint is None  # nothing was installed


def test_row_mask_freezes_rows_of_a_plain_tf_variable():
    var = tf.Variable(np.arange(12, dtype=np.float32).reshape(4, 3))
    freezer = FrozenEntries()
    freezer.freeze(var, np.array([True, False, True, False]))
    opt = keras.optimizers.AdamW(0.1, weight_decay=0.5)
    before = var.numpy().copy()
    for _ in range(3):
        freezer.apply_gradients(opt, [(tf.ones((4, 3)), var)])
    assert np.array_equal(var.numpy()[[0, 2]], before[[0, 2]])
    assert not np.array_equal(var.numpy()[[1, 3]], before[[1, 3]])


# -- row-sparse updates: what Keras 3 does, and the lazy option -----------------

V, D = 37, 3  # V distinct from every other size, to spot a [V, D] densification in the graph


def _sparse_step(opt, table, ids, transform=None):
    @tf.function
    def step(ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.gather(table, ids) ** 2)
        grad = tape.gradient(loss, table)
        pairs = [(grad, table)]
        if transform is not None:
            pairs = transform_slices(pairs, transform)
        opt.apply_gradients(pairs)
        return pairs[0][0]

    return step


def _densifies(step, ids) -> bool:
    graph = step.get_concrete_function(tf.TensorSpec(ids.shape, tf.int32)).graph
    return any(op.type == "UnsortedSegmentSum" and tuple(op.outputs[0].shape) == (V, D) for op in graph.get_operations())


def _table(seed=0):
    return tf.Variable(np.random.default_rng(seed).normal(size=(V, D)).astype("float32"))


def test_keras_adam_densifies_and_moves_absent_rows():
    table = _table()
    opt = keras.optimizers.Adam(0.1)
    step = _sparse_step(opt, table, None)
    step(tf.constant([0, 1, 2]))  # moments now nonzero for rows 0-2
    assert _densifies(step, tf.constant([5]))
    before = table.numpy().copy()
    step(tf.constant([5]))
    changed = np.flatnonzero((table.numpy() != before).any(axis=1))
    assert set(changed) == {0, 1, 2, 5}  # rows 0-2 were not in the batch but moved


def test_lazy_adam_updates_only_rows_in_batch():
    table = _table()
    opt = LazyAdam(0.1)
    step = _sparse_step(opt, table, None)
    grad = step(tf.constant([0, 1, 2, 2]))
    assert isinstance(grad, tf.IndexedSlices)
    assert not _densifies(step, tf.constant([5]))
    before = table.numpy().copy()
    m_before = [s.numpy().copy() for s in (opt._momentums[0], opt._velocities[0])]
    step(tf.constant([5, 5]))
    changed = np.flatnonzero((table.numpy() != before).any(axis=1))
    assert list(changed) == [5]
    for slot, old in zip((opt._momentums[0], opt._velocities[0]), m_before):
        moved = np.flatnonzero((slot.numpy() != old).any(axis=1))
        assert list(moved) == [5]


def test_sgd_updates_only_rows_in_batch_without_densifying():
    table = _table()
    step = _sparse_step(keras.optimizers.SGD(0.1), table, None)
    assert not _densifies(step, tf.constant([4, 7]))
    before = table.numpy().copy()
    step(tf.constant([4, 7, 7]))
    assert list(np.flatnonzero((table.numpy() != before).any(axis=1))) == [4, 7]


@pytest.mark.parametrize("weight_decay", [None, 0.05])
def test_lazy_adam_matches_adam_when_every_row_is_in_the_batch(weight_decay):
    ids = tf.constant(np.arange(V)[::-1].copy())
    tables, opts = [_table(), _table()], [keras.optimizers.Adam(0.05, weight_decay=weight_decay), LazyAdam(0.05, weight_decay=weight_decay)]
    steps = [_sparse_step(o, t, None) for o, t in zip(opts, tables)]
    for _ in range(5):
        for s in steps:
            s(ids)
    np.testing.assert_allclose(tables[1].numpy(), tables[0].numpy(), rtol=1e-6, atol=1e-7)
    assert not np.array_equal(tables[0].numpy(), _table().numpy())


def test_lazy_adam_dense_gradient_equals_adamw():
    a, b = tf.Variable([[1.0, -2.0]]), tf.Variable([[1.0, -2.0]])
    oa, ob = keras.optimizers.AdamW(0.1, weight_decay=0.2), LazyAdam(0.1, weight_decay=0.2)
    for _ in range(3):
        oa.apply_gradients([(tf.constant([[0.3, 0.4]]), a)])
        ob.apply_gradients([(tf.constant([[0.3, 0.4]]), b)])
    np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-6)


def test_slices_hook_caps_rows_and_drops_indices():
    table = _table()
    step = _sparse_step(keras.optimizers.SGD(1.0), table, None, transform=CapRowNorm(0.5))
    before = table.numpy().copy()
    grad = step(tf.constant([1, 3]))
    assert isinstance(grad, tf.IndexedSlices)
    np.testing.assert_allclose(np.linalg.norm(before - table.numpy(), axis=1)[[1, 3]], 0.5, rtol=1e-5)

    table2 = _table()
    step2 = _sparse_step(keras.optimizers.SGD(1.0), table2, None, transform=DropRows([3]))
    before2 = table2.numpy().copy()
    step2(tf.constant([1, 3, 3]))
    assert list(np.flatnonzero((table2.numpy() != before2).any(axis=1))) == [1]


def test_lazy_adam_slices_transform_and_serialization():
    opt = LazyAdam(0.1, weight_decay=0.01, slices_transform=DropRows([2]))
    table = _table()
    before = table.numpy().copy()
    _sparse_step(opt, table, None)(tf.constant([1, 2]))
    assert list(np.flatnonzero((table.numpy() != before).any(axis=1))) == [1]
    clone = keras.optimizers.deserialize(keras.optimizers.serialize(opt))
    assert isinstance(clone, LazyAdam) and isinstance(clone.slices_transform, DropRows)
    assert clone.slices_transform.rows == [2] and clone.weight_decay == 0.01


def test_slices_transform_arguments_are_validated():
    with pytest.raises(ValueError, match=r"max_norm.*-1"):
        CapRowNorm(-1)
    with pytest.raises(ValueError, match=r"rows.*-3"):
        DropRows([1, -3])
    with pytest.raises(ValueError, match=r"slices_transform.*3"):
        LazyAdam(slices_transform=3)
