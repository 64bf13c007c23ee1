"""``SparseDense``: a fully connected layer whose weight is stored sparse, and its pruning plumbing.

The weight is ``tf.SparseTensor(indices, values, [n_in, n_out])``: ``values``
is a trainable ``[nnz]`` variable, ``indices`` a non-trainable int64
``[nnz, 2]`` variable beside it, row-major sorted, and ``values[k]`` belongs
to ``indices[k]``. The product runs through :func:`prune.layers.kernels.sparse_matmul`
(``matmul="native"|"coo"|"csr"|"dense"|"auto"``), whose gradients reach
``values`` and the input only.

Beside them the layer keeps what the kernels read, rebuilt only when the
structure changes (in :meth:`SparseDense._set_structure`, which build,
:meth:`SparseDense.compact` and loading go through): ``transpose_perm`` and
``transpose_indices`` (``W^T`` in row-major order, for the CSR kernel) and
``native_structure``, the int32 vector of :func:`prune.native.structure`
(CSR of ``W`` and of ``W^T`` and the permutation between them) for the
native kernels. They are derived, never taken from outside:
:meth:`SparseDense.set_weights`, loading (``.keras`` and ``.weights.h5``
files) and :meth:`SparseDense.from_sparse` validate ``values`` and
``indices`` (integer, in range, row-major sorted and unique, lengths that
agree) before any variable changes, and recompute the derived arrays from
them, ignoring any copies given or stored: the kernels trust them, and a
``transpose_perm`` or ``native_structure`` that disagreed with ``indices``
would give wrong products, not errors. (``model.set_weights`` and
``tf.train.Checkpoint`` assign the layer's variables directly, past these
checks.) ``values`` stay in ``W``'s row-major order, so the weight a
user sees, the saved format and every mask driver are the same whichever
kernel runs; the native forward pass gathers the values into ``W^T`` order
inside its op (one pass over ``nnz``, about 0.1 ms at 100k entries).

Design decision: **the layer shrinks in place as it is pruned.** At each mask
update (eager, between training steps) :meth:`SparseDense.compact` drops the
pruned entries from ``values``, ``indices``, the transposed-structure helpers
and the optimizer's slots, so parameter count and memory fall as sparsity
rises. Keras variables have a fixed shape, and a compiled train step holds the
resource handles it traced with, so:

* the layer's own variables are Keras variables backed by ``tf.Variable``\\ s
  whose first dimension is unknown (``TensorShape([None])``). Their *objects*
  never change, only their contents, so a ``tf.function`` traced before a
  compaction reads the new, shorter values without retracing, and the
  optimizer (which keys its slots by variable identity) still knows them.
  The Keras-side ``shape`` is updated to the current ``nnz``, so
  ``count_params`` and saving report the truth.
* the optimizer's slots are created by the optimizer with a static shape. At
  the first compaction each slot's backing ``tf.Variable`` is replaced once by
  an unknown-first-dimension one; a compiled train step traced before then
  holds the old handles and must be retraced once.
  :meth:`SparseDense.compact` returns ``True`` exactly then;
  :class:`prune.UpdatePruningStep` calls ``model.make_train_function(force=True)``
  (Keras's ``fit`` loop looks ``train_function`` up again before every batch).
  A stale train step does not train silently: its slots no longer match the
  gradient's length and the step fails with a shape error.

Alternatives rejected: a full-size ``values`` with a mask (memory does not
fall); replacing variables at every update (the optimizer would lose track of
them and every update would force a retrace).

Mask updates: ``SparseDense`` answers the mask-target protocol
(:meth:`SparseDense.mask_targets`, see :mod:`prune.core.targets`): it presents
the dense view of its weight (absent entries are zeros and count as already
pruned) and installs a new keep-mask by :meth:`SparseDense.restructure`
(the engine's masks only shrink: that drops entries). So
:func:`prune.update_masks` and :class:`prune.UpdatePruningStep` drive it
exactly as they drive masked layers, with every criterion, pattern and scope
(a masked-dense model and a ``SparseDense`` model pruned alike select the
same masks, also under global scope), and a key ``"<layer>/kernel"`` as a
``MaskedDense`` of the same name has. A block or N:M pattern leaves a block or
N:M structure, stored as COO entries. When the entries form whole 1 x C tiles
along the output axis (C = 4, 8, 16 or 32, e.g. a ``Block((r, 16))`` pattern),
``native_structure`` also holds their block-CSR and block-CSC (row-major
``values`` already are the tiles, one after another) and the native ops run
their block kernels: no variable changes, so the saved format is today's.

``SparseDense`` is a :class:`prune.layers.ScheduledLayer` (pruning parameters
and step counter as every layer the engine drives), but deliberately not a
:class:`prune.layers.PrunableLayer`:
it has no dense ``kernel`` or ``kernel_mask`` for :func:`prune.strip_pruning`
or :func:`prune.apply_masked_gradients` to act on, and a dense mask variable
would defeat the memory saving. In a custom loop call
:func:`prune.update_masks` eagerly before the step and retrace the compiled
step when its result has ``retrace=True``.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator, Sequence

import keras
import numpy as np
import tensorflow as tf

from prune._internals import backing_variable, override_call, own_variables, set_backing_variable, set_variable_shape
from prune import native
from prune.layers import kernels
from prune.core import masks as _masks
from prune.layers.kinds import register_layer
from prune.layers.scheduled import ScheduledLayer
from prune.layers.optimizer_state import slots_for
from prune.core.patterns import Pattern, num_zeros
from prune.core.targets import MaskTarget, iter_layers
from prune.core.schedules import PruningSchedule

__all__ = ["BITMAP_FORMAT", "STORE_FORMAT", "SparseDense", "sparse_layers", "store_format"]


def _make_dynamic(var: Any, value: Any) -> bool:
    """Give Keras variable ``var`` the contents ``value``, whose first dimension may differ.

    Returns True when the backing ``tf.Variable`` had to be replaced (it had
    a static shape), i.e. when graphs traced earlier hold a stale handle.
    """
    value = tf.convert_to_tensor(value, dtype=var.dtype)
    backing = backing_variable(var)
    replaced = backing.shape.rank is None or backing.shape[0] is not None
    if replaced:
        dynamic = tf.TensorShape([None]).concatenate(value.shape[1:])
        set_backing_variable(var, tf.Variable(value, shape=dynamic, trainable=backing.trainable, name=backing.name.split(":")[0]))
    else:
        backing.assign(value)
    set_variable_shape(var, tuple(int(d) for d in value.shape))
    return replaced


def _check_finite(w: np.ndarray, name: str) -> None:
    """Refuse a dense weight holding NaN or inf (the pruning engine refuses those too), naming the first."""
    if w.dtype.kind in "fc" and not np.all(np.isfinite(w)):
        bad = np.argwhere(~np.isfinite(w))
        raise ValueError(
            f"{name} holds {len(bad)} NaN or infinite entries (the first at {tuple(int(i) for i in bad[0])}: "
            f"{w[tuple(bad[0])]!r}); a sparse layer cannot be built from them"
        )


def _check_bias(bias: Any, n_out: int) -> None:
    """Refuse a ``bias`` (construction input, ``None`` allowed) that is not ``n_out`` real numbers."""
    if bias is None:
        return
    b = np.asarray(bias)
    if b.shape != (n_out,):
        raise ValueError(f"bias must have shape ({n_out},), got shape {b.shape}")
    if not kernels.is_real_dtype(b.dtype):
        raise ValueError(f"bias must be real numbers, got dtype {b.dtype}")


STORE_FORMAT = 2
"""The version of :meth:`SparseDense.save_own_variables`' compact store by CSR (``row_ptr``, ``cols``; 1: Keras's
own, every variable)."""

BITMAP_FORMAT = 3
"""The version of the compact store by bitmap (``mask_bits``: one bit per cell of the weight matrix), written
instead of :data:`STORE_FORMAT` when it is smaller (:func:`store_format`)."""


def store_format(n_in: int, n_out: int, nnz: int) -> int:
    """The compact store :meth:`SparseDense.save_own_variables` writes for a matrix of these sizes: the smaller one.

    CSR (:data:`STORE_FORMAT`) takes ``4 * (n_in + 1 + nnz)`` bytes of structure, the bitmap
    (:data:`BITMAP_FORMAT`) ``ceil(n_in * n_out / 8)``: the bitmap wins above a density of about 1/32 (below
    about 97% sparsity), and an N:M structure costs it exactly ``m / n / 8`` bytes per entry (2 bits at 2:4,
    where CSR costs 32). The values are stored alike in both.
    """
    bitmap = -(-int(n_in) * int(n_out) // 8)
    return BITMAP_FORMAT if bitmap < 4 * (int(n_in) + 1 + int(nnz)) else STORE_FORMAT


def _store_source(store: Any) -> str | None:
    """The file a Keras weights store reads, when the store says (a path, or a ``.keras`` archive and its member).

    Keras reads a ``.keras`` file's weights through an in-memory copy whose
    store knows no path; then ``None``.
    """
    member = getattr(store, "path_or_io", None)
    archive = getattr(getattr(store, "archive", None), "filename", None)
    if archive:
        return f"{str(archive)!r} (member {str(member)!r})"
    for path in (member, getattr(store, "path", None)):
        if isinstance(path, (str, os.PathLike)):
            return repr(str(path))
    return None


@register_layer
class SparseDense(ScheduledLayer, keras.layers.Layer):
    """Fully connected layer with a sparse weight: ``activation(x @ W + bias)``.

    Build it from a dense matrix and mask with :meth:`from_dense`, from COO
    entries with :meth:`from_sparse`, or directly, in which case a uniformly
    random structure with exactly ``round(sparsity * n_in * units)`` absent
    entries is drawn at build time from ``seed``, and values come from
    ``kernel_initializer`` (evaluated on the dense shape, so fan-in and
    fan-out scaling match ``Dense``).

    Args:
        units: Output width.
        activation: Keras activation.
        use_bias: Whether to add a bias.
        kernel_initializer: Initializer of the stored values (dense-shaped).
        bias_initializer: Initializer of the bias.
        matmul: ``"auto"`` (default: native or densify when the native
            library is built, else among TensorFlow's kernels), ``"native"``,
            ``"coo"``, ``"csr"`` or ``"dense"``; see :mod:`prune.layers.kernels`.
        sparsity: Fraction of absent entries of a randomly structured layer.
        seed: Seed of the random structure.
        nnz: Number of stored entries. Set by ``get_config`` so that a loaded
            layer builds variables of the saved length; the structure is then
            overwritten by the loaded weights.
        pruning_schedule: Schedule for :func:`prune.update_masks`, or ``None``.
        pattern: A :mod:`prune.core.patterns` value (default ``Unstructured()``).
        criterion: Registered criterion name (:func:`prune.criteria`).
        scope: ``"layer"``, ``"global"`` or ``"erk"``, as for masked layers.
            These four and ``seed`` are the layer's
            :class:`prune.layers.PruningParams` (:class:`prune.layers.ScheduledLayer`).
        **kwargs: Keras layer arguments (``name``, ``dtype``, ...).

    Raises:
        ValueError: unknown ``matmul``, bad ``sparsity``, ``units``,
            ``criterion`` or ``scope``.
    """

    def __init__(
        self,
        units: int,
        activation: Any = None,
        use_bias: bool = True,
        kernel_initializer: Any = "glorot_uniform",
        bias_initializer: Any = "zeros",
        matmul: str = "auto",
        sparsity: float = 0.0,
        seed: int = 0,
        nnz: int | None = None,
        pruning_schedule: PruningSchedule | dict | Any | None = None,
        criterion: str = "magnitude",
        scope: str = "layer",
        pattern: Pattern | dict | None = None,
        **kwargs: Any,
    ) -> None:
        kernels.check_matmul(matmul)
        if isinstance(units, bool) or not isinstance(units, (int, np.integer)) or units < 1:
            raise ValueError(f"units must be a positive integer, got {units!r}")
        if not (0.0 <= float(sparsity) <= 1.0):
            raise ValueError(f"sparsity must be in [0, 1], got {sparsity!r}")
        if nnz is not None and (isinstance(nnz, bool) or not isinstance(nnz, (int, np.integer)) or nnz < 0):
            raise ValueError(f"nnz must be a non-negative integer or None, got {nnz!r}")
        super().__init__(
            pruning_schedule=pruning_schedule, pattern=pattern, criterion=criterion, scope=scope, seed=seed, **kwargs
        )
        self.units = int(units)
        self.activation = keras.activations.get(activation)
        self.use_bias = bool(use_bias)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.matmul = matmul
        self.sparsity = float(sparsity)
        self._config_nnz = None if nnz is None else int(nnz)
        self._pending: tuple[np.ndarray, np.ndarray] | None = None
        self.input_spec = keras.layers.InputSpec(min_ndim=2)
        # Keras turns XLA off for a model with a layer that says False, with a warning naming none; True lets
        # call() say which layer and kernel XLA cannot compile, at trace time (kernels.check_xla)
        self.supports_jit = True

    # -- construction --------------------------------------------------------
    @classmethod
    def from_sparse(
        cls,
        indices: Any,
        values: Any,
        dense_shape: tuple[int, int],
        matmul: str = "auto",
        bias: Any = None,
        **layer_kwargs: Any,
    ) -> "SparseDense":
        """A built layer holding ``W = SparseTensor(indices, values, dense_shape)``.

        This is construction input, so unsorted entries are sorted here
        (values follow); :meth:`set_weights` and loading, which take stored
        state, reject them instead.

        Args:
            indices: ``[nnz, 2]`` integer entries; unsorted input is sorted
                (values follow), duplicates and out-of-range entries are errors.
            values: ``[nnz]`` real values in the order of ``indices``.
            dense_shape: ``(n_in, n_out)``.
            matmul: See :mod:`prune.layers.kernels`.
            bias: Optional ``[n_out]`` initial bias.
            **layer_kwargs: Other constructor arguments (``activation``, ``name``...).

        Raises:
            ValueError: naming the bad argument and the first bad entry (its
                position and value): indices not integer, out of range or
                duplicated, values not real or of another length, a bias of
                another shape or given with ``use_bias=False``; before anything is built.
        """
        if len(tuple(dense_shape)) != 2:
            raise ValueError(f"dense_shape must be (n_in, n_out), got {dense_shape!r}")
        n_in, n_out = (int(d) for d in dense_shape)
        idx, vals = kernels.check_structure(indices, values, (n_in, n_out))
        _check_bias(bias, n_out)
        layer = cls(n_out, matmul=matmul, **layer_kwargs)
        if bias is not None and not layer.use_bias:
            raise ValueError("bias was given but use_bias=False")
        layer._pending = (idx, vals)
        layer.build((None, n_in))
        if bias is not None:
            layer.bias.assign(np.asarray(bias))
        return layer

    @classmethod
    def from_dense(
        cls, weights: Any, mask: Any, matmul: str = "auto", bias: Any = None, **layer_kwargs: Any
    ) -> "SparseDense":
        """A built layer storing ``weights`` where ``mask`` is 1.

        Args:
            weights: Dense ``[n_in, n_out]`` matrix.
            mask: Binary (0/1 or bool) array of the same shape.
            matmul: See :mod:`prune.layers.kernels`.
            bias: Optional ``[n_out]`` initial bias.
            **layer_kwargs: Other constructor arguments.

        Raises:
            ValueError: ``weights`` not 2-D, not real or holding NaN or inf (the pruning engine
                refuses those too), ``mask`` of another shape or not binary, ``bias`` as in
                :meth:`from_sparse`; before anything is built.
        """
        w = np.asarray(weights)
        if w.ndim != 2:
            raise ValueError(f"weights must be a 2-D [n_in, n_out] matrix, got shape {w.shape}")
        _check_finite(w, "weights")
        keep = _masks.validate_mask(mask, w.shape, name="mask")
        idx = np.argwhere(keep)
        return cls.from_sparse(idx, w[keep], w.shape, matmul=matmul, bias=bias, **layer_kwargs)

    def build(self, input_shape: Any) -> None:
        n_in = self._matrix_rows(input_shape)
        self.dense_shape = (n_in, self.units)
        if self._pending is not None:
            idx, vals = self._pending
            self._pending = None
        else:
            idx, vals = self._initial_structure(n_in)
        vals = np.asarray(vals, dtype=self.variable_dtype)
        self.values = self.add_weight(name="values", shape=(len(idx),), initializer="zeros", trainable=True)
        self.indices = self.add_weight(name="indices", shape=(len(idx), 2), initializer="zeros", dtype="int64", trainable=False)
        self.transpose_perm = self.add_weight(
            name="transpose_perm", shape=(len(idx),), initializer="zeros", dtype="int64", trainable=False
        )
        self.transpose_indices = self.add_weight(
            name="transpose_indices", shape=(len(idx), 2), initializer="zeros", dtype="int64", trainable=False
        )
        self.bias = (
            self.add_weight(name="bias", shape=self._bias_shape(), initializer=self.bias_initializer, trainable=True)
            if self.use_bias
            else None
        )
        self.add_step_counter()
        # Last, so that files saved before it existed hold a prefix of the variables (see load_own_variables).
        self.native_structure = self.add_weight(
            name="native_structure", shape=(len(idx) * 3 + n_in + self.units + 2,), initializer="zeros",
            dtype="int32", trainable=False,
        )
        self._set_structure(idx, vals)

    def _bias_shape(self) -> tuple[int, ...]:
        """The bias's shape, called in :meth:`build` after :meth:`_matrix_rows`: ``(units,)`` here (a subclass whose
        bias broadcasts over more output axes, ``SparseEinsumDense``'s, gives its own)."""
        return (self.units,)

    def _pattern_shape(self) -> tuple[int, ...] | None:
        """The shape patterns select the weight in (:attr:`prune.core.targets.MaskTarget.pattern_shape`): ``None``,
        :attr:`weight_shape` itself, here and in ``SparseConv2D`` (``NByM`` along ``C_in``, as ``MaskedConv2D``)."""
        return None

    def _matrix_rows(self, input_shape: Any) -> int:
        """The weight matrix's ``n_in`` for ``input_shape`` (a subclass maps its weight onto a matrix here)."""
        n_in = input_shape[-1]
        if n_in is None:
            raise ValueError(f"the last input dimension of {self.name!r} must be known, got input shape {input_shape}")
        return int(n_in)

    @property
    def weight_shape(self) -> tuple[int, ...]:
        """The shape of the weight as users, masks and reports see it: ``(n_in, n_out)`` here.

        The stored entries index the ``[n_in, n_out]`` matrix ``dense_shape``;
        a subclass whose weight has another shape (``SparseConv2D``'s 4-D
        kernel) reshapes it row-major onto that matrix.
        """
        return tuple(self.dense_shape)

    def _as_matrix(self, arr: np.ndarray) -> np.ndarray:
        """``arr`` of :attr:`weight_shape` (or already of ``dense_shape``) as a ``dense_shape`` matrix."""
        return arr.reshape(self.dense_shape) if arr.shape == tuple(self.weight_shape) else arr

    def _initial_structure(self, n_in: int) -> tuple[np.ndarray, np.ndarray]:
        n = n_in * self.units
        if self._config_nnz is not None:  # placeholder of the saved length; loading overwrites it
            flat = np.arange(self._config_nnz, dtype=np.int64)
            return np.stack([flat // self.units, flat % self.units], 1), np.zeros(self._config_nnz)
        zeros = n if self.sparsity == 1.0 else num_zeros(self.sparsity, n)  # a layer may be built empty
        rng = np.random.default_rng(self.seed)
        flat = np.sort(rng.permutation(n)[: n - zeros]).astype(np.int64)
        dense = np.asarray(self.kernel_initializer(self.weight_shape, dtype=self.variable_dtype))
        idx = np.stack([flat // self.units, flat % self.units], 1)
        return idx, dense.reshape(-1)[flat]

    def _derived(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(transpose_perm, transpose_indices, native_structure)`` of validated, sorted ``indices``."""
        perm, t_idx = kernels.transpose_structure(indices, self.dense_shape)
        return perm, t_idx.reshape(-1, 2), native.structure(indices, *self.dense_shape)

    def _set_structure(
        self, indices: np.ndarray, values: np.ndarray, derived: tuple[np.ndarray, ...] | None = None
    ) -> bool:
        """Install a validated, sorted structure; returns whether any backing variable was replaced.

        The derived arrays (``derived``, else computed here from ``indices``) are
        all computed before the first variable changes, so an error leaves the layer as it was.
        """
        perm, t_idx, structure = self._derived(indices) if derived is None else derived
        replaced = _make_dynamic(self.values, values)
        replaced |= _make_dynamic(self.indices, indices.astype(np.int64).reshape(-1, 2))
        replaced |= _make_dynamic(self.transpose_perm, perm)
        replaced |= _make_dynamic(self.transpose_indices, t_idx)
        replaced |= _make_dynamic(self.native_structure, structure)
        return replaced

    # -- forward ---------------------------------------------------------------
    def call(self, inputs: Any, training: Any = None) -> Any:
        self.advance_step(training)  # the saved step counter, advanced inside the compiled step
        kernels.check_xla(self.matmul, f"SparseDense layer {self.name!r}")
        x = tf.convert_to_tensor(inputs)
        if x.dtype != self.values.dtype:
            x = tf.cast(x, self.values.dtype)
        # The common case, [batch, n_in] with n_in static: no reshapes around the product (5 fewer graph ops).
        rank2 = x.shape.rank == 2 and x.shape[-1] == self.dense_shape[0]
        shape = None if rank2 else tf.shape(x)
        y = self._matmul(x if rank2 else tf.reshape(x, [-1, self.dense_shape[0]]))
        if not rank2:
            y = tf.reshape(y, tf.concat([shape[:-1], [self.units]], 0))
            y = tf.ensure_shape(y, x.shape[:-1].concatenate([self.units]))
        if self.bias is not None:
            y = y + self.bias
        if self.activation is not None:
            y = self.activation(y)
        return y

    def _matmul(self, flat: tf.Tensor, values: tf.Tensor | None = None) -> tf.Tensor:
        """``flat @ W`` for a ``[rows, n_in]`` batch, by the layer's ``matmul`` over its stored structure.

        ``values``: the stored values as a tensor (default: the variable's current value).
        """
        return kernels.sparse_matmul(
            flat,
            self.values.value if values is None else values,
            self.indices.value,
            self.dense_shape,
            matmul=self.matmul,
            transpose_perm=self.transpose_perm.value,
            transpose_indices=self.transpose_indices.value,
            structure=self.native_structure.value,
            blocked=self._blocked(),
            nm=native.has_nm_section(int(self.native_structure.shape[0]), int(self.values.shape[0]), *self.dense_shape),
        )

    def _blocked(self) -> bool:
        """Whether ``native_structure`` has a block section (:func:`prune.native.has_block_section`), from its length.

        (Whether it has an N:M section instead: :func:`prune.native.has_nm_section`, from the same length.)
        """
        return native.has_block_section(int(self.native_structure.shape[0]), int(self.values.shape[0]), *self.dense_shape)

    def compute_output_shape(self, input_shape: Any) -> tuple:
        return tuple(input_shape[:-1]) + (self.units,)

    # -- views -------------------------------------------------------------------
    @property
    def nnz(self) -> int:
        """Number of stored entries."""
        self._sync_shapes()
        return int(self.values.shape[0])

    def _structural(self) -> tuple[Any, ...]:
        return (self.values, self.indices, self.transpose_perm, self.transpose_indices, self.native_structure)

    def _sync_shapes(self) -> None:
        # tf.train.Checkpoint restores straight into the backing variables,
        # which may change their length: bring the Keras-side shapes up to date.
        for var in self._structural():
            set_variable_shape(var, tuple(int(d) for d in tf.shape(backing_variable(var)).numpy()))

    def to_dense(self) -> np.ndarray:
        """The weight as a dense array of :attr:`weight_shape` (+0.0 where absent)."""
        self._sync_shapes()
        dense = np.zeros(self.dense_shape, dtype=self.values.dtype)
        idx = self.indices.numpy()
        dense[idx[:, 0], idx[:, 1]] = self.values.numpy()
        return dense.reshape(self.weight_shape)

    def to_dense_layer(self) -> keras.layers.Dense:
        """A built ``keras.layers.Dense`` computing the same function: this weight (+0.0 where absent) and bias.

        What :func:`prune.strip_pruning` and ``prune.convert(to="dense")`` put
        in this layer's place.

        Raises:
            ValueError: the layer is not built (its structure is drawn at build).
        """
        if not self.built:
            raise ValueError(f"SparseDense layer {self.name!r} must be built before it becomes a Dense layer")
        dense = keras.layers.Dense(
            self.units,
            activation=self.activation,
            use_bias=self.use_bias,
            name=self.name,
            bias_initializer=self.bias_initializer,
            kernel_initializer=self.kernel_initializer,
        )
        return self._filled(dense, (None, self.dense_shape[0]))

    def _filled(self, layer: Any, input_shape: tuple) -> Any:
        """``layer`` (an unbuilt plain Keras twin of this one) built for ``input_shape``, holding this weight
        (+0.0 where absent) as its ``kernel`` and this bias: what :meth:`to_dense_layer` returns."""
        layer.build(input_shape)
        layer.kernel.assign(self.to_dense())
        if self.bias is not None:
            layer.bias.assign(self.bias.numpy())
        return layer

    def get_mask(self) -> np.ndarray:
        """The structure as a dense bool array of :attr:`weight_shape`."""
        mask = np.zeros(self.dense_shape, dtype=bool)
        idx = self.indices.numpy()
        mask[idx[:, 0], idx[:, 1]] = True
        return mask.reshape(self.weight_shape)

    def sparse_weight(self) -> tf.SparseTensor:
        """``tf.SparseTensor(indices, values, dense_shape)`` of the current weight."""
        return tf.SparseTensor(self.indices.value, self.values.value, self.dense_shape)

    # -- shrinking -----------------------------------------------------------------
    def compact(self, keep: Any, optimizer: Any = None) -> bool:
        """Drop entries: keep only those where ``keep`` is True, in values, indices and optimizer slots.

        Call it eagerly, between training steps.

        Args:
            keep: Bool ``[nnz]`` over the stored entries, or a dense 0/1
                mask of :attr:`weight_shape` (or ``dense_shape``) that is a
                subset of the structure.
            optimizer: Keras 3 optimizer training ``values``; its slots for
                ``values`` (found by :func:`prune.layers.optimizer_state.slots_for`)
                are shrunk the same way.

        Returns:
            True when a compiled train step traced before this call must be
            retraced (the first compaction of a built optimizer's slots).

        Raises:
            ValueError: ``keep`` of the wrong shape, not binary, or keeping an
                absent entry; raised before anything changes.
        """
        if not self.built:
            raise ValueError(f"layer {self.name!r} must be built before compact")
        self._sync_shapes()
        idx = self.indices.numpy()
        arr = np.asarray(keep)
        if arr.shape == (self.nnz,) and arr.shape not in (tuple(self.dense_shape), tuple(self.weight_shape)):
            entries = _masks.validate_mask(arr, (self.nnz,), name="keep")
            dense = np.zeros(self.dense_shape, dtype=bool)
            dense[idx[entries, 0], idx[entries, 1]] = True
        else:
            shape = self.weight_shape if arr.shape == tuple(self.weight_shape) else tuple(self.dense_shape)
            dense = self._as_matrix(_masks.validate_mask(arr, shape, name="keep"))
            entries = dense[idx[:, 0], idx[:, 1]]
            if int(dense.sum()) != int(entries.sum()):
                raise ValueError(
                    f"keep for {self.name!r} keeps {int(dense.sum()) - int(entries.sum())} entries that are not "
                    f"stored; a {type(self).__name__} can only drop entries"
                )
        return self.restructure(dense, optimizer)

    def restructure(self, keep: Any, optimizer: Any = None) -> bool:
        """Install a structure that may also grow (sparse training, :mod:`prune.training.dst`).

        Entries stored before and kept keep their value and optimizer slots;
        new entries are stored with value +0.0 and zero slots; the others are
        dropped. Call it eagerly, between training steps.

        Args:
            keep: Dense 0/1 (or bool) mask of the new structure, of
                :attr:`weight_shape` (or ``dense_shape``).
            optimizer: Keras 3 optimizer training ``values``; its slots follow.

        Returns:
            True when a compiled train step traced before must be retraced.

        Raises:
            ValueError: ``keep`` of the wrong shape or not binary, before anything changes.
        """
        if not self.built:
            raise ValueError(f"layer {self.name!r} must be built before restructure")
        self._sync_shapes()
        shape = self.weight_shape if np.shape(keep) == tuple(self.weight_shape) else tuple(self.dense_shape)
        new = self._as_matrix(_masks.validate_mask(keep, shape, name="keep"))
        idx = self.indices.numpy()
        old_flat = idx[:, 0] * self.units + idx[:, 1]
        new_flat = np.flatnonzero(new)  # row-major, the stored order
        pos = np.minimum(np.searchsorted(old_flat, new_flat), max(len(old_flat) - 1, 0))
        found = (old_flat[pos] == new_flat) if len(old_flat) else np.zeros(len(new_flat), bool)
        new_idx = np.stack([new_flat // self.units, new_flat % self.units], 1).astype(np.int64)

        def carry(old: np.ndarray) -> np.ndarray:
            out = np.zeros(len(new_flat), old.dtype)  # +0.0 for new entries
            out[found] = old[pos[found]]
            return out

        slots = slots_for(optimizer, self.values)
        replaced = self._set_structure(new_idx, carry(self.values.numpy()))
        for slot in slots:
            replaced |= _make_dynamic(slot, carry(slot.numpy()))
        return replaced

    # -- the mask-target protocol (prune.core.targets) ------------------------------------
    takes_mask_targets = True

    def mask_targets(self) -> list[MaskTarget]:
        """The weight as one :class:`prune.core.targets.MaskTarget`: its dense view, restructured on install."""

        def to_dense(values: np.ndarray) -> np.ndarray:
            self._sync_shapes()
            idx = self.indices.numpy()
            dense = np.zeros(self.dense_shape, dtype=np.asarray(values).dtype)
            dense[idx[:, 0], idx[:, 1]] = np.asarray(values)
            return dense.reshape(self.weight_shape)

        return [
            MaskTarget(
                key=f"{self.name}/kernel",
                layer=self,
                variable=self.values,
                read=lambda: (self.to_dense(), self.get_mask()),
                writer=self.restructure,
                to_dense=to_dense,
                stores_dense=False,
                pattern_shape=self._pattern_shape(),
                dense_pass=self._dense_pass,
            )
        ]

    @contextlib.contextmanager
    def _dense_pass(self) -> Iterator[Any]:
        """One forward pass with a dense ``[n_in, n_out]`` weight scattered from the values; yields that weight.

        Its gradient is the dense product ``x^T . dy`` (RigL's grow score); no
        dense weight is kept afterwards.
        """
        w_dense = tf.scatter_nd(self.indices.value, self.values.value, self.dense_shape)

        def call(inputs: Any, training: Any = None) -> Any:
            x = tf.convert_to_tensor(inputs)
            if x.dtype != w_dense.dtype:
                x = tf.cast(x, w_dense.dtype)
            shape = tf.shape(x)
            y = tf.matmul(tf.reshape(x, [-1, self.dense_shape[0]]), w_dense)
            y = tf.reshape(y, tf.concat([shape[:-1], [self.units]], 0))
            if self.bias is not None:
                y = y + self.bias
            return self.activation(y) if self.activation is not None else y

        with override_call(self, call):
            yield w_dense

    # -- state from outside: set_weights and loading ------------------------------------
    def _checked_state(
        self, given: Sequence[tuple[Any, Any, str]], where: str, same_nnz: bool
    ) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, ...], list[tuple[Any, np.ndarray]]]:
        """Validate arrays meant for this layer's variables, changing nothing.

        Args:
            given: ``(variable, array, label)`` for some or all of the layer's
                own variables; ``values`` and ``indices`` are required, a missing
                ``native_structure`` (files older than it) is fine.
            where: Prefix of every error message (the operation, layer and file).
            same_nnz: Require the current number of entries (``set_weights``,
                whose arrays keep the variables' shapes, as Keras's does).

        Returns:
            ``(indices, values, derived, rest)``: the validated entries, the
            derived arrays recomputed from them (for :meth:`_set_structure`),
            and ``(variable, array)`` pairs for the bias and step counter.

        Raises:
            ValueError: ``where``, the label of the bad array and its first bad
                entry or its shape.
        """
        by_var = {id(v): (np.asarray(a), label) for v, a, label in given}
        rest: list[tuple[Any, np.ndarray]] = []
        nnz = self.nnz
        derived_vars = (self.transpose_perm, self.transpose_indices, self.native_structure)
        for v, _, _ in given:
            arr, label = by_var[id(v)]
            if not kernels.is_real_dtype(arr.dtype):
                raise ValueError(f"{where}: {label} must be real numbers, got dtype {arr.dtype}")
            if v is self.native_structure:
                if arr.ndim != 1:  # its length depends on the layout (block and panel sections or none): any is fine
                    raise ValueError(f"{where}: {label} must be 1-D, got shape {arr.shape}")
            elif v is self.values or v is self.indices or any(v is d for d in derived_vars):
                if same_nnz and arr.shape != tuple(v.shape):
                    raise ValueError(
                        f"{where}: {label} has shape {arr.shape}, expected {tuple(v.shape)} "
                        f"(the layer holds {nnz} entries)"
                    )
            elif arr.shape != tuple(v.shape):
                raise ValueError(f"{where}: {label} has shape {arr.shape}, expected {tuple(v.shape)}")
            elif np.dtype(v.dtype).kind in "iu" and arr.dtype.kind not in "iu":
                raise ValueError(f"{where}: {label} must be integers, got dtype {arr.dtype}")
            else:
                rest.append((v, arr.astype(v.dtype)))  # cast now: no assignment below can fail
        (vals, values_label), (idx, indices_label) = by_var[id(self.values)], by_var[id(self.indices)]
        try:
            idx, vals = kernels.check_structure(
                idx, vals, self.dense_shape, name=indices_label, require_sorted=True, values_name=values_label
            )
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from None
        vals = vals.astype(self.values.dtype)
        for v, shape in ((self.transpose_perm, (len(idx),)), (self.transpose_indices, (len(idx), 2))):
            if id(v) in by_var and by_var[id(v)][0].shape != shape:
                arr, label = by_var[id(v)]
                raise ValueError(
                    f"{where}: {label} has shape {arr.shape}, expected {shape} for the {len(idx)} stored entries "
                    "(its contents are ignored and recomputed from indices)"
                )
        try:
            derived = self._derived(idx)
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from None
        return idx, vals, derived, rest

    def set_weights(self, weights: Sequence[Any]) -> None:
        """Set the layer's weights from arrays in ``get_weights()`` order, validated before anything changes.

        The order is ``[v.name for v in layer.weights]``: ``values``, ``bias``
        (when ``use_bias``), ``indices``, ``transpose_perm``,
        ``transpose_indices``, ``pruning_step``, ``native_structure``; each
        array has the shape of its variable (the number of entries does not
        change here; ``native_structure`` may have any length).

        ``values`` and ``indices`` are stored state, not construction input:
        ``indices`` must be integer, in range and row-major sorted and unique,
        and unsorted or duplicate entries are rejected (:meth:`from_sparse`
        sorts them instead). The derived arrays ``transpose_perm``,
        ``transpose_indices`` and ``native_structure`` are ignored (only their
        shapes are checked) and recomputed from ``indices``.

        Args:
            weights: One array per variable, as ``get_weights()`` returns them.

        Raises:
            ValueError: naming the layer, the argument (``weights[i]``), the
                weight and its first bad entry (position and value) or its
                shape; raised before any variable changes.
        """
        if not self.built:
            keras.layers.Layer.set_weights(self, weights)  # Keras's error: no weights to set yet
            return
        self._sync_shapes()
        variables = self.weights
        where = f"set_weights on {type(self).__name__} layer {self.name!r}"
        weights = list(weights)
        if len(weights) != len(variables):
            raise ValueError(
                f"{where}: expected {len(variables)} arrays ({', '.join(v.name for v in variables)}), got {len(weights)}"
            )
        given = [(v, w, f"weights[{i}] ({v.name!r})") for i, (v, w) in enumerate(zip(variables, weights))]
        idx, vals, derived, rest = self._checked_state(given, where, same_nnz=True)
        self._set_structure(idx, vals, derived)
        for v, arr in rest:
            v.assign(arr)

    # -- serialisation ---------------------------------------------------------------
    def save_own_variables(self, store: Any) -> None:
        """Write the layer's state to a Keras weights store in a compact format, the smaller of two (:func:`store_format`).

        Only what the layer cannot derive is written: ``values`` (float32 in row-major order), the structure,
        the bias and the step counter, plus ``format``. The structure is either CSR (:data:`STORE_FORMAT`: row
        pointers ``row_ptr``, int32, ``n_in + 1``, and the column of each entry, ``cols``, int32; 8 bytes per
        entry with its value) or a bitmap (:data:`BITMAP_FORMAT`: ``mask_bits``, the row-major keep-mask of
        the ``[n_in, n_out]`` matrix packed 8 cells to a byte, most significant bit first, as ``np.packbits``
        does), whichever is smaller: 4 bytes and 2 bits per entry at 2:4, about 5.3 bytes at 90% sparsity.
        Keras's own format of every variable (56 bytes per entry: int64 ``indices``, the transposes and the
        native structure) is still read by :meth:`load_own_variables`. A layer whose dimensions or entry count
        int32 cannot hold is written in Keras's format.
        """
        n_in, n_out = self.dense_shape
        idx = np.asarray(self.indices.numpy(), np.int64).reshape(-1, 2)
        if max(n_in, n_out, len(idx)) >= 2**31:
            keras.layers.Layer.save_own_variables(self, store)
            return
        version = store_format(n_in, n_out, len(idx))
        store["format"] = np.asarray([version], np.int32)
        store["values"] = np.asarray(self.values.numpy())
        if version == BITMAP_FORMAT:
            keep = np.zeros(n_in * n_out, bool)
            keep[idx[:, 0] * n_out + idx[:, 1]] = True
            store["mask_bits"] = np.packbits(keep)
        else:
            store["row_ptr"] = np.searchsorted(idx[:, 0], np.arange(n_in + 1)).astype(np.int32)
            store["cols"] = idx[:, 1].astype(np.int32)
        if self.use_bias:
            store["bias"] = np.asarray(self.bias.numpy())
        store["pruning_step"] = np.asarray(self.pruning_step.numpy())

    def _compact_given(self, store: Any, where: str) -> list[tuple[Any, Any, str]]:
        """``(variable, array, label)`` from a compact store, with ``indices`` rebuilt from its structure
        (``row_ptr``/``cols``, or ``mask_bits``)."""
        keys = set(store.keys())
        version = np.asarray(store["format"]).reshape(-1)
        if version.size != 1 or int(version[0]) not in (STORE_FORMAT, BITMAP_FORMAT):
            raise ValueError(f"{where}: stored 'format' is {version.tolist()}, this version reads formats "
                             f"{STORE_FORMAT} and {BITMAP_FORMAT} (or Keras's own, keys '0', '1', ...)")
        structure = ("mask_bits",) if int(version[0]) == BITMAP_FORMAT else ("row_ptr", "cols")
        expected = {"format", "values", *structure, "pruning_step"} | ({"bias"} if self.use_bias else set())
        if keys != expected:
            raise ValueError(f"{where}: the store has keys {sorted(keys)}, expected {sorted(expected)}")
        n_in, n_out = self.dense_shape
        if structure == ("mask_bits",):
            indices = self._bitmap_indices(np.asarray(store["mask_bits"]), where)
            label = "weight 'indices' (stored as 'mask_bits')"
        else:
            indices = self._csr_indices(np.asarray(store["row_ptr"]), np.asarray(store["cols"]), where)
            label = "weight 'indices' (stored as 'row_ptr' and 'cols')"
        given = [(self.values, store["values"], "weight 'values' (stored as 'values')"),
                 (self.indices, indices, label),
                 (self.pruning_step, store["pruning_step"], "weight 'pruning_step' (stored as 'pruning_step')")]
        if self.use_bias:
            given.append((self.bias, store["bias"], "weight 'bias' (stored as 'bias')"))
        return given

    def _csr_indices(self, row_ptr: np.ndarray, cols: np.ndarray, where: str) -> np.ndarray:
        """``[nnz, 2]`` indices from stored CSR ``row_ptr``/``cols`` (columns are range-checked later, with the values)."""
        n_in = self.dense_shape[0]
        for name, arr in (("row_ptr", row_ptr), ("cols", cols)):
            if arr.ndim != 1 or arr.dtype.kind not in "iu":
                raise ValueError(f"{where}: weight {name!r} must be a 1-D integer array, got shape {arr.shape}, dtype {arr.dtype}")
        if len(row_ptr) != n_in + 1:
            raise ValueError(f"{where}: weight 'row_ptr' has {len(row_ptr)} entries, expected n_in + 1 = {n_in + 1}")
        steps = np.diff(row_ptr.astype(np.int64))
        if row_ptr[0] != 0 or row_ptr[-1] != len(cols) or (steps < 0).any():
            bad = int(np.flatnonzero(steps < 0)[0]) + 1 if (steps < 0).any() else (0 if row_ptr[0] != 0 else n_in)
            raise ValueError(
                f"{where}: weight 'row_ptr' must rise from 0 to len(cols) = {len(cols)}; "
                f"row_ptr[{bad}] = {int(row_ptr[bad])}" + (f" after row_ptr[{bad - 1}] = {int(row_ptr[bad - 1])}" if bad else "")
            )
        rows = np.repeat(np.arange(n_in, dtype=np.int64), steps)
        return np.stack([rows, cols.astype(np.int64)], axis=1) if len(cols) else np.zeros((0, 2), np.int64)

    def _bitmap_indices(self, bits: np.ndarray, where: str) -> np.ndarray:
        """``[nnz, 2]`` row-major indices from a stored ``mask_bits`` bitmap of the ``[n_in, n_out]`` matrix."""
        n_in, n_out = self.dense_shape
        cells = n_in * n_out
        if bits.ndim != 1 or bits.dtype != np.uint8:
            raise ValueError(f"{where}: weight 'mask_bits' must be a 1-D uint8 array, got shape {bits.shape}, dtype {bits.dtype}")
        if len(bits) != -(-cells // 8):
            raise ValueError(f"{where}: weight 'mask_bits' has {len(bits)} bytes, expected ceil(n_in * n_out / 8) = "
                             f"{-(-cells // 8)} for dense_shape {(n_in, n_out)}")
        keep = np.unpackbits(bits)
        if keep[cells:].any():
            raise ValueError(f"{where}: weight 'mask_bits' sets bits past the {cells} cells of dense_shape {(n_in, n_out)} "
                             f"(in its last byte, {int(bits[-1])})")
        flat = np.flatnonzero(keep[:cells]).astype(np.int64)
        return np.stack([flat // n_out, flat % n_out], axis=1)

    def load_own_variables(self, store: Any) -> None:
        """Load the layer's variables from a Keras weights store (``.keras``/``.weights.h5`` loading), validated.

        Three formats load: the compact ones :meth:`save_own_variables` writes (``format``, ``values``,
        ``row_ptr`` and ``cols`` or ``mask_bits``, ``bias``, ``pruning_step``), and Keras's own of every variable (keys ``"0"``, ``"1"``, ...),
        which files saved before the compact format hold.

        The stored number of entries may differ from the placeholder built
        from the config (e.g. a checkpoint of another sparsity). As in
        :meth:`set_weights`, the stored ``indices`` must be integer, in range,
        row-major sorted and unique (a file is stored state: it is rejected,
        not re-sorted), ``values`` of the same length, and the bias and step
        of their shapes. The stored ``transpose_perm``, ``transpose_indices``
        (which must have ``nnz`` rows) and ``native_structure`` (absent from
        files older than it) are ignored and recomputed from ``indices``.

        Args:
            store: The Keras store of this layer's variables, keyed ``"0"``,
                ``"1"``... in ``save_own_variables`` order.

        Raises:
            ValueError: naming the layer, the file when the store knows it, the
                weight (and its key in the store) and its first bad entry
                (position and value) or its shape; raised before any variable
                changes. Keras's loader reports it inside its own ValueError.
        """
        all_vars = own_variables(self)
        source = _store_source(store)
        where = f"loading {type(self).__name__} layer {self.name!r}" + (f" from {source}" if source else "")
        if "format" in set(store.keys()):
            idx, vals, derived, rest = self._checked_state(self._compact_given(store, where), where, same_nnz=False)
            self._set_structure(idx, vals, derived)
            for v, arr in rest:
                v.assign(arr)
            return
        keys = len(store.keys())
        # Files saved before native_structure existed lack that last variable: it is derived, so rebuilt anyway.
        if keys not in (len(all_vars), len(all_vars) - 1):
            raise ValueError(
                f"{where}: expected {len(all_vars)} variables ({', '.join(v.name for v in all_vars)}), "
                f"the store has {keys}"
            )
        given = [(v, store[str(i)], f"weight {v.name!r} (stored as {str(i)!r})") for i, v in enumerate(all_vars[:keys])]
        idx, vals, derived, rest = self._checked_state(given, where, same_nnz=False)
        self._set_structure(idx, vals, derived)
        for v, arr in rest:
            v.assign(arr)

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update(
            units=self.units,
            activation=keras.activations.serialize(self.activation),
            use_bias=self.use_bias,
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
            bias_initializer=keras.initializers.serialize(self.bias_initializer),
            matmul=self.matmul,
            sparsity=self.sparsity,
            nnz=self.nnz if self.built else self._config_nnz,
        )  # the pruning keys (seed among them): ScheduledLayer.get_config
        return config


def sparse_layers(model: Any) -> list[SparseDense]:
    """The :class:`SparseDense` layers inside ``model`` (or ``[model]``)."""
    return [layer for layer in iter_layers(model) if isinstance(layer, SparseDense)]
