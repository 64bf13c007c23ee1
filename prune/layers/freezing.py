"""Partial trainability: freeze chosen entries of any weight, exactly.

Three recipes from the reference threads freeze part of a tensor:

1. :func:`entry_stop_gradients` -- ``stop_gradient((1 - mask) * t) + mask * t``
   in the forward pass (mask: **1 = trainable, 0 = frozen**).
2. A constant for the frozen part concatenated with a variable for the rest
   (``PartiallyFrozenEmbedding(method="split")`` in :mod:`prune.layers.frozen`).
3. Multiplying the gradient by the mask between ``tape.gradient`` and
   ``apply_gradients`` (:meth:`FrozenEntries.mask_gradients`).

**The trap they share.** A zero gradient does not keep an entry fixed:

* momentum / Adam / RMSprop state that already exists for the entry keeps
  moving it (``m <- beta * m`` is not zero);
* decoupled weight decay (AdamW, or any Keras 3 optimizer with
  ``weight_decay``) computes ``w <- w - lr * wd * w`` for *every* entry of the
  variable, gradient or not;
* ``w + 0.0`` turns a stored ``-0.0`` into ``+0.0`` (SGD with momentum adds).

**Design used here: zero the gradient, zero the slots, restore after apply.**

* Gradients of frozen entries are zeroed (``IndexedSlices`` stay row-sparse:
  their values are multiplied by the gathered mask rows), so the optimizer
  never *builds* state for a frozen entry.
* When an entry becomes frozen after optimizer state exists, its slot entries
  are set to +0.0 (:func:`prune.layers.optimizer_state.zero_slot_entries`), so with
  every Keras 3 optimizer the *update* of a frozen entry is exactly zero.
* That still leaves weight decay (and the ``-0.0`` sign), so every frozen
  variable keeps a non-trainable copy of its frozen values and, after each
  ``apply``, the frozen entries are written back with ``tf.where`` (a select,
  so it is bitwise, ``-0.0`` and NaN included). The write-back rides on the hook
  Keras 3 itself calls after each update: ``Variable.constraint`` (an existing
  constraint such as ``max_norm`` is kept and applied first). Hence it works in
  ``model.fit``, in ``optimizer.apply_gradients`` in a custom loop, inside
  ``tf.function``, with EMA overwrite and with gradient accumulation, without
  wrapping the optimizer. Excluding the variable from weight decay was
  rejected: Keras excludes whole variables only, so trainable entries of the
  same weight would lose their decay.
  Cost: one copy of the variable (the reference values) and one elementwise
  select per step -- the same order as the weight decay it undoes.

The frozen mask is distinct from the pruning mask (``<weight>_mask`` of
:mod:`prune.layers.masked`): a pruned entry is held at exactly zero, a frozen
entry is held at whatever value it had when frozen, which may be nonzero. Both
can apply to one weight.

**Row-sparse gradients and what Keras 3's Adam does with them.** The gradient
of ``tf.gather`` (an embedding lookup) is a ``tf.IndexedSlices``. Keras 3.15
hands it unchanged to ``update_step``; SGD without momentum and Adagrad then
stay sparse (``keras.ops`` multiply/divide keep slices, ``assign_sub`` becomes
``scatter_sub``), so only looked-up rows move. But Keras 3 ``Adam.update_step``
computes ``m += (g - m) * (1 - beta_1)``: ``ops.subtract(IndexedSlices, dense)``
*densifies* the slices (``keras/src/backend/tensorflow/sparse.py``,
``elementwise_binary_union``: "x1 is an IndexedSlices, densify") through
``UnsortedSegmentSum`` into a ``[V, D]`` tensor, and then ``m``, ``v`` and the
variable are updated densely: the moments of rows absent from the batch decay
(``m <- beta_1 m``, ``v <- beta_2 v``) and those rows keep moving by
``alpha * m / (sqrt(v) + eps)`` although their gradient is zero. SGD with
momentum likewise densifies (``ops.subtract(m * momentum, g * lr)``) and moves
absent rows. TensorFlow's "Converting sparse IndexedSlices to a dense Tensor"
warning is only raised for shapes of 1e8+ elements, so silence proves nothing;
the tests look for a ``[V, D]`` ``UnsortedSegmentSum`` in the traced graph.

:class:`LazyAdam` is the lazy option (as ``tensorflow_addons.optimizers.LazyAdam``):
for ``IndexedSlices`` gradients only the rows in the batch update their
moments, their decay and their values; dense gradients get plain Adam.
:func:`transform_slices` is the hook to edit slices (cap rows, drop indices)
before they are applied; :class:`LazyAdam` also accepts one as
``slices_transform`` so the hook runs inside ``model.fit``.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, Sequence

import keras
import numpy as np
import tensorflow as tf

from prune.core.masks import validate_mask
from prune._internals import adam_moments, optimizer_variable_index, uses_weight_decay
from prune.layers.optimizer_state import zero_slot_entries

__all__ = [
    "entry_stop_gradients",
    "FrozenEntries",
    "freeze_entries",
    "transform_slices",
    "CapRowNorm",
    "DropRows",
    "LazyAdam",
]


# ---------------------------------------------------------------------------
# Recipe 1: stop_gradient on the frozen part.


def _row_broadcast(mask: tf.Tensor, rank: int, target_shape: Any) -> tf.Tensor:
    """Append trailing unit axes so a leading-axes mask (e.g. a row mask) broadcasts."""
    m_rank = mask.shape.rank
    if m_rank is None or m_rank >= rank:
        return mask
    lead = target_shape[:m_rank]
    if all(a is None or b is None or a == b for a, b in zip(mask.shape, lead)):
        return tf.reshape(mask, tf.concat([tf.shape(mask), tf.ones([rank - m_rank], tf.int32)], 0))
    return mask


def entry_stop_gradients(target: Any, mask: Any) -> tf.Tensor:
    """``stop_gradient((1 - mask) * target) + mask * target``: gradient only where mask is 1.

    Mask orientation: **1 (or True) = trainable, 0 (or False) = frozen.** The
    value returned equals ``target`` (bitwise for finite values); the gradient
    with respect to ``target`` is the upstream gradient times ``mask``.

    A mask whose shape equals the *leading* axes of ``target`` is broadcast
    over the remaining axes, so a row mask ``[V]`` freezes whole rows of a
    ``[V, D]`` matrix (numpy broadcasting would align it with the last axis
    instead). Any other shape broadcasts as usual. Works eagerly and in
    ``tf.function``.

    Args:
        target: Tensor or variable (float).
        mask: 0/1 or bool array or tensor, of ``target``'s shape, of its
            leading axes, or broadcastable to it.

    Returns:
        A tensor with the value of ``target``.

    Raises:
        ValueError: a concrete (non-symbolic) mask with values other than 0/1,
            or a mask that does not broadcast against ``target``.
    """
    target = tf.convert_to_tensor(target)
    if isinstance(mask, (np.ndarray, list, tuple, bool, int, float)) or (
        isinstance(mask, tf.Tensor) and tf.executing_eagerly() and not isinstance(mask, tf.Variable)
    ):
        arr = np.asarray(mask)
        if arr.dtype != bool and not np.isin(arr, (0, 1)).all():
            bad = np.unique(arr[~np.isin(arr, (0, 1))])[:5].tolist()
            raise ValueError(f"mask must contain only 0 and 1 (1 = trainable, 0 = frozen), got values {bad}")
    mask_t = tf.cast(tf.convert_to_tensor(mask), target.dtype)
    mask_t = _row_broadcast(mask_t, target.shape.rank, target.shape)
    try:
        tf.broadcast_static_shape(mask_t.shape, target.shape)
    except ValueError as err:
        raise ValueError(
            f"mask of shape {tuple(mask_t.shape)} does not broadcast against target of shape {tuple(target.shape)}"
        ) from err
    return tf.stop_gradient((1 - mask_t) * target) + mask_t * target


# ---------------------------------------------------------------------------
# Slices hook.

SlicesFn = Callable[[tf.IndexedSlices, Any], tf.IndexedSlices]


def transform_slices(grads_and_vars: Iterable[tuple[Any, Any]], fn: SlicesFn) -> list[tuple[Any, Any]]:
    """Apply ``fn(slices, variable) -> slices`` to every ``IndexedSlices`` gradient.

    The TF2 form of the reference's
    ``tf.IndexedSlices(MyCapper(grad.values), grad.indices)``: call it between
    ``tape.gradient`` and ``optimizer.apply_gradients``. Dense gradients and
    ``None`` pass through unchanged, so the result stays row-sparse::

        grads = tape.gradient(loss, model.trainable_variables)
        pairs = prune.transform_slices(zip(grads, model.trainable_variables), prune.CapRowNorm(1.0))
        optimizer.apply_gradients(pairs)

    For ``model.fit`` pass the transform to :class:`LazyAdam`
    (``slices_transform=``).

    Args:
        grads_and_vars: ``(gradient, variable)`` pairs.
        fn: Callable taking the slices and the variable, returning new slices
            (values and/or indices edited; dense_shape kept).

    Returns:
        The list of transformed pairs.
    """
    if not callable(fn):
        raise ValueError(f"fn must be callable, got {fn!r}")
    out = []
    for grad, var in grads_and_vars:
        if isinstance(grad, tf.IndexedSlices):
            grad = fn(grad, var)
            if not isinstance(grad, tf.IndexedSlices):
                raise ValueError(f"slices transform {fn!r} must return tf.IndexedSlices, got {type(grad).__name__}")
        out.append((grad, var))
    return out


@keras.saving.register_keras_serializable(package="prune")
class CapRowNorm:
    """Slices transform: clip each gradient row to L2 norm at most ``max_norm``.

    Args:
        max_norm: Positive float.
    """

    def __init__(self, max_norm: float) -> None:
        if isinstance(max_norm, bool) or not isinstance(max_norm, (int, float)) or not max_norm > 0:
            raise ValueError(f"max_norm must be a positive number, got {max_norm!r}")
        self.max_norm = float(max_norm)

    def __call__(self, slices: tf.IndexedSlices, variable: Any = None) -> tf.IndexedSlices:
        axes = list(range(1, slices.values.shape.rank))
        values = tf.clip_by_norm(slices.values, self.max_norm, axes=axes) if axes else slices.values
        return tf.IndexedSlices(values, slices.indices, slices.dense_shape)

    def get_config(self) -> dict[str, Any]:
        return {"max_norm": self.max_norm}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "CapRowNorm":
        return cls(**config)


@keras.saving.register_keras_serializable(package="prune")
class DropRows:
    """Slices transform: remove the given row indices from the gradient.

    Dropped rows are absent from the update, so with :class:`LazyAdam` or SGD
    neither they nor their moments change.

    Args:
        rows: Row indices (non-negative integers) to drop.
    """

    def __init__(self, rows: Sequence[int]) -> None:
        arr = np.asarray(rows)
        if arr.ndim != 1 or (arr.size and (arr.dtype.kind not in "iu" or arr.min() < 0)):
            raise ValueError(f"rows must be a 1-D sequence of non-negative integers, got {rows!r}")
        self.rows = [int(r) for r in arr]

    def __call__(self, slices: tf.IndexedSlices, variable: Any = None) -> tf.IndexedSlices:
        rows = tf.constant(self.rows, dtype=slices.indices.dtype)
        keep = tf.logical_not(tf.reduce_any(tf.equal(slices.indices[:, None], rows[None, :]), axis=1))
        return tf.IndexedSlices(
            tf.boolean_mask(slices.values, keep), tf.boolean_mask(slices.indices, keep), slices.dense_shape
        )

    def get_config(self) -> dict[str, Any]:
        return {"rows": list(self.rows)}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "DropRows":
        return cls(**config)


# ---------------------------------------------------------------------------
# General entry freezing.


def _as_tensor(v: Any) -> tf.Tensor:
    return tf.convert_to_tensor(v.value if isinstance(v, keras.Variable) else v)


class _RestoreFrozen:
    """Constraint: apply the previous constraint, then write back frozen entries."""

    def __init__(self, frozen: tf.Variable, reference: tf.Variable, previous: Any) -> None:
        self.frozen = frozen
        self.reference = reference
        self.previous = previous

    def __call__(self, w: Any) -> tf.Tensor:
        if self.previous is not None:
            w = self.previous(w)
        w = _as_tensor(w)
        return tf.where(self.frozen, tf.cast(self.reference, w.dtype), w)


class _Entry:
    def __init__(self, variable: Any, frozen: np.ndarray) -> None:
        self.variable = variable
        self.frozen = tf.Variable(frozen, trainable=False, dtype=tf.bool)
        self.reference = tf.Variable(_as_tensor(variable), trainable=False)
        self.previous = getattr(variable, "constraint", None) if isinstance(variable, keras.Variable) else None
        if isinstance(variable, keras.Variable):
            variable.constraint = _RestoreFrozen(self.frozen, self.reference, self.previous)


def _frozen_full(frozen: Any, shape: tuple[int, ...], name: str) -> np.ndarray:
    """Validate a frozen mask of ``shape`` or of its leading axes; broadcast to ``shape``."""
    arr = np.asarray(frozen)
    if arr.ndim < len(shape) and tuple(arr.shape) == tuple(shape[: arr.ndim]):
        arr = validate_mask(arr, tuple(arr.shape), name=name)
        return np.broadcast_to(arr.reshape(arr.shape + (1,) * (len(shape) - arr.ndim)), shape).copy()
    return validate_mask(arr, tuple(shape), name=name)


class FrozenEntries:
    """Freeze arbitrary entries of variables; frozen entries keep their value bitwise.

    ``frozen`` masks here are **True = frozen** (the inverse of the
    ``entry_stop_gradients`` mask, hence the different argument name). A mask
    may have the variable's shape or that of its leading axes (a row mask).

    Usage, for ``model.fit`` or any loop that calls ``optimizer.apply``::

        freezer = prune.FrozenEntries()
        frozen = np.zeros(dense.kernel.shape, bool); frozen[:, :10] = True
        freezer.freeze(dense.kernel, frozen, optimizer)   # first 10 output units
        model.fit(...)        # frozen entries never change

    The write-back is installed as the variable's ``constraint``, which Keras
    reads when it *traces* the train step: freeze before the first
    ``fit``/``tf.function`` trace, or retrace afterwards
    (``model.make_train_function(force=True)``; :func:`freeze_entries` does it).
    Changing an existing frozen set later needs no retrace (masks and values
    live in variables).

    In a custom loop, :meth:`apply_gradients` also zeroes the frozen entries'
    gradients first (recipe 3), so optimizer state is never built for them.

    Args:
        None. Variables are added with :meth:`freeze`.
    """

    def __init__(self) -> None:
        self._entries: dict[int, _Entry] = {}

    # -- state --------------------------------------------------------------
    def freeze(self, variable: Any, frozen: Any, optimizer: Any = None) -> None:
        """Set the frozen entries of ``variable`` (replacing any earlier set).

        Entries frozen now keep their current value from here on; entries
        unfrozen start training from their current value. Slot entries of
        every entry whose status changes, and of every frozen entry, are set
        to +0.0, so a later unfreeze starts with fresh optimizer state.

        Args:
            variable: A ``keras.Variable`` (restored automatically after each
                optimizer step) or a ``tf.Variable`` (call :meth:`restore`).
            frozen: Bool or 0/1 array, True/1 = frozen, of the variable's shape
                or of its leading axes.
            optimizer: Optimizer whose state to reset, or ``None``.

        Raises:
            ValueError: bad variable or mask; raised before anything changes.
        """
        if not hasattr(variable, "assign") or not hasattr(variable, "shape"):
            raise ValueError(f"variable must be a keras.Variable or tf.Variable, got {variable!r}")
        shape = tuple(int(d) for d in variable.shape)
        name = f"frozen mask for {getattr(variable, 'path', getattr(variable, 'name', 'variable'))}"
        full = _frozen_full(frozen, shape, name)
        entry = self._entries.get(id(variable))
        previous = np.zeros(shape, bool) if entry is None else entry.frozen.numpy()
        if entry is None:
            entry = _Entry(variable, full)
            self._entries[id(variable)] = entry
        else:
            entry.frozen.assign(full)
            entry.reference.assign(_as_tensor(variable))
        zero_slot_entries(optimizer, variable, ~(full | (full != previous)))

    set_frozen = freeze

    def unfreeze(self, variable: Any, optimizer: Any = None) -> None:
        """Make every entry of ``variable`` trainable again and drop its bookkeeping."""
        entry = self._entries.pop(id(variable), None)
        if entry is None:
            raise ValueError(f"variable {getattr(variable, 'path', variable)!r} is not frozen by this FrozenEntries")
        zero_slot_entries(optimizer, variable, ~entry.frozen.numpy())
        if isinstance(variable, keras.Variable):
            variable.constraint = entry.previous

    def variables(self) -> list[Any]:
        """The variables with a frozen set."""
        return [e.variable for e in self._entries.values()]

    def frozen_mask(self, variable: Any) -> np.ndarray:
        """The current frozen mask (bool, variable's shape; True = frozen)."""
        entry = self._entries.get(id(variable))
        if entry is None:
            return np.zeros(tuple(variable.shape), bool)
        return entry.frozen.numpy().astype(bool)

    # -- training -----------------------------------------------------------
    def mask_gradients(self, grads_and_vars: Iterable[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
        """Zero the gradients of frozen entries (recipe 3); slices stay slices."""
        out = []
        for grad, var in grads_and_vars:
            entry = self._entries.get(id(var))
            if grad is not None and entry is not None:
                trainable = tf.logical_not(tf.convert_to_tensor(entry.frozen))
                if isinstance(grad, tf.IndexedSlices):
                    rows = tf.gather(trainable, grad.indices)
                    values = tf.where(rows, grad.values, tf.zeros_like(grad.values))
                    grad = tf.IndexedSlices(values, grad.indices, grad.dense_shape)
                else:
                    grad = tf.where(trainable, grad, tf.zeros_like(grad))
            out.append((grad, var))
        return out

    def restore(self) -> None:
        """Write the frozen values back into every frozen entry (bitwise)."""
        for entry in self._entries.values():
            value = _as_tensor(entry.variable)
            entry.variable.assign(tf.where(entry.frozen, tf.cast(entry.reference, value.dtype), value))

    def apply_gradients(
        self,
        optimizer: Any,
        grads_and_vars: Iterable[tuple[Any, Any]],
        slices_transform: SlicesFn | None = None,
    ) -> None:
        """Mask frozen gradients, optionally transform slices, apply, restore.

        Args:
            optimizer: A Keras 3 optimizer.
            grads_and_vars: ``(gradient, variable)`` pairs.
            slices_transform: Optional hook for ``IndexedSlices`` gradients,
                see :func:`transform_slices`.
        """
        pairs = self.mask_gradients(grads_and_vars)
        if slices_transform is not None:
            pairs = transform_slices(pairs, slices_transform)
        optimizer.apply_gradients(pairs)
        # keras.Variables were restored by their constraint inside apply; plain tf.Variables here.
        for entry in self._entries.values():
            if not isinstance(entry.variable, keras.Variable):
                value = _as_tensor(entry.variable)
                entry.variable.assign(tf.where(entry.frozen, tf.cast(entry.reference, value.dtype), value))


def freeze_entries(model: Any, frozen: Mapping[str, Any], optimizer: Any = None) -> FrozenEntries:
    """Freeze entries of a model's weights, addressed by variable path.

    Args:
        model: A built Keras model or layer.
        frozen: ``{variable path: frozen mask}``, e.g.
            ``{"dense/kernel": mask}`` (``variable.path`` in Keras 3, with or
            without the model's name in front); True = frozen.
        optimizer: Optimizer whose state for newly frozen entries to reset.

    Returns:
        The :class:`FrozenEntries` holding the masks.

    Raises:
        ValueError: an unknown path (the valid ones are listed) or a bad mask,
            before any variable changes.
    """
    if not isinstance(frozen, Mapping):
        raise ValueError(f"frozen must be a mapping of variable path to mask, got {type(frozen).__name__}")
    by_path = {v.path: v for v in model.weights}
    prefix = f"{model.name}/"
    # Also accept paths relative to the model ("dense/kernel" for "sequential/dense/kernel").
    by_path.update({p[len(prefix) :]: v for p, v in list(by_path.items()) if p.startswith(prefix)})
    unknown = [p for p in frozen if p not in by_path]
    if unknown:
        raise ValueError(f"unknown variable path(s) {unknown}; valid paths: {sorted(by_path)}")
    for path, mask in frozen.items():  # validate everything before changing anything
        var = by_path[path]
        _frozen_full(mask, tuple(int(d) for d in var.shape), f"frozen mask for {path}")
    freezer = FrozenEntries()
    for path, mask in frozen.items():
        freezer.freeze(by_path[path], mask, optimizer)
    if getattr(model, "train_function", None) is not None:
        model.train_function = None  # retrace fit's step so it sees the new constraints
    return freezer


# ---------------------------------------------------------------------------
# Lazy (row-sparse) Adam.


def _read(v: Any) -> Any:
    return v.value if isinstance(v, keras.Variable) else v


@keras.saving.register_keras_serializable(package="prune")
class LazyAdam(keras.optimizers.Adam):
    """Adam whose ``IndexedSlices`` updates touch only the rows in the batch.

    As ``tensorflow_addons.optimizers.LazyAdam``: for a row-sparse gradient the
    first and second moments, the (decoupled) weight decay and the value are
    updated only for the rows present (duplicate indices are summed first).
    Rows absent from the batch keep value *and* moments bitwise. Dense
    gradients get exactly Keras Adam's update. Bias correction uses the global
    step, as in LazyAdam, so a row seen rarely gets a different step size than
    under dense Adam -- the known trade-off of lazy Adam.

    Args:
        slices_transform: Optional hook ``fn(slices, variable) -> slices``
            applied to every ``IndexedSlices`` gradient before the update (see
            :func:`transform_slices`); use a serialisable one (:class:`CapRowNorm`,
            :class:`DropRows`) if the optimizer is saved.
        **kwargs: Every ``keras.optimizers.Adam`` argument, ``weight_decay``
            included (decoupled, as AdamW).
    """

    def __init__(self, *args: Any, slices_transform: SlicesFn | None = None, **kwargs: Any) -> None:
        if isinstance(slices_transform, dict):
            slices_transform = keras.saving.deserialize_keras_object(slices_transform)
        if slices_transform is not None and not callable(slices_transform):
            raise ValueError(f"slices_transform must be callable or None, got {slices_transform!r}")
        super().__init__(*args, **kwargs)
        self.slices_transform = slices_transform

    def _apply_weight_decay(self, variables: Any) -> None:
        return None  # applied per row (or densely for dense gradients) in update_step

    def _decay(self, variable: Any, learning_rate: Any) -> Any:
        if self.weight_decay is None or not uses_weight_decay(self, variable):
            return None
        return tf.cast(learning_rate, variable.dtype) * tf.cast(self.weight_decay, variable.dtype)

    def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> None:
        if not isinstance(gradient, tf.IndexedSlices):
            decay = self._decay(variable, learning_rate)
            if decay is not None:
                variable.assign(variable - variable * decay)
            super().update_step(gradient, variable, learning_rate)
            return
        if self.slices_transform is not None:
            gradient = self.slices_transform(gradient, variable)
        dtype = variable.dtype
        lr = tf.cast(learning_rate, dtype)
        step = tf.cast(self.iterations + 1, dtype)
        beta_1 = tf.cast(self.beta_1, dtype)
        beta_2 = tf.cast(self.beta_2, dtype)
        alpha = lr * tf.sqrt(1 - tf.pow(beta_2, step)) / (1 - tf.pow(beta_1, step))
        rows, pos = tf.unique(gradient.indices)
        g = tf.math.unsorted_segment_sum(tf.cast(gradient.values, dtype), pos, tf.shape(rows)[0])
        m, v, hat = adam_moments(self, optimizer_variable_index(self, variable))
        m, v = _read(m), _read(v)
        var = _read(variable)
        m_rows, v_rows = tf.gather(m, rows), tf.gather(v, rows)
        # Same constants and operation order as keras Adam (1 - beta in Python, then cast).
        m_rows = m_rows + (g - m_rows) * tf.cast(1 - self.beta_1, dtype)
        v_rows = v_rows + (tf.square(g) - v_rows) * tf.cast(1 - self.beta_2, dtype)
        m.scatter_update(tf.IndexedSlices(m_rows, rows))
        v.scatter_update(tf.IndexedSlices(v_rows, rows))
        if self.amsgrad:
            vh = _read(hat)
            v_rows = tf.maximum(tf.gather(vh, rows), v_rows)
            vh.scatter_update(tf.IndexedSlices(v_rows, rows))
        decay = self._decay(variable, learning_rate)
        if decay is not None:
            w_rows = tf.gather(var, rows)
            var.scatter_update(tf.IndexedSlices(w_rows - w_rows * decay, rows))
        var.scatter_sub(tf.IndexedSlices(m_rows * alpha / (tf.sqrt(v_rows) + tf.cast(self.epsilon, dtype)), rows))

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config["slices_transform"] = (
            None if self.slices_transform is None else keras.saving.serialize_keras_object(self.slices_transform)
        )
        return config
