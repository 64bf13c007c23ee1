"""``convert``: switch a whole model between dense, masked and sparse fully connected, convolution and einsum layers.

Three interchangeable implementations of the same function::

    dense   keras.layers.Dense        kernel with zeros in it
    masked  prune.layers.MaskedDense  kernel and kernel_mask beside it
    sparse  prune.layers.SparseDense  values at indices (prune.layers.kernels)

and the same three for 2-D convolutions (``keras.layers.Conv2D``,
``prune.layers.MaskedConv2D``, ``prune.layers.SparseConv2D``; ``groups=1``,
``channels_last``), for einsum layers (``keras.layers.EinsumDense``,
``prune.layers.MaskedEinsumDense``, ``prune.layers.SparseEinsumDense``; the
equations of :func:`prune.layers.einsum_form.einsum_matrix_form`) and for
attention (``keras.layers.MultiHeadAttention``,
``prune.layers.MaskedMultiHeadAttention``, ``prune.layers.SparseMultiHeadAttention``:
its four projection kernels; no gate, regularizer or constraint).

Which entries are "present" in each form, so that every round trip keeps the
structure and the outputs agree (up to the summation order of the kernels):

* masked -> sparse takes the structure from the mask; sparse -> masked makes
  the mask from the stored indices and scatters the values back (+0.0 where
  absent); sparse -> dense scatters the values into a plain kernel.
* a plain ``Dense`` has no mask, so its structure is its nonzero entries:
  dense -> masked masks the exact zeros (a freshly initialised layer keeps
  everything; a stripped pruned model gets its mask back), dense -> sparse
  stores the nonzeros.
* masked -> dense is :func:`prune.strip_pruning` for that layer (other masked
  layers, ``MaskedConv2D`` etc., are stripped too).

Only these have a sparse form. Layers that carry weights of a prunable kind
but cannot be brought to the target (e.g. a ``Conv1D``, a grouped ``Conv2D``
or an ``EinsumDense`` with a transposed kernel such as ``abc,dc->abd`` asked
to become sparse, a ``Dense`` with LoRA, an unbuilt layer) are left as they
are and listed in a :class:`ConversionWarning`; :func:`unconvertible_layers`
returns the same list without converting. A plain layer with no sparse form
of its own whose sublayers have one (a gated ``MultiHeadAttention``, KerasHub's
``CachedMultiHeadAttention``) is converted through them, where they are; a
masked layer whose masks cover its sublayers' weights
(``MaskedMultiHeadAttention`` with a gate) is copied whole and named. Other
layers are copied unchanged.

Sequential and functional models are cloned (with weights copied); subclassed
models are changed in place (via :func:`prune.api._convert`, the machinery of
``prune_low_magnitude``).
"""

from __future__ import annotations

import warnings
from typing import Any

import keras
import numpy as np

from prune._internals import has_sublayers
from prune.api import _clone_layer, _convert, _to_masked, _to_plain
from prune.layers.kernels import check_matmul
from prune.layers.masked import MaskedConv2D, MaskedDense, PrunableLayer
from prune.layers.masked_more import MaskedEinsumDense, MaskedMultiHeadAttention
from prune.layers.scheduled import pruning_params_of
from prune.layers.sparse import SparseDense
from prune.layers.sparse_attention import PROJECTIONS, SparseMultiHeadAttention
from prune.layers.sparse_conv import SparseConv2D
from prune.layers.einsum_form import einsum_matrix_form
from prune.layers.sparse_einsum import SparseEinsumDense
from prune.core.targets import iter_layers
from prune.layers.registry import masked_class_for

__all__ = ["convert", "unconvertible_layers", "ConversionWarning", "TARGETS"]

TARGETS = ("dense", "masked", "sparse")


class ConversionWarning(UserWarning):
    """Some layers of a model could not be converted and were left as they are."""


def _check_to(to: Any) -> str:
    if not isinstance(to, str) or to not in TARGETS:
        raise ValueError(f"to must be one of {list(TARGETS)}, got {to!r}")
    return to


