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

from typing import Any

import keras
import numpy as np
import tensorflow as tf
from keras import ops

from prune import masks as _masks
from prune.driving import require_driver
from prune.optimizer_state import zero_slot_entries
from prune.schedules import PruningSchedule, as_schedule, serialize_schedule

__all__ = [
    "PrunableLayer",
    "MaskedDense",
    "MaskedConv1D",
    "MaskedConv2D",
    "MaskedEmbedding",
]

_PRUNING_KEYS = ("pruning_schedule", "criterion", "scope", "seed")


class PrunableLayer:
    """Mixin for a Keras layer whose ``prunable_weight_names`` carry masks.

    Subclass it together with a Keras layer (``class MaskedDense(PrunableLayer,
    keras.layers.Dense)``), list the weights to prune in
    ``prunable_weight_names``, set ``base_class`` to the plain layer, and make
    the forward pass use :meth:`masked_weight`. Register the pair with
    :func:`prune.register_prunable`.

    Args:
        pruning_schedule: A schedule (ours, tfmot's, or a config dict), or
            ``None`` for masks that change only through :meth:`set_mask`.
        criterion: Registered score name, ``"magnitude"`` or ``"random"``.
        scope: ``"layer"`` (own threshold) or ``"global"`` (one threshold
            shared by every globally scoped weight in the model).
        seed: Seed of the random criterion.
    """

    prunable_weight_names: tuple[str, ...] = ("kernel",)
    base_class: type | None = None
    keeps_pruning_step = True  # has a saved ``pruning_step`` counter (see prune.pruning.stepped_layers)

    def __init__(
        self,
        *args: Any,
        pruning_schedule: PruningSchedule | dict | Any | None = None,
        criterion: str = "magnitude",
        scope: str = "layer",
        seed: int = 0,
        **kwargs: Any,
    ) -> None:
        schedule = None if pruning_schedule is None else as_schedule(pruning_schedule)
        _masks.get_criterion(criterion)
        _masks.check_scope(scope)
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise ValueError(f"seed must be an integer, got {seed!r}")
        super().__init__(*args, **kwargs)
        self.pruning_schedule = schedule
        self.criterion = criterion
        self.scope = scope
        self.seed = int(seed)

    # -- state -----------------------------------------------------------
    def build(self, input_shape: Any = None) -> None:
        super().build(input_shape)
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
        self.pruning_step = self.add_weight(
            name="pruning_step", shape=(), initializer="zeros", dtype="int64", trainable=False
        )

    def _weight(self, name: str) -> Any:
        private = getattr(self, f"_{name}", None)  # Dense/Embedding keep the variable in _kernel/_embeddings
        return private if isinstance(private, keras.Variable) else getattr(self, name)

    def advance_step(self, training: Any) -> None:
        """Count one training step, inside the compiled step (no eager op per batch).

        Called by ``call`` with its ``training`` argument; counts Python-true
        ``training`` only. A layer called several times in one training step
        (a shared layer) counts each call.
        """
        if isinstance(training, bool) and training and self.built:
            require_driver(self)  # Python, at trace time: no per-step cost (prune/driving.py)
            self.pruning_step.assign_add(1)

    def weight_and_mask(self, name: str) -> tuple[Any, Any]:
        """The variable ``name`` and its mask variable."""
        if name not in self.prunable_weight_names:
            raise ValueError(f"weight {name!r} is not prunable in {self.name}; prunable: {list(self.prunable_weight_names)}")
        return self._weight(name), getattr(self, f"{name}_mask")

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
        apply_mask(weight, mask_var, keep, optimizer)

    # -- serialisation -----------------------------------------------------
    # Dense/Embedding/Conv override these to store only kernel and bias (for
    # quantisation and LoRA, which masked layers reject); the generic Layer
    # versions store every variable, masks and step counter included.
    def save_own_variables(self, store: Any) -> None:
        keras.layers.Layer.save_own_variables(self, store)

    def load_own_variables(self, store: Any) -> None:
        keras.layers.Layer.load_own_variables(self, store)

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update(
            pruning_schedule=None if self.pruning_schedule is None else serialize_schedule(self.pruning_schedule),
            criterion=self.criterion,
            scope=self.scope,
            seed=self.seed,
        )
        return config

    def pruning_params(self) -> dict[str, Any]:
        """The pruning arguments of this layer (schedule object, criterion, scope, seed)."""
        return {k: getattr(self, k) for k in _PRUNING_KEYS}

    @classmethod
    def plain_config(cls, config: dict[str, Any]) -> dict[str, Any]:
        """``config`` without the pruning keys: the base layer's config."""
        return {k: v for k, v in config.items() if k not in _PRUNING_KEYS}


def apply_mask(weight: Any, mask_var: Any, keep: np.ndarray, optimizer: Any = None) -> None:
    """Write ``keep`` into ``mask_var``, set pruned weight entries to +0.0, zero their slots."""
    keep = np.asarray(keep, dtype=bool)
    keep_t = tf.constant(keep)
    mask_var.assign(tf.cast(keep_t, mask_var.dtype))
    value = tf.convert_to_tensor(weight.value)
    weight.assign(tf.where(keep_t, value, tf.zeros_like(value)))
    zero_slot_entries(optimizer, weight, keep)


def _reject_lora_and_quantization(layer: Any) -> None:
    if getattr(layer, "lora_rank", None):
        raise ValueError(f"lora_rank={layer.lora_rank!r} is not supported by {type(layer).__name__}")
    if getattr(layer, "quantization_mode", None):
        raise ValueError(f"quantization_mode={layer.quantization_mode!r} is not supported by {type(layer).__name__}")


@keras.saving.register_keras_serializable(package="prune")
class MaskedDense(PrunableLayer, keras.layers.Dense):
    """``keras.layers.Dense`` with ``kernel_mask`` beside ``kernel``.

    Takes every ``Dense`` argument plus the :class:`PrunableLayer` ones.
    """

    base_class = keras.layers.Dense

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


@keras.saving.register_keras_serializable(package="prune")
class MaskedConv1D(PrunableLayer, _MaskedConvMixin, keras.layers.Conv1D):
    """``keras.layers.Conv1D`` with ``kernel_mask`` beside ``kernel``."""

    base_class = keras.layers.Conv1D


@keras.saving.register_keras_serializable(package="prune")
class MaskedConv2D(PrunableLayer, _MaskedConvMixin, keras.layers.Conv2D):
    """``keras.layers.Conv2D`` with ``kernel_mask`` beside ``kernel``."""

    base_class = keras.layers.Conv2D


@keras.saving.register_keras_serializable(package="prune")
class MaskedEmbedding(PrunableLayer, keras.layers.Embedding):
    """``keras.layers.Embedding`` with ``embeddings_mask`` beside ``embeddings``.

    The lookup gathers weight rows and mask rows separately and multiplies
    them, so the gradient stays a row-sparse ``IndexedSlices``.
    """

    prunable_weight_names = ("embeddings",)
    base_class = keras.layers.Embedding

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
