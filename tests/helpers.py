"""Small real models and data shared by the tests."""

from __future__ import annotations

import keras
import numpy as np


def mixed_model(seed: int = 0) -> keras.Model:
    """Functional model with Embedding, Conv1D and Dense: every 1-D prunable kind."""
    keras.utils.set_random_seed(seed)
    ids = keras.Input((6,), dtype="int32")
    x = keras.layers.Embedding(20, 4, name="emb")(ids)
    x = keras.layers.Conv1D(5, 3, activation="relu", name="conv")(x)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dense(8, activation="tanh", name="hidden")(x)
    out = keras.layers.Dense(3, name="out")(x)
    return keras.Model(ids, out)


def mixed_data(n: int = 64, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 20, size=(n, 6)).astype("int32")
    y = (x.sum(axis=1) % 3).astype("int32")
    return x, y


def mlp(seed: int = 0, inputs: int = 12, hidden: int = 16, classes: int = 3) -> keras.Sequential:
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((inputs,)),
            keras.layers.Dense(hidden, activation="relu", name="fc1"),
            keras.layers.Dense(classes, name="fc2"),
        ]
    )


def mlp_data(n: int = 64, inputs: int = 12, classes: int = 3, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, inputs)).astype("float32")
    y = rng.integers(0, classes, size=n).astype("int32")
    return x, y


def masked_train_step(model: keras.Model, optimizer, loss_fn):
    """A custom-loop training step (``tf.function``) through ``prune.apply_masked_gradients``; returns the loss."""
    import tensorflow as tf

    import prune

    @tf.function
    def train_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        prune.apply_masked_gradients(optimizer, zip(grads, model.trainable_variables), model)
        return loss

    return train_step