def _pruning_params(layer: Any) -> dict[str, Any]:
    # Carry schedule, pattern, criterion, scope and seed between masked and sparse forms (one engine drives both).
    params = pruning_params_of(layer)
    return {} if params is None else params.as_kwargs()


def _dense_kwargs(layer: Any) -> dict[str, Any]:
    return {
        "activation": layer.activation,
        "use_bias": layer.use_bias,
        "name": layer.name,
        "bias_initializer": layer.bias_initializer,
        "kernel_initializer": layer.kernel_initializer,
    }


def _is_plain_dense(layer: Any) -> bool:
    return type(layer) is keras.layers.Dense and not getattr(layer, "lora_rank", None) and not getattr(
        layer, "quantization_mode", None
    )


def _is_sparse_conv_source(layer: Any) -> bool:
    """A plain or masked ``Conv2D`` of the form ``SparseConv2D`` computes: ``groups=1``, ``channels_last``, no LoRA."""
    return (
        type(layer) in (keras.layers.Conv2D, MaskedConv2D)
        and layer.groups == 1
        and layer.data_format == "channels_last"
        and not getattr(layer, "lora_rank", None)
        and not getattr(layer, "quantization_mode", None)
    )


def _plain_extras(layer: Any) -> bool:
    """Whether ``layer`` uses LoRA or quantisation (no sparse form)."""
    return bool(getattr(layer, "lora_rank", None) or getattr(layer, "quantization_mode", None))


def _is_sparse_einsum_source(layer: Any) -> bool:
    """A plain or masked ``EinsumDense`` of the equations ``SparseEinsumDense`` computes, without LoRA, quantisation,
    regularizers or constraints on its kernel."""
    return (
        type(layer) in (keras.layers.EinsumDense, MaskedEinsumDense)
        and einsum_matrix_form(layer.equation) is not None
        and not _plain_extras(layer)
        and layer.kernel_constraint is None
    )


def _is_sparse_attention_source(layer: Any) -> bool:
    """A plain or masked ``MultiHeadAttention`` that ``SparseMultiHeadAttention`` can hold: no gate, regularizer or
    constraint (its projections are all in the ``SparseEinsumDense`` family)."""
    if type(layer) not in (keras.layers.MultiHeadAttention, MaskedMultiHeadAttention):
        return False
    config = layer.get_config()
    return (
        not config.get("use_gate")
        and all(config.get(k) is None for k in ("kernel_regularizer", "bias_regularizer", "kernel_constraint",
                                                "bias_constraint"))
        and all(_is_sparse_einsum_source(getattr(layer, attr)) for attr in PROJECTIONS.values())
    )


def _has_sparse_form(layer: Any) -> bool:
    """Whether a built plain or masked layer converts to a sparse layer."""
    if not layer.built:
        return False
    return (
        isinstance(layer, MaskedDense)
        or _is_plain_dense(layer)
        or _is_sparse_conv_source(layer)
        or _is_sparse_einsum_source(layer)
        or _is_sparse_attention_source(layer)
    )


def _dense_parts(layer: Any) -> tuple[np.ndarray, np.ndarray, Any]:
    """``(kernel, mask, bias)`` of a built Dense, Conv2D or EinsumDense, their masked twins, or a sparse layer."""
    bias = None if layer.bias is None else np.asarray(layer.bias.numpy())
    if isinstance(layer, SparseDense):
        return layer.to_dense(), layer.get_mask(), bias
    if isinstance(layer, (MaskedDense, MaskedConv2D, MaskedEinsumDense)):
        weight, mask_var = layer.weight_and_mask("kernel")
        mask = mask_var.numpy() != 0
        kernel = np.where(mask, np.asarray(weight.numpy()), 0).astype(weight.dtype)  # +0.0, never -0.0
        return kernel, mask, bias
    kernel = np.asarray(layer.kernel.numpy())
    return kernel, kernel != 0, bias


