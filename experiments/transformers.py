"""The runner's transformers, built from Keras layers: a small ViT and an MLP-Mixer for 28 x 28 images.

Both cut the image into ``patch x patch`` patches, embed each with one ``Conv2D`` of kernel and stride ``patch``
(``conv_0``: the per-patch linear map of both papers), and end with layer normalisation, the mean over tokens and
a softmax ``Dense`` (``dense_head``). Blocks are pre-norm with residual connections:

* ``vit`` (Dosovitskiy et al., "An Image is Worth 16x16 Words", ICLR 2021): learned position embeddings added to
  the tokens; each block ``x + MHA(LN(x))`` then ``x + MLP(LN(x))``, the MLP ``Dense(2 dim, gelu)-Dense(dim)``.
  The mean over tokens replaces the class token (the paper's Appendix D.3 finds the two equal when the learning
  rate suits each).
* ``mixer`` (Tolstikhin et al., "MLP-Mixer: An all-MLP Architecture for Vision", NeurIPS 2021): each block
  ``x + T(MLP_tok(T(LN(x))))`` (``T``: swap tokens and channels; ``MLP_tok``: ``Dense(dim / 2, gelu)-Dense(tokens)``)
  then ``x + MLP(LN(x))`` as ViT's. The hidden widths follow Mixer-S's ratios for the token MLP (256 of 512) and
  ViT's MLP ratio here.

Layer names, so that per-layer results line up across runs: ``conv_0``, ``positions``, ``block_{i}_ln_{0,1}``,
``block_{i}_attn`` (vit) or ``block_{i}_token_{0,1}`` (mixer), ``block_{i}_mlp_{0,1}``, ``ln_head``,
``dense_head``.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from experiments.config import ModelConfig

__all__ = ["vit", "mixer", "positions_layer"]


@functools.lru_cache(maxsize=None)
def positions_layer() -> type:
    """``LearnedPositions``: adds a learned ``[tokens, dim]`` table to its input (ViT's position embedding).

    A Keras 3 layer registered for ``.keras`` files (package ``experiments``); made on first use, so that importing
    this module does not import Keras.
    """
    import keras

    @keras.saving.register_keras_serializable(package="experiments")
    class LearnedPositions(keras.layers.Layer):
        """``x + P`` for a learned ``P`` of shape ``x.shape[1:]``, initialised ``N(0, 0.02)`` as ViT's."""

        def build(self, input_shape: Any) -> None:
            self.positions = self.add_weight(name="positions", shape=tuple(input_shape[1:]),
                                             initializer=keras.initializers.RandomNormal(stddev=0.02))

        def call(self, x: Any) -> Any:
            return x + self.positions

        def get_prunable_weights(self) -> list[Any]:
            """None: the table stays dense (tfmot's contract), as ViT pruning work leaves embeddings."""
            return []

    return LearnedPositions


def _tokens(keras: Any, config: ModelConfig, input_shape: tuple[int, ...]) -> tuple[Any, Any, int]:
    """``(inputs, tokens [batch, n, dim], n)``: the patch embedding."""
    if len(input_shape) != 3:
        raise ValueError(f"{config.name} needs image inputs (H, W, C), got shape {tuple(input_shape)}")
    h, w, _ = input_shape
    if h % config.patch or w % config.patch:
        raise ValueError(f"patch {config.patch} must divide the image's sides {h} x {w} ({config.name})")
    L = keras.layers
    inputs = keras.Input(shape=tuple(input_shape))
    x = L.Conv2D(config.dim, config.patch, strides=config.patch, name="conv_0")(inputs)
    n = (h // config.patch) * (w // config.patch)
    return inputs, L.Reshape((n, config.dim), name="to_tokens")(x), n


def _mlp(keras: Any, x: Any, hidden: int, out: int, name: str) -> Any:
    L = keras.layers
    x = L.Dense(hidden, activation="gelu", name=f"{name}_0")(x)
    return L.Dense(out, name=f"{name}_1")(x)


def _head(keras: Any, config: ModelConfig, inputs: Any, x: Any, n_classes: int) -> Any:
    L = keras.layers
    x = L.LayerNormalization(epsilon=1e-6, name="ln_head")(x)
    x = L.GlobalAveragePooling1D(name="pool")(x)
    out = L.Dense(n_classes, activation="softmax", name="dense_head")(x)
    return keras.Model(inputs, out, name=config.label.replace("-", "_"))


def vit(keras: Any, config: ModelConfig, input_shape: tuple[int, ...], n_classes: int) -> Any:
    """A small ViT: patch embedding, learned positions, ``config.depth`` pre-norm blocks, mean-pooled head.

    Args:
        keras: The Keras 3 module.
        config: ``patch``, ``dim``, ``depth``, ``heads``.
        input_shape: ``(H, W, C)``; ``patch`` divides ``H`` and ``W``.
        n_classes: Output width.

    Raises:
        ValueError: the input is not an image, or ``patch`` does not divide its sides.
    """
    L = keras.layers
    inputs, x, _ = _tokens(keras, config, input_shape)
    x = positions_layer()(name="positions")(x)
    for i in range(config.depth):
        y = L.LayerNormalization(epsilon=1e-6, name=f"block_{i}_ln_0")(x)
        y = L.MultiHeadAttention(config.heads, config.dim // config.heads, name=f"block_{i}_attn")(y, y)
        x = L.Add(name=f"block_{i}_add_0")([x, y])
        y = L.LayerNormalization(epsilon=1e-6, name=f"block_{i}_ln_1")(x)
        x = L.Add(name=f"block_{i}_add_1")([x, _mlp(keras, y, 2 * config.dim, config.dim, f"block_{i}_mlp")])
    return _head(keras, config, inputs, x, n_classes)


def mixer(keras: Any, config: ModelConfig, input_shape: tuple[int, ...], n_classes: int) -> Any:
    """An MLP-Mixer: patch embedding, ``config.depth`` token-mixing and channel-mixing blocks, mean-pooled head.

    Arguments and errors as :func:`vit`'s; ``config.heads`` is not used.
    """
    L = keras.layers
    inputs, x, n = _tokens(keras, config, input_shape)
    for i in range(config.depth):
        y = L.LayerNormalization(epsilon=1e-6, name=f"block_{i}_ln_0")(x)
        y = L.Permute((2, 1), name=f"block_{i}_to_channels")(y)
        y = _mlp(keras, y, max(config.dim // 2, 1), n, f"block_{i}_token")
        y = L.Permute((2, 1), name=f"block_{i}_to_tokens")(y)
        x = L.Add(name=f"block_{i}_add_0")([x, y])
        y = L.LayerNormalization(epsilon=1e-6, name=f"block_{i}_ln_1")(x)
        x = L.Add(name=f"block_{i}_add_1")([x, _mlp(keras, y, 2 * config.dim, config.dim, f"block_{i}_mlp")])
    return _head(keras, config, inputs, x, n_classes)
