"""prune.training.lottery: IMP's level masks, the sparsity path, rewinding and the two controls, exactly."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import prune
from prune.training import lottery
from prune.layers.optimizer_state import slots_for
from tests.helpers import mlp, mlp_data

A = np.array([[0.1, -0.9, 0.3], [-0.2, 0.5, 0.3]], np.float32)  # "a/kernel": a tie at 0.3 (flat 2 and 5)
B = np.array([[1.0, 2.0], [3.0, 0.05], [-4.0, 0.2]], np.float32)  # "b/kernel": 0.2 ties a's -0.2 globally


def _tiny():
    model = keras.Sequential(
        [keras.Input((2,)), keras.layers.Dense(3, name="a"), keras.layers.Dense(2, name="b")]
    )
    model = prune.prune_low_magnitude(model)
    layers = {layer.name: layer for layer in prune.prunable_layers(model)}
    layers["a"].weight_and_mask("kernel")[0].assign(A)
    layers["b"].weight_and_mask("kernel")[0].assign(B)
    return model


def _kernel(model, name):
    layer = next(layer for layer in prune.prunable_layers(model) if layer.name == name)
    weight, mask = layer.weight_and_mask("kernel")
    return weight.numpy(), mask.numpy()


# -- the sparsity path ------------------------------------------------------------------------


def test_sparsity_path_is_exact_and_stops_where_told():
    assert lottery.sparsity_path(0.5, 0.2) == [0.0, 0.2, 0.36, 0.488, 0.5]
    assert lottery.sparsity_path(0.5, 0.2, stops=[0.3]) == [0.0, 0.2, 0.3, 0.44, 0.5]
    # Stops at or above the target change nothing; unsorted stops are fine.
    assert lottery.sparsity_path(0.5, 0.2, stops=[0.95, 0.3, 0.5]) == [0.0, 0.2, 0.3, 0.44, 0.5]
    # 1 - s = 0.8 ** n exactly (no drift over 10 levels): 0.8 ** 10 = 0.1073741824.
    path = lottery.sparsity_path(0.9, 0.2)
    assert len(path) == 12 and path[10] == 1 - 0.1073741824 and path[-1] == 0.9
    assert lottery.sparsity_path(0.0, 0.2) == [0.0]
    assert lottery.next_sparsity(0.488, 0.2, 0.5) == 0.5
    assert lottery.next_sparsity(0.2, 0.2, 0.9, stops=[0.3]) == 0.3
    assert lottery.next_sparsity(0.5, 0.2, 0.5) == 0.5


@pytest.mark.parametrize(
    "kwargs, named",
    [
        (dict(target=0.9, rate=0.0), "rate"),
        (dict(target=0.9, rate=1.0), "rate"),
        (dict(target=0.9, rate=True), "rate"),
        (dict(target=0.9, rate="0.2"), "rate"),
        (dict(target=1.0, rate=0.2), "target"),
        (dict(target=float("nan"), rate=0.2), "target"),
        (dict(target=0.9, rate=0.2, stops=[0.0]), r"stops\[0\]"),
        (dict(target=0.9, rate=0.2, stops="0.5"), "stops"),
    ],
)
def test_sparsity_path_refuses_bad_input_naming_it(kwargs, named):
    with pytest.raises(ValueError, match=named):
        lottery.sparsity_path(**kwargs)


def test_next_sparsity_refuses_a_current_past_the_target():
    with pytest.raises(ValueError, match="current must be at most target"):
        lottery.next_sparsity(0.6, 0.2, 0.5)


# -- the next level's masks ------------------------------------------------------------------------


def test_layerwise_masks_drop_exactly_the_smallest_with_ties_at_the_lower_index():
    model = _tiny()
    keep = lottery.magnitude_masks(model, 0.5, scope="layer")
    assert sorted(keep) == ["a/kernel", "b/kernel"]
    # a: |0.1| and |-0.2| go, and of the tied 0.3s the lower flat index (2) goes.
    np.testing.assert_array_equal(keep["a/kernel"], [[False, True, False], [False, True, True]])
    # b: 0.05, 0.2 and 1.0 go.
    np.testing.assert_array_equal(keep["b/kernel"], [[False, True], [True, False], [True, False]])
    # Nothing was written.
    np.testing.assert_array_equal(_kernel(model, "a")[1], np.ones((2, 3)))
    np.testing.assert_array_equal(_kernel(model, "a")[0], A)


def test_global_masks_use_one_threshold_and_break_ties_at_the_earlier_weight():
    model = _tiny()
    keep = lottery.magnitude_masks(model, 5 / 12, scope="global")  # round(5/12 * 12) = 5 zeros in total
    # Ascending: 0.05 (b), 0.1 (a), 0.2 (a, earlier weight), 0.2 (b), 0.3 (a, flat 2), 0.3 (a, flat 5), ...
    np.testing.assert_array_equal(keep["a/kernel"], [[False, True, False], [False, True, True]])
    np.testing.assert_array_equal(keep["b/kernel"], [[True, True], [True, False], [True, False]])
    assert sum(int((~k).sum()) for k in keep.values()) == 5


def test_pruned_entries_stay_pruned_at_the_next_level():
    model = _tiny()
    first = lottery.magnitude_masks(model, 0.5)
    lottery.rewind(model, lottery.snapshot(model), first)
    # Make a pruned entry the largest: it must stay pruned, a live one goes instead.
    layer = next(layer for layer in prune.prunable_layers(model) if layer.name == "a")
    w = layer.weight_and_mask("kernel")[0]
    w.assign(np.where(first["a/kernel"], A, 0.0).astype(np.float32))
    second = lottery.magnitude_masks(model, 4 / 6)  # 4 zeros of 6
    assert not (second["a/kernel"] & ~first["a/kernel"]).any()
    np.testing.assert_array_equal(second["a/kernel"], [[False, True, False], [False, True, False]])
    assert [int((~k).sum()) for k in second.values()] == [4, 4]


def test_magnitude_masks_refuse_bad_input():
    model = _tiny()
    with pytest.raises(ValueError, match=r"unknown scope 'gaussian'; valid: \['layer', 'global', 'erk'\]"):
        lottery.magnitude_masks(model, 0.5, scope="gaussian")
    with pytest.raises(ValueError, match="sparsity must be in"):
        lottery.magnitude_masks(model, 1.0)
    with pytest.raises(ValueError, match="no masked or SparseDense layer"):
        lottery.magnitude_masks(mlp(), 0.5)


def test_magnitude_masks_take_every_registered_distribution():
    """The level's masks come from the distribution registry: ERK gives its exact counts per weight, like the engine."""
    from prune.core import distributions

    model = _tiny()
    shapes = {t.key: t.shape for t in prune.core.targets.mask_targets(model)}
    keep = lottery.magnitude_masks(model, 0.5, scope="erk")
    assert {k: int((~m).sum()) for k, m in keep.items()} == distributions.erk_zeros(shapes, 0.5)
    assert distributions.distributions() == ["layer", "global", "erk"]  # every one a scope of magnitude_masks