def _attention_parts(layer: Any) -> dict[str, tuple[np.ndarray, np.ndarray, Any]]:
    """``{projection: (kernel, mask, bias)}`` of a built plain, masked or sparse ``MultiHeadAttention``."""
    parts = {}
    for (name, attr), weight_name in zip(PROJECTIONS.items(), MaskedMultiHeadAttention.prunable_weight_names):
        proj = getattr(layer, attr)
        bias = None if proj.bias is None else np.asarray(proj.bias.numpy())
        if isinstance(layer, SparseMultiHeadAttention):
            parts[name] = (proj.to_dense(), proj.get_mask(), bias)
        elif isinstance(layer, MaskedMultiHeadAttention):
            weight, mask_var = layer.weight_and_mask(weight_name)
            mask = mask_var.numpy() != 0
            parts[name] = (np.where(mask, np.asarray(weight.numpy()), 0).astype(weight.dtype), mask, bias)
        else:
            kernel = np.asarray(proj.kernel.numpy())
            parts[name] = (kernel, kernel != 0, bias)
    return parts


def _attention_from(layer: Any, to: str, matmul: str) -> Any:
    """A ``SparseMultiHeadAttention`` converted to ``to``."""
    if to == "sparse":
        return _sparse_from(layer, matmul)
    dense = layer.to_dense_layer()
    if to == "dense":
        return dense
    masked = _to_masked(dense, {"pruning_schedule": None, **layer.pruning_params.as_kwargs()})
    for (name, _), weight_name in zip(PROJECTIONS.items(), masked.prunable_weight_names):
        masked.set_mask(weight_name, layer.projections[name].get_mask())
    return masked


def _convert_layer(layer: Any, to: str, matmul: str) -> Any:
    """The converted layer, or ``None`` if ``layer`` cannot be converted to ``to``."""
    if isinstance(layer, SparseMultiHeadAttention):
        return _attention_from(layer, to, matmul) if layer.built else None
    if isinstance(layer, SparseDense):
        if not layer.built:
            return None
        if to == "sparse":
            return _sparse_from(layer, matmul)
        dense = layer.to_dense_layer()
        if to == "dense":
            return dense
        masked = _to_masked(dense, {"pruning_schedule": None, **_pruning_params(layer)})
        masked.set_mask("kernel", layer.get_mask())
        return masked
    if isinstance(layer, PrunableLayer):
        if to == "masked":
            return _clone_layer(layer)
        if to == "dense":
            return _to_plain(layer)
        if _has_sparse_form(layer):
            return _sparse_from(layer, matmul)
        # Its sublayers (a gated MaskedMultiHeadAttention's projections) are masked by it: copied whole, so that
        # they are not converted on their own
        return _clone_layer(layer) if has_sublayers(layer) else None
    if masked_class_for(layer) is not None:  # a registered plain layer: Dense, Conv*, Embedding
        if to == "dense":
            return _clone_layer(layer)
        if not layer.built:
            return None
        if to == "masked":
            masked = _to_masked(layer, {"pruning_schedule": None})
            weight = masked.weight_and_mask(masked.prunable_weight_names[0])[0]
            masked.set_mask(masked.prunable_weight_names[0], np.asarray(weight.numpy()) != 0)
            return masked
        return _sparse_from(layer, matmul) if _has_sparse_form(layer) else None
    return _clone_layer(layer)


def _sparse_from(layer: Any, matmul: str) -> Any:
    if isinstance(layer, (keras.layers.MultiHeadAttention)):
        params = pruning_params_of(layer)
        if isinstance(layer, SparseMultiHeadAttention):
            config, params = layer.plain_config(), layer.pruning_params
        else:
            config = layer.plain_config(layer.get_config()) if isinstance(layer, PrunableLayer) else layer.get_config()
        return SparseMultiHeadAttention.from_projections(
            config, layer.get_build_config(), _attention_parts(layer), matmul=matmul,
            pruning=None if params is None else params.get_config(),
        )
    kernel, mask, bias = _dense_parts(layer)
    if isinstance(layer, SparseEinsumDense) or _is_sparse_einsum_source(layer):
        config = layer.get_build_config() or {}
        shape = config.get("input_shape")
        return SparseEinsumDense.from_dense(
            kernel, mask, layer.equation, output_shape=layer.partial_output_shape, bias_axes=layer.bias_axes,
            matmul=matmul, bias=bias, input_shape=None if shape is None else tuple(shape), activation=layer.activation,
            name=layer.name, kernel_initializer=layer.kernel_initializer, bias_initializer=layer.bias_initializer,
            **_pruning_params(layer),
        )
    kwargs = _dense_kwargs(layer)
    kwargs.update(_pruning_params(layer))
    if isinstance(layer, SparseConv2D) or _is_sparse_conv_source(layer):
        config = layer.get_build_config() or {}
        shape = config.get("input_shape")
        kwargs.update(strides=layer.strides, padding=layer.padding, dilation_rate=layer.dilation_rate)
        return SparseConv2D.from_dense(
            kernel, mask, matmul=matmul, bias=bias, input_shape=None if shape is None else tuple(shape), **kwargs
        )
    return SparseDense.from_dense(kernel, mask, matmul=matmul, bias=bias, **kwargs)


