"""``PartiallyFrozenEmbedding``: pretrained rows fixed, the other rows trained.

Three interchangeable implementations (``method``), the three recipes of the
reference threads; they compute the same outputs and, after the same steps
with SGD or Adam, the same trainable rows:

``"stop_gradient"``
    One trainable ``embeddings`` variable ``[V, D]``; the lookup is
    ``entry_stop_gradients(rows, 1 - frozen[ids])``, so frozen rows get a zero
    gradient inside any training loop.
``"gradient_mask"``
    One trainable ``embeddings`` variable; the lookup is a plain gather and
    :meth:`PartiallyFrozenEmbedding.mask_gradients` zeroes the frozen rows'
    gradients between ``tape.gradient`` and ``apply_gradients`` (recipe 3).
    In ``model.fit`` (no such hook) frozen rows receive gradients and
    optimizer state, but their values are still restored after each step.
``"split"``
    Only the trainable rows live in a trainable variable ``trainable_rows``
    ``[V_t, D]``; the frozen rows are held apart in the non-trainable
    ``frozen_rows`` ``[V_f, D]`` and ``row_position[V]`` maps a word id to its
    row in either part. The optimizer allocates state for ``V_t`` rows only and
    never sees the frozen rows, so they cannot move. The lookup partitions the
    ids (``tf.dynamic_partition``), gathers from each part and stitches the
    result; no ``[V, D]`` concatenation is materialised per step.

For the two single-variable methods a zero gradient is not enough (see
:mod:`prune.layers.freezing`): the layer keeps ``frozen_reference`` (a copy of the
matrix) and writes the frozen rows back after every optimizer step, through
the variable's ``constraint``, which Keras 3 applies inside
``optimizer.apply``. This holds under weight decay and any optimizer state;
its price is one extra ``[V, D]`` copy, which ``"split"`` does not need.

Every row-sparse property is kept: the gradient reaching the trainable
variable is a ``tf.IndexedSlices`` for all three methods.

Masks are **True = frozen** here (``frozen``), the inverse of
``entry_stop_gradients``' trainable mask.
"""

from __future__ import annotations

from typing import Any, Iterable

import keras
import numpy as np
import tensorflow as tf

from prune.layers.freezing import entry_stop_gradients
from prune.layers.kinds import register_layer
from prune.layers.optimizer_state import zero_slot_entries

__all__ = ["PartiallyFrozenEmbedding", "METHODS"]

METHODS = ("stop_gradient", "split", "gradient_mask")


def _check_frozen(frozen: Any, rows: int, name: str = "frozen") -> np.ndarray:
    arr = np.asarray(frozen)
    if arr.dtype != bool:
        raise ValueError(f"{name} must be a boolean array (True = frozen), got dtype {arr.dtype}")
    if arr.shape != (rows,):
        raise ValueError(f"{name} must have shape ({rows},) (one flag per pretrained row), got shape {arr.shape}")
    return arr


def _positions(frozen: np.ndarray) -> np.ndarray:
    """Row of each word id inside its part (trainable or frozen), in id order."""
    pos = np.empty(frozen.shape[0], np.int32)
    pos[~frozen] = np.arange(int((~frozen).sum()), dtype=np.int32)
    pos[frozen] = np.arange(int(frozen.sum()), dtype=np.int32)
    return pos


class _RestoreFrozenRows:
    """Variable constraint: frozen rows back to their reference values (bitwise)."""

    def __init__(self, layer: "PartiallyFrozenEmbedding") -> None:
        self.layer = layer

    def __call__(self, w: Any) -> tf.Tensor:
        w = tf.convert_to_tensor(w.value if isinstance(w, keras.Variable) else w)
        frozen = tf.convert_to_tensor(self.layer.frozen_mask.value)[:, None]
        ref = tf.convert_to_tensor(self.layer.frozen_reference.value)
        return tf.where(frozen, ref, w)


