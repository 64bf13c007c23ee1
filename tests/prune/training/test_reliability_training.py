"""Pruning follows training steps: steps_per_execution > 1, lazily built models; schedule power validated."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import prune
from tests.helpers import mlp, mlp_data


def _masked(schedule: prune.PolynomialDecay, steps_per_execution: int) -> keras.Model:
    model = prune.prune_low_magnitude(mlp(seed=1), schedule)
    model.compile(keras.optimizers.Adam(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  steps_per_execution=steps_per_execution)
    return model


def _fit(model: keras.Model, epochs: int = 2) -> None:
    x, y = mlp_data(64)  # 8 steps of 8 per epoch
    model.fit(x, y, batch_size=8, epochs=epochs, shuffle=False, verbose=0, callbacks=[prune.UpdatePruningStep()])


def _kernel_sparsity(model: keras.Model) -> float:
    kernels = [np.asarray(w) for w in prune.strip_pruning(model).get_weights() if np.ndim(w) == 2]
    return float(sum((k == 0).sum() for k in kernels) / sum(k.size for k in kernels))


def test_steps_per_execution_reaches_every_update_at_its_step():
    # Updates at 0, 4, 8, 12 (steps 0..15): every one on a boundary of executions of 4 steps.
    schedule = prune.PolynomialDecay(0.0, 0.8, begin_step=0, end_step=12, frequency=4)
    one, four = _masked(schedule, 1), _masked(schedule, 4)
    _fit(one)
    _fit(four)
    assert _kernel_sparsity(four) == pytest.approx(0.8, abs=0.01)  # was 0.0: the schedule never reached step 12
    for a, b in zip(one.weights, four.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)
    assert int(prune.prunable_layers(four)[0].pruning_step.numpy()) == 16


def test_steps_per_execution_refuses_an_update_inside_an_execution_before_training():
    schedule = prune.PolynomialDecay(0.0, 0.8, begin_step=0, end_step=12, frequency=2)  # step 2 is mid-execution
    model = _masked(schedule, 4)
    before = [w.numpy() for w in model.weights]
    with pytest.raises(ValueError, match=r"steps_per_execution=4 cannot honour .* at step 2, inside an execution"):
        _fit(model)
    for a, b in zip(before, model.weights):
        np.testing.assert_array_equal(a, b.numpy())  # nothing trained


def test_unbuilt_model_single_batch_fit_gets_its_step_0_update():
    keras.utils.set_random_seed(0)
    lazy = keras.Sequential([keras.layers.Dense(8, name="a"), keras.layers.Dense(3, name="b")])  # no Input
    model = prune.prune_low_magnitude(lazy, prune.ConstantSparsity(0.5, begin_step=0, frequency=100))
    model.compile("sgd", "mse")
    x = np.random.default_rng(0).random((4, 5), dtype=np.float32)
    model.fit(x, np.zeros((4, 3), "float32"), batch_size=4, verbose=0, callbacks=[prune.UpdatePruningStep()])
    for layer in prune.prunable_layers(model):
        weight, mask = layer.weight_and_mask("kernel")
        m = np.asarray(mask.value)
        assert (m == 0).mean() == 0.5, layer.name  # was 0.0: the update waited for a second batch that never came
        assert np.all(np.asarray(weight.value)[m == 0] == 0.0)


@pytest.mark.parametrize("power", [0, -2, float("nan"), float("inf"), "3"])
def test_polynomial_power_must_be_a_positive_number(power):
    with pytest.raises((ValueError, TypeError), match="power"):
        prune.PolynomialDecay(0.0, 0.8, begin_step=0, end_step=10, power=power)
