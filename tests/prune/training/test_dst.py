"""Sparse training: the drop/grow arithmetic exactly on tiny arrays, RigL's cosine, static masks,
exact zeros under every optimizer while masks move, determinism, and argument checks."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

import prune
import prune.training.dst  # prune.training.dst.METHODS below
from prune.core.distributions import erk_zeros
from prune.algorithms import cosine_drop_fraction, drop_and_grow, get_algorithm, num_drop, sign_drop_counts
from prune.layers.sparse import SparseDense
from prune.layers.optimizer_state import slots_for
from tests.helpers import masked_train_step, mlp, mlp_data

# The registered algorithms that exchange entries (each weight keeps its live count): SET, RigL, MEST. GraNet,
# whose schedule shrinks the masks, has its own tests (tests/prune/algorithms/test_algorithms.py).
EXCHANGES = tuple(m for m in prune.training.dst.METHODS if get_algorithm(m).keeps_live)

# -- the arithmetic -----------------------------------------------------------------------

W = np.array([0.1, -0.9, 0.0, 0.5, -0.2, 0.0])
KEEP = np.array([True, True, False, True, True, False])


def test_drop_smallest_live_and_grow_highest_scores():
    # drop 0.1 (index 0) and -0.2 (index 4); candidates 0, 2, 4, 5; grow the two highest: 2 and 5
    new = drop_and_grow(W, KEEP, 2, np.array([0.3, 9.0, 0.7, 0.0, 0.1, 0.6]))
    np.testing.assert_array_equal(new, [False, True, True, True, False, True])


def test_ties_drop_and_grow_the_lower_index_first():
    w = np.array([0.2, 0.5, -0.2, 0.0, 0.0])
    keep = np.array([True, True, True, False, False])
    # |w| ties at indices 0 and 2: index 0 is dropped; grow scores tie at 3 and 4: index 3 grows
    new = drop_and_grow(w, keep, 1, np.array([0.0, 0.0, 0.0, 1.0, 1.0]))
    np.testing.assert_array_equal(new, [False, True, True, True, False])


def test_just_dropped_entries_compete_for_regrowth_as_in_rigl():
    # index 0 is dropped by magnitude, then has the highest grow score: it stays live
    new = drop_and_grow(W, KEEP, 2, np.array([5.0, 0.0, 0.0, 0.0, 0.0, 1.0]))
    np.testing.assert_array_equal(new, [True, True, False, True, False, True])


def test_zero_drop_changes_nothing_and_counts_are_checked():
    np.testing.assert_array_equal(drop_and_grow(W, KEEP, 0, np.ones(6)), KEEP)
    with pytest.raises(ValueError, match=r"n must be an integer in \[0, 4\].*got 5"):
        drop_and_grow(W, KEEP, 5, np.ones(6))


def test_per_sign_drop_takes_each_sign_apart_as_mocanu():
    # positives 0.1, 0.5, 0.3 and negatives -0.05, -0.9, -0.04; fraction 0.4 drops floor(3 * 0.4) = 1 of each:
    # +0.1 (the smallest positive) and -0.04 (the negative closest to zero). Over both signs by magnitude (rigl's
    # drop) the two smallest |w| are both negative: -0.04 and -0.05.
    w = np.array([0.1, -0.05, 0.5, -0.9, 0.3, -0.04, 0.0, 0.0])
    keep = np.array([True, True, True, True, True, True, False, False])
    assert sign_drop_counts(w, keep, 0.4) == (1, 1)
    grow = np.array([0, 0, 0, 0, 0, 0, 2.0, 1.0])
    per_sign = drop_and_grow(w, keep, 1, grow, n_negative=1)
    np.testing.assert_array_equal(per_sign, [False, True, True, True, True, False, True, True])
    both = drop_and_grow(w, keep, 2, grow)  # rigl's: the two smallest |w| overall, both negative
    np.testing.assert_array_equal(both, [True, False, True, True, True, False, True, True])
    with pytest.raises(ValueError, match=r"n_negative must be an integer in \[0, 3\].*got 4"):
        drop_and_grow(w, keep, 1, grow, n_negative=4)


def test_per_sign_set_callback_keeps_the_live_count_and_drops_both_signs():
    model = prune.prune_low_magnitude(mlp(), prune.ConstantSparsity(0.0, 0))
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    prune.sparse_init(model, 0.8, seed=1)
    cb = prune.DynamicSparsity("set", update_every=1, drop_fraction=0.3, seed=0, drop="per_sign")
    cb.set_model(model)
    before = {t.key: (t.weight, t.keep) for t in prune.core.targets.require_targets(model, "test")}
    records = cb.update(1)
    for r in records:
        w, keep = before[r["key"]]
        assert r["live"] == int(keep.sum())
        assert r["n"] == sum(sign_drop_counts(w, keep, 0.3)) > 0
    with pytest.raises(ValueError, match="drop must be one of.*'sideways'"):
        prune.DynamicSparsity("set", drop="sideways")


def test_num_drop_floors_like_rigl():
    assert num_drop(14, 0.25) == 3
    assert num_drop(10, 0.29) == 2
    assert num_drop(3, 1.0) == 3


def test_cosine_drop_fraction_values():
    assert cosine_drop_fraction(0, 0.3, 100) == 0.3
    assert cosine_drop_fraction(25, 0.3, 100) == 0.15 * (1 + math.cos(math.pi / 4))
    assert abs(cosine_drop_fraction(50, 0.3, 100) - 0.15) < 1e-15
    assert cosine_drop_fraction(100, 0.3, 100) == 0.0
    assert cosine_drop_fraction(150, 0.3, 100) == 0.0
    # rigl_tf2's CosineUpdateSchedule is Keras' CosineDecay(f, end_step, alpha=0)
    keras_decay = keras.optimizers.schedules.CosineDecay(0.3, 100, alpha=0.0)
    for step in (0, 10, 37, 99, 100, 130):
        assert abs(cosine_drop_fraction(step, 0.3, 100) - float(keras_decay(step))) < 1e-7


def test_callback_schedule_of_updates_and_fractions():
    cb = prune.DynamicSparsity("rigl", update_every=10, drop_fraction=0.4, end_step=40, gradient_data=(0, 0))
    assert [s for s in range(60) if cb.should_update(s)] == [10, 20, 30]
    assert cb.fraction_at(20) == cosine_drop_fraction(20, 0.4, 40)
    set_cb = prune.DynamicSparsity("set", update_every=5, drop_fraction=0.4)
    assert set_cb.decay == "constant" and set_cb.fraction_at(1000) == 0.4
    assert [s for s in range(16) if set_cb.should_update(s)] == [5, 10, 15]


# -- one update on a hand-made layer ------------------------------------------------------------


def _tiny_model(optimizer=None):
    """y = x @ W, W 3x2 with 3 live entries; loss sum(y_true * y_pred) so dL/dW = x^T y_true."""
    model = keras.Sequential([keras.Input((3,)), prune.layers.masked.MaskedDense(2, use_bias=False, name="d")])
    layer = model.layers[0]
    layer.kernel.assign(np.array([[0.5, 0.0], [-0.1, 0.0], [0.0, 0.2]], "float32"))
    layer.set_mask("kernel", np.array([[1, 0], [1, 0], [0, 1]]))
    if optimizer is not None:
        model.compile(optimizer, loss=lambda yt, yp: tf.reduce_sum(yt * yp))
    return model, layer


def test_rigl_update_drops_by_magnitude_grows_by_dense_gradient_and_resets_slots():
    x, yt = np.array([[1.0, 2.0, 3.0]], "float32"), np.array([[1.0, -4.0]], "float32")
    model, layer = _tiny_model(keras.optimizers.Adam(0.1))
    model.train_on_batch(x, yt)  # builds Adam's moments; live entries have moved
    before = layer.kernel.numpy().copy()
    slots = slots_for(model.optimizer, layer.kernel)
    assert len(slots) == 2
    for slot in slots:  # a (forbidden) leftover at the pruned entry (1, 1): the update must clear it
        slot.assign(tf.tensor_scatter_nd_update(slot.value, [[1, 1]], [1.0]))
    cb = prune.DynamicSparsity("rigl", update_every=1, drop_fraction=0.5, decay="constant", gradient_data=(x, yt))
    cb.set_model(model)
    (r,) = cb.update(7)
    # 3 live, floor(1.5) = 1 moves: drop the smallest |w| (1, 0); |dense grad| of candidates
    # (0,1)=4, (1,0)=2, (1,1)=8, (2,0)=3: grow (1, 1), which the masked gradient (0 there) would miss
    assert r == {"step": 7, "key": "d/kernel", "fraction": 0.5, "live": 3, "n": 1, "dropped": 1, "grown": 1}
    mask = layer.get_masks()["kernel"]
    np.testing.assert_array_equal(mask, [[True, False], [False, True], [False, True]])
    k = layer.kernel.numpy()
    assert k[1, 1] == 0.0 and not np.signbit(k[1, 1]) and k[1, 0] == 0.0 and not np.signbit(k[1, 0])
    assert k[0, 0] == before[0, 0] and k[2, 1] == before[2, 1]  # survivors untouched, bitwise
    for slot in slots:
        s = slot.numpy()
        assert s[1, 1] == 0.0 and s[1, 0] == 0.0, slot.path
        assert s[0, 0] != 0.0 and s[2, 1] != 0.0, slot.path  # survivors keep their state
    # the masks are back after the dense-gradient pass, and the next step trains the grown entry
    model.train_on_batch(x, yt)
    assert layer.kernel.numpy()[1, 1] != 0.0 and layer.kernel.numpy()[1, 0] == 0.0


def test_set_update_grows_at_random_among_candidates_with_exact_counts():
    model, layer = _tiny_model()
    cb = prune.DynamicSparsity("set", update_every=1, drop_fraction=1.0, seed=3)
    cb.set_model(model)
    (r,) = cb.update(1)
    assert r["n"] == 3 and r["live"] == 3
    assert r["dropped"] == r["grown"]
    mask = layer.get_masks()["kernel"]
    assert mask.sum() == 3
    grown = mask & ~np.array([[1, 0], [1, 0], [0, 1]], bool)
    assert np.all(layer.kernel.numpy()[grown] == 0.0)
    # the random grow scores are those of (seed, step, key): another seed or step draws another mask
    masks = set()
    for seed in range(6):
        m, lay = _tiny_model()
        c = prune.DynamicSparsity("set", update_every=1, drop_fraction=1.0, seed=seed)
        c.set_model(m)
        c.update(1)
        masks.add(lay.get_masks()["kernel"].tobytes())
    assert len(masks) > 1


# -- static masks ------------------------------------------------------------------------------------


def test_sparse_init_exact_counts_uniform_and_erk_and_reproducible():
    model = prune.prune_low_magnitude(mlp())
    zeros = prune.sparse_init(model, 0.8)
    assert zeros == {"fc1/kernel": round(0.8 * 192), "fc2/kernel": round(0.8 * 48)}
    for layer in prune.prunable_layers(model):
        mask = layer.get_masks()["kernel"]
        assert (~mask).sum() == zeros[f"{layer.name}/kernel"]
        assert np.all(layer.kernel.numpy()[~mask] == 0.0)
    zeros = prune.sparse_init(model, 0.8, distribution="erk", seed=1)
    assert zeros == erk_zeros({"fc1/kernel": (12, 16), "fc2/kernel": (16, 3)}, 0.8)
    first = [layer.get_masks()["kernel"] for layer in prune.prunable_layers(model)]
    assert [(~m).sum() for m in first] == [zeros["fc1/kernel"], zeros["fc2/kernel"]]
    again = prune.prune_low_magnitude(mlp())
    prune.sparse_init(again, 0.8, distribution="erk", seed=1)
    for a, b in zip(first, [layer.get_masks()["kernel"] for layer in prune.prunable_layers(again)]):
        np.testing.assert_array_equal(a, b)


def test_static_sparse_training_fits_without_a_pruning_callback_and_keeps_its_mask():
    model = prune.prune_low_magnitude(mlp())  # a default schedule: fit alone would raise
    model.compile(keras.optimizers.Adam(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    prune.sparse_init(model, 0.75, seed=3)
    assert [layer.pruning_schedule for layer in prune.prunable_layers(model)] == [None, None]
    before = [layer.get_masks()["kernel"] for layer in prune.prunable_layers(model)]
    x, y = mlp_data(32)
    model.fit(x, y, batch_size=8, epochs=2, verbose=0)
    for mask, layer in zip(before, prune.prunable_layers(model)):
        np.testing.assert_array_equal(layer.get_masks()["kernel"], mask)
        assert np.all(layer.kernel.numpy()[~mask] == 0.0) and np.any(layer.kernel.numpy()[mask] != 0.0)


# -- exact zeros while masks move, under every optimizer ----------------------------------------------

STEPS, EVERY = 16, 4


class _Check(keras.callbacks.Callback):
    def __init__(self, live):
        super().__init__()
        self.live = live
        self.checked = 0

    def on_train_batch_end(self, batch, logs=None):
        for layer in prune.prunable_layers(self.model):
            mask = layer.get_masks()["kernel"]
            assert mask.sum() == self.live[layer.name], layer.name  # exact at every step
            w = layer.kernel.numpy()[~mask]
            assert np.array_equal(w, np.zeros_like(w)) and not np.signbit(w).any(), layer.name
            for slot in slots_for(self.model.optimizer, layer.kernel):
                s = slot.numpy()[~mask]
                assert np.array_equal(s, np.zeros_like(s)), slot.path
            self.checked += int((~mask).sum())


def _fit(method, optimizer, seed=0):
    model = prune.prune_low_magnitude(mlp())
    model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    optimizer.build(model.trainable_variables)  # so that sparse_init zeroes the slots too (Adagrad starts at 0.1)
    prune.sparse_init(model, 0.75, distribution="erk", seed=seed)
    live = {layer.name: int(layer.get_masks()["kernel"].sum()) for layer in prune.prunable_layers(model)}
    x, y = mlp_data(STEPS * 4)
    cb = prune.DynamicSparsity(
        method, update_every=EVERY, drop_fraction=0.5, end_step=STEPS, seed=seed, gradient_data=(x[:16], y[:16])
    )
    check = _Check(live)
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0, callbacks=[cb, check])
    return model, cb, check


@pytest.mark.parametrize("method", EXCHANGES)
def test_fit_keeps_pruned_weights_exactly_zero_while_masks_move(optimizer_factory, method):
    model, cb, check = _fit(method, optimizer_factory())
    assert check.checked > 0
    assert sorted({r["step"] for r in cb.history}) == [4, 8, 12]
    assert sum(r["grown"] for r in cb.history) > 0  # masks did move
    assert all(r["grown"] == r["dropped"] and r["dropped"] <= r["n"] for r in cb.history)
    assert prune.get_step(model) == STEPS


@pytest.mark.parametrize("method", EXCHANGES)
def test_same_seed_same_masks_and_weights(method):
    runs = [_fit(method, keras.optimizers.SGD(0.05, momentum=0.9), seed=s)[0] for s in (0, 0, 1)]
    weights = [[v.numpy() for v in m.weights] for m in runs]
    for a, b in zip(weights[0], weights[1]):
        np.testing.assert_array_equal(a, b)
    masks = [[layer.get_masks()["kernel"] for layer in prune.prunable_layers(m)] for m in runs]
    assert any(not np.array_equal(a, b) for a, b in zip(masks[0], masks[2]))


def test_custom_loop_drives_the_callback_like_update_pruning_step():
    model = prune.prune_low_magnitude(mlp())
    optimizer = keras.optimizers.Adam(0.01)
    prune.sparse_init(model, 0.75, optimizer=optimizer)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    x, y = mlp_data(STEPS * 4)
    train_step = masked_train_step(model, optimizer, loss_fn)

    cb = prune.DynamicSparsity(
        "rigl", update_every=EVERY, end_step=STEPS, optimizer=optimizer, gradient_data=(x[:16], y[:16]), loss=loss_fn
    )
    cb.set_model(model)
    cb.on_train_begin()
    live = [int(layer.get_masks()["kernel"].sum()) for layer in prune.prunable_layers(model)]
    for i in range(STEPS):
        cb.on_train_batch_begin(i)
        train_step(x[4 * i : 4 * i + 4], y[4 * i : 4 * i + 4])
        for layer, n in zip(prune.prunable_layers(model), live):
            mask = layer.get_masks()["kernel"]
            assert mask.sum() == n
            assert np.all(layer.kernel.numpy()[~mask] == 0.0)
            for slot in slots_for(optimizer, layer.kernel):
                assert np.all(slot.numpy()[~mask] == 0.0)
    assert sorted({r["step"] for r in cb.history}) == [4, 8, 12]


# -- bad input ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"method": "snip"}, "method must be one of .*'snip'"),
        ({"update_every": 0}, "update_every must be a positive integer, got 0"),
        ({"update_every": 2.5}, "update_every must be a positive integer, got 2.5"),
        ({"drop_fraction": 0.0}, r"drop_fraction must be a number in \(0, 1\], got 0.0"),
        ({"drop_fraction": 1.5}, r"drop_fraction must be a number in \(0, 1\], got 1.5"),
        ({"end_step": -3}, "end_step must be a positive integer or None, got -3"),
        ({"decay": "linear"}, "decay must be one of .*'linear'"),
        ({"decay": "cosine"}, "decay='cosine' needs end_step.*end_step=None"),
        ({"method": "rigl", "end_step": 10}, "method='rigl' grows by the dense gradient: pass gradient_data"),
        ({"seed": 1.5}, "seed must be an integer, got 1.5"),
    ],
)
def test_bad_callback_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        prune.DynamicSparsity(**kwargs)


def test_bad_input_changes_nothing():
    model = prune.prune_low_magnitude(mlp())
    prune.sparse_init(model, 0.5)
    layer = prune.prunable_layers(model)[0]
    mask, kernel = layer.get_masks()["kernel"].copy(), layer.kernel.numpy().copy()
    with pytest.raises(ValueError, match=r"unknown distribution 'gaussian'; valid: \['layer', 'global', 'erk'\]"):
        prune.sparse_init(model, 0.9, distribution="gaussian")
    with pytest.raises(ValueError, match=r"sparsity must be a number in \[0, 1\), got 1.0"):
        prune.sparse_init(model, 1.0)
    cb = prune.DynamicSparsity("set", update_every=1)
    cb.set_model(model)
    bad = kernel.copy()
    bad[np.argwhere(mask)[0][0], np.argwhere(mask)[0][1]] = np.nan
    layer.kernel.assign(bad)
    with pytest.raises(ValueError, match=r"weight 'fc1/kernel' \(layer 'fc1'\) has 1 NaN or infinite entries; no mask was changed"):
        cb.update(1)
    np.testing.assert_array_equal(layer.get_masks()["kernel"], mask)
    assert cb.history == []


def test_structured_patterns_are_refused_by_name():
    blocked = prune.prune_low_magnitude(mlp(), pattern=prune.Block((2, 2)))
    with pytest.raises(ValueError, match="needs pattern=Unstructured\\(\\); layer 'fc1'"):
        prune.sparse_init(blocked, 0.5)
    cb = prune.DynamicSparsity("set")
    cb.set_model(blocked)
    with pytest.raises(ValueError, match="layer 'fc1'"):
        cb.on_train_begin()


# -- SparseDense -----------------------------------------------------------------------------------------------


def test_restructure_keeps_survivors_and_stores_new_entries_at_zero_with_zero_slots():
    w = np.array([[0.5, 0.0], [-0.1, 0.0], [0.0, 0.2]], "float32")
    layer = SparseDense.from_dense(w, w != 0, use_bias=False, name="sd")
    model = keras.Sequential([keras.Input((3,)), layer])
    model.compile(keras.optimizers.Adam(0.1), loss=lambda yt, yp: tf.reduce_sum(yt * yp))
    model.train_on_batch(np.ones((1, 3), "float32"), np.ones((1, 2), "float32"))
    before = layer.to_dense()
    slots = slots_for(model.optimizer, layer.values)
    old_slots = [s.numpy().copy() for s in slots]  # stored order (0,0), (1,0), (2,1)
    layer.restructure(np.array([[1, 0], [0, 1], [0, 1]]), model.optimizer)
    np.testing.assert_array_equal(layer.get_mask(), [[True, False], [False, True], [False, True]])
    np.testing.assert_array_equal(layer.indices.numpy(), [[0, 0], [1, 1], [2, 1]])
    v = layer.values.numpy()
    assert v[0] == before[0, 0] and v[2] == before[2, 1] and v[1] == 0.0 and not np.signbit(v[1])
    for slot, old in zip(slot_list := slots_for(model.optimizer, layer.values), old_slots):
        np.testing.assert_array_equal(slot.numpy(), [old[0], 0.0, old[2]])
    assert len(slot_list) == 2
    model.train_on_batch(np.ones((1, 3), "float32"), np.ones((1, 2), "float32"))  # trains on the new structure
    assert layer.to_dense()[1, 1] != 0.0 and layer.to_dense()[1, 0] == 0.0


def _twins(seed=0):
    """A masked MLP and a SparseDense MLP with the same weights and masks (layers named alike)."""
    masked = prune.prune_low_magnitude(mlp(seed))
    prune.sparse_init(masked, 0.7, seed=seed)
    layers = []
    for layer in prune.prunable_layers(masked):
        mask = layer.get_masks()["kernel"]
        layers.append(SparseDense.from_dense(layer.kernel.numpy(), mask, bias=layer.bias.numpy(), name=layer.name,
                                             activation=layer.activation))
    sparse = keras.Sequential([keras.Input((12,)), *layers])
    for model in (masked, sparse):
        model.compile(keras.optimizers.SGD(0.05), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return masked, sparse


@pytest.mark.parametrize("method", EXCHANGES)
def test_sparse_dense_moves_its_structure_like_the_masked_layer(method):
    masked, sparse = _twins()
    x, y = mlp_data(32)
    grads = [prune.dense_gradients(m, x, y) for m in (masked, sparse)]
    for key in grads[0]:
        np.testing.assert_allclose(grads[0][key], grads[1][key], rtol=1e-5, atol=1e-7)
    for model in (masked, sparse):
        cb = prune.DynamicSparsity(method, update_every=1, drop_fraction=0.5, decay="constant", gradient_data=(x, y))
        cb.set_model(model)
        cb.update(3)
        model.history_ = cb.history
    assert masked.history_ == sparse.history_ and sum(r["grown"] for r in masked.history_) > 0
    for a, b in zip(prune.prunable_layers(masked), sparse.layers):
        np.testing.assert_array_equal(a.get_masks()["kernel"], b.get_mask())
        np.testing.assert_array_equal(a.kernel.numpy(), b.to_dense())
    # and it trains afterwards, in fit, with the structure moving between steps
    cb = prune.DynamicSparsity(method, update_every=2, drop_fraction=0.5, end_step=8, gradient_data=(x, y))
    nnz = [layer.nnz for layer in sparse.layers]
    sparse.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[cb])
    assert [layer.nnz for layer in sparse.layers] == nnz
    assert sorted({r["step"] for r in cb.history}) == [2, 4, 6]
