"""Keras 3 layers of the framework: masked (and, as they land, sparse and partially frozen) layers."""

from prune.layers.frozen import PartiallyFrozenEmbedding
from prune.layers.sparse import SparseDense
from prune.layers.masked import MaskedConv1D, MaskedConv2D, MaskedDense, MaskedEmbedding, PrunableLayer, PruneLowMagnitude

__all__ = ["SparseDense", "PartiallyFrozenEmbedding", "PrunableLayer", "MaskedDense", "MaskedConv1D", "MaskedConv2D", "MaskedEmbedding", "PruneLowMagnitude"]
