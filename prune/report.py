"""Per-weight sparsity report as a tidy pandas DataFrame."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from prune.layers.masked import is_masked_layer
from prune.pruning import iter_layers
from prune.registry import unsupported

__all__ = ["sparsity_report", "REPORT_COLUMNS"]

REPORT_COLUMNS = [
    "layer",
    "weight",
    "shape",
    "nnz",
    "size",
    "sparsity",
    "dense_flops",
    "nonzero_flops",
    "dense_bytes",
    "status",
]


def _output_positions(layer: Any) -> float:
    """How many times the kernel is applied per example (1 for Dense, H*W for Conv2D)."""
    kind = type(layer).__mro__
    names = {c.__name__ for c in kind}
    if "Embedding" in names:
        return 0.0  # a lookup: no multiply-adds
    if not ({"Conv1D", "Conv2D", "Conv3D"} & names):
        return 1.0
    try:
        shape = layer.compute_output_shape(layer.get_build_config()["input_shape"])
    except Exception:  # noqa: BLE001 - unknown spatial size: FLOPs unknown, not wrong
        return float("nan")
    spatial = shape[1:-1] if getattr(layer, "data_format", "channels_last") == "channels_last" else shape[2:]
    return float(np.prod([d for d in spatial if d is not None]))


def sparsity_report(model: Any) -> pd.DataFrame:
    """One row per prunable weight, and one per weight of an unsupported layer.

    Columns:
        layer, weight, shape: where the weight is.
        nnz, size, sparsity: nonzeros of the *stored* weight, entries, 1 - nnz/size.
        dense_flops, nonzero_flops: FLOPs per example (2 per multiply-add) of the
            dense weight and of its nonzeros; 0 for embedding lookups, NaN when
            a convolution's output size is unknown.
        dense_bytes: bytes of the weight stored densely.
        status: ``"pruned"`` (has a mask), ``"sparse"`` (a ``SparseDense``) or
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
        positions = _output_positions(layer)
        for name, w in names:
            value = np.asarray(w.numpy())
            nnz = int(np.count_nonzero(value))
            rows.append(
                dict(
                    layer=layer.name,
                    weight=name,
                    shape=tuple(int(d) for d in value.shape),
                    nnz=nnz,
                    size=int(value.size),
                    sparsity=1.0 - nnz / value.size if value.size else 0.0,
                    dense_flops=2.0 * value.size * positions,
                    nonzero_flops=2.0 * nnz * positions,
                    dense_bytes=int(value.nbytes),
                    status=status,
                )
            )
    return pd.DataFrame(rows, columns=REPORT_COLUMNS)


def _sparse_row(layer: Any) -> dict[str, Any]:
    """A SparseDense weight: stored entries are its indices; nnz counts nonzero stored values."""
    n_in, n_out = (int(d) for d in layer.dense_shape)
    values = np.asarray(layer.values.numpy())
    nnz = int(np.count_nonzero(values))
    size = n_in * n_out
    return dict(
        layer=layer.name,
        weight="kernel",
        shape=(n_in, n_out),
        nnz=nnz,
        size=size,
        sparsity=1.0 - nnz / size if size else 0.0,
        dense_flops=2.0 * size,
        nonzero_flops=2.0 * nnz,
        dense_bytes=size * values.dtype.itemsize,
        status="sparse",
    )
