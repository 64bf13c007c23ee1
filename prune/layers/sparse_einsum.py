"""``SparseEinsumDense``: a Keras ``EinsumDense`` whose kernel is stored sparse, as a matrix.

The layer takes the ``EinsumDense`` equations in which the input's last ``k``
axes are contracted with the kernel's first ``k`` axes and the output is the
input's other axes followed by the kernel's other axes, in order:
``ab,bc->ac``, ``abc,cd->abd``, ``abc,cde->abde`` (the query, key and value
projections of ``MultiHeadAttention``), ``abcd,cde->abe`` (its output
projection), ``btd,dnh->btnh``, and the same with a leading ellipsis
(``...b,bc->...c``). :func:`prune.layers.einsum_form.einsum_matrix_form` tells them apart; others are
refused. For them the kernel ``K`` of shape ``(contracted..., free...)`` read
row-major is the matrix ``W = K.reshape(prod(contracted), prod(free))``, and
``einsum(x, K)`` is ``x.reshape(-1, prod(contracted)) @ W`` reshaped to the
output: no transpose, so the product is :class:`prune.layers.SparseDense`'s
(every ``matmul`` kernel, the native ones included).

``W`` is stored as :class:`prune.layers.SparseDense` stores its weight (it is a
subclass, as :class:`prune.layers.SparseConv2D` is): ``values`` at row-major
``indices``, the derived structures beside them, the compact ``.keras`` store,
compaction as it is pruned, and the mask-target protocol. Masks, reports and
:meth:`SparseEinsumDense.to_dense` see the kernel's own shape
(:attr:`SparseEinsumDense.weight_shape`), so a ``MaskedEinsumDense`` and a
``SparseEinsumDense`` pruned alike select the same masks (patterns select on the ``[d_in, d_out]`` matrix in
both: ``NByM``'s groups run along the inputs, ``Block`` tiles the matrix;
:attr:`prune.core.targets.MaskTarget.pattern_shape`).

The bias follows ``EinsumDense``'s ``bias_axes``: its shape covers the output
axes from the first bias axis to the last, 1 on the axes without a bias, and it
is added by broadcasting, as ``EinsumDense`` adds it.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import keras
import numpy as np
import tensorflow as tf

from prune._internals import override_call
from prune.layers import kernels
from prune.layers.einsum_form import FAMILY, EinsumMatrixForm, einsum_matrix_form
from prune.layers.kinds import register_layer
from prune.layers.sparse import SparseDense, _check_finite

__all__ = ["SparseEinsumDense", "matrix_entries"]

def _form_of(equation: Any) -> EinsumMatrixForm:
    """:func:`einsum_matrix_form` of ``equation``, or a ValueError naming it."""
    form = einsum_matrix_form(equation)
    if form is None:
        raise ValueError(f"equation must be an EinsumDense equation of the form {FAMILY}; got equation={equation!r}")
    return form


def matrix_entries(
    indices: Any, values: Any, kernel_shape: tuple[int, ...], contracted: int
) -> tuple[np.ndarray, np.ndarray]:
    """Entries of a kernel of ``kernel_shape`` as sorted ``[nnz, 2]`` entries of its row-major matrix.

    The matrix is ``[prod(kernel_shape[:contracted]), prod(kernel_shape[contracted:])]``.

    Args:
        indices: ``[nnz, len(kernel_shape)]`` integer entries of the kernel.
        values: ``[nnz]`` real values in their order.
        kernel_shape: The kernel's shape.
        contracted: How many leading kernel axes make the matrix's rows.

    Returns:
        ``(indices, values)`` of the matrix, row-major sorted (values follow).

    Raises:
        ValueError: indices of another width, not integers, out of range or
            duplicated, values not real or of another length.
    """
    shape = tuple(int(d) for d in kernel_shape)
    idx = np.asarray(indices)
    if idx.size == 0:
        idx = idx.reshape(0, len(shape))
    if idx.ndim != 2 or idx.shape[1] != len(shape):
        raise ValueError(f"indices must have shape [nnz, {len(shape)}], got shape {idx.shape}")
    if idx.dtype.kind not in "iu":
        raise ValueError(f"indices must be integers, got dtype {idx.dtype}")
    bad = np.flatnonzero(((idx < 0) | (idx >= np.asarray(shape))).any(axis=1))
    if len(bad):
        raise ValueError(f"indices[{int(bad[0])}] = {idx[bad[0]].tolist()} is out of range for kernel_shape {shape}")
    idx = idx.astype(np.int64)
    n_in, n_out = int(np.prod(shape[:contracted])), int(np.prod(shape[contracted:]))
    rows = np.ravel_multi_index(tuple(idx[:, :contracted].T), shape[:contracted]) if len(idx) else np.zeros(0, np.int64)
    cols = np.ravel_multi_index(tuple(idx[:, contracted:].T), shape[contracted:]) if len(idx) else np.zeros(0, np.int64)
    return kernels.check_structure(np.stack([rows, cols], 1).astype(np.int64), values, (n_in, n_out))


def _positive(d: Any) -> bool:
    return not isinstance(d, bool) and isinstance(d, (int, np.integer)) and d >= 1


@register_layer
class SparseEinsumDense(SparseDense):
    """``keras.layers.EinsumDense`` with a sparse kernel: ``activation(einsum(equation, x, kernel) + bias)``.

    Build it from a dense kernel and mask with :meth:`from_dense`, from kernel
    entries with :meth:`from_sparse`, or directly, in which case a uniformly
    random structure with exactly ``round(sparsity * kernel.size)`` absent
    entries is drawn at build time from ``seed`` and the values come from
    ``kernel_initializer`` on the kernel's shape (a variance-scaling
    initializer with its fan-in over the contracted axes, as ``EinsumDense``
    sets it). See the module docstring for the equations it takes.

    Args:
        equation: An equation of the family of :func:`einsum_matrix_form`.
        output_shape: As ``EinsumDense``'s: the output's shape without the
            batch axis (and the ellipsis' axes); the kernel's free axes (its
            last entries) must be known, the others may be ``None``.
        activation: Keras activation.
        bias_axes: As ``EinsumDense``'s: output axis letters that carry a bias,
            or ``None`` for no bias.
        kernel_initializer: Initializer of the stored values.
        bias_initializer: Initializer of the bias.
        matmul, sparsity, seed, nnz, pruning_schedule, criterion, scope, pattern:
            As :class:`prune.layers.SparseDense`'s.
        **kwargs: Keras layer arguments (``name``, ``dtype``, ...).

    Raises:
        ValueError: naming the argument and its value: an ``equation`` outside
            the family, an ``output_shape`` of the wrong length or with unknown
            or non-positive kernel axes, ``bias_axes`` naming letters outside
            the output or repeated, and the errors of :class:`prune.layers.SparseDense`.
    """

    def __init__(
        self,
        equation: str,
        output_shape: int | tuple[int | None, ...],
        activation: Any = None,
        bias_axes: str | None = None,
        kernel_initializer: Any = "glorot_uniform",
        bias_initializer: Any = "zeros",
        **kwargs: Any,
    ) -> None:
        form = _form_of(equation)
        partial = (output_shape,) if isinstance(output_shape, (int, np.integer)) else output_shape
        try:
            partial = tuple(partial)
        except TypeError:
            partial = ()
        if not partial or not all(d is None or _positive(d) for d in partial):
            raise ValueError(
                "output_shape must be a positive int or a sequence of positive ints and None, got "
                f"output_shape={output_shape!r}"
            )
        expected = len(form.output) - (0 if form.ellipsis else 1)
        if len(partial) != expected:
            raise ValueError(
                f"output_shape must have {expected} entries for equation {equation!r} (the output's axes "
                f"{'after the ellipsis' if form.ellipsis else 'after the batch axis'}), got output_shape={output_shape!r}"
            )
        free = partial[len(partial) - form.free :]
        if not all(_positive(d) for d in free):
            raise ValueError(
                f"the last {form.free} entries of output_shape (the kernel's axes {form.kernel[form.contracted:]!r}) "
                f"must be positive integers, got output_shape={output_shape!r}"
            )
        if bias_axes is not None and (
            not isinstance(bias_axes, str) or not bias_axes or len(set(bias_axes)) != len(bias_axes)
            or not set(bias_axes) <= set(form.output)
        ):
            raise ValueError(
                f"bias_axes must be None or distinct letters of the output {form.output!r} of equation {equation!r}, "
                f"got bias_axes={bias_axes!r}"
            )
        super().__init__(
            int(np.prod(free)),
            activation=activation,
            use_bias=bias_axes is not None,
            kernel_initializer=kernel_initializer,
            bias_initializer=bias_initializer,
            **kwargs,
        )
        self.equation = equation
        self.form = form
        self.partial_output_shape = tuple(None if d is None else int(d) for d in partial)
        self.free_shape = tuple(int(d) for d in free)
        self.bias_axes = bias_axes
        self.input_spec = keras.layers.InputSpec(min_ndim=len(form.inputs) + 1) if form.ellipsis else (
            keras.layers.InputSpec(ndim=len(form.inputs))
        )

    # -- construction --------------------------------------------------------
    @classmethod
    def from_sparse(  # type: ignore[override]
        cls,
        indices: Any,
        values: Any,
        kernel_shape: tuple[int, ...],
        equation: str,
        output_shape: Any = None,
        bias_axes: str | None = None,
        matmul: str = "auto",
        bias: Any = None,
        input_shape: tuple[int | None, ...] | None = None,
        **layer_kwargs: Any,
    ) -> "SparseEinsumDense":
        """A built layer whose kernel holds ``values`` at the kernel-shaped ``indices`` (zeros elsewhere).

        Args:
            indices: ``[nnz, kernel.ndim]`` integer entries; unsorted input is
                sorted (values follow), duplicates and out-of-range entries are errors.
            values: ``[nnz]`` real values in the order of ``indices``.
            kernel_shape: The kernel's shape, ``(contracted..., free...)``.
            equation: As the constructor's.
            output_shape: As the constructor's; default: the kernel's free axes
                after ``None`` for the input's free axes but the batch.
            bias_axes: As the constructor's.
            matmul: See :mod:`prune.layers.kernels`.
            bias: Optional initial bias, of the shape ``EinsumDense`` gives it.
            input_shape: The shape to build with (``None`` for unknown sizes);
                default ``None`` on the input's free axes and the kernel's
                contracted sizes on the others.
            **layer_kwargs: Other constructor arguments (``activation``, ``name``, ...).

        Raises:
            ValueError: an ``equation`` outside the family, a ``kernel_shape``
                whose rank or sizes do not fit it, an ``input_shape`` whose
                contracted sizes differ, the entry errors of
                :meth:`prune.layers.SparseDense.from_sparse`, a ``bias`` of
                another shape or given without ``bias_axes``; before anything is built.
        """
        form = _form_of(equation)
        shape = tuple(kernel_shape) if isinstance(kernel_shape, (tuple, list)) else ()
        if len(shape) != len(form.kernel) or not all(_positive(d) for d in shape):
            raise ValueError(
                f"kernel_shape must be {len(form.kernel)} positive integers (axes {form.kernel!r} of equation "
                f"{equation!r}), got kernel_shape={kernel_shape!r}"
            )
        shape = tuple(int(d) for d in shape)
        c = form.contracted
        if output_shape is None:
            n_in_free = len(form.inputs) - c - (0 if form.ellipsis else 1)
            output_shape = (None,) * n_in_free + shape[c:]
        flat_idx, vals = matrix_entries(indices, values, shape, c)
        layer = cls(equation, output_shape, bias_axes=bias_axes, matmul=matmul, **layer_kwargs)
        if layer.free_shape != shape[c:]:
            raise ValueError(
                f"output_shape={output_shape!r} gives the kernel's free axes {layer.free_shape}, but kernel_shape "
                f"is {shape}"
            )
        if input_shape is None:
            lead = (None,) * (len(form.inputs) - c + (1 if form.ellipsis else 0))
            input_shape = lead + shape[:c]
        input_shape = tuple(input_shape)
        if len(input_shape) < c or tuple(input_shape[len(input_shape) - c :]) != shape[:c]:
            raise ValueError(
                f"input_shape must end with the kernel's contracted sizes {shape[:c]}, got input_shape={input_shape!r}"
            )
        layer._check_input_rank(input_shape)
        if bias is not None:
            if not layer.use_bias:
                raise ValueError("bias was given but bias_axes is None")
            expected = layer._einsum_bias_shape(input_shape)
            if np.shape(bias) != expected:
                raise ValueError(
                    f"bias must have shape {expected} (EinsumDense's for bias_axes={bias_axes!r}), got shape {np.shape(bias)}"
                )
            if not kernels.is_real_dtype(np.asarray(bias).dtype):
                raise ValueError(f"bias must be real numbers, got dtype {np.asarray(bias).dtype}")
        layer._pending = (flat_idx, vals)
        layer.build(input_shape)
        if bias is not None:
            layer.bias.assign(np.asarray(bias))
        return layer

    @classmethod
    def from_dense(  # type: ignore[override]
        cls,
        kernel: Any,
        mask: Any,
        equation: str,
        output_shape: Any = None,
        bias_axes: str | None = None,
        matmul: str = "auto",
        bias: Any = None,
        input_shape: tuple[int | None, ...] | None = None,
        **layer_kwargs: Any,
    ) -> "SparseEinsumDense":
        """A built layer storing the ``EinsumDense`` kernel ``kernel`` where ``mask`` is 1.

        Args:
            kernel: The kernel, of the shape ``equation`` gives it.
            mask: Binary (0/1 or bool) array of the same shape.
            equation, output_shape, bias_axes, matmul, bias, input_shape, **layer_kwargs:
                As :meth:`from_sparse`.

        Raises:
            ValueError: ``equation`` outside the family, ``kernel`` of another
                rank, not real or holding NaN or inf, ``mask`` of another shape
                or not binary, and the errors of :meth:`from_sparse`; before
                anything is built.
        """
        from prune.core import masks as _masks

        form = _form_of(equation)
        w = np.asarray(kernel)
        if w.ndim != len(form.kernel):
            raise ValueError(
                f"kernel must have {len(form.kernel)} axes ({form.kernel!r} of equation {equation!r}), got shape {w.shape}"
            )
        if not kernels.is_real_dtype(w.dtype):
            raise ValueError(f"kernel must be real numbers, got dtype {w.dtype}")
        _check_finite(w, "kernel")
        keep = _masks.validate_mask(mask, w.shape, name="mask")
        return cls.from_sparse(
            np.argwhere(keep), w[keep], w.shape, equation, output_shape=output_shape, bias_axes=bias_axes,
            matmul=matmul, bias=bias, input_shape=input_shape, **layer_kwargs,
        )

    # -- shapes ------------------------------------------------------------------
    def _check_input_rank(self, input_shape: Any) -> None:
        shape = tuple(input_shape)
        n = len(self.form.inputs)
        if (len(shape) < n + 1) if self.form.ellipsis else (len(shape) != n):
            raise ValueError(
                f"SparseEinsumDense layer {self.name!r} (equation {self.equation!r}) takes inputs of rank "
                f"{'at least ' + str(n + 1) if self.form.ellipsis else n}, got input shape {input_shape}"
            )

    def _matrix_rows(self, input_shape: Any) -> int:
        self._check_input_rank(input_shape)
        c = self.form.contracted
        contracted = tuple(input_shape)[-c:]
        if any(d is None for d in contracted):
            raise ValueError(
                f"the contracted input axes of {self.name!r} (its last {c}) must be known, got input shape {input_shape}"
            )
        self.contracted_shape = tuple(int(d) for d in contracted)
        passed = tuple(input_shape)[: len(input_shape) - c]
        given = self.partial_output_shape[: len(self.partial_output_shape) - self.form.free]
        for i in range(1, len(given) + 1):
            if given[-i] is not None and passed[-i] is not None and given[-i] != passed[-i]:
                raise ValueError(
                    f"output_shape={self.partial_output_shape} of {self.name!r} gives {given[-i]} for an input axis "
                    f"that is {passed[-i]} in input shape {tuple(input_shape)}"
                )
        self._built_bias_shape = self._einsum_bias_shape(input_shape) if self.use_bias else None
        init = self.kernel_initializer
        if isinstance(init, keras.initializers.VarianceScaling) and (init.input_axes is None or init.output_axes is None):
            config = init.get_config()  # EinsumDense's fan-in and fan-out: over the contracted and the free axes
            config.update(seed=init.seed, input_axes=list(range(c)), output_axes=list(range(c, len(self.form.kernel))))
            self.kernel_initializer = type(init).from_config(config)
        return int(np.prod(self.contracted_shape))

    def _einsum_bias_shape(self, input_shape: Any) -> tuple[int, ...]:
        """The bias's shape for ``input_shape``, as ``EinsumDense`` computes it (ValueError if a size is unknown)."""
        out = self.form.output
        full = list(self.compute_output_shape(input_shape))[-len(out):]
        given = self.partial_output_shape  # as EinsumDense: output_shape's sizes, else the input's
        for i in range(1, len(given) + 1):
            if given[-i] is not None:
                full[-i] = given[-i]
        first = min(out.index(ch) for ch in self.bias_axes)
        shape = tuple(full[i] if out[i] in self.bias_axes else 1 for i in range(first, len(out)))
        if any(d is None for d in shape):
            raise ValueError(
                f"bias_axes={self.bias_axes!r} of {self.name!r} need the sizes of output axes that the input shape "
                f"{tuple(input_shape)} leaves unknown"
            )
        return tuple(int(d) for d in shape)

    def _bias_shape(self) -> tuple[int, ...]:
        return self._built_bias_shape

    @property
    def weight_shape(self) -> tuple[int, ...]:
        """The kernel's shape, ``(contracted..., free...)``, as ``EinsumDense``'s."""
        return (*self.contracted_shape, *self.free_shape)

    def _pattern_shape(self) -> tuple[int, ...] | None:
        """The ``[d_in, d_out]`` matrix the kernel is stored as: patterns select on it, as on a ``MaskedEinsumDense``'s
        (:meth:`prune.layers.MaskedEinsumDense.pattern_shape`), so ``NByM``'s groups run along the inputs."""
        return tuple(self.dense_shape)

    def compute_output_shape(self, input_shape: Any) -> tuple:
        shape = tuple(input_shape)
        return shape[: len(shape) - self.form.contracted] + self.free_shape

    # -- forward ---------------------------------------------------------------
    def call(self, inputs: Any, training: Any = None) -> Any:
        self.advance_step(training)
        kernels.check_xla(self.matmul, f"SparseEinsumDense layer {self.name!r}")
        x = tf.convert_to_tensor(inputs)
        if x.dtype != self.values.dtype:
            x = tf.cast(x, self.values.dtype)
        c = self.form.contracted
        rank2 = x.shape.rank == 2 and c == 1 and x.shape[-1] == self.dense_shape[0]
        if rank2:  # ab,bc->ac: no reshapes around the product
            y = self._matmul(x)
        else:
            lead = tf.shape(x)[: x.shape.rank - c]
            y = self._matmul(tf.reshape(x, [-1, self.dense_shape[0]]))
            y = tf.reshape(y, tf.concat([lead, self.free_shape], 0))
            y = tf.ensure_shape(y, x.shape[: x.shape.rank - c].concatenate(self.free_shape))
        if self.bias is not None:
            y = y + self.bias
        if self.activation is not None:
            y = self.activation(y)
        return y

    @contextlib.contextmanager
    def _dense_pass(self) -> Iterator[Any]:
        """One forward pass with the dense kernel scattered from the values (``einsum``, as ``EinsumDense``);
        yields that kernel, of :attr:`weight_shape`. Its gradient is the dense kernel gradient (RigL's grow score)."""
        w_dense = tf.reshape(tf.scatter_nd(self.indices.value, self.values.value, self.dense_shape), self.weight_shape)

        def call(inputs: Any, training: Any = None) -> Any:
            x = tf.convert_to_tensor(inputs)
            if x.dtype != w_dense.dtype:
                x = tf.cast(x, w_dense.dtype)
            y = tf.einsum(self.equation.replace(" ", ""), x, w_dense)
            if self.bias is not None:
                y = y + self.bias
            return self.activation(y) if self.activation is not None else y

        with override_call(self, call):
            yield w_dense

    # -- views -------------------------------------------------------------------
    def to_dense_layer(self) -> keras.layers.EinsumDense:  # type: ignore[override]
        """A built ``keras.layers.EinsumDense`` computing the same function: this kernel (+0.0 where absent) and bias.

        What :func:`prune.strip_pruning` and ``prune.convert(to="dense")`` put in this layer's place.

        Raises:
            ValueError: the layer is not built.
        """
        if not self.built:
            raise ValueError(f"SparseEinsumDense layer {self.name!r} must be built before it becomes an EinsumDense layer")
        dense = keras.layers.EinsumDense(
            self.equation,
            output_shape=self.partial_output_shape,
            activation=self.activation,
            bias_axes=self.bias_axes,
            kernel_initializer=self.kernel_initializer,
            bias_initializer=self.bias_initializer,
            name=self.name,
            dtype=self.dtype_policy,
        )
        return self._filled(dense, self.built_input_shape())

    def built_input_shape(self) -> tuple:
        """The input shape the layer was built with (a converted layer keeps the sizes it knew)."""
        config = self.get_build_config() or {}
        shape = config.get("input_shape")
        if shape is not None:
            return tuple(shape)
        lead = len(self.form.inputs) - self.form.contracted + (1 if self.form.ellipsis else 0)
        return (None,) * lead + self.contracted_shape

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.pop("units")
        config.pop("use_bias")
        config.update(equation=self.equation, output_shape=self.partial_output_shape, bias_axes=self.bias_axes)
        return config
