"""Masked twins of the other layers tfmot prunes, with the weights tfmot prunes in each.

Which weights are pruned follows tfmot's ``PruneRegistry``
(``prune_registry.py`` in tensorflow/model-optimization):

* ``Conv3D``, ``Conv2DTranspose``, ``Conv3DTranspose``: ``kernel``;
* ``SeparableConv1D``, ``SeparableConv2D``: ``pointwise_kernel`` (the depthwise kernel stays dense);
* ``MultiHeadAttention``: the kernels of the query, key, value and output projections;
* ``EinsumDense`` (not in tfmot's registry, which predates it): ``kernel``. A ``MultiHeadAttention`` subclass
  (KerasHub's ``CachedMultiHeadAttention``), which the twin above does not take, is pruned through its four
  ``EinsumDense`` projections, each with its own mask;
* ``ReversibleEmbedding`` (Keras's, which KerasHub's language models tie to their output layer):
  ``embeddings``, and ``reverse_embeddings`` when the weights are not tied;
* ``SimpleRNN``, ``GRU``, ``LSTM``: the cell's ``kernel`` and ``recurrent_kernel``;
* ``RNN`` over ``SimpleRNNCell``, ``GRUCell`` or ``LSTMCell`` cells, stacked or not: each cell's ``kernel``
  and ``recurrent_kernel``.

``DepthwiseConv1D``/``DepthwiseConv2D`` have no prunable weight in tfmot's
registry either: they pass through ``prune_low_magnitude`` unpruned
(:func:`prune.layers.registry.keeps_dense`).

Each layer follows the design of :mod:`prune.layers.masked`: a mask beside
each pruned weight, and a forward pass that multiplies the weight by its mask.
Keras's own ``call`` reads these weights from attributes (``self.kernel``,
``self.cell.recurrent_kernel``, ``self._query_dense._kernel``), so while the
masked layer's ``call`` runs, those attributes hold ``weight * mask``, and the
variables are put back when it returns (:class:`_SwapMasked`). The masks,
counters and schedule live on the outer layer (on the ``LSTM``, not its cell;
on the ``MultiHeadAttention``, not its projections).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import keras

from keras import ops

from prune.layers.masked import RNN_CELLS, PrunableLayer, _MaskedConvMixin, _reject_lora_and_quantization, rnn_cells
from prune.layers.einsum_form import matrix_shape
from prune.layers.kinds import register_layer

__all__ = [
    "MaskedConv3D",
    "MaskedConv2DTranspose",
    "MaskedConv3DTranspose",
    "MaskedSeparableConv1D",
    "MaskedSeparableConv2D",
    "MaskedMultiHeadAttention",
    "MaskedEinsumDense",
    "MaskedReversibleEmbedding",
    "MaskedSimpleRNN",
    "MaskedGRU",
    "MaskedLSTM",
    "MaskedRNN",
]


class _SwapMasked:
    """While ``call`` runs, each pruned weight's attribute holds ``weight * mask``.

    ``_slots`` maps a prunable weight name to ``(owner, attribute)``: the
    sublayer attribute holding the owner (``""`` for the layer itself) and the
    attribute Keras's ``call`` reads the variable from. A class whose owners
    are not attributes overrides :meth:`_slot`.
    """

    _slots: dict[str, tuple[str, str]] = {}

    def _slot(self, name: str) -> tuple[Any, str]:
        owner, attr = self._slots[name]
        return (getattr(self, owner) if owner else self), attr

    def _variable(self, name: str) -> Any:
        owner, attr = self._slot(name)
        return getattr(owner, attr)

    @contextlib.contextmanager
    def _masking(self) -> Iterator[None]:
        saved = []
        try:
            for name in self.prunable_weight_names:  # type: ignore[attr-defined]
                owner, attr = self._slot(name)
                variable = getattr(owner, attr)
                mask = getattr(self, f"{name}_mask")
                object.__setattr__(owner, attr, variable * mask)  # bypass Keras tracking: a tensor, for this call
                saved.append((owner, attr, variable))
            yield
        finally:
            for owner, attr, variable in reversed(saved):
                object.__setattr__(owner, attr, variable)


class _SwapConv(_SwapMasked):
    def call(self, inputs: Any, training: Any = None) -> Any:
        self.advance_step(training)  # type: ignore[attr-defined]
        with self._masking():
            return super().call(inputs)  # type: ignore[misc]


@register_layer(prunes=keras.layers.Conv3D)
class MaskedConv3D(PrunableLayer, _MaskedConvMixin, keras.layers.Conv3D):
    """``keras.layers.Conv3D`` with ``kernel_mask`` beside ``kernel``."""


@register_layer(prunes=keras.layers.Conv2DTranspose)
class MaskedConv2DTranspose(PrunableLayer, _SwapConv, keras.layers.Conv2DTranspose):
    """``keras.layers.Conv2DTranspose`` with ``kernel_mask`` beside ``kernel``."""

    _slots = {"kernel": ("", "kernel")}


@register_layer(prunes=keras.layers.Conv3DTranspose)
class MaskedConv3DTranspose(PrunableLayer, _SwapConv, keras.layers.Conv3DTranspose):
    """``keras.layers.Conv3DTranspose`` with ``kernel_mask`` beside ``kernel``."""

    _slots = {"kernel": ("", "kernel")}


@register_layer(prunes=keras.layers.SeparableConv1D)
class MaskedSeparableConv1D(PrunableLayer, _SwapConv, keras.layers.SeparableConv1D):
    """``keras.layers.SeparableConv1D`` with ``pointwise_kernel_mask``; the depthwise kernel stays dense (as in tfmot)."""

    prunable_weight_names = ("pointwise_kernel",)
    _slots = {"pointwise_kernel": ("", "pointwise_kernel")}


@register_layer(prunes=keras.layers.SeparableConv2D)
class MaskedSeparableConv2D(PrunableLayer, _SwapConv, keras.layers.SeparableConv2D):
    """``keras.layers.SeparableConv2D`` with ``pointwise_kernel_mask``; the depthwise kernel stays dense (as in tfmot)."""

    prunable_weight_names = ("pointwise_kernel",)
    _slots = {"pointwise_kernel": ("", "pointwise_kernel")}


class _MHABuild(keras.layers.MultiHeadAttention):
    """Takes ``PrunableLayer.build``'s single argument as the tuple of MHA's three shapes."""

    def build(self, shapes: Any) -> None:  # type: ignore[override]
        keras.layers.MultiHeadAttention.build(self, *shapes)


@register_layer(prunes=keras.layers.MultiHeadAttention)
class MaskedMultiHeadAttention(PrunableLayer, _SwapMasked, _MHABuild):
    """``keras.layers.MultiHeadAttention`` with masks on its four projection kernels.

    The pruned weights are named ``query_kernel``, ``key_kernel``,
    ``value_kernel`` and ``output_kernel`` (the ``kernel`` of tfmot's
    ``_query_dense`` ... ``_output_dense``), with masks ``query_kernel_mask``
    etc. on this layer; the projection biases stay dense.
    """

    prunable_weight_names = ("query_kernel", "key_kernel", "value_kernel", "output_kernel")
    _slots = {
        "query_kernel": ("_query_dense", "_kernel"),
        "key_kernel": ("_key_dense", "_kernel"),
        "value_kernel": ("_value_dense", "_kernel"),
        "output_kernel": ("_output_dense", "_kernel"),
    }

    def pattern_shape(self, name: str) -> tuple[int, ...] | None:
        """The projection's kernel as its ``[d_in, d_out]`` matrix (:func:`prune.layers.einsum_form.matrix_shape`),
        so that ``NByM``'s groups run along the inputs of the projection (``d``, not the heads)."""
        owner = getattr(self, self._slots[name][0])
        return matrix_shape(owner.equation, tuple(self._variable(name).shape))

    query_kernel = property(lambda self: self._variable("query_kernel"))
    key_kernel = property(lambda self: self._variable("key_kernel"))
    value_kernel = property(lambda self: self._variable("value_kernel"))
    output_kernel = property(lambda self: self._variable("output_kernel"))

    def build(self, query_shape: Any, value_shape: Any, key_shape: Any = None) -> None:  # type: ignore[override]
        PrunableLayer.build(self, (query_shape, value_shape, key_shape))

    def call(
        self,
        query: Any,
        value: Any,
        key: Any = None,
        query_mask: Any = None,
        value_mask: Any = None,
        key_mask: Any = None,
        attention_mask: Any = None,
        return_attention_scores: bool = False,
        training: Any = None,
        use_causal_mask: bool = False,
    ) -> Any:
        self.advance_step(training)
        with self._masking():
            return super().call(
                query,
                value,
                key=key,
                query_mask=query_mask,
                value_mask=value_mask,
                key_mask=key_mask,
                attention_mask=attention_mask,
                return_attention_scores=return_attention_scores,
                training=training,
                use_causal_mask=use_causal_mask,
            )


