"""Files saved by an earlier version load with today's code: a ``.keras`` pruned model, a ``tf.train.Checkpoint``
of it, and a ``SparseDense`` model (tests/fixtures/compat, written at commit 09e7a03 by
tests/fixtures/make_compat_fixtures.py, before the mask-target protocol and the distribution registry)."""

from __future__ import annotations

from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

import prune

# Written by tests/fixtures/make_compat_fixtures.py with the code of each commit: 09e7a03 (before the mask-target
# protocol and the distribution registry) and dd60273 (before issue 32's folders, algorithm base and layer contract).
FIXTURE_DIRS = {commit: Path(__file__).resolve().parents[2] / "fixtures" / name
                for commit, name in (("09e7a03", "compat"), ("dd60273", "compat_dd60273"))}


@pytest.fixture(params=sorted(FIXTURE_DIRS))
def FIXTURES(request):
    """The fixtures written at one commit."""
    return FIXTURE_DIRS[request.param]


def _plain() -> keras.Model:
    return keras.Sequential(
        [
            keras.Input((6, 6, 1)),
            keras.layers.Conv2D(4, 3, name="conv"),
            keras.layers.Flatten(name="flat"),
            keras.layers.Dense(12, activation="relu", name="fc"),
            keras.layers.Dense(3, name="out"),
        ]
    )


def test_an_older_keras_file_loads_predicts_and_keeps_pruning(FIXTURES):
    expected = np.load(FIXTURES / "expected.npz")
    model = keras.models.load_model(FIXTURES / "masked.keras")
    np.testing.assert_allclose(model.predict(expected["x"], verbose=0), expected["masked"], rtol=1e-6, atol=1e-6)
    layers = prune.prunable_layers(model)
    assert [layer.name for layer in layers] == ["conv", "fc", "out"]
    for layer in layers:
        np.testing.assert_array_equal(layer.get_masks()["kernel"], expected[f"mask_{layer.name}"])
    # The schedule came along; the engine (now through mask targets) moves the loaded masks on to 0.75.
    assert prune.get_step(model) == 4
    prune.update_masks(model, 4)
    for layer in layers:
        keep = layer.get_masks()["kernel"]
        assert abs(1.0 - keep.mean() - 0.75) < 0.05 and not np.asarray(layer.kernel)[~keep].any()
        assert (keep <= expected[f"mask_{layer.name}"]).all()  # masks only shrink


def test_an_older_checkpoint_restores_into_a_model_built_today(FIXTURES):
    expected = np.load(FIXTURES / "expected.npz")
    model = prune.prune_low_magnitude(_plain(), prune.PolynomialDecay(0.0, 0.75, begin_step=0, end_step=4, frequency=2))
    tf.train.Checkpoint(model=model).read(str(FIXTURES / "masked_ckpt")).assert_existing_objects_matched()
    np.testing.assert_allclose(model.predict(expected["x"], verbose=0), expected["masked"], rtol=1e-6, atol=1e-6)
    for layer in prune.prunable_layers(model):
        np.testing.assert_array_equal(layer.get_masks()["kernel"], expected[f"mask_{layer.name}"])


def test_an_older_sparse_dense_file_loads_and_predicts(FIXTURES):
    expected = np.load(FIXTURES / "expected.npz")
    model = keras.models.load_model(FIXTURES / "sparse.keras")
    np.testing.assert_allclose(model.predict(expected["xs"], verbose=0), expected["sparse"], rtol=1e-5, atol=1e-6)
    (target,) = prune.core.targets.mask_targets(model)
    assert target.key == "sd/kernel" and not target.stores_dense and target.keep.shape == (6, 5)