# -- rewinding ---------------------------------------------------------------------------------------


def _trained(optimizer, steps=6, seed=0):
    model = prune.prune_low_magnitude(mlp(seed))
    init = lottery.snapshot(model)
    lottery.rewind(model, init)  # fixes the all-ones masks: no schedule, no callback needed
    model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = mlp_data(steps * 4)
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    return model, init, (x, y)


def test_rewind_sets_survivors_to_the_snapshot_and_pruned_to_plus_zero():
    model, init, _ = _trained(keras.optimizers.Adam(0.01))
    trained = lottery.snapshot(model)
    keep = lottery.magnitude_masks(model, 0.75)
    lottery.rewind(model, init, keep, optimizer=model.optimizer)
    after = lottery.snapshot(model)
    assert sorted(after) == sorted(init)
    for layer in prune.prunable_layers(model):
        weight, mask = layer.weight_and_mask("kernel")
        k = keep[f"{layer.name}/kernel"]
        np.testing.assert_array_equal(mask.numpy(), k.astype(np.float32))
        w = weight.numpy()
        np.testing.assert_array_equal(w[k], init[weight.path][k])  # survivors: bitwise the snapshot
        assert np.all(w[~k] == 0) and not np.signbit(w[~k]).any()  # pruned: +0.0
        assert int((~k).sum()) == round(0.75 * k.size)
        assert not np.array_equal(trained[weight.path], init[weight.path])  # training did move it
        assert layer.pruning_schedule is None
    for path in init:
        if path.endswith("bias"):
            np.testing.assert_array_equal(after[path], init[path])
    # The optimizer is back at its start: step 0, zero moments.
    assert int(model.optimizer.iterations.numpy()) == 0
    assert all(not np.any(s.numpy()) for v in model.trainable_variables for s in slots_for(model.optimizer, v))


def test_reset_optimizer_gives_the_fresh_optimizers_state():
    model, _, _ = _trained(keras.optimizers.Adagrad(0.05))
    opt = model.optimizer
    assert any(np.any(s.numpy() != 0.1) for v in model.trainable_variables for s in slots_for(opt, v))
    lottery.reset_optimizer(opt)
    for v in model.trainable_variables:
        slots = slots_for(opt, v)
        assert slots and all(np.all(s.numpy() == np.float32(0.1)) for s in slots)  # Adagrad's initial accumulator
    assert int(opt.iterations.numpy()) == 0


