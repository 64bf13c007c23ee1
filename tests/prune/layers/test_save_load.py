"""Weights, masks and the step counter round-trip together; save, load and continue
equals an uninterrupted run."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import prune
from tests.helpers import mixed_data, mixed_model

SCHEDULE = prune.PolynomialDecay(0.0, 0.8, begin_step=2, end_step=14, frequency=2)


def _fresh():
    model = prune.prune_low_magnitude(mixed_model(seed=3), SCHEDULE, criterion="magnitude")
    model.compile(keras.optimizers.Adam(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _fit(model, x, y, epochs):
    model.fit(x, y, batch_size=8, epochs=epochs, shuffle=False, verbose=0, callbacks=[prune.UpdatePruningStep()])


def _state(model):
    return [v.numpy() for v in model.weights]


def _assert_same(a, b):
    assert len(a) == len(b)
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)


@pytest.fixture(scope="module")
def uninterrupted():
    x, y = mixed_data(64)
    model = _fresh()
    _fit(model, x, y, epochs=2)  # 16 steps: masks change at 2, 4, ..., 14
    return x, y, _state(model), model.predict(x, verbose=0)


def test_keras_file_round_trip_and_continue(tmp_path, uninterrupted):
    x, y, final_state, final_pred = uninterrupted
    model = _fresh()
    _fit(model, x, y, epochs=1)
    path = tmp_path / "m.keras"
    model.save(path)
    loaded = keras.models.load_model(path)  # masked layers are registered: no custom_objects needed
    _assert_same(_state(model), _state(loaded))
    np.testing.assert_array_equal(model.predict(x, verbose=0), loaded.predict(x, verbose=0))
    assert prune.get_step(loaded) == 8
    assert loaded.layers[-1].pruning_schedule == SCHEDULE
    _fit(loaded, x, y, epochs=1)  # optimizer state came back with the file
    _assert_same(final_state, _state(loaded))
    np.testing.assert_array_equal(final_pred, loaded.predict(x, verbose=0))


def test_tf_checkpoint_round_trip_and_continue(tmp_path, uninterrupted):
    x, y, final_state, _ = uninterrupted
    model = _fresh()
    _fit(model, x, y, epochs=1)
    ckpt = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
    path = ckpt.write(str(tmp_path / "ckpt"))
    other = _fresh()
    other.build((None, 6))
    other.optimizer.build(other.trainable_variables)
    tf.train.Checkpoint(model=other, optimizer=other.optimizer).read(path).assert_consumed()
    _assert_same(_state(model), _state(other))
    assert prune.get_step(other) == 8
    _fit(other, x, y, epochs=1)
    _assert_same(final_state, _state(other))


def test_save_weights_round_trip(tmp_path):
    x, y = mixed_data(32)
    model = _fresh()
    _fit(model, x, y, epochs=2)  # 8 steps: masks updated at 2 (to 0%), 4 and 6
    path = tmp_path / "m.weights.h5"
    model.save_weights(path)
    other = _fresh()
    other.build((None, 6))
    other.load_weights(path)
    _assert_same(_state(model), _state(other))
    masks = [l.get_masks() for l in prune.prunable_layers(other)]
    assert all((~m).any() for d in masks for m in d.values())  # masks came back, not all-ones
    assert prune.get_step(other) == 8
