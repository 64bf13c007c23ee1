"""What held under stress stays held: mixed precision, XLA and MirroredStrategy keep pruned weights exactly zero.

(Save -> load -> continue, bitwise equal to an uninterrupted run, for ``.keras``
and ``tf.train.Checkpoint``: tests/prune/layers/test_save_load.py.)
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import keras
import numpy as np
import pytest

import prune
from tests.helpers import mlp, mlp_data

REPO = Path(__file__).resolve().parents[3]
SCHEDULE = prune.PolynomialDecay(0.0, 0.75, begin_step=0, end_step=12, frequency=4)


def _train(jit_compile: bool = False) -> keras.Model:
    model = prune.prune_low_magnitude(mlp(seed=2), SCHEDULE)
    model.compile(keras.optimizers.Adam(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=jit_compile)
    x, y = mlp_data(64)
    model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=[prune.UpdatePruningStep()])
    return model


def _assert_pruned_exactly(model: keras.Model, sparsity: float) -> None:
    for layer in prune.prunable_layers(model):
        for name in layer.prunable_weight_names:
            weight, mask = layer.weight_and_mask(name)
            w, m = np.asarray(weight.value), np.asarray(mask.value)
            assert (m == 0).mean() == pytest.approx(sparsity, abs=1 / m.size), (layer.name, name)
            pruned = w[m == 0]
            assert np.all(pruned == 0) and not np.signbit(pruned).any(), (layer.name, name)  # +0.0, bitwise


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_keeps_pruned_weights_exactly_zero(policy):
    before = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        model = _train()
    finally:
        keras.config.set_dtype_policy(before)
    assert model.layers[0].compute_dtype == policy.split("_")[1]
    assert np.asarray(prune.prunable_layers(model)[0].weight_and_mask("kernel")[0].value).dtype == np.float32
    _assert_pruned_exactly(model, 0.75)


def test_jit_compile_keeps_pruned_weights_exactly_zero_and_the_same_masks():
    xla, plain = _train(jit_compile=True), _train(jit_compile=False)
    _assert_pruned_exactly(xla, 0.75)
    for a, b in zip(prune.prunable_layers(xla), prune.prunable_layers(plain)):
        np.testing.assert_array_equal(np.asarray(a.weight_and_mask("kernel")[1].value),
                                      np.asarray(b.weight_and_mask("kernel")[1].value))


MIRRORED = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import keras
    import prune
    from prune._internals import backing_variable
    from tests.helpers import mlp, mlp_data

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model = prune.prune_low_magnitude(mlp(seed=2), prune.PolynomialDecay(0.0, 0.75, begin_step=0, end_step=12,
                                                                             frequency=4))
        model.compile(keras.optimizers.Adam(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = mlp_data(64)
    model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=[prune.UpdatePruningStep()])
    out = {"replicas": strategy.num_replicas_in_sync, "layers": {}}
    for layer in prune.prunable_layers(model):
        weight, mask = layer.weight_and_mask("kernel")
        ws = [v.numpy() for v in strategy.experimental_local_results(backing_variable(weight))]
        ms = [v.numpy() for v in strategy.experimental_local_results(backing_variable(mask))]
        out["layers"][layer.name] = {
            "copies": len(ms),
            "masks_equal": all(np.array_equal(ms[0], m) for m in ms),
            "weights_equal": all(np.array_equal(ws[0], w) for w in ws),
            "sparsity": [float((m == 0).mean()) for m in ms],
            "pruned_nonzero": [int(np.count_nonzero(w[m == 0])) for w, m in zip(ws, ms)],
            "pruned_negative_zero": [int(np.signbit(w[m == 0]).sum()) for w, m in zip(ws, ms)],
        }
    print(json.dumps(out))
    """
)


@pytest.mark.slow
def test_mirrored_strategy_on_two_cpus_keeps_replicas_equal_and_pruned_weights_zero():
    import json

    out = subprocess.run([sys.executable, "-c", MIRRORED], cwd=REPO, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["replicas"] == 2
    assert result["layers"]
    for name, layer in result["layers"].items():
        assert layer["copies"] == 2, name
        assert layer["masks_equal"] and layer["weights_equal"], (name, layer)
        assert all(abs(s - 0.75) <= 0.02 for s in layer["sparsity"]), (name, layer)
        assert layer["pruned_nonzero"] == [0, 0] and layer["pruned_negative_zero"] == [0, 0], (name, layer)
