"""The step size's decay and decoupled weight decay of ``TrainingConfig`` (issue 37, item 3).

Exact schedule values from Keras's own schedules; the fields are refused with their path; defaulted fields keep
every existing run's hash; pruned weights stay at exactly zero under weight decay.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import keras
import numpy as np
import pytest

import prune
from experiments.config import ConfigError, TrainingConfig, config_hash, from_dict, parse_sweep, RunConfig
from experiments.grid import expand
from experiments.train import learning_rate, make_optimizer

REPO = Path(__file__).resolve().parents[2]
BASE = dict(name="t", implementations=["masked"], sparsities=[0.5], models=["lenet300"], datasets=["digits"])


@pytest.mark.parametrize("training, path, words", [
    ({"lr_decay": "linear"}, "training.lr_decay", ["'linear'", "(valid: constant, cosine, step)"]),
    ({"lr_decay": 1}, "training.lr_decay", ["1"]),
    ({"weight_decay": -1e-4}, "training.weight_decay", ["[0, 1)", "-0.0001"]),
    ({"weight_decay": 1.0}, "training.weight_decay", ["[0, 1)", "1.0"]),
    ({"weight_decay": True}, "training.weight_decay", ["True"]),
    ({"weight_decay": float("nan")}, "training.weight_decay", ["nan"]),
])
def test_a_bad_decay_is_refused_naming_the_field_and_value(training, path, words):
    with pytest.raises(ConfigError) as info:
        expand(parse_sweep({**BASE, "training": training}))
    message = str(info.value)
    assert message.startswith(path), message
    for word in words:
        assert word in message, message


def test_the_defaults_keep_every_committed_run_hash():
    """A run whose config omits both fields and one that states their defaults hash alike, and every run of a
    committed sweep still has the hash its runs.csv recorded."""
    explicit = expand(parse_sweep({**BASE, "training": {"lr_decay": "constant", "weight_decay": 0.0}}))
    omitted = expand(parse_sweep(BASE))
    assert [config_hash(r) for r in explicit] == [config_hash(r) for r in omitted]
    decayed = expand(parse_sweep({**BASE, "training": {"lr_decay": "cosine"}}))
    assert config_hash(decayed[0]) != config_hash(omitted[0])
    runs = REPO / "results" / "fmnist_lenet300" / "runs"
    checked = 0
    with open(REPO / "results" / "fmnist_lenet300" / "runs.csv", newline="") as f:
        for row in list(csv.DictReader(f))[:5]:
            config = json.loads((runs / row["run_id"] / "config.json").read_text())
            assert config_hash(from_dict(RunConfig, config["run"])) == row["config_hash"] == config["config_hash"]
            checked += 1
    assert checked == 5


def test_cosine_decay_falls_from_the_rate_to_zero_over_the_run():
    config = TrainingConfig(learning_rate=0.1, epochs=2, lr_decay="cosine")
    schedule = learning_rate(config, keras, steps_per_epoch=50)  # 100 steps
    values = [float(schedule(step)) for step in (0, 50, 100, 150)]
    np.testing.assert_allclose(values, [0.1, 0.05, 0.0, 0.0], atol=1e-7)


def test_step_decay_is_a_tenth_after_half_and_a_hundredth_after_three_quarters():
    config = TrainingConfig(learning_rate=0.1, epochs=4, lr_decay="step")
    schedule = learning_rate(config, keras, steps_per_epoch=10)  # 40 steps: boundaries 20 and 30
    values = [float(schedule(step)) for step in (0, 20, 21, 30, 31, 39)]
    np.testing.assert_allclose(values, [0.1, 0.1, 0.01, 0.01, 0.001, 0.001], rtol=1e-6)


def test_a_constant_rate_is_a_float_and_a_decay_needs_the_steps():
    assert learning_rate(TrainingConfig(learning_rate=0.5), keras, 7) == 0.5
    with pytest.raises(ValueError, match=r"lr_decay='cosine' needs steps_per_epoch \(a positive int\), got None"):
        make_optimizer(TrainingConfig(lr_decay="cosine"), keras)


@pytest.mark.parametrize("optimizer", ["adam", "sgd", "momentum"])
def test_weight_decay_reaches_the_optimizer_and_pruned_weights_stay_exactly_zero(optimizer):
    config = TrainingConfig(optimizer=optimizer, learning_rate=0.05, lr_decay="cosine", weight_decay=0.1)
    opt = make_optimizer(config, keras, steps_per_epoch=4)
    assert opt.weight_decay == pytest.approx(0.1)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(5), keras.layers.Dense(3)])
    pruned = prune.prune_low_magnitude(model, prune.ConstantSparsity(0.5, 0))
    pruned.compile(opt, loss="mse")
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((16, 6)).astype("float32"), rng.standard_normal((16, 3)).astype("float32")
    before = [layer.kernel.numpy().copy() for layer in prune.prunable_layers(pruned)]
    pruned.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[prune.UpdatePruningStep()])
    for layer, old in zip(prune.prunable_layers(pruned), before):
        kernel, mask = layer.kernel.numpy(), layer.kernel_mask.numpy()
        assert (mask == 0).sum() == int(np.round(kernel.size * 0.5))  # 15 of 30, 8 of 15 (half to even)
        np.testing.assert_array_equal(kernel[mask == 0], 0.0)  # exactly zero, under decay
        assert not np.array_equal(kernel[mask == 1], old[mask == 1])  # the live weights trained
