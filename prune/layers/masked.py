"""Keras 3 layers whose prunable weights carry a binary mask beside them.

Design decision: **the forward pass multiplies by the mask, and the stored
weight is kept at exactly zero as well.**

* Multiplying in the forward pass (PyTorch's ``weight * weight_mask``
  reparametrisation) makes the gradient of every pruned entry zero by the chain
  rule, in ``model.fit``, in any ``tf.GradientTape`` loop and under any
  optimizer wrapper, without the user having to remember a helper. With an
  all-ones mask ``w * 1.0 == w`` bitwise, so an unpruned model computes exactly
  what the plain Keras layer computes. The extra elementwise product costs far
  less than the matmul it feeds (``benchmarks/fit_step.py`` measures it).
* Keeping the stored weight at zero (tfmot's approach) is what makes
  checkpoints sparse and what ``strip_pruning`` relies on. It holds because at
  every mask update the pruned entries of the weight *and of every optimizer
  slot* are set to +0.0 (``tf.where``, never ``w * 0``, which gives -0.0), and
  afterwards their gradient is zero; with zero state and zero gradient SGD,
  momentum, Nesterov, Adam, AdamW's decoupled weight decay, RMSprop, Adagrad and
  Lion all apply an update of exactly zero.

Each prunable weight ``<name>`` gets a non-trainable ``<name>_mask`` of the
same shape and dtype, created in ``build()`` and saved with the layer, and each
layer has a non-trainable int64 ``pruning_step`` counter, advanced inside the compiled
step by every training-mode call, so ``model.save``,
``save_weights`` and ``tf.train.Checkpoint`` all carry weights, masks and step
together.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Iterator

import keras
import numpy as np
import tensorflow as tf
from keras import ops

from prune.core import masks as _masks
from prune._internals import input_shape_arg, private_weight
from prune.layers.kinds import register_layer
from prune.layers.scheduled import ScheduledLayer
from prune.core.notices import PruningWarning
from prune.layers.optimizer_state import zero_slot_entries
from prune.core.targets import MaskTarget

__all__ = [
    "PrunableLayer",
    "PruneLowMagnitude",
    "is_masked_layer",
    "is_custom_prunable",
    "custom_prunable_weights",
    "copy_or_share",
    "MaskedDense",
    "MaskedConv1D",
    "MaskedConv2D",
    "MaskedEmbedding",
]

class PrunableLayer(ScheduledLayer):
    """Mixin for a Keras layer whose ``prunable_weight_names`` carry masks.

    Two ways to make a layer prunable:

    * **A masked twin** (how ``Dense``, ``Conv*`` and ``Embedding`` are done):
      subclass this mixin *first*, together with a Keras layer (``class
      MaskedDense(PrunableLayer, keras.layers.Dense)``), list the weights to
      prune in ``prunable_weight_names``, make the forward pass use
      :meth:`masked_weight`, and register it with one
      ``@register_layer(prunes=PlainLayer)``
      (:func:`prune.layers.kinds.register_layer`; it sets ``base_class``).
    * **tfmot's contract**: a custom layer that implements
      ``get_prunable_weights()`` (returning the variables to prune), whether it
      also subclasses ``prune.PrunableLayer`` (as tfmot's ``PrunableLayer``) or
      not. :func:`prune.prune_low_magnitude` wraps it in
      :class:`PruneLowMagnitude`, which keeps the masks and feeds the layer
      ``weight * mask`` in its forward pass.

    Every masked layer answers the mask-target protocol
    (:meth:`mask_targets`, see :mod:`prune.core.targets`), and keeps its pruning
    parameters and step counter as every scheduled layer does
    (:class:`prune.layers.ScheduledLayer`).

    Args:
        pruning_schedule, pattern, criterion, scope, seed: As :class:`prune.layers.ScheduledLayer`; a
            ``pruning_schedule`` of ``None`` keeps masks that change only through :meth:`set_mask`.
    """

    prunable_weight_names: tuple[str, ...] = ("kernel",)
    base_class: type | None = None

    # -- state -----------------------------------------------------------
    def build(self, input_shape: Any = None) -> None:
        super().build(input_shape)
        if not is_masked_layer(self):
            return  # a custom layer using tfmot's contract: PruneLowMagnitude keeps its masks
        for name in self.prunable_weight_names:
            weight = self._weight(name)
            mask = self.add_weight(
                name=f"{name}_mask",
                shape=tuple(weight.shape),
                initializer="ones",
                dtype=weight.dtype,
                trainable=False,
                autocast=True,
            )
            setattr(self, f"{name}_mask", mask)  # a plain attribute: tf.train.Checkpoint tracks it by name
        self.add_step_counter()
        for name in self.prunable_weight_names:
            self.pattern.check(self.pattern_shape(name) or tuple(self._weight(name).shape), f"{self.name}.{name}")

    def pattern_shape(self, name: str) -> tuple[int, ...] | None:
        """The shape patterns select weight ``name`` in (:attr:`prune.core.targets.MaskTarget.pattern_shape`):
        ``None`` here, the weight's own; a layer whose weight is a matrix read another way gives that matrix."""
        return None

    def _weight(self, name: str) -> Any:
        private = private_weight(self, name)  # Dense/Embedding keep the variable in _kernel/_embeddings
        return private if private is not None else getattr(self, name)

    def weight_and_mask(self, name: str) -> tuple[Any, Any]:
        """The variable ``name`` and its mask variable."""
        if name not in self.prunable_weight_names:
            raise ValueError(f"weight {name!r} is not prunable in {self.name}; prunable: {list(self.prunable_weight_names)}")
        return self._weight(name), getattr(self, f"{name}_mask")

    def get_prunable_weights(self) -> list[Any]:
        """The pruned variables (tfmot's ``PrunableLayer`` interface)."""
        return [self._weight(n) for n in self.prunable_weight_names]

    @property
    def takes_mask_targets(self) -> bool:
        """Whether this layer carries masks (:func:`is_masked_layer`), so answers :meth:`mask_targets` once built."""
        return is_masked_layer(self)

    def mask_targets(self) -> list[MaskTarget]:
        """One :class:`prune.core.targets.MaskTarget` per prunable weight (the mask-target protocol)."""
        if not is_masked_layer(self):
            return []
        out = []
        for name in self.prunable_weight_names:
            weight, mask_var = self.weight_and_mask(name)
            out.append(
                MaskTarget(
                    key=f"{self.name}/{name}",
                    layer=self,
                    variable=weight,
                    read=lambda weight=weight, mask_var=mask_var: (
                        np.asarray(weight.numpy()),
                        np.asarray(mask_var.numpy()) != 0,
                    ),
                    writer=lambda keep, optimizer, weight=weight, mask_var=mask_var: install_mask(
                        weight, mask_var, keep, optimizer
                    ),
                    dense_pass=lambda weight=weight, mask_var=mask_var: _unmasked(weight, mask_var),
                    pattern_shape=self.pattern_shape(name),
                )
            )
        return out

    def masked_weight(self, name: str) -> Any:
        """``weight * mask``, the value the forward pass uses."""
        return self._weight(name) * getattr(self, f"{name}_mask")

    def get_masks(self) -> dict[str, np.ndarray]:
        """Current masks as bool arrays, keyed by weight name."""
        return {n: np.asarray(self.weight_and_mask(n)[1].numpy()).astype(bool) for n in self.prunable_weight_names}

    def set_mask(self, name: str, mask: Any, optimizer: Any = None) -> None:
        """Install a fixed mask: zero the pruned weight entries and their optimizer slots.

        Args:
            name: A prunable weight name, e.g. ``"kernel"``.
            mask: Array of the weight's shape with only 0/1 (or bool) values.
            optimizer: If given, the slots of newly pruned entries are zeroed.

        Raises:
            ValueError: wrong name, shape or values; raised before any variable changes.
        """
        if not self.built:
            raise ValueError(f"layer {self.name!r} must be built before set_mask")
        weight, mask_var = self.weight_and_mask(name)
        keep = _masks.validate_mask(mask, tuple(weight.shape), name=f"mask for {self.name}.{name}")
        install_mask(weight, mask_var, keep, optimizer)

    # -- serialisation -----------------------------------------------------
    # Dense/Embedding/Conv override these to store only kernel and bias (for
    # quantisation and LoRA, which masked layers reject); the generic Layer
    # versions store every variable, masks and step counter included.
    def save_own_variables(self, store: Any) -> None:
        keras.layers.Layer.save_own_variables(self, store)

    def load_own_variables(self, store: Any) -> None:
        keras.layers.Layer.load_own_variables(self, store)


def is_masked_layer(layer: Any) -> bool:
    """Whether ``layer`` carries prune's masks (a masked twin or a :class:`PruneLowMagnitude`).

    A user layer that subclasses :class:`PrunableLayer` only to implement
    tfmot's ``get_prunable_weights()`` is not: it is prunable, not pruned.
    """
    return isinstance(layer, PrunableLayer) and type(layer).get_prunable_weights is PrunableLayer.get_prunable_weights


RNN_CELLS = (keras.layers.SimpleRNNCell, keras.layers.GRUCell, keras.layers.LSTMCell)
"""The RNN cells whose ``kernel`` and ``recurrent_kernel`` are pruned (tfmot's ``_RNN_CELLS_WEIGHTS_MAP``)."""


def rnn_cells(cell: Any) -> list[Any]:
    """The cells of an RNN's ``cell``: the stack's cells, or the cell itself."""
    return list(cell.cells) if isinstance(cell, keras.layers.StackedRNNCells) else [cell]


def _has_own_prunable_weights(layer: Any) -> bool:
    return callable(getattr(layer, "get_prunable_weights", None)) and not is_masked_layer(layer)


def _is_rnn_over_custom_cells(layer: Any) -> bool:
    """A ``keras.layers.RNN`` whose cells are each known or implement ``get_prunable_weights()``, one at least
    the latter (an RNN over known cells only is a ``MaskedRNN``). tfmot's ``PruneRegistry.supports`` rule."""
    if type(layer) is not keras.layers.RNN:
        return False
    cells = rnn_cells(layer.cell)
    custom = [_has_own_prunable_weights(c) for c in cells]
    return any(custom) and all(c or type(cell) in RNN_CELLS for c, cell in zip(custom, cells))


def is_custom_prunable(layer: Any) -> bool:
    """Whether ``layer`` follows tfmot's contract and is not masked yet: it implements
    ``get_prunable_weights()``, or it is a ``keras.layers.RNN`` over cells that do (or are known cells)."""
    return _has_own_prunable_weights(layer) or _is_rnn_over_custom_cells(layer)


def custom_prunable_weights(layer: Any) -> list[Any]:
    """The variables tfmot's contract prunes in ``layer`` (see :func:`is_custom_prunable`)."""
    if _has_own_prunable_weights(layer):
        return list(layer.get_prunable_weights())
    weights: list[Any] = []
    for cell in rnn_cells(layer.cell):
        weights.extend(cell.get_prunable_weights() if _has_own_prunable_weights(cell) else [cell.kernel, cell.recurrent_kernel])
    return weights


def copy_or_share(layer: Any, make_copy: Any) -> Any:
    """``make_copy()``, or ``layer`` itself (with a :class:`prune.PruningWarning`) when Keras cannot rebuild it.

    Keras rebuilds a layer as ``type(layer).from_config(layer.get_config())``;
    that fails for an ``__init__`` that takes no ``trainable``/``dtype``/``name``
    and for a class (or an RNN cell) registered with nobody. tfmot never
    copies; ``prune`` copies so that a pruned model shares nothing with its
    original, and falls back to tfmot's way for such layers.
    """
    try:
        return make_copy()
    except (TypeError, ValueError, NotImplementedError) as exc:
        warnings.warn(
            f"layer {layer.name!r} ({type(layer).__name__}) cannot be copied through its config ({exc}); it is used "
            "itself, as tfmot does, so the result shares its variables with the original. Give the layer "
            "get_config/from_config (and register it with keras.saving.register_keras_serializable) to get a copy",
            PruningWarning,
            stacklevel=3,
        )
        return layer


def install_mask(weight: Any, mask_var: Any, keep: np.ndarray, optimizer: Any = None) -> bool:
    """Write any keep-mask into ``mask_var``: entries that stay keep value and slots; the others are +0.0, slots zeroed.

    An entry that grows (kept now, pruned before) starts at +0.0 with zeroed
    slots, as sparse training and IMP's controls need; under a schedule the
    mask only shrinks, and this is just the pruning of the dropped entries.
    Returns False: a masked layer's variables never change shape, so no
    traced step needs retracing.
    """
    keep = np.asarray(keep, dtype=bool)
    stays = keep & (np.asarray(mask_var.numpy()) != 0)
    stays_t = tf.constant(stays)
    value = tf.convert_to_tensor(weight.value)
    weight.assign(tf.where(stays_t, value, tf.zeros_like(value)))  # tf.where: +0.0, never -0.0
    zero_slot_entries(optimizer, weight, stays)
    mask_var.assign(tf.cast(tf.constant(keep), mask_var.dtype))
    return False


@contextlib.contextmanager
def _unmasked(weight: Any, mask_var: Any) -> Iterator[Any]:
    """The masks set to ones for one forward pass: the weight's gradient is then the dense gradient.

    Pruned weights are stored as +0.0, so the forward pass computes bitwise
    what it computes with the mask; the mask is restored on leaving.
    """
    saved = mask_var.numpy()
    mask_var.assign(tf.ones_like(mask_var.value))
    try:
        yield weight
    finally:
        mask_var.assign(saved)


def _reject_lora_and_quantization(layer: Any) -> None:
    if getattr(layer, "lora_rank", None):
        raise ValueError(f"lora_rank={layer.lora_rank!r} is not supported by {type(layer).__name__}")
    if getattr(layer, "quantization_mode", None):
        raise ValueError(f"quantization_mode={layer.quantization_mode!r} is not supported by {type(layer).__name__}")


@register_layer(prunes=keras.layers.Dense)
class MaskedDense(PrunableLayer, keras.layers.Dense):
    """``keras.layers.Dense`` with ``kernel_mask`` beside ``kernel``.

    Takes every ``Dense`` argument plus the :class:`PrunableLayer` ones.
    """


    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _reject_lora_and_quantization(self)

    def call(self, inputs: Any, training: Any = None) -> Any:
        self.advance_step(training)
        x = ops.matmul(inputs, self.masked_weight("kernel"))
        if self.bias is not None:
            x = ops.add(x, self.bias)
        if self.activation is not None:
            x = self.activation(x)
        return x


class _MaskedConvMixin:
    """Masks the kernel inside ``call`` without copying Keras's conv code.

    ``Conv1D.call`` reads ``self.kernel`` directly (for causal padding) while
    ``BaseConv.call`` goes through ``convolution_op``; both read the
    ``kernel`` property, so the property returns ``kernel * kernel_mask``
    while ``call`` runs, and the plain variable everywhere else (so
    ``layer.kernel.assign`` keeps working).
    """

    @property
    def kernel(self) -> Any:
        k = super().kernel  # type: ignore[misc]
        return k * self.kernel_mask if getattr(self, "_masking", False) else k

    def call(self, inputs: Any, training: Any = None) -> Any:
        self.advance_step(training)  # type: ignore[attr-defined]
        object.__setattr__(self, "_masking", True)
        try:
            return super().call(inputs)  # type: ignore[misc]
        finally:
            object.__setattr__(self, "_masking", False)


@register_layer(prunes=keras.layers.Conv1D)
class MaskedConv1D(PrunableLayer, _MaskedConvMixin, keras.layers.Conv1D):
    """``keras.layers.Conv1D`` with ``kernel_mask`` beside ``kernel``."""


@register_layer(prunes=keras.layers.Conv2D)
class MaskedConv2D(PrunableLayer, _MaskedConvMixin, keras.layers.Conv2D):
    """``keras.layers.Conv2D`` with ``kernel_mask`` beside ``kernel``."""


@register_layer(prunes=keras.layers.Embedding)
class MaskedEmbedding(PrunableLayer, keras.layers.Embedding):
    """``keras.layers.Embedding`` with ``embeddings_mask`` beside ``embeddings``.

    The lookup gathers weight rows and mask rows separately and multiplies
    them, so the gradient stays a row-sparse ``IndexedSlices``.
    """

    prunable_weight_names = ("embeddings",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _reject_lora_and_quantization(self)

    def call(self, inputs: Any, training: Any = None) -> Any:
        self.advance_step(training)
        if inputs.dtype != "int32" and inputs.dtype != "int64":
            inputs = ops.cast(inputs, "int32")
        weight, mask = self.weight_and_mask("embeddings")
        outputs = ops.take(weight, inputs, axis=0) * ops.take(mask, inputs, axis=0)
        return ops.cast(outputs, dtype=self.compute_dtype)


@register_layer
class PruneLowMagnitude(PrunableLayer, keras.layers.Wrapper):
    """Masks for a custom layer that implements tfmot's ``get_prunable_weights()``.

    tfmot's ``PruneLowMagnitude`` wrapper, with prune's design: the masks live
    in the wrapper (``<weight>_mask``), and the wrapped layer's forward pass
    sees ``weight * mask`` (through a Keras ``StatelessScope`` mapping each
    prunable variable to its masked value), so the gradient of a pruned entry
    is zero and it stays bitwise +0.0 under every optimizer, as for the masked
    twins. Other variable updates the layer makes in ``call`` and the losses it
    adds are carried out of the scope. :func:`prune.strip_pruning` returns the
    wrapped layer, with pruned entries at +0.0.

    Args:
        layer: A Keras layer with ``get_prunable_weights()``.
        **kwargs: The :class:`PrunableLayer` arguments and Keras layer arguments.
    """

    def __init__(self, layer: Any, **kwargs: Any) -> None:
        if not isinstance(layer, keras.layers.Layer) or not is_custom_prunable(layer):
            raise ValueError(
                f"layer must be a Keras layer with get_prunable_weights(), or an RNN over such cells, got {layer!r}"
            )
        kwargs.setdefault("name", f"prune_low_magnitude_{layer.name}")
        super().__init__(layer, **kwargs)
        self.prunable_weight_names: tuple[str, ...] = ()
        object.__setattr__(self, "_prunable", {})  # untracked: the variables belong to the wrapped layer

    def build(self, input_shape: Any = None) -> None:
        keras.layers.Wrapper.build(self, input_shape)
        weights = custom_prunable_weights(self.layer)
        owned = {id(v) for v in self.layer.weights}
        names: list[str] = []
        for v in weights:
            if id(v) not in owned:
                raise ValueError(f"get_prunable_weights() of {self.layer.name!r} returned {v!r}, which the layer does not own")
            name = v.name if v.name not in names else v.path.replace("/", "_")
            names.append(name)
        object.__setattr__(self, "_prunable", dict(zip(names, weights)))
        self.prunable_weight_names = tuple(names)
        PrunableLayer.build(self, input_shape)

    def _weight(self, name: str) -> Any:
        return self._prunable[name]

    @classmethod
    def wrap(cls, layer: Any, params: dict[str, Any]) -> "PruneLowMagnitude":
        """Wrap a copy of ``layer`` (same config and weights, no shared variables), built if ``layer`` is.

        A layer that cannot be rebuilt from its config (an ``__init__`` that
        takes no ``trainable``/``dtype``, a cell registered with nobody) is
        wrapped itself, as tfmot wraps every layer, with a
        :class:`prune.PruningWarning`: its variables are then shared with
        whatever held it. The ``input_shape`` the layer was built with passes
        to the wrapper, so a ``Sequential`` starting with it is built.
        """
        input_shape = input_shape_arg(layer)
        if input_shape is not None and "input_shape" not in params:
            params = {**params, "input_shape": input_shape}
        inner = copy_or_share(layer, lambda: type(layer).from_config(layer.get_config()))
        wrapper = cls(inner, **params)
        if layer.built:
            build_config = layer.get_build_config()
            if build_config is None:
                raise ValueError(f"layer {layer.name!r} is built but has no build config; cannot copy it")
            wrapper.build(build_config["input_shape"])
            if inner is not layer:
                for old, new in zip(layer.weights, inner.weights):
                    new.assign(old.value)
        return wrapper

    def call(self, inputs: Any, training: Any = None, **kwargs: Any) -> Any:
        self.advance_step(training)
        mapping = [(self._weight(n), self.masked_weight(n)) for n in self.prunable_weight_names]
        with keras.StatelessScope(state_mapping=mapping, collect_losses=True) as scope:
            outputs = self.layer(inputs, training=training, **kwargs)
        pruned = {id(v) for v, _ in mapping}
        for v in self.layer.variables:
            new = scope.get_current_value(v)
            if new is not None and id(v) not in pruned:
                v.assign(new)
        for loss in scope.losses:
            self.add_loss(loss)
        return outputs

    def strip(self) -> Any:
        """The wrapped layer, with its pruned entries set to +0.0."""
        if self.built:
            for name in self.prunable_weight_names:
                weight, mask = self.weight_and_mask(name)
                value = tf.convert_to_tensor(weight.value)
                weight.assign(tf.where(tf.convert_to_tensor(mask.value) != 0, value, tf.zeros_like(value)))
        return self.layer

    @classmethod
    def from_config(cls, config: dict[str, Any], custom_objects: Any = None) -> "PruneLowMagnitude":
        config = dict(config)
        layer = keras.saving.deserialize_keras_object(config.pop("layer"), custom_objects=custom_objects)
        return cls(layer, **config)
