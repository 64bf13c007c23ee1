"""Per-weight sparsity report as a tidy pandas DataFrame."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from prune.core.counting import REPORT_COLUMNS, applications, weight_row
from prune.layers.masked import is_masked_layer
from prune.core.targets import iter_layers
from prune.layers.registry import unsupported

__all__ = ["sparsity_report"]


def sparsity_report(model: Any) -> pd.DataFrame:
    """One row per prunable weight, and one per weight of an unsupported layer.

    Columns:
        layer, weight, shape: where the weight is.
        nnz, size, sparsity: nonzeros of the *stored* weight, entries, 1 - nnz/size.
        dense_flops, nonzero_flops: FLOPs per example (2 per multiply-add) of the
            dense weight and of its nonzeros, counting every application of the
            weight (a convolution's output positions, a transposed convolution's
            input positions, an RNN's timesteps, an attention projection's
            sequence length, the rows of a Dense layer's leading dimensions); 0
            for embedding lookups; NaN when a size is unknown or the layer is of
            a kind the report cannot count (the weights of an unsupported
            layer such as ``ConvLSTM1D``).
        dense_bytes: bytes of the weight stored densely.
        status: ``"pruned"`` (has a mask), ``"sparse"`` (a ``SparseDense`` or one of its subclasses:
            ``SparseConv2D``, ``SparseEinsumDense``, each of ``SparseMultiHeadAttention``'s projections) or
            ``"dense (unsupported)"``.
    """
    units = [
        (layer, [(n, layer.weight_and_mask(n)[0]) for n in layer.prunable_weight_names], "pruned")
        for layer in iter_layers(model)
        if is_masked_layer(layer) and layer.built
    ]
    units += [(layer, [(w.name, w) for w in weights], "dense (unsupported)") for layer, weights in unsupported(model)]
    rows = [_sparse_row(layer) for layer in iter_layers(model) if hasattr(layer, "sparse_weight") and layer.built]
    for layer, names, status in units:
        for name, w in names:
            rows.append(weight_row(layer.name, name, w.numpy(), applications(layer, name), status))
    return pd.DataFrame(rows, columns=REPORT_COLUMNS)


def _sparse_row(layer: Any) -> dict[str, Any]:
    """A SparseDense (or subclass) weight: stored entries are its indices; nnz counts nonzero stored values."""
    n_in, n_out = (int(d) for d in layer.dense_shape)
    values = np.asarray(layer.values.numpy())
    nnz = int(np.count_nonzero(values))
    size = n_in * n_out  # the weight's size: a SparseConv2D's or SparseEinsumDense's kernel read as a matrix
    positions = applications(layer, "kernel")
    return dict(
        layer=layer.name,
        weight="kernel",
        shape=tuple(int(d) for d in layer.weight_shape),
        nnz=nnz,
        size=size,
        sparsity=1.0 - nnz / size if size else 0.0,
        dense_flops=2.0 * size * positions,
        nonzero_flops=2.0 * nnz * positions,
        dense_bytes=size * values.dtype.itemsize,
        status="sparse",
    )