def test_rewind_refuses_mismatches_before_changing_anything():
    model, init, _ = _trained(keras.optimizers.SGD(0.05))
    before = lottery.snapshot(model)
    keep = lottery.magnitude_masks(model, 0.5)
    bad_values = dict(init)
    bad_values.pop(next(iter(bad_values)))
    bad_shape = {k: v[..., :1] for k, v in init.items()}
    bad_masks = {k: np.full(m.shape, 2) for k, m in keep.items()}
    for values, masks, match in [
        (bad_values, keep, "missing"),
        (bad_shape, keep, "has shape"),
        (init, {"x/kernel": keep["fc1/kernel"]}, "must have exactly the keys"),
        (init, bad_masks, "only 0 and 1"),
        ({k: np.full_like(v, np.nan) for k, v in init.items()}, keep, "NaN"),
    ]:
        with pytest.raises(ValueError, match=match):
            lottery.rewind(model, values, masks)
    after = lottery.snapshot(model)
    for k in before:
        np.testing.assert_array_equal(after[k], before[k])
    assert all(np.all(m) for m in lottery.current_masks(model).values())


# -- the controls ---------------------------------------------------------------------------------------


def test_random_masks_keep_each_weights_count_and_follow_the_seed():
    keep = {"a/kernel": np.array([[1, 0, 0, 1, 1, 0]] * 4, bool), "b/kernel": np.eye(5, dtype=bool)}
    r1, r1b, r2 = (lottery.random_masks(keep, s) for s in (1, 1, 2))
    for key in keep:
        assert r1[key].shape == keep[key].shape and r1[key].dtype == bool
        assert int(r1[key].sum()) == int(keep[key].sum())  # 12 of 24, 5 of 25
        np.testing.assert_array_equal(r1[key], r1b[key])
        assert not np.array_equal(r1[key], keep[key])
        assert not np.array_equal(r1[key], r2[key])
    with pytest.raises(ValueError, match="seed must be an integer"):
        lottery.random_masks(keep, True)
    with pytest.raises(ValueError, match="only 0 and 1"):
        lottery.random_masks({"a/kernel": np.full((2, 2), 3)}, 0)


def test_reinit_values_are_fresh_draws_of_the_layers_initializers():
    model = prune.prune_low_magnitude(mlp(0))
    init = lottery.snapshot(model)
    r1, r1b, r2 = (lottery.reinit_values(model, s) for s in (5, 5, 6))
    assert sorted(r1) == sorted(init)
    for path, value in init.items():
        assert r1[path].shape == value.shape and r1[path].dtype == value.dtype
        np.testing.assert_array_equal(r1[path], r1b[path])
        if path.endswith("bias"):
            np.testing.assert_array_equal(r1[path], np.zeros_like(value))  # bias_initializer="zeros"
        else:
            fan_in, fan_out = value.shape
            limit = np.sqrt(6.0 / (fan_in + fan_out))  # glorot_uniform, the Dense default
            assert np.all(np.abs(r1[path]) <= limit)
            assert not np.array_equal(r1[path], value) and not np.array_equal(r1[path], r2[path])
    with pytest.raises(ValueError, match="seed must be an integer"):
        lottery.reinit_values(model, 1.5)


# -- exact zeros through a level, under every optimizer --------------------------------------------------


class _Check(keras.callbacks.Callback):
    """Pruned weights are +0.0 after every step; their slots keep the level's starting value
    (0 for all but Adagrad's accumulator, which a fresh Adagrad starts at 0.1)."""

    def __init__(self):
        super().__init__()
        self.checked = 0

    def _slots(self):
        return {s.path: s.numpy().copy() for v in self.model.trainable_variables for s in slots_for(self.model.optimizer, v)}

    def on_train_begin(self, logs=None):
        self.start = None

    def on_train_batch_end(self, batch, logs=None):
        if self.start is None:  # Keras builds the optimizer in the first step
            self.start = self._slots()
        for layer in prune.prunable_layers(self.model):
            weight, mask = layer.weight_and_mask("kernel")
            pruned = mask.numpy() == 0
            w = weight.numpy()[pruned]
            assert np.all(w == 0) and not np.signbit(w).any(), layer.name
            for slot in slots_for(self.model.optimizer, weight):
                start = self.start[slot.path][pruned]
                assert np.all(start == (0.1 if "accumulator" in slot.path else 0.0)), slot.path
                np.testing.assert_array_equal(slot.numpy()[pruned], start, err_msg=slot.path)
            self.checked += int(pruned.sum())


def test_a_level_keeps_pruned_weights_exactly_zero(optimizer_factory):
    model, init, (x, y) = _trained(optimizer_factory())
    # Ticket level: magnitude masks, rewound, the same (reset) optimizer.
    keep = lottery.magnitude_masks(model, 0.75)
    lottery.rewind(model, init, keep, optimizer=model.optimizer)
    check = _Check()
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0, callbacks=[check])
    # Random control on the same model: the mask grows where the ticket's did not.
    random = lottery.random_masks(keep, 3)
    lottery.rewind(model, init, random, optimizer=model.optimizer)
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0, callbacks=[check])
    assert check.checked == 2 * 6 * sum(int((~k).sum()) for k in keep.values())
    np.testing.assert_array_equal(lottery.current_masks(model)["fc1/kernel"], random["fc1/kernel"])
