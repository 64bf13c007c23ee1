"""The architectures, built with whichever Keras the process has.

:func:`build` takes the Keras module as an argument so that the same code
builds the Keras 3 model (dense, masked, sparse_tensor) and the tf-keras model
of the tfmot baseline, which lives in its own process. Initial weights come
from numpy, seeded by the run seed (:func:`initial_weights`), so every
implementation starts from bit-identical weights whatever Keras RNG it has.

Layers are named ``dense_0, dense_1, ...`` and ``conv_0, ...`` so that per-layer
results line up across implementations.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from typing import TYPE_CHECKING

from experiments import axes
from experiments.axis_registry import resolve

if TYPE_CHECKING:
    from experiments.config import ModelConfig

__all__ = ["MHA_KERNELS", "build", "initial_weights", "hidden_widths", "layer_positions", "lenet5_stem", "mobilenet_stem"]


MHA_KERNELS = ("query", "key", "value", "output")
"""``MultiHeadAttention``'s projections, whose kernels a report names ``query_kernel`` ... (as ``prune``'s)."""


def hidden_widths(config: ModelConfig) -> tuple[int, ...]:
    """Hidden Dense widths: the registered model's fixed ones (lenet300: 300, 100) or ``config.widths``."""
    fixed = axes.MODELS.get(config.name).hidden
    return tuple(config.widths) if fixed is None else fixed


def lenet5_stem(keras: Any, input_shape: tuple[int, ...], config: ModelConfig | None = None) -> list[Any]:
    """lenet5's convolutions: conv(6, 5x5, same)-maxpool-conv(16, 5x5, same)-maxpool-flatten."""
    if len(input_shape) != 3:
        raise ValueError(f"lenet5 needs image inputs (H, W, C), got shape {tuple(input_shape)}")
    L = keras.layers
    return [
        L.Conv2D(6, 5, padding="same", activation="relu", name="conv_0"),
        L.MaxPooling2D(2, name="pool_0"),
        L.Conv2D(16, 5, padding="same", activation="relu", name="conv_1"),
        L.MaxPooling2D(2, name="pool_1"),
        L.Flatten(name="flatten"),
    ]


MOBILENET_BLOCKS = ((1, 64), (2, 128), (1, 128), (2, 256), (1, 256))
"""``(depthwise stride, pointwise filters)`` of mobilenet's depthwise-separable blocks at ``alpha = 1``: MobileNet
v1's first five (Howard et al. 2017, Table 1): two stride-2 blocks take 28 x 28 inputs to 7 x 7 (224 x 224 ImageNet
inputs reach 28 x 28 there, after MobileNet's stride-2 first convolution, which this stem does not have)."""


def mobilenet_stem(keras: Any, input_shape: tuple[int, ...], config: ModelConfig | None = None) -> list[Any]:
    """A MobileNet-v1-style stem: conv(32a, 3x3) then depthwise-separable blocks, global average pooling.

    Each block is a 3 x 3 ``DepthwiseConv2D`` (``dw_i``; stays dense, as in every pruning run here) and a 1 x 1
    ``Conv2D`` (``conv_{i+1}``, pruned), each followed by batch normalisation and ReLU6; the first
    convolution ``conv_0`` (stride 1, to keep 28 x 28 inputs at 28 x 28) is kept dense by the model
    (``keep_dense``, as Zhu & Gupta keep MobileNet's first layer). Channels are ``max(8, round(a * c))`` for the
    width multiplier ``a = config.alpha`` (Howard et al. 2017). Convolutions carry no bias (BN has one).
    """
    if len(input_shape) != 3:
        raise ValueError(f"mobilenet needs image inputs (H, W, C), got shape {tuple(input_shape)}")
    alpha = 1.0 if config is None else config.alpha
    L = keras.layers

    def width(c: int) -> int:
        return max(8, int(round(alpha * c)))

    layers = [L.Conv2D(width(32), 3, padding="same", use_bias=False, name="conv_0"),
              L.BatchNormalization(name="bn_0"), L.ReLU(6.0, name="relu_0")]
    for i, (stride, filters) in enumerate(MOBILENET_BLOCKS, start=1):
        layers += [L.DepthwiseConv2D(3, strides=stride, padding="same", use_bias=False, name=f"dw_{i}"),
                   L.BatchNormalization(name=f"dw_bn_{i}"), L.ReLU(6.0, name=f"dw_relu_{i}"),
                   L.Conv2D(width(filters), 1, use_bias=False, name=f"conv_{i}"),
                   L.BatchNormalization(name=f"bn_{i}"), L.ReLU(6.0, name=f"relu_{i}")]
    return layers + [L.GlobalAveragePooling2D(name="flatten")]


