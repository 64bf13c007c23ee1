"""Keras 3 layers of the framework: masked (and, as they land, sparse and partially frozen) layers."""

from prune.layers.frozen import PartiallyFrozenEmbedding
from prune.layers.sparse import SparseDense
from prune.layers.masked import MaskedConv1D, MaskedConv2D, MaskedDense, MaskedEmbedding, PrunableLayer, PruneLowMagnitude

__all__ = ["SparseDense", "PartiallyFrozenEmbedding", "PrunableLayer", "MaskedDense", "MaskedConv1D", "MaskedConv2D", "MaskedEmbedding", "PruneLowMagnitude"]

_MORE = (
    "MaskedConv3D",
    "MaskedConv2DTranspose",
    "MaskedConv3DTranspose",
    "MaskedSeparableConv1D",
    "MaskedSeparableConv2D",
    "MaskedMultiHeadAttention",
    "MaskedSimpleRNN",
    "MaskedGRU",
    "MaskedLSTM",
    "MaskedRNN",
)


def __getattr__(name: str):  # the masked_more classes: imported by ``import prune``, after the registry
    if name in _MORE:
        from prune.layers import masked_more

        return getattr(masked_more, name)
    raise AttributeError(f"module 'prune.layers' has no attribute {name!r}")