@register_layer(prunes=keras.layers.EinsumDense)
class MaskedEinsumDense(PrunableLayer, keras.layers.EinsumDense):
    """``keras.layers.EinsumDense`` with ``kernel_mask`` beside ``kernel`` (any shape the equation gives it).

    Takes every ``EinsumDense`` argument plus the :class:`PrunableLayer` ones; LoRA and quantisation are
    refused, as for ``MaskedDense``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _reject_lora_and_quantization(self)

    def pattern_shape(self, name: str) -> tuple[int, ...] | None:
        """The kernel as its ``[d_in, d_out]`` matrix when the equation is a matrix product in order
        (:func:`prune.layers.einsum_form.matrix_shape`), so that ``NByM``'s groups run along its inputs; else
        ``None`` (the kernel's own shape)."""
        return matrix_shape(self.equation, tuple(self.kernel.shape))

    def call(self, inputs: Any, training: Any = None) -> Any:
        self.advance_step(training)
        x = ops.einsum(self.equation, inputs, self.masked_weight("kernel"))
        if self.bias is not None:
            x = ops.add(x, self.bias)
        if self.activation is not None:
            x = self.activation(x)
        return x


@register_layer(prunes=keras.layers.ReversibleEmbedding)
class MaskedReversibleEmbedding(PrunableLayer, _SwapMasked, keras.layers.ReversibleEmbedding):
    """``keras.layers.ReversibleEmbedding`` with ``embeddings_mask`` (and ``reverse_embeddings_mask`` when untied).

    Both directions use the masked weights: the lookup (``reverse=False``) and the output projection
    (``reverse=True``, ``x @ embeddings.T`` when tied). Keras's own ``call`` runs on ``weight * mask``, so the
    lookup's gradient is dense here, not row-sparse as in :class:`prune.layers.MaskedEmbedding`.
    """

    _slots = {"embeddings": ("", "_embeddings"), "reverse_embeddings": ("", "reverse_embeddings")}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _reject_lora_and_quantization(self)
        names = ("embeddings",) if self.tie_weights else ("embeddings", "reverse_embeddings")
        object.__setattr__(self, "prunable_weight_names", names)  # per instance: untied weights add one

    def call(self, inputs: Any, reverse: bool = False, training: Any = None) -> Any:
        self.advance_step(training)
        with self._masking():
            return super().call(inputs, reverse=reverse)


class _SwapRNN(_SwapMasked):
    """An RNN layer whose cell's ``kernel`` and ``recurrent_kernel`` are masked."""

    _slots = {"kernel": ("cell", "kernel"), "recurrent_kernel": ("cell", "recurrent_kernel")}

    kernel = property(lambda self: self._variable("kernel"))
    recurrent_kernel = property(lambda self: self._variable("recurrent_kernel"))

    def call(self, sequences: Any, initial_state: Any = None, mask: Any = None, training: Any = False) -> Any:
        self.advance_step(training)  # type: ignore[attr-defined]
        with self._masking():
            return super().call(sequences, initial_state=initial_state, mask=mask, training=training)  # type: ignore[misc]


@register_layer(prunes=keras.layers.SimpleRNN)
class MaskedSimpleRNN(PrunableLayer, _SwapRNN, keras.layers.SimpleRNN):
    """``keras.layers.SimpleRNN`` with masks on its cell's ``kernel`` and ``recurrent_kernel``."""

    prunable_weight_names = ("kernel", "recurrent_kernel")


@register_layer(prunes=keras.layers.GRU)
class MaskedGRU(PrunableLayer, _SwapRNN, keras.layers.GRU):
    """``keras.layers.GRU`` with masks on its cell's ``kernel`` and ``recurrent_kernel``."""

    prunable_weight_names = ("kernel", "recurrent_kernel")


@register_layer(prunes=keras.layers.LSTM)
class MaskedLSTM(PrunableLayer, _SwapRNN, keras.layers.LSTM):
    """``keras.layers.LSTM`` with masks on its cell's ``kernel`` and ``recurrent_kernel``."""

    prunable_weight_names = ("kernel", "recurrent_kernel")


@register_layer(prunes=keras.layers.RNN)
class MaskedRNN(PrunableLayer, _SwapRNN, keras.layers.RNN):
    """``keras.layers.RNN`` over ``SimpleRNNCell``, ``GRUCell`` or ``LSTMCell`` cells, one or a stack of them.

    As in tfmot, each cell's ``kernel`` and ``recurrent_kernel`` are pruned;
    here they are named ``cell_<i>_kernel`` and ``cell_<i>_recurrent_kernel``
    (``i`` counts the stacked cells from 0), with masks of the same names plus
    ``_mask``.

    Raises:
        ValueError: a cell of another type (it would stay dense, unmasked).
    """

    def __init__(self, cell: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(cell, *args, **kwargs)
        cells = rnn_cells(self.cell)
        other = [type(c).__name__ for c in cells if type(c) not in RNN_CELLS]
        if other:
            raise ValueError(f"MaskedRNN prunes SimpleRNNCell, GRUCell and LSTMCell only, got cells {other}")
        names = tuple(f"cell_{i}_{w}" for i in range(len(cells)) for w in ("kernel", "recurrent_kernel"))
        object.__setattr__(self, "prunable_weight_names", names)  # per instance: one pair per cell

    @classmethod
    def can_prune(cls, layer: Any) -> bool:
        """Whether every cell of the ``keras.layers.RNN`` ``layer`` is one this class masks."""
        return all(type(c) in RNN_CELLS for c in rnn_cells(layer.cell))

    def _slot(self, name: str) -> tuple[Any, str]:
        _, index, attr = name.split("_", 2)
        return rnn_cells(self.cell)[int(index)], attr

    def __getattr__(self, name: str) -> Any:
        # PrunableLayer finds a pruned weight as an attribute of that name.
        if name.startswith("cell_") and name in self.__dict__.get("prunable_weight_names", ()):
            return self._variable(name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