def build(config: ModelConfig, input_shape: tuple[int, ...], n_classes: int, keras: Any) -> Any:
    """A Sequential model for ``config`` (not compiled, weights not yet set); a functional one for a model with a
    ``builder`` (``vit``, ``mixer``: :mod:`experiments.transformers`).

    lenet300 and mlp flatten the input, then Dense+ReLU layers, then a Dense
    softmax. lenet5 is conv(6, 5x5, same)-maxpool-conv(16, 5x5, same)-maxpool-
    dense 120-dense 84-dense classes; both convolutions use ``same`` padding
    (classic LeNet-5 has a ``valid`` second one) so it also fits 8x8 digits.

    Args:
        config: The architecture.
        input_shape: Shape of one example.
        n_classes: Output width.
        keras: The ``keras`` module (Keras 3) or ``tf_keras``.
    """
    L = keras.layers
    spec = axes.MODELS.get(config.name)
    if spec.builder:  # a whole functional model (the transformers: blocks with residual connections)
        return resolve(spec.builder)(keras, config, tuple(input_shape), n_classes)
    layers: list[Any] = [keras.Input(shape=tuple(input_shape))]
    layers += resolve(spec.stem)(keras, tuple(input_shape), config) if spec.stem else [L.Flatten(name="flatten")]
    widths = hidden_widths(config)
    for i, w in enumerate(widths):
        layers.append(L.Dense(w, activation="relu", name=f"dense_{i}"))
    layers.append(L.Dense(n_classes, activation="softmax", name=f"dense_{len(widths)}"))
    return keras.Sequential(layers, name=config.label.replace("-", "_"))


def initial_weights(model: Any, seed: int) -> list[np.ndarray]:
    """Glorot-uniform kernels and zero biases from numpy, in ``model.get_weights()`` order (``N(0, 0.02)`` for vit's
    position table).

    Batch normalisation starts as Keras starts it: ``gamma`` and ``moving_variance`` ones, ``beta`` and
    ``moving_mean`` zeros.
    """
    rng = np.random.default_rng([seed, 1234])
    out = []
    names = [v.name.split("/")[-1].split(":")[0] for v in model.weights]  # Keras 3: "gamma"; tf-keras: ".../gamma:0"
    for w, name in zip(model.get_weights(), names, strict=True):
        if w.ndim == 1 and name in ("gamma", "moving_variance"):
            out.append(np.ones_like(w))
        elif name == "bias":  # 2-D in an attention projection ([heads, head_dim]): zeros all the same
            out.append(np.zeros_like(w))
        elif name == "positions":  # vit's learned position table: N(0, 0.02), as ViT's
            out.append(rng.normal(0.0, 0.02, size=w.shape).astype(w.dtype))
        elif w.ndim >= 2:
            receptive = int(np.prod(w.shape[:-2])) if w.ndim > 2 else 1
            fan_in, fan_out = w.shape[-2] * receptive, w.shape[-1] * receptive
            limit = np.sqrt(6.0 / (fan_in + fan_out))
            out.append(rng.uniform(-limit, limit, size=w.shape).astype(w.dtype))
        else:
            out.append(np.zeros_like(w))
    return out


def layer_positions(model: Any) -> dict[str, float]:
    """Times each kernel is applied per example (:func:`prune.core.counting.applications`, as ``prune.sparsity_report``
    counts): 1 for Dense on ``[batch, features]`` (the tokens on ``[batch, tokens, features]``), the output positions
    H*W for Conv2D; by ``layer/query_kernel`` ... for a ``MultiHeadAttention`` layer's four kernels. Keras 3 or
    tf-keras layers."""
    from prune.core.counting import applications

    out: dict[str, float] = {}
    for layer in model.layers:
        name = getattr(layer, "base_name", None) or layer.name
        if hasattr(layer, "kernel"):
            out[name] = applications(layer, "kernel")
        elif all(hasattr(layer, f"{p}_dense") for p in MHA_KERNELS):
            out.update({f"{name}/{p}_kernel": applications(layer, f"{p}_kernel") for p in MHA_KERNELS})
    return out


def seeded_model(run: Any, data: Any, keras_module: Any) -> tuple[Any, dict[str, float]]:
    """Fresh session, seeds, op determinism, then the run's plain model with its numpy initial weights.

    Shared by the Keras 3 implementations and the tfmot baseline (``keras_module``
    is ``keras`` or ``tf_keras``), so every implementation starts identically.

    Returns:
        ``(model, layer_positions(model))``.
    """
    import tensorflow as tf

    keras_module.backend.clear_session()
    keras_module.utils.set_random_seed(run.seed)
    tf.config.experimental.enable_op_determinism()
    plain = build(run.model, data.input_shape, data.n_classes, keras_module)
    plain.set_weights(initial_weights(plain, run.seed))
    return plain, layer_positions(plain)
