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


_TRANSPOSED = {"Conv1DTranspose", "Conv2DTranspose", "Conv3DTranspose"}
_SLIDING = {"Conv1D", "Conv2D", "Conv3D", "DepthwiseConv1D", "DepthwiseConv2D", "SeparableConv1D", "SeparableConv2D"}
_RECURRENT = {"SimpleRNN", "GRU", "LSTM", "RNN"}


def _product(dims: Any) -> float:
    dims = list(dims)
    return float("nan") if any(d is None for d in dims) else float(np.prod(dims))


def _spatial(layer: Any, shape: Any) -> float:
    shape = tuple(shape)
    return _product(shape[1:-1] if getattr(layer, "data_format", "channels_last") == "channels_last" else shape[2:])


def _applications(layer: Any, weight: str) -> float:
    """How many times per example each entry of ``layer``'s ``weight`` is multiplied.

    1 for ``Dense`` on ``[batch, features]`` (once per row of the leading
    dimensions otherwise); a convolution's output positions (a transposed
    convolution's input positions: each input position meets every kernel
    entry once); an RNN's timesteps, for its kernel and its recurrent kernel;
    for ``MultiHeadAttention``, the query's or the key's or value's length,
    by projection; 0 for an embedding lookup. NaN when a needed size is
    unknown or the layer is of another kind: unknown, not wrong.
    """
    names = {c.__name__ for c in type(layer).__mro__}
    if "Embedding" in names:
        return 0.0  # a lookup: no multiply-adds
    try:
        config = layer.get_build_config() or {}
    except Exception:  # noqa: BLE001 - no build config: sizes unknown
        config = {}
    if "MultiHeadAttention" in names:
        shapes = config.get("shapes_dict", {})
        query, value = shapes.get("query_shape"), shapes.get("value_shape")
        by_weight = {"query_kernel": query, "output_kernel": query, "value_kernel": value,
                     "key_kernel": shapes.get("key_shape") or value}
        shape = by_weight.get(weight)
        return float("nan") if shape is None else _product(tuple(shape)[1:-1])
    input_shape = config.get("input_shape")
    if input_shape is None:
        return float("nan")
    if names & _TRANSPOSED:
        return _spatial(layer, input_shape)
    if names & _SLIDING:
        try:
            return _spatial(layer, layer.compute_output_shape(input_shape))
        except Exception:  # noqa: BLE001 - unknown spatial size: FLOPs unknown, not wrong
            return float("nan")
    if names & _RECURRENT and not any(n.startswith("ConvLSTM") for n in names):
        return _product(tuple(input_shape)[1:2])
    if "Dense" in names or hasattr(layer, "sparse_weight"):  # Dense, MaskedDense, SparseDense
        try:  # the tensor it was called on: a layer built from (None, n_in) alone does not know the rest
            input_shape = tuple(layer.input.shape)
        except Exception:  # noqa: BLE001 - not called in a functional graph (or called several times)
            pass
        return _product(tuple(input_shape)[1:-1])
    return float("nan")  # e.g. ConvLSTM, EinsumDense: not counted


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
        for name, w in names:
            positions = _applications(layer, name)
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
    applications = _applications(layer, "kernel")
    return dict(
        layer=layer.name,
        weight="kernel",
        shape=(n_in, n_out),
        nnz=nnz,
        size=size,
        sparsity=1.0 - nnz / size if size else 0.0,
        dense_flops=2.0 * size * applications,
        nonzero_flops=2.0 * nnz * applications,
        dense_bytes=size * values.dtype.itemsize,
        status="sparse",
    )
