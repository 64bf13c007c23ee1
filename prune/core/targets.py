"""The mask-target protocol: one way to reach every prunable weight's mask.

A layer takes part by a ``mask_targets()`` method that returns one
:class:`MaskTarget` per prunable weight. A target reads the weight and its
keep-mask as dense views, and installs **any** keep-mask: entries that stay
keep their value and optimizer slots, entries that grow start at +0.0 with
zeroed slots, entries that go are set to +0.0 with zeroed slots. It says
whether a compiled train step must be retraced (a ``SparseDense`` whose
stored structure changed size). Masked layers
(:class:`prune.layers.PrunableLayer`, which covers ``PruneLowMagnitude``
around custom layers and the RNN cells) and :class:`prune.layers.SparseDense`
implement it; a new kind of prunable layer implements it in its own file
(and sets ``takes_mask_targets``, so that an unbuilt one is named).

Everything that moves masks goes through it: the pruning engine
(:func:`prune.update_masks`, whose schedules only ever shrink a mask: that
rule lives where the masks are selected, :mod:`prune.core.masks`), sparse training
(:mod:`prune.training.dst`: ``sparse_init``, SET, RigL), IMP's rewind and controls
(:mod:`prune.training.lottery`) and the dense gradients RigL grows by
(:meth:`MaskTarget.dense_pass`).

Nothing here imports TensorFlow or Keras.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Iterator

import numpy as np

__all__ = ["MaskTarget", "iter_layers", "mask_targets", "require_targets"]


@dataclass
class MaskTarget:
    """One prunable weight, as its layer presents it.

    Values are read lazily and cached until the next :meth:`install`, so
    listing the targets before every batch costs no variable reads.

    Attributes:
        key: ``"layer/weight"``, unique in the model (:func:`mask_targets` appends
            ``#2``, ``#3`` to repeated names of nested models).
        layer: The layer that owns the weight.
        variable: The trainable variable that gradients and optimizer slots belong to.
        read: ``() -> (weight, keep)``: dense views of the values (+0.0 where
            pruned or absent) and of the keep-mask (bool, True = kept).
        writer: ``writer(keep, optimizer) -> retrace``: installs any keep-mask
            (see the module docstring).
        to_dense: Maps an array shaped like ``variable`` (a gradient, a slot) to
            the dense view; the identity when the variable is stored dense.
        stores_dense: The variable has the weight's dense shape (masked layers),
            rather than holding only the stored entries (``SparseDense``).
        dense_pass: ``() -> context manager`` yielding a tensor whose gradient,
            in a forward pass run inside the context, is the dense gradient
            with respect to ``weight * mask`` (pruned entries included).
        pattern_shape: The shape patterns select on, the weight read row-major
            (``None``: the weight's own). An ``EinsumDense`` kernel gives its
            ``[d_in, d_out]`` matrix (:func:`prune.layers.einsum_form.matrix_shape`),
            so that ``NByM``'s groups run along its inputs and ``Block`` tiles
            the matrix, as for a ``Dense`` kernel.
    """

    key: str
    layer: Any
    variable: Any
    read: Callable[[], tuple[np.ndarray, np.ndarray]]
    writer: Callable[[np.ndarray, Any], bool]
    to_dense: Callable[[np.ndarray], np.ndarray] = np.asarray
    stores_dense: bool = True
    dense_pass: Callable[[], ContextManager[Any]] | None = None
    pattern_shape: tuple[int, ...] | None = None
    _values: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False)

    def _read(self) -> tuple[np.ndarray, np.ndarray]:
        if self._values is None:
            self._values = self.read()
        return self._values

    @property
    def weight(self) -> np.ndarray:
        """Dense view of the weight's current values."""
        return self._read()[0]

    @property
    def keep(self) -> np.ndarray:
        """Dense bool view of the current keep-mask."""
        return self._read()[1]

    @property
    def shape(self) -> tuple[int, ...]:
        """The weight's dense shape."""
        return tuple(self.keep.shape)

    def install(self, keep: np.ndarray, optimizer: Any = None) -> bool:
        """Install ``keep`` (any mask of the dense shape); returns whether a traced train step must be retraced."""
        retrace = bool(self.writer(np.asarray(keep, dtype=bool), optimizer))
        self._values = None
        return retrace


def iter_layers(model: Any) -> Iterator[Any]:
    """Every layer inside ``model`` (depth first, each once), ``model`` included."""
    from prune._internals import sublayers

    seen: set[int] = set()
    stack = [model]
    while stack:
        layer = stack.pop()
        if id(layer) in seen:
            continue
        seen.add(id(layer))
        yield layer
        stack.extend(reversed(sublayers(layer)))


def mask_targets(model: Any, built_only: bool = True) -> list[MaskTarget]:
    """Every :class:`MaskTarget` of the layers in ``model``, with unique keys.

    Args:
        model: A model or a layer.
        built_only: Skip layers that are not built yet (their weights do not exist).
    """
    out: list[MaskTarget] = []
    for layer in iter_layers(model):
        fn = getattr(layer, "mask_targets", None)
        if fn is None or not callable(fn) or (built_only and not getattr(layer, "built", False)):
            continue
        out.extend(fn())
    # Layers of nested models may share a name: the second "a/kernel" becomes "a/kernel#2" (traversal order).
    seen: dict[str, int] = {}
    for t in out:
        seen[t.key] = seen.get(t.key, 0) + 1
        if seen[t.key] > 1:
            t.key = f"{t.key}#{seen[t.key]}"
    return out


def require_targets(model: Any, what: str, unstructured: bool = True) -> list[MaskTarget]:
    """:func:`mask_targets` of a model whose masks a method moves entry by entry; refuses what cannot move.

    Args:
        model: The model.
        what: The caller's name, for messages.
        unstructured: Require ``pattern=Unstructured()`` on every layer (methods that move single entries).

    Raises:
        ValueError: an unbuilt prunable layer, a structured pattern, or no target at all (named).
    """
    from prune.core.patterns import Unstructured

    for layer in iter_layers(model):
        if getattr(layer, "takes_mask_targets", False) and not getattr(layer, "built", False):
            raise ValueError(f"{what}: layer {layer.name!r} is not built; build the model first (call it on a batch)")
    targets = mask_targets(model)
    if unstructured:
        for t in targets:
            pattern = getattr(t.layer, "pattern", None)
            if pattern is not None and not isinstance(pattern, Unstructured):
                raise ValueError(
                    f"{what} moves single entries and needs pattern=Unstructured(); layer {t.layer.name!r} has {pattern!r}"
                )
    if not targets:
        raise ValueError(
            f"{what} found no masked or SparseDense layer in {getattr(model, 'name', model)!r}; "
            "call prune.prune_low_magnitude first"
        )
    return targets