def _needs(layer: Any) -> bool:
    """Whether ``layer`` is of a kind ``convert`` acts on (masked, sparse or registered prunable)."""
    return isinstance(layer, (SparseDense, SparseMultiHeadAttention, PrunableLayer)) or masked_class_for(layer) is not None


def _blocked(layer: Any, to: str) -> bool:
    if not _needs(layer):
        return False
    if isinstance(layer, (SparseDense, SparseMultiHeadAttention)):
        return not layer.built
    if to == "dense":
        return False
    if isinstance(layer, PrunableLayer):
        return to == "sparse" and not _has_sparse_form(layer)
    if not layer.built:
        return True
    if to != "sparse" or _has_sparse_form(layer):
        return False
    # A plain layer with sublayers that convert (a gated MultiHeadAttention's projections) is converted through
    # them; its other prunable sublayers are named on their own. One with none (an LSTM and its cell) is named.
    return not (has_sublayers(layer) and any(_has_sparse_form(sub) for sub in iter_layers(layer) if sub is not layer))


def unconvertible_layers(model: Any, to: str) -> list[str]:
    """Names of the layers :func:`convert` would leave unconverted for target ``to``.

    Raises:
        ValueError: unknown ``to``.
    """
    _check_to(to)
    return [layer.name for layer in iter_layers(model) if not isinstance(layer, keras.Model) and _blocked(layer, to)]


def convert(model: Any, to: str, matmul: str = "auto") -> Any:
    """Convert every fully connected layer, 2-D convolution, einsum layer and attention of ``model`` to ``to``.

    Args:
        model: A Keras layer, a Sequential or functional model (cloned, with
            weights copied) or a subclassed model (changed in place and
            returned).
        to: ``"dense"`` (``keras.layers.Dense``, masked layers stripped),
            ``"masked"`` (``MaskedDense`` and the other masked layers) or
            ``"sparse"`` (``SparseDense``, ``SparseConv2D``, ``SparseEinsumDense``,
            ``SparseMultiHeadAttention``). See the module docstring for how the structure carries over.
        matmul: Kernel of the created sparse layers (``"auto"``,
            ``"native"``, ``"coo"``, ``"csr"``, ``"dense"``).

    Returns:
        The converted layer or model. Outputs agree with the input model's to
        float rounding (the sparse kernels sum in another order).

    Warns:
        ConversionWarning: listing the layers left unconverted
            (see :func:`unconvertible_layers`).

    Raises:
        ValueError: unknown ``to`` or ``matmul``, or ``model`` is not a Keras layer;
            raised before anything changes.
    """
    _check_to(to)
    check_matmul(matmul)
    if not isinstance(model, keras.layers.Layer):
        raise ValueError(f"model must be a Keras 3 layer or model, got {type(model).__module__}.{type(model).__name__}")
    blocked = unconvertible_layers(model, to)

    def fn(layer: Any) -> Any:
        if isinstance(layer, keras.Model):
            return _convert(layer, fn)
        new = _convert_layer(layer, to, matmul)
        return layer if new is None else new

    out = _convert(model, fn)
    if blocked:
        warnings.warn(
            f"convert(to={to!r}) left {len(blocked)} layer(s) unconverted: {blocked}", ConversionWarning, stacklevel=2
        )
    return out
