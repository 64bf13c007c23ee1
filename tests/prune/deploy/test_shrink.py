"""prune.shrink: a channel-pruned LeNet-5 becomes a smaller plain model computing the same function."""

import keras
import numpy as np
import pytest

import prune


def _lenet5(padding="valid"):
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(6, 5, activation="relu", padding=padding, name="c1"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Conv2D(16, 5, activation="relu", name="c3"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Flatten(),
            keras.layers.Dense(120, activation="relu", name="f5"),
            keras.layers.Dense(84, activation="tanh", name="f6"),
            keras.layers.Dense(10, name="out"),
        ]
    )


def _channel_pruned(model):
    rng = np.random.default_rng(1)
    for layer in model.layers:  # nonzero biases, so removed units carry constants to fold
        if getattr(layer, "bias", None) is not None:
            layer.bias.assign(rng.normal(0, 0.5, layer.bias.shape).astype("float32"))
    pruned = prune.prune_low_magnitude(model, prune.OneShot(0.5, 0), pattern=prune.Channel())
    prune.update_masks(pruned, 0)
    return pruned


def test_shrunk_lenet5_computes_the_same_function():
    pruned = _channel_pruned(_lenet5())
    small = prune.shrink(pruned)
    report = prune.shrink_report(pruned)
    assert report["live_units"].tolist() == [3, 8, 60, 42, 10]  # round-half-even of 0.5 * (6, 16, 120, 84); outputs kept
    assert report["live_inputs"].tolist() == [1, 3, 8 * 16, 60, 42]
    assert small.count_params() == report["params"].sum() < pruned.count_params() // 2
    assert all(type(layer).__module__.startswith("keras") for layer in small.layers)
    x = np.random.default_rng(2).normal(size=(8, 28, 28, 1)).astype("float32")
    np.testing.assert_allclose(small.predict(x, verbose=0), pruned.predict(x, verbose=0), rtol=1e-5, atol=1e-5)


def test_shrink_refuses_same_padding_with_constants_and_other_layers():
    pruned = _channel_pruned(_lenet5())
    model = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Conv2D(4, 3, name="a"), keras.layers.Conv2D(2, 3, padding="same", name="b")])
    model.layers[0].bias.assign(np.ones(4, "float32"))
    kernel = model.layers[0].kernel.numpy()
    kernel[..., :2] = 0.0  # two units pruned, each outputs its bias 1.0
    model.layers[0].kernel.assign(kernel)
    with pytest.raises(ValueError, match=r"layer 'b' has padding='same'"):
        prune.shrink(model)
    norm = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.LayerNormalization(name="ln"), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match=r"shrink cannot pass layer 'ln' \(LayerNormalization\)"):
        prune.shrink(norm)
    assert prune.shrink_report(pruned)["units"].tolist() == [6, 16, 120, 84, 10]
