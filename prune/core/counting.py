"""Counting a weight: its nonzeros, size and FLOPs per example, as every report of the project writes them.

:func:`prune.sparsity_report` and the experiment runner's weight report (which
also runs in the tf-keras process of the tfmot baseline) share these, so a
fix to the counting reaches both. Duck-typed over the layer (class names
along its MRO, its build config, its output shape), so Keras 3 and tf-keras
layers count alike; imports neither Keras nor TensorFlow.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["REPORT_COLUMNS", "applications", "weight_row"]

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
_SLIDING = {"Conv1D", "Conv2D", "Conv3D", "DepthwiseConv1D", "DepthwiseConv2D", "SeparableConv1D", "SeparableConv2D",
            "SparseConv2D"}
_RECURRENT = {"SimpleRNN", "GRU", "LSTM", "RNN"}


def _product(dims: Any) -> float:
    dims = list(dims)
    return float("nan") if any(d is None for d in dims) else float(np.prod(dims))


def _spatial(layer: Any, shape: Any) -> float:
    shape = tuple(shape)
    return _product(shape[1:-1] if getattr(layer, "data_format", "channels_last") == "channels_last" else shape[2:])


def applications(layer: Any, weight: str) -> float:
    """How many times per example each entry of ``layer``'s ``weight`` is multiplied.

    1 for ``Dense`` on ``[batch, features]`` (once per row of the leading
    dimensions otherwise); a convolution's output positions (a transposed
    convolution's input positions: each input position meets every kernel
    entry once); an RNN's timesteps, for its kernel and its recurrent kernel;
    for ``MultiHeadAttention``, the query's or the key's or value's length,
    by projection; for ``EinsumDense`` and ``SparseEinsumDense``, the input's
    axes the kernel does not have; 0 for an embedding lookup (NaN for a ``ReversibleEmbedding``, which
    may also run as an output projection). NaN when a needed size is
    unknown or the layer is of another kind: unknown, not wrong.
    """
    names = {c.__name__ for c in type(layer).__mro__}
    if "ReversibleEmbedding" in names:
        return float("nan")  # a lookup (0), or an output projection when called with reverse=True: unknown
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
    if names & {"EinsumDense", "SparseEinsumDense"}:
        count = _einsum_applications(str(getattr(layer, "equation", "")), tuple(input_shape))
        if np.isnan(count):
            try:  # the tensor it was called on: a layer built before its other sizes were known
                count = _einsum_applications(str(getattr(layer, "equation", "")), tuple(layer.input.shape))
            except Exception:  # noqa: BLE001 - not called in a functional graph (or called several times)
                pass
        return count
    if names & _TRANSPOSED:
        return _spatial(layer, input_shape)
    if names & _SLIDING:
        shapes = [input_shape]
        try:  # the tensor it was called on, for a layer built before its spatial sizes were known
            shapes.append(tuple(layer.input.shape))
        except Exception:  # noqa: BLE001 - not called in a functional graph (or called several times)
            pass
        for shape in shapes:
            try:
                positions = _spatial(layer, layer.compute_output_shape(tuple(shape)))
            except Exception:  # noqa: BLE001 - unknown spatial size: FLOPs unknown, not wrong
                continue
            if not np.isnan(positions):
                return positions
        return float("nan")
    if names & _RECURRENT and not any(n.startswith("ConvLSTM") for n in names):
        return _product(tuple(input_shape)[1:2])
    if "Dense" in names or hasattr(layer, "sparse_weight"):  # Dense, MaskedDense, SparseDense
        try:  # the tensor it was called on: a layer built from (None, n_in) alone does not know the rest
            input_shape = tuple(layer.input.shape)
        except Exception:  # noqa: BLE001 - not called in a functional graph (or called several times)
            pass
        return _product(tuple(input_shape)[1:-1])
    return float("nan")  # e.g. ConvLSTM: not counted



def _einsum_applications(equation: str, input_shape: tuple[Any, ...]) -> float:
    """Per example, how often ``EinsumDense``'s kernel meets the input: the product of the input's axes that the
    kernel does not have (the leading batch axis excluded). ``abc,cde->abde`` on ``[B, T, c]``: ``T``."""
    equation = equation.replace(" ", "")
    try:
        lhs, _ = equation.split("->")
        x, k = lhs.split(",")
    except ValueError:
        return float("nan")
    dims = list(input_shape)
    if x.startswith("..."):  # leading axes under the ellipsis: every one but the batch axis is an application
        x = x[3:]
        extra = dims[1:len(dims) - len(x)] if len(dims) > len(x) else []
        own = dims[len(dims) - len(x):]
        return _product(extra + [d for c, d in zip(x, own) if c not in k])
    if "." in x or len(x) != len(dims):
        return float("nan")
    return _product(d for c, d in list(zip(x, dims))[1:] if c not in k)


def weight_row(layer: str, weight: str, value: Any, positions: float, status: str) -> dict[str, Any]:
    """One report row (:data:`REPORT_COLUMNS`) of the weight ``value`` applied ``positions`` times per example."""
    value = np.asarray(value)
    nnz = int(np.count_nonzero(value))
    return dict(
        layer=layer,
        weight=weight,
        shape=tuple(int(d) for d in value.shape),
        nnz=nnz,
        size=int(value.size),
        sparsity=1.0 - nnz / value.size if value.size else 0.0,
        dense_flops=2.0 * value.size * positions,
        nonzero_flops=2.0 * nnz * positions,
        dense_bytes=int(value.nbytes),
        status=status,
    )
