"""Pruned weights stay bitwise +0.0 under every optimizer, in fit and in custom loops,
including when pruning starts after optimizer state exists, for every pattern."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import prune
from prune.layers.optimizer_state import slots_for
from tests.helpers import masked_train_step, mixed_data, mixed_model

# Pruning starts at step 4, after four unpruned steps have built momentum/moments.
SCHEDULE = prune.PolynomialDecay(0.0, 0.75, begin_step=4, end_step=12, frequency=2)
STEPS = 16

# Every pattern in one model, so each run covers them all: "unstructured" is the
# plain case, "structured" gives each layer of the mixed model another pattern.
PATTERNS = {
    "unstructured": {},
    "structured": {
        "emb": prune.NByM(2, 4),
        "conv": prune.Channel(),
        "hidden": prune.Block((2, 2), "AVG"),
        "out": prune.Block((2, 1), "MAX"),
    },
}


@pytest.fixture(params=sorted(PATTERNS))
def patterns(request):
    return PATTERNS[request.param]


def _pruned_model(patterns):
    def clone(layer):
        if isinstance(layer, keras.layers.InputLayer) or not layer.weights:
            return layer.__class__.from_config(layer.get_config())
        return prune.prune_low_magnitude(layer, SCHEDULE, pattern=patterns.get(layer.name))

    return keras.models.clone_model(mixed_model(), clone_function=clone)


def _check_final_counts(model):
    """Each weight ends with exactly round(0.75 * units) dead units (NByM: m of every n)."""
    for layer in prune.prunable_layers(model):
        mask = layer.get_masks()[layer.prunable_weight_names[0]]
        pattern = layer.pattern
        if isinstance(pattern, prune.NByM):
            assert (~mask).sum() == mask.size * pattern.m // pattern.n, layer.name
            np.testing.assert_array_equal(pattern.select(mask.astype(float), previous=mask), mask)
        else:
            _, alive = pattern.units(np.zeros(mask.shape), mask)
            assert (~alive).sum() == int(np.round(0.75 * alive.size)), layer.name
            np.testing.assert_array_equal(pattern.expand(alive, mask.shape), mask)  # whole units only


def _check_exact_zero(model, optimizer):
    checked = 0
    for layer in prune.prunable_layers(model):
        for name in layer.prunable_weight_names:
            weight, mask = layer.weight_and_mask(name)
            pruned = mask.numpy() == 0
            w = weight.numpy()[pruned]
            assert np.array_equal(w, np.zeros_like(w)) and not np.signbit(w).any(), f"{layer.name}.{name}"
            for slot in slots_for(optimizer, weight):
                s = slot.numpy()[pruned]
                assert np.array_equal(s, np.zeros_like(s)), f"{slot.path} moved for pruned entries"
            checked += int(pruned.sum())
    return checked


class _Check(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.pruned_counts = []

    def on_train_batch_end(self, batch, logs=None):
        self.pruned_counts.append(_check_exact_zero(self.model, self.model.optimizer))


def test_fit_keeps_pruned_weights_exactly_zero(optimizer_factory, patterns):
    model = _pruned_model(patterns)
    x, y = mixed_data(STEPS * 4)
    model.compile(optimizer_factory(), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    check = _Check()
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0, callbacks=[prune.UpdatePruningStep(), check])
    assert check.pruned_counts[:4] == [0, 0, 0, 0]  # unpruned steps first
    assert check.pruned_counts[-1] > 0
    _check_final_counts(model)
    report = prune.sparsity_report(model)
    for layer in prune.prunable_layers(model):  # the stored weight has at least the mask's zeros
        row = report[report["layer"] == layer.name].iloc[0]
        assert row["size"] - row["nnz"] >= (~layer.get_masks()[row["weight"]]).sum()
    assert prune.get_step(model) == STEPS


def test_custom_loop_keeps_pruned_weights_exactly_zero(optimizer_factory, patterns):
    model = _pruned_model(patterns)
    optimizer = optimizer_factory()
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    x, y = mixed_data(STEPS * 4)
    train_step = masked_train_step(model, optimizer, loss_fn)

    step = prune.UpdatePruningStep(optimizer=optimizer)
    step.set_model(model)
    model(x[:1])
    step.on_train_begin()
    counts = []
    for i in range(STEPS):
        step.on_train_batch_begin(i)
        train_step(x[4 * i : 4 * i + 4], y[4 * i : 4 * i + 4])
        step.on_train_batch_end(i)
        counts.append(_check_exact_zero(model, optimizer))
    assert counts[:4] == [0, 0, 0, 0] and counts[-1] > 0
    _check_final_counts(model)


def test_unmasked_gradient_would_move_pruned_weights():
    """The trap the framework closes: a zero gradient alone does not keep a weight at zero."""
    v = keras.Variable(np.array([1.0, 2.0], "float32"))
    opt = keras.optimizers.SGD(0.1, momentum=0.9)
    opt.apply_gradients([(tf.constant([1.0, 1.0]), v)])  # momentum builds up
    v.assign([0.0, 2.0])  # "prune" entry 0 by overwriting only
    opt.apply_gradients([(tf.constant([0.0, 1.0]), v)])  # zero gradient for it
    assert v.numpy()[0] != 0.0
