"""``SparseConv2D``: a 2-D convolution whose kernel is stored sparse, as a patch matrix.

A ``Conv2D`` kernel ``[kh, kw, C_in, C_out]`` read row-major is the patch
matrix ``W = kernel.reshape(kh * kw * C_in, C_out)``: row ``(dy * kw + dx) *
C_in + c`` multiplies input channel ``c`` at kernel tap ``(dy, dx)``, the
order in which ``tf.image.extract_patches`` lays out a patch. The layer
stores ``W`` exactly as :class:`prune.layers.SparseDense` stores its weight
(it is a subclass): ``values`` at row-major ``indices``, the transposed
structure and the native structure beside them, the compact ``.keras`` store,
compaction as it is pruned, and the mask-target protocol. Masks, reports and
:meth:`SparseConv2D.to_dense` see the 4-D kernel (:attr:`weight_shape`), so a
``MaskedConv2D`` and a ``SparseConv2D`` pruned alike select the same masks
(``NByM`` groups run along ``C_in``, axis -2, as in the masked layer).

How a call computes ``y = conv2d(x, kernel) + bias`` (``channels_last``):

* **1 x 1 kernels** (the pointwise convolutions of MobileNets, where most
  of their weights are): a stride is a strided slice, and the product is
  :func:`prune.layers.kernels.sparse_matmul` over ``[batch * H * W, C_in]``,
  a reshape of the input with no copy at stride 1. Every ``matmul`` applies,
  the native kernels and their block micro-kernels included (a structure of
  whole 1 x C tiles along the output channels, what ``Block((1, C))`` on the
  patch matrix leaves, is found by :func:`prune.native.structure`).
* **k x k kernels, ``matmul="native"``** (float32, library loaded): the native
  op ``PruneConv2d``, implicit im2col: the forward op's tiled kernel over the
  output positions, each tile's patches written from the NHWC input into the
  tile buffer, in cache, so the ``[batch * H_out * W_out, kh * kw * C_in]``
  patch matrix is never formed. Its gradient (:func:`_prune_conv2d_grad`):
  TensorFlow's dense convolution gradients without dilation, the native
  ``PruneSpmm``/``PruneCol2im``/``PruneSddmm`` route with it.
* **k x k kernels, ``matmul="auto"``**: a run-time ``tf.switch_case`` between
  TensorFlow's dense convolution and ``PruneConv2d``, priced by
  :mod:`prune.layers.kernels`' cost model with rows = output positions (fitted
  on dense layers, not refitted on convolutions).
* **k x k kernels, ``matmul="dense"``** (and under XLA): the values scattered
  into the 4-D kernel and TensorFlow's dense convolution
  (``tf.nn.convolution``, as Keras's ``Conv2D``).
* **k x k kernels, ``"coo"``/``"csr"``, and the fallback** (``PRUNE_NATIVE=0``,
  other dtypes): ``tf.image.extract_patches`` (im2col) then ``sparse_matmul``
  over the patch matrix, which is then formed whole, ``kh * kw`` times the
  input's size (strides aside); ``extract_patches`` has TensorFlow's own gradient.

Gradients reach the input and ``values`` only. ``groups`` must be 1 and
``data_format`` ``"channels_last"``; ``DepthwiseConv2D`` stays dense. Speed:
``docs/kernels.md`` (sparse convolutions).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import keras
import numpy as np
import tensorflow as tf

from prune._internals import override_call
from prune.layers import kernels
from prune.layers.kinds import register_layer
from prune.layers.sparse import SparseDense, _check_bias, _check_finite

__all__ = ["SparseConv2D", "conv_output_size"]

PADDINGS = ("valid", "same")


def _pair(value: Any, name: str) -> tuple[int, int]:
    """``value`` (an int or two ints) as two positive ints; a ValueError naming ``name`` otherwise."""
    items = (value, value) if isinstance(value, (int, np.integer)) and not isinstance(value, bool) else value
    try:
        items = tuple(items)
    except TypeError:
        items = ()
    if len(items) != 2 or any(isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 1 for d in items):
        raise ValueError(f"{name} must be a positive integer or two positive integers, got {value!r}")
    return int(items[0]), int(items[1])


def conv_output_size(size: int | None, kernel: int, stride: int, dilation: int, padding: str) -> int | None:
    """One spatial output size of a convolution, as TensorFlow and Keras compute it (``None`` stays ``None``).

    ``"valid"``: ``(size - dilation * (kernel - 1) - 1) // stride + 1``
    (at least 0); ``"same"``: ``ceil(size / stride)``.
    """
    if size is None:
        return None
    if padding == "same":
        return -(-int(size) // stride)
    return max((int(size) - dilation * (kernel - 1) - 1) // stride + 1, 0)


@tf.RegisterGradient("PruneConv2d")
def _prune_conv2d_grad(op: Any, dy: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, None]:
    """Gradients of the native ``PruneConv2d`` with respect to ``x`` and ``values`` (none for the structure).

    Without dilation, TensorFlow's dense convolution gradients on the kernel scattered from the values
    (``Conv2DBackpropInput`` and ``Conv2DBackpropFilter``, oneDNN's, what a ``Conv2D`` trains with), the kernel's
    gradient read at the stored entries. With the native route below for every kernel, a 3x3 layer's training
    step ran at 0.24-0.53x dense's speed at batch 32 (50-95% sparse, 32-64 channels at 14x14 and 28x28;
    ``results/benchmarks/history/2026-12-03-amd-epyc-conv-native-gradient/conv_speed.md``), since it forms the
    ``[positions, kh * kw * C]`` patches and their gradient whole; with these, 0.74-1.44x
    (``results/benchmarks/conv_speed.md``; both on the same AMD EPYC, 2 threads).
    With dilation (TensorFlow's CPU ``Conv2DBackpropInput`` refuses dilation rates above 1): the input
    gradient ``dy @ W^T`` by ``PruneSpmm`` (transpose) into patch gradients, summed into the pixels by
    ``PruneCol2im``; the values gradient by ``PruneSddmm`` over ``tf.image.extract_patches``.
    A registered gradient (not ``tf.custom_gradient``), so that the op differentiates inside the
    ``tf.switch_case`` of ``matmul="auto"``.
    """
    from prune import native

    x, values, structure = op.inputs
    n_in, n_out = op.get_attr("n_in"), op.get_attr("n_out")
    kernel, strides, dilations = (list(op.get_attr(a)) for a in ("kernel_size", "strides", "dilations"))
    padding = op.get_attr("padding")
    padding = padding.decode() if isinstance(padding, bytes) else padding
    if dilations == [1, 1]:
        rp = structure[: n_in + 1]  # the CSR of W (prune.native.structure): row pointers, then each entry's column
        cols = structure[n_in + 1 : n_in + 1 + tf.shape(values)[0]]
        indices = tf.stack([tf.repeat(tf.range(n_in), rp[1:] - rp[:-1]), cols], 1)
        shape = [*kernel, n_in // (kernel[0] * kernel[1]), n_out]
        w = tf.reshape(tf.scatter_nd(indices, values, [n_in, n_out]), shape)
        conv_strides = [1, *strides, 1]
        dx = tf.raw_ops.Conv2DBackpropInput(
            input_sizes=tf.shape(x), filter=w, out_backprop=dy, strides=conv_strides, padding=padding
        )
        dw = tf.raw_ops.Conv2DBackpropFilter(
            input=x, filter_sizes=shape, out_backprop=dy, strides=conv_strides, padding=padding
        )
        dv = tf.gather_nd(tf.reshape(dw, [n_in, n_out]), indices)
        return tf.ensure_shape(dx, x.shape), tf.ensure_shape(dv, values.shape), None
    lib = native.load()
    shape = tf.shape(dy)
    dy_flat = tf.reshape(dy, [-1, n_out])
    d_patches = lib.prune_spmm(dy_flat, values, structure, n_in=n_in, n_out=n_out, transpose=True)
    dx = lib.prune_col2im(
        tf.reshape(d_patches, tf.concat([shape[:3], [n_in]], 0)), x,
        kernel_size=kernel, strides=strides, dilations=dilations, padding=padding,
    )
    patches = tf.image.extract_patches(
        x, sizes=[1, *kernel, 1], strides=[1, *strides, 1], rates=[1, *dilations, 1], padding=padding
    )
    dv = lib.prune_sddmm(tf.reshape(patches, [-1, n_in]), dy_flat, values, structure, n_in=n_in, n_out=n_out)
    return tf.ensure_shape(dx, x.shape), tf.ensure_shape(dv, values.shape), None


@register_layer
class SparseConv2D(SparseDense):
    """2-D convolution with a sparse kernel: ``activation(conv2d(x, kernel) + bias)``, ``channels_last``.

    Build it from a dense kernel and mask with :meth:`from_dense`, from 4-D
    COO entries with :meth:`from_sparse`, or directly, in which case a
    uniformly random structure with exactly ``round(sparsity * kernel.size)``
    absent entries is drawn at build time from ``seed`` and the values come
    from ``kernel_initializer`` on the 4-D kernel shape (fan-in and fan-out as
    ``Conv2D``'s). See the module docstring for the storage and the kernels.

    Args:
        filters: Output channels.
        kernel_size: ``kh`` and ``kw`` (an int or two).
        strides: An int or two; ``strides > 1`` with ``dilation_rate > 1`` is
            refused, as in Keras.
        padding: ``"valid"`` or ``"same"`` (any case).
        data_format: ``"channels_last"`` or ``None`` (Keras's image data
            format, which must then be ``"channels_last"``).
        dilation_rate: An int or two.
        groups: Must be 1.
        activation: Keras activation.
        use_bias: Whether to add a bias.
        kernel_initializer: Initializer of the stored values (on the 4-D shape).
        bias_initializer: Initializer of the bias.
        matmul: As :class:`prune.layers.SparseDense`'s (``"auto"``,
            ``"native"``, ``"coo"``, ``"csr"``, ``"dense"``).
        sparsity, seed, nnz, pruning_schedule, criterion, scope, pattern:
            As :class:`prune.layers.SparseDense`'s.
        **kwargs: Keras layer arguments (``name``, ``dtype``, ...).

    Raises:
        ValueError: naming the argument and its value: ``filters``,
            ``kernel_size``, ``strides`` or ``dilation_rate`` not positive,
            both strides and dilation above 1, an unknown ``padding``,
            ``channels_first``, ``groups`` other than 1, and the errors of
            :class:`prune.layers.SparseDense`.
    """

    def __init__(
        self,
        filters: int,
        kernel_size: int | tuple[int, int],
        strides: int | tuple[int, int] = (1, 1),
        padding: str = "valid",
        data_format: str | None = None,
        dilation_rate: int | tuple[int, int] = (1, 1),
        groups: int = 1,
        activation: Any = None,
        use_bias: bool = True,
        kernel_initializer: Any = "glorot_uniform",
        bias_initializer: Any = "zeros",
        **kwargs: Any,
    ) -> None:
        if isinstance(filters, bool) or not isinstance(filters, (int, np.integer)) or filters < 1:
            raise ValueError(f"filters must be a positive integer, got {filters!r}")
        kernel_size = _pair(kernel_size, "kernel_size")
        strides = _pair(strides, "strides")
        dilation_rate = _pair(dilation_rate, "dilation_rate")
        if max(strides) > 1 and max(dilation_rate) > 1:
            raise ValueError(
                f"strides > 1 with dilation_rate > 1 is not supported (as in Keras), got strides={strides} "
                f"and dilation_rate={dilation_rate}"
            )
        if not isinstance(padding, str) or padding.lower() not in PADDINGS:
            raise ValueError(f"padding must be one of {list(PADDINGS)}, got {padding!r}")
        fmt = keras.config.image_data_format() if data_format is None else data_format
        if fmt != "channels_last":
            raise ValueError(
                f"data_format must be 'channels_last' (SparseConv2D has no channels_first form), got {data_format!r}"
                + ("" if data_format is not None else f" (Keras's image_data_format() is {fmt!r})")
            )
        if isinstance(groups, bool) or groups != 1:
            raise ValueError(f"groups must be 1 (SparseConv2D has no grouped form), got {groups!r}")
        kwargs.pop("units", None)  # a config always names filters; units is SparseDense's name for them
        super().__init__(
            int(filters),
            activation=activation,
            use_bias=use_bias,
            kernel_initializer=kernel_initializer,
            bias_initializer=bias_initializer,
            **kwargs,
        )
        self.filters = int(filters)
        self.kernel_size = kernel_size
        self.strides = strides
        self.padding = padding.lower()
        self.data_format = "channels_last"
        self.dilation_rate = dilation_rate
        self.groups = 1
        self.input_spec = keras.layers.InputSpec(ndim=4)

    # -- construction --------------------------------------------------------
    @classmethod
    def from_sparse(  # type: ignore[override]
        cls,
        indices: Any,
        values: Any,
        kernel_shape: tuple[int, int, int, int],
        matmul: str = "auto",
        bias: Any = None,
        input_shape: tuple[int | None, ...] | None = None,
        **layer_kwargs: Any,
    ) -> "SparseConv2D":
        """A built layer whose kernel holds ``values`` at the 4-D ``indices`` (zeros elsewhere).

        Args:
            indices: ``[nnz, 4]`` integer entries ``(dy, dx, c_in, c_out)``;
                unsorted input is sorted (values follow), duplicates and
                out-of-range entries are errors.
            values: ``[nnz]`` real values in the order of ``indices``.
            kernel_shape: ``(kh, kw, C_in, C_out)``.
            matmul: See :mod:`prune.layers.kernels`.
            bias: Optional ``[C_out]`` initial bias.
            input_shape: The shape to build with (``(batch, H, W, C_in)``,
                ``None`` for unknown sizes); default ``(None, None, None, C_in)``.
                Known spatial sizes let :func:`prune.sparsity_report` count FLOPs.
            **layer_kwargs: Other constructor arguments (``strides``,
                ``padding``, ``activation``, ``name``, ...).

        Raises:
            ValueError: a ``kernel_shape`` that is not four positive ints, an
                ``input_shape`` whose channels differ, the entry and bias
                errors of :meth:`prune.layers.SparseDense.from_sparse`;
                before anything is built.
        """
        shape = tuple(kernel_shape) if isinstance(kernel_shape, (tuple, list)) else ()
        if len(shape) != 4 or any(isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 1 for d in shape):
            raise ValueError(f"kernel_shape must be four positive integers (kh, kw, C_in, C_out), got {kernel_shape!r}")
        kh, kw, c_in, c_out = (int(d) for d in shape)
        idx = np.asarray(indices)
        if idx.size == 0:
            idx = idx.reshape(0, 4)
        if idx.ndim != 2 or idx.shape[1] != 4:
            raise ValueError(f"indices must have shape [nnz, 4] (dy, dx, c_in, c_out), got shape {idx.shape}")
        if idx.dtype.kind not in "iu":
            raise ValueError(f"indices must be integers, got dtype {idx.dtype}")
        for axis, size in enumerate((kh, kw, c_in, c_out)):
            bad = np.flatnonzero((idx[:, axis] < 0) | (idx[:, axis] >= size))
            if len(bad):
                raise ValueError(
                    f"indices[{int(bad[0])}] = {idx[bad[0]].tolist()} is out of range for kernel_shape {(kh, kw, c_in, c_out)}"
                )
        idx = idx.astype(np.int64)
        rows = (idx[:, 0] * kw + idx[:, 1]) * c_in + idx[:, 2]
        flat_idx, vals = kernels.check_structure(np.stack([rows, idx[:, 3]], 1), values, (kh * kw * c_in, c_out))
        if input_shape is None:
            input_shape = (None, None, None, c_in)
        input_shape = tuple(input_shape)
        if len(input_shape) != 4 or input_shape[-1] != c_in:
            raise ValueError(f"input_shape must be (batch, H, W, {c_in}) for kernel_shape {shape}, got {input_shape!r}")
        _check_bias(bias, c_out)
        layer = cls(c_out, (kh, kw), matmul=matmul, **layer_kwargs)
        if bias is not None and not layer.use_bias:
            raise ValueError("bias was given but use_bias=False")
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
        matmul: str = "auto",
        bias: Any = None,
        input_shape: tuple[int | None, ...] | None = None,
        **layer_kwargs: Any,
    ) -> "SparseConv2D":
        """A built layer storing ``kernel`` (``[kh, kw, C_in, C_out]``) where ``mask`` is 1.

        Args:
            kernel: A ``Conv2D`` kernel.
            mask: Binary (0/1 or bool) array of the same shape.
            matmul, bias, input_shape, **layer_kwargs: As :meth:`from_sparse`.

        Raises:
            ValueError: ``kernel`` not 4-D, not real or holding NaN or inf,
                ``mask`` of another shape or not binary, and the errors of
                :meth:`from_sparse`; before anything is built.
        """
        from prune.core import masks as _masks

        w = np.asarray(kernel)
        if w.ndim != 4:
            raise ValueError(f"kernel must be a 4-D [kh, kw, C_in, C_out] array, got shape {w.shape}")
        if not kernels.is_real_dtype(w.dtype):
            raise ValueError(f"kernel must be real numbers, got dtype {w.dtype}")
        _check_finite(w, "kernel")
        keep = _masks.validate_mask(mask, w.shape, name="mask")
        return cls.from_sparse(
            np.argwhere(keep), w[keep], w.shape, matmul=matmul, bias=bias, input_shape=input_shape, **layer_kwargs
        )

    def _matrix_rows(self, input_shape: Any) -> int:
        shape = tuple(input_shape)
        if len(shape) != 4:
            raise ValueError(f"SparseConv2D layer {self.name!r} takes 4-D (batch, H, W, C) inputs, got input shape {input_shape}")
        if shape[-1] is None:
            raise ValueError(f"the channel dimension of {self.name!r} must be known, got input shape {input_shape}")
        self.in_channels = int(shape[-1])
        kh, kw = self.kernel_size
        return kh * kw * self.in_channels

    @property
    def weight_shape(self) -> tuple[int, ...]:
        """``(kh, kw, C_in, C_out)``: the kernel's shape, as ``Conv2D``'s."""
        return (*self.kernel_size, self.in_channels, self.filters)

    # -- forward ---------------------------------------------------------------
    def call(self, inputs: Any, training: Any = None) -> Any:
        self.advance_step(training)
        kernels.check_xla(self.matmul, f"SparseConv2D layer {self.name!r}")
        x = tf.convert_to_tensor(inputs)
        if x.dtype != self.values.dtype:
            x = tf.cast(x, self.values.dtype)
        y = self._convolve(x)
        if self.bias is not None:
            y = y + self.bias
        if self.activation is not None:
            y = self.activation(y)
        return y

    def _convolve(self, x: tf.Tensor) -> tf.Tensor:
        """``conv2d(x, kernel)`` by the kernel the module docstring gives for this layer's shape and ``matmul``."""
        from prune._internals import in_xla_context

        static = self.compute_output_shape(tuple(x.shape))
        if self.kernel_size == (1, 1):
            y = self._patch_product(x, self.values.value)
        elif self.matmul == "dense" or in_xla_context():
            y = self._dense_conv(x, self._dense_kernel(self.values.value))
        else:
            lib = kernels.native_library() if self.matmul in ("auto", "native") and x.dtype == tf.float32 else None
            if lib is None:
                y = self._patch_product(x, self.values.value)
            elif self.matmul == "native":
                y = self._native_conv(lib, x)
            else:  # auto: TF's dense convolution or the native one, by the cost model at run time
                # Variables read before the switch, so that its branches export no intermediates of different
                # dtypes to the gradient (TF's type inference warns about an int64 and an int32 in one slot).
                values, indices, structure = (
                    tf.convert_to_tensor(v.value) for v in (self.values, self.indices, self.native_structure)
                )
                positions = tf.shape(x)[0] * self._output_positions(x, static)
                which = kernels._argmin_branch(kernels._COST, ("dense", "native"), tf.shape(indices)[0], positions, *self.dense_shape)
                y = tf.switch_case(
                    which,
                    [lambda: self._dense_conv(x, self._dense_kernel(values, indices)),
                     lambda: self._native_conv(lib, x, values, structure)],
                )
        return tf.ensure_shape(y, static)

    def _output_positions(self, x: tf.Tensor, static: tuple) -> Any:
        """``H_out * W_out`` of input ``x`` (``static``: its output shape as far as known): a Python int when the
        sizes are static, else a tensor (no patches formed)."""
        if None not in static[1:3]:
            return int(static[1]) * int(static[2])
        shape = tf.shape(x)
        sizes = []
        for i in range(2):
            k, s, d = self.kernel_size[i], self.strides[i], self.dilation_rate[i]
            n = shape[1 + i]
            sizes.append((n + s - 1) // s if self.padding == "same" else tf.maximum((n - d * (k - 1) - 1) // s + 1, 0))
        return sizes[0] * sizes[1]

    def _patches(self, x: tf.Tensor) -> tf.Tensor:
        """The ``[B, H_out, W_out, kh * kw * C_in]`` patches of ``x`` (for 1 x 1, ``x`` itself, strided)."""
        kh, kw = self.kernel_size
        sh, sw = self.strides
        if (kh, kw) == (1, 1):
            return x if (sh, sw) == (1, 1) else x[:, ::sh, ::sw, :]
        dh, dw = self.dilation_rate
        return tf.image.extract_patches(
            x, sizes=[1, kh, kw, 1], strides=[1, sh, sw, 1], rates=[1, dh, dw, 1], padding=self.padding.upper()
        )

    def _patch_product(self, x: tf.Tensor, values: tf.Tensor) -> tf.Tensor:
        """``patches(x) @ W`` by :func:`prune.layers.kernels.sparse_matmul` with the layer's ``matmul``."""
        patches = self._patches(x)
        shape = tf.shape(patches)
        y = self._matmul(tf.reshape(patches, [-1, self.dense_shape[0]]), values)
        return tf.reshape(y, tf.concat([shape[:3], [self.filters]], 0))

    def _native_conv(self, lib: Any, x: tf.Tensor, values: Any = None, structure: Any = None) -> tf.Tensor:
        """The native implicit-im2col forward op ``PruneConv2d`` (its gradient: :func:`_prune_conv2d_grad`)."""
        values = self.values.value if values is None else values
        structure = self.native_structure.value if structure is None else structure
        return lib.prune_conv2d(
            x, values, structure, n_in=self.dense_shape[0], n_out=self.filters,
            kernel_size=list(self.kernel_size), strides=list(self.strides), dilations=list(self.dilation_rate),
            padding=self.padding.upper(),
        )

    def _dense_kernel(self, values: tf.Tensor, indices: Any = None) -> tf.Tensor:
        """The 4-D kernel scattered from ``values`` (+0.0 where absent), differentiable in ``values``."""
        indices = self.indices.value if indices is None else indices
        return tf.reshape(tf.scatter_nd(indices, values, self.dense_shape), self.weight_shape)

    def _dense_conv(self, x: tf.Tensor, kernel: tf.Tensor) -> tf.Tensor:
        # tf.nn.convolution, as Keras: it runs a dilation by space_to_batch, and TensorFlow's CPU
        # Conv2DBackpropInput (tf.nn.conv2d's gradient) refuses dilation rates above 1
        return tf.nn.convolution(
            x, kernel, strides=list(self.strides), padding=self.padding.upper(), dilations=list(self.dilation_rate)
        )

    def compute_output_shape(self, input_shape: Any) -> tuple:
        shape = tuple(input_shape)
        if len(shape) != 4:
            raise ValueError(f"SparseConv2D layer {self.name!r} takes 4-D (batch, H, W, C) inputs, got input shape {input_shape}")
        sizes = [
            conv_output_size(shape[1 + i], self.kernel_size[i], self.strides[i], self.dilation_rate[i], self.padding)
            for i in range(2)
        ]
        return (shape[0], *sizes, self.filters)

    # -- views -------------------------------------------------------------------
    def to_dense_layer(self) -> keras.layers.Conv2D:  # type: ignore[override]
        """A built ``keras.layers.Conv2D`` computing the same function: this kernel (+0.0 where absent) and bias.

        What :func:`prune.strip_pruning` and ``prune.convert(to="dense")`` put in this layer's place.

        Raises:
            ValueError: the layer is not built.
        """
        if not self.built:
            raise ValueError(f"SparseConv2D layer {self.name!r} must be built before it becomes a Conv2D layer")
        conv = keras.layers.Conv2D(
            self.filters,
            **self.geometry(),
            activation=self.activation,
            use_bias=self.use_bias,
            name=self.name,
            bias_initializer=self.bias_initializer,
            kernel_initializer=self.kernel_initializer,
        )
        return self._filled(conv, self._build_input_shape())

    def _build_input_shape(self) -> tuple:
        """The input shape the layer was built with (so that a converted layer keeps the spatial sizes it knew)."""
        config = self.get_build_config() or {}
        shape = config.get("input_shape")
        return tuple(shape) if shape is not None else (None, None, None, self.in_channels)

    @contextlib.contextmanager
    def _dense_pass(self) -> Iterator[Any]:
        """One forward pass with the dense 4-D kernel scattered from the values; yields that kernel.

        Its gradient is the dense kernel gradient (RigL's grow score); no dense kernel is kept afterwards.
        """
        w_dense = self._dense_kernel(self.values.value)

        def call(inputs: Any, training: Any = None) -> Any:
            x = tf.convert_to_tensor(inputs)
            if x.dtype != w_dense.dtype:
                x = tf.cast(x, w_dense.dtype)
            y = self._dense_conv(x, w_dense)
            if self.bias is not None:
                y = y + self.bias
            return self.activation(y) if self.activation is not None else y

        with override_call(self, call):
            yield w_dense

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.pop("units")
        config.update(filters=self.filters, data_format=self.data_format, groups=self.groups, **self.geometry())
        return config

    def geometry(self) -> dict[str, Any]:
        """``kernel_size``, ``strides``, ``padding`` and ``dilation_rate``, as ``Conv2D`` takes them."""
        return dict(kernel_size=self.kernel_size, strides=self.strides, padding=self.padding,
                    dilation_rate=self.dilation_rate)
