"""``SparseMultiHeadAttention``: Keras's ``MultiHeadAttention`` with its four projections stored sparse.

A subclass of ``keras.layers.MultiHeadAttention`` whose ``_query_dense``,
``_key_dense``, ``_value_dense`` and ``_output_dense`` (named ``query``,
``key``, ``value`` and ``attention_output``, as Keras names them) are
:class:`prune.layers.SparseEinsumDense` layers with the equations and bias axes
Keras gives them; the attention itself is Keras's. The projections keep the
attribute names of Keras's, so ``.keras`` saving stores each one's compact
sparse state where Keras stores its projections, and every projection is a
mask target of its own (``"query/kernel"``, ...), driven by
:func:`prune.update_masks` as any sparse layer.

The config carries each projection's number of entries (``projection_nnz``),
so that a loaded layer builds placeholders of the saved lengths that loading
then overwrites (as :class:`prune.layers.SparseDense`'s ``nnz``), the kernel
``matmul`` and the projections' pruning parameters (``pruning``, a
:class:`prune.layers.PruningParams` config: ``seed`` is Keras's dropout seed
here). Built from scratch, each projection draws a random structure of
``sparsity`` from the pruning seed (the same seed for all four).

``prune.convert(model, to="sparse")`` builds it from a ``MultiHeadAttention``
(structure: the nonzeros) or a ``MaskedMultiHeadAttention`` (structure: the
masks) with :meth:`SparseMultiHeadAttention.from_projections`;
:meth:`SparseMultiHeadAttention.to_dense_layer` goes back to Keras's layer.
The gated form (``use_gate=True``), regularizers and constraints have no
sparse form and are refused.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from prune.layers import kernels
from prune.layers.kinds import register_layer
from prune.layers.scheduled import PruningParams
from prune.layers.sparse_einsum import SparseEinsumDense, matrix_entries

__all__ = ["PROJECTIONS", "SparseMultiHeadAttention", "projection_equation"]

PROJECTIONS = {"query": "query_dense", "key": "key_dense", "value": "value_dense", "attention_output": "output_dense"}
"""Projection name (its layer's name, Keras's) -> the public ``MultiHeadAttention`` property that returns it (the
layer is held in the attribute of that name with a leading underscore, which ``.keras`` saving walks)."""

_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def projection_equation(free_dims: int, bound_dims: int, output_dims: int) -> tuple[str, str, int]:
    """``(equation, bias_axes, output_rank)`` of a ``MultiHeadAttention`` projection, as Keras builds them.

    ``free_dims`` input axes pass through, ``bound_dims`` are contracted and
    ``output_dims`` come from the kernel (and carry the bias):
    ``projection_equation(2, 1, 2) == ("abc,cde->abde", "de", 4)``.
    """
    free = _LETTERS[:free_dims]
    bound = _LETTERS[free_dims : free_dims + bound_dims]
    out = _LETTERS[free_dims + bound_dims : free_dims + bound_dims + output_dims]
    return f"{free}{bound},{bound}{out}->{free}{out}", out, free_dims + output_dims


def _fresh(initializer: Any) -> Any:
    """A new instance of ``initializer`` (as Keras gives each projection its own, so that they draw differently)."""
    return initializer.__class__.from_config(initializer.get_config())


@register_layer
class SparseMultiHeadAttention(keras.layers.MultiHeadAttention):
    """``keras.layers.MultiHeadAttention`` whose four projections are :class:`prune.layers.SparseEinsumDense`.

    Args:
        num_heads, key_dim: As ``MultiHeadAttention``'s.
        matmul: Kernel of the projections (``"auto"``, ``"native"``, ``"coo"``, ``"csr"``, ``"dense"``).
        sparsity: Fraction of absent entries of a projection built without ``projection_nnz``.
        projection_nnz: ``{name: nnz}`` for some of ``query``, ``key``,
            ``value``, ``attention_output``: the number of entries of each
            projection's placeholder (set by ``get_config``; loading overwrites the structure).
        pruning: A :class:`prune.layers.PruningParams` config (schedule,
            pattern, criterion, scope, seed) given to every projection, or ``None``.
        **kwargs: The other ``MultiHeadAttention`` arguments (``value_dim``,
            ``dropout``, ``use_bias``, ``output_shape``, ``attention_axes``, initializers, ``seed``, ``name``...).

    Raises:
        ValueError: naming the argument and its value: unknown ``matmul``,
            ``sparsity`` outside [0, 1], bad ``projection_nnz`` or
            ``pruning``, ``use_gate=True``, a regularizer or constraint.
    """

    def __init__(
        self,
        num_heads: int,
        key_dim: int,
        matmul: str = "auto",
        sparsity: float = 0.0,
        projection_nnz: dict[str, int] | None = None,
        pruning: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        kernels.check_matmul(matmul)
        if not (0.0 <= float(sparsity) <= 1.0):
            raise ValueError(f"sparsity must be in [0, 1], got sparsity={sparsity!r}")
        nnz = dict(projection_nnz or {})
        bad = {k: v for k, v in nnz.items() if k not in PROJECTIONS or isinstance(v, bool)
               or not isinstance(v, (int, np.integer)) or v < 0}
        if bad:
            raise ValueError(
                f"projection_nnz must map names among {list(PROJECTIONS)} to non-negative integers, got "
                f"projection_nnz={projection_nnz!r}"
            )
        if kwargs.get("use_gate"):
            raise ValueError("use_gate=True has no sparse form (its gate projection would stay dense), got use_gate=True")
        for key in ("kernel_regularizer", "bias_regularizer", "kernel_constraint", "bias_constraint"):
            if kwargs.get(key) is not None:
                raise ValueError(f"{key} has no sparse form in SparseMultiHeadAttention, got {key}={kwargs[key]!r}")
        params = PruningParams.from_config(pruning or {})
        super().__init__(num_heads, key_dim, **kwargs)
        self.pruning_params = params
        self.matmul = matmul
        self.sparsity = float(sparsity)
        self._projection_nnz = {k: int(v) for k, v in nnz.items()}
        self._pending_projections: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    @classmethod
    def from_projections(
        cls,
        config: dict[str, Any],
        build_config: dict[str, Any],
        parts: dict[str, tuple[Any, Any, Any]],
        **kwargs: Any,
    ) -> "SparseMultiHeadAttention":
        """A built layer whose projections store the given kernels where their masks are 1.

        Args:
            config: A ``MultiHeadAttention`` config (``get_config()`` of Keras's layer or a masked twin's plain config).
            build_config: Its ``get_build_config()`` (the query, value and key shapes).
            parts: ``{name: (kernel, mask, bias)}`` for each of ``query``, ``key``, ``value``,
                ``attention_output``; ``bias`` ``None`` when the layer has none.
            **kwargs: ``matmul``, ``pruning`` and other constructor arguments.

        Raises:
            ValueError: a projection missing from ``parts``, a kernel, mask or
                bias of the wrong shape or not binary, and the constructor's
                errors; before anything is built.
        """
        from prune.core import masks as _masks

        missing = sorted(set(PROJECTIONS) - set(parts))
        if missing:
            raise ValueError(f"parts must hold the projections {list(PROJECTIONS)}, missing {missing}")
        shapes = build_config.get("shapes_dict") if isinstance(build_config, dict) else None
        if not isinstance(shapes, dict) or "query_shape" not in shapes or "value_shape" not in shapes:
            raise ValueError(
                f"build_config must be a MultiHeadAttention's build config ({{'shapes_dict': {{'query_shape': ..., "
                f"'value_shape': ...}}}}), got build_config={build_config!r}"
            )
        layer = cls(**{**config, **kwargs})
        expected = layer.kernel_shapes(**shapes)
        entries = {}
        for name in PROJECTIONS:
            w = np.asarray(parts[name][0])
            if w.shape != expected[name]:
                raise ValueError(
                    f"parts[{name!r}] kernel has shape {w.shape}, expected {expected[name]} for this layer's shapes"
                )
            keep = _masks.validate_mask(parts[name][1], w.shape, name=f"parts[{name!r}] mask")
            bias = parts[name][2]
            bias_shape = expected[name][2:] if name == "attention_output" else expected[name][1:]  # the kernel's free axes
            if bias is not None and (not layer.use_bias or np.shape(bias) != bias_shape):
                raise ValueError(
                    f"parts[{name!r}] bias has shape {np.shape(bias)}, expected "
                    + (f"{bias_shape}" if layer.use_bias else "None (use_bias=False)")
                )
            entries[name] = (keep, w)
        layer._projection_nnz = {n: int(k.sum()) for n, (k, _) in entries.items()}
        layer._pending_projections = {name: (np.argwhere(keep), w[keep]) for name, (keep, w) in entries.items()}
        try:
            layer.build_from_config(build_config)
        finally:
            layer._pending_projections = {}
        for name, proj in layer.projections.items():
            if parts[name][2] is not None:
                proj.bias.assign(np.asarray(parts[name][2]))
        return layer

    def kernel_shapes(self, query_shape: Any, value_shape: Any, key_shape: Any = None) -> dict[str, tuple[int, ...]]:
        """``{name: kernel shape}`` of the four projections for these input shapes, as Keras's layer builds them."""
        key_shape = value_shape if key_shape is None else key_shape
        out = tuple(self._output_shape) if self._output_shape else (query_shape[-1],)
        return {  # (contracted..., free...), as _projection builds them
            "query": (query_shape[-1], self._num_heads, self._key_dim),
            "key": (key_shape[-1], self._num_heads, self._key_dim),
            "value": (value_shape[-1], self._num_heads, self._value_dim),
            "attention_output": (self._num_heads, self._value_dim, *out),
        }

    def build(self, query_shape: Any, value_shape: Any, key_shape: Any = None) -> None:
        key_shape = value_shape if key_shape is None else key_shape
        if tuple(value_shape[1:-1]) != tuple(key_shape[1:-1]):
            raise ValueError(
                "All dimensions of `value` and `key`, except the last one, must be equal. "
                f"Received: value_shape={value_shape} and key_shape={key_shape}"
            )
        shapes = self.kernel_shapes(query_shape, value_shape, key_shape)
        self._query_dense = self._projection("query", len(query_shape) - 1, 1, shapes["query"][1:], query_shape)
        self._key_dense = self._projection("key", len(key_shape) - 1, 1, shapes["key"][1:], key_shape)
        self._value_dense = self._projection("value", len(value_shape) - 1, 1, shapes["value"][1:], value_shape)
        self._build_attention(len(value_shape) + 1)  # the rank of the projected query, key and value
        out_input = list(self._query_dense.compute_output_shape(tuple(query_shape)))
        out_input[-1] = self._value_dim
        self._output_dense = self._projection(
            "attention_output", len(query_shape) - 1, 2, shapes["attention_output"][2:], tuple(out_input)
        )

    def _projection(self, name: str, free: int, bound: int, kernel_out: tuple, input_shape: Any) -> SparseEinsumDense:
        equation, bias_axes, rank = projection_equation(free, bound, len(kernel_out))
        output_shape = [None] * (rank - 1 - len(kernel_out)) + list(kernel_out)
        layer = SparseEinsumDense(
            equation,
            output_shape,
            bias_axes=bias_axes if self._use_bias else None,
            kernel_initializer=_fresh(self._kernel_initializer),
            bias_initializer=_fresh(self._bias_initializer),
            matmul=self.matmul,
            sparsity=self.sparsity,
            nnz=self._projection_nnz.get(name),
            name=name,
            dtype=self.dtype_policy,
            **self.pruning_params.as_kwargs(),
        )
        pending = self._pending_projections.get(name)
        if pending is not None:  # from_projections: kernel shapes checked against kernel_shapes() already
            shape = tuple(int(d) for d in tuple(input_shape)[len(input_shape) - bound :]) + tuple(kernel_out)
            layer._pending = matrix_entries(*pending, shape, bound)
        layer.build(tuple(input_shape))
        return layer

    @property
    def projections(self) -> dict[str, SparseEinsumDense]:
        """``{name: projection}`` of the built layer, in :data:`PROJECTIONS` order."""
        return {name: getattr(self, attr) for name, attr in PROJECTIONS.items()}

    def to_dense_layer(self) -> keras.layers.MultiHeadAttention:
        """A built ``keras.layers.MultiHeadAttention`` with these kernels (+0.0 where absent) and biases.

        What :func:`prune.strip_pruning` and ``prune.convert(to="dense")`` put in this layer's place.

        Raises:
            ValueError: the layer is not built.
        """
        if not self.built:
            raise ValueError(f"SparseMultiHeadAttention layer {self.name!r} must be built before it becomes dense")
        dense = keras.layers.MultiHeadAttention.from_config(self.plain_config())
        dense.build_from_config(self.get_build_config())
        for name, attr in PROJECTIONS.items():
            src, dst = getattr(self, attr), getattr(dense, attr)
            dst.kernel.assign(src.to_dense())
            if src.bias is not None:
                dst.bias.assign(src.bias.numpy())
        return dense

    def plain_config(self) -> dict[str, Any]:
        """The config of Keras's ``MultiHeadAttention`` (this one without its sparse keys)."""
        return keras.layers.MultiHeadAttention.get_config(self)

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        nnz = {n: p.nnz for n, p in self.projections.items()} if self.built else dict(self._projection_nnz)
        config.update(matmul=self.matmul, sparsity=self.sparsity, projection_nnz=nnz,
                      pruning=self.pruning_params.get_config())
        return config