@register_layer
class PartiallyFrozenEmbedding(keras.layers.Layer):
    """Embedding whose frozen rows stay bitwise fixed under any optimizer.

    Example::

        words, matrix, known = prune.layers.embeddings.load_glove("glove.6B.50d.txt", vocab)
        emb = prune.layers.PartiallyFrozenEmbedding(matrix, frozen=known, method="split")

    Args:
        pretrained: Initial matrix ``[V, D]`` (float). May be ``None`` only
            when ``input_dim`` and ``output_dim`` are given (loading).
        frozen: Bool ``[V]``, True = row frozen. ``None`` freezes nothing.
        method: ``"stop_gradient"``, ``"split"`` or ``"gradient_mask"``.
        input_dim: Vocabulary size ``V`` when ``pretrained`` is ``None``.
        output_dim: Embedding width ``D`` when ``pretrained`` is ``None``.
        num_frozen: Number of frozen rows when ``pretrained`` is ``None``
            (fixes the variable shapes of ``"split"``).
        **kwargs: ``keras.layers.Layer`` arguments (``name``, ``dtype``...).

    Raises:
        ValueError: naming the argument and value, before any variable is
            created: ``pretrained`` not 2-D or not numeric, ``frozen`` of the
            wrong length or not boolean, unknown ``method``.
    """

    def __init__(
        self,
        pretrained: Any = None,
        frozen: Any = None,
        method: str = "stop_gradient",
        input_dim: int | None = None,
        output_dim: int | None = None,
        num_frozen: int | None = None,
        **kwargs: Any,
    ) -> None:
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}; valid methods: {list(METHODS)}")
        if pretrained is not None:
            arr = np.asarray(pretrained)
            if arr.ndim != 2:
                raise ValueError(f"pretrained must be a 2-D array [V, D], got shape {arr.shape}")
            if arr.dtype.kind not in "fiu":
                raise ValueError(f"pretrained must be numeric, got dtype {arr.dtype}")
            rows, dim = int(arr.shape[0]), int(arr.shape[1])
        else:
            for arg, value in (("input_dim", input_dim), ("output_dim", output_dim)):
                if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
                    raise ValueError(f"{arg} must be a positive integer when pretrained is None, got {value!r}")
            arr, rows, dim = None, int(input_dim), int(output_dim)
        if frozen is None:
            if arr is None and num_frozen not in (None, 0):
                frozen_arr = None  # loading: the saved frozen_mask variable supplies it
            else:
                frozen_arr = np.zeros(rows, bool)
        else:
            frozen_arr = _check_frozen(frozen, rows)
        if frozen_arr is not None:
            num_frozen = int(frozen_arr.sum())
        elif isinstance(num_frozen, bool) or not isinstance(num_frozen, (int, np.integer)) or not 0 <= num_frozen <= rows:
            raise ValueError(f"num_frozen must be an integer in [0, {rows}], got {num_frozen!r}")
        super().__init__(**kwargs)
        self.method = method
        self.input_dim = rows
        self.output_dim = dim
        self.num_frozen = int(num_frozen)
        self._init_values = arr
        self._init_frozen = frozen_arr if frozen_arr is not None else np.zeros(rows, bool)
        self.build()

    # -- state ------------------------------------------------------------
    def build(self, input_shape: Any = None) -> None:
        if self.built:
            return
        values = self._init_values
        frozen = self._init_frozen
        if frozen.sum() != self.num_frozen:  # loading split: placeholder layout of the right sizes
            frozen = np.zeros(self.input_dim, bool)
            frozen[: self.num_frozen] = True
        dtype = self.variable_dtype

        def const(array: np.ndarray | None, shape: tuple[int, ...]) -> Any:
            if array is None:
                return "zeros"
            return lambda shape=None, dtype=None: np.asarray(array).astype(keras.backend.standardize_dtype(dtype))

        self.frozen_mask = self.add_weight(
            name="frozen_mask", shape=(self.input_dim,), dtype="bool", trainable=False,
            initializer=lambda shape=None, dtype=None: frozen,
        )
        if self.method == "split":
            n_frozen, dim = self.num_frozen, self.output_dim
            self.trainable_rows = self.add_weight(
                name="trainable_rows", shape=(self.input_dim - n_frozen, dim), dtype=dtype,
                initializer=const(None if values is None else values[~frozen], ()),
            )
            self.frozen_rows = self.add_weight(
                name="frozen_rows", shape=(n_frozen, dim), dtype=dtype, trainable=False,
                initializer=const(None if values is None else values[frozen], ()),
            )
            self.row_position = self.add_weight(
                name="row_position", shape=(self.input_dim,), dtype="int32", trainable=False,
                initializer=lambda shape=None, dtype=None: _positions(frozen),
            )
        else:
            self.embeddings = self.add_weight(
                name="embeddings", shape=(self.input_dim, self.output_dim), dtype=dtype,
                initializer=const(values, ()),
            )
            self.frozen_reference = self.add_weight(
                name="frozen_reference", shape=(self.input_dim, self.output_dim), dtype=dtype, trainable=False,
                initializer=const(values, ()),
            )
            self.embeddings.constraint = _RestoreFrozenRows(self)
        self._init_values = None  # do not pin the caller's array
        self.built = True

    @property
    def trainable_variable(self) -> Any:
        """The variable the optimizer trains (``trainable_rows`` or ``embeddings``)."""
        return self.trainable_rows if self.method == "split" else self.embeddings

    def get_frozen(self) -> np.ndarray:
        """The frozen row mask (bool ``[V]``, True = frozen)."""
        return np.asarray(self.frozen_mask.numpy()).astype(bool)

    def get_embeddings(self) -> np.ndarray:
        """The full ``[V, D]`` matrix the layer looks up, as a NumPy array."""
        if self.method != "split":
            return np.asarray(self.embeddings.numpy())
        frozen = self.get_frozen()
        pos = np.asarray(self.row_position.numpy())
        out = np.empty((self.input_dim, self.output_dim), dtype=keras.backend.standardize_dtype(self.variable_dtype))
        out[~frozen] = np.asarray(self.trainable_rows.numpy())[pos[~frozen]]
        out[frozen] = np.asarray(self.frozen_rows.numpy())[pos[frozen]]
        return out

    def set_frozen(self, frozen: Any, optimizer: Any = None) -> None:
        """Change the frozen rows mid-training, keeping every frozen row exact.

        Rows frozen now keep their current value from here on. The optimizer
        slot entries of every row whose status changes are set to +0.0 (and,
        for the single-variable methods, those of all frozen rows), so newly
        trainable rows start with fresh state and newly frozen rows get an
        exactly zero update. ``"split"`` fixes its variable shapes, so there the
        number of frozen rows must stay the same (rows swap between parts).

        Args:
            frozen: Bool ``[V]``, True = frozen.
            optimizer: The optimizer training this layer, or ``None``.

        Raises:
            ValueError: bad mask, or a changed frozen count with ``"split"``;
                raised before any variable changes.
        """
        new = _check_frozen(frozen, self.input_dim)
        old = self.get_frozen()
        if self.method != "split":
            changed_or_frozen = new | (new != old)
            self.frozen_reference.assign(self.embeddings.value)
            self.frozen_mask.assign(new)
            keep = np.broadcast_to(~changed_or_frozen[:, None], (self.input_dim, self.output_dim))
            zero_slot_entries(optimizer, self.embeddings, keep)
            return
        if int(new.sum()) != self.num_frozen:
            raise ValueError(
                f"method='split' keeps {self.num_frozen} frozen rows (its variable shapes are fixed), "
                f"got frozen with {int(new.sum())} True; build a new layer or use method='stop_gradient'"
            )
        full = self.get_embeddings()
        pos = np.asarray(self.row_position.numpy()).copy()
        new_pos = np.empty_like(pos)
        # Rows that keep their status keep their position; movers take the freed positions.
        for part in (False, True):
            stay = (new == part) & (old == part)
            new_pos[stay] = pos[stay]
            used = np.zeros(int((new == part).sum()), bool)
            used[pos[stay]] = True
            movers = np.flatnonzero((new == part) & (old != part))
            new_pos[movers] = np.flatnonzero(~used)[: movers.size]
        train_rows = np.empty((self.input_dim - self.num_frozen, self.output_dim), full.dtype)
        frozen_rows = np.empty((self.num_frozen, self.output_dim), full.dtype)
        train_rows[new_pos[~new]] = full[~new]
        frozen_rows[new_pos[new]] = full[new]
        keep_slots = np.ones(train_rows.shape[0], bool)
        keep_slots[new_pos[~new & old]] = False  # positions now holding a newly trainable row
        self.trainable_rows.assign(train_rows)
        self.frozen_rows.assign(frozen_rows)
        self.row_position.assign(new_pos)
        self.frozen_mask.assign(new)
        zero_slot_entries(optimizer, self.trainable_rows, np.broadcast_to(keep_slots[:, None], train_rows.shape))

    # -- training ---------------------------------------------------------
    def call(self, inputs: Any) -> tf.Tensor:
        ids = tf.convert_to_tensor(inputs)
        if ids.dtype not in (tf.int32, tf.int64):
            ids = tf.cast(ids, tf.int32)
        if self.method == "gradient_mask":
            out = tf.gather(self.embeddings.value, ids)
        elif self.method == "stop_gradient":
            rows = tf.gather(self.embeddings.value, ids)
            trainable = tf.logical_not(tf.gather(self.frozen_mask.value, ids))
            out = entry_stop_gradients(rows, trainable)
        else:
            flat = tf.reshape(ids, [-1])
            part = tf.cast(tf.gather(self.frozen_mask.value, flat), tf.int32)
            pos = tf.gather(self.row_position.value, flat)
            where = tf.range(tf.shape(flat)[0])
            pos_t, pos_f = tf.dynamic_partition(pos, part, 2)
            at_t, at_f = tf.dynamic_partition(where, part, 2)
            rows_t = tf.gather(self.trainable_rows.value, pos_t)
            rows_f = tf.gather(self.frozen_rows.value, pos_f)
            out = tf.dynamic_stitch([at_t, at_f], [rows_t, rows_f])
            out = tf.reshape(out, tf.concat([tf.shape(ids), [self.output_dim]], 0))
        return tf.cast(out, self.compute_dtype)

    def compute_output_shape(self, input_shape: Any) -> tuple:
        return tuple(input_shape) + (self.output_dim,)

    def mask_gradients(self, grads_and_vars: Iterable[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
        """Zero the frozen rows' gradients (recipe 3); slices stay slices.

        Needed only with ``method="gradient_mask"`` in a custom loop; a no-op
        for pairs of other variables.
        """
        out = []
        for grad, var in grads_and_vars:
            if grad is not None and self.method != "split" and var is self.embeddings:
                trainable = tf.logical_not(tf.convert_to_tensor(self.frozen_mask.value))
                if isinstance(grad, tf.IndexedSlices):
                    keep = tf.gather(trainable, grad.indices)[:, None]
                    grad = tf.IndexedSlices(
                        tf.where(keep, grad.values, tf.zeros_like(grad.values)), grad.indices, grad.dense_shape
                    )
                else:
                    grad = tf.where(trainable[:, None], grad, tf.zeros_like(grad))
            out.append((grad, var))
        return out

    # -- serialisation ----------------------------------------------------
    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update(
            method=self.method,
            input_dim=self.input_dim,
            output_dim=self.output_dim,
            num_frozen=self.num_frozen,
        )
        return config

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "PartiallyFrozenEmbedding":
        return cls(**config)
