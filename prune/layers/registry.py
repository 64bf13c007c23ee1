"""Which Keras layers can be pruned, and by which masked layer.

One dict, :data:`prune.layers.kinds.MASKED_TWINS`: prune's masked layers enter
it where they are defined (``@register_layer(prunes=keras.layers.Dense)``), a
user's through :func:`register_prunable`. Matching is by exact class: a user
subclass of ``Dense`` may override ``call`` in ways the masked layer would
silently drop, so it must be registered explicitly. Layers with no entry stay
dense and are listed by :func:`prune.sparsity_report`.
"""

from __future__ import annotations

from typing import Any

import keras

from prune._internals import sublayers
from prune._lazy import settle
from prune.layers.kinds import MASKED_TWINS, register_twin
from prune.layers.masked import PrunableLayer, is_custom_prunable, is_masked_layer
from prune.layers.scheduled import keeps_step

__all__ = ["register_prunable", "masked_class_for", "unsupported", "keeps_dense"]

# Layers with weights that tfmot's PruneRegistry supports with no prunable weight
# (an empty list there): they stay dense by design and are not "unsupported".
# Depthwise kernels are tiny and each filter sees one channel only.
_KEEP_DENSE: tuple[type, ...] = (
    keras.layers.BatchNormalization,
    keras.layers.LayerNormalization,
    keras.layers.DepthwiseConv1D,
    keras.layers.DepthwiseConv2D,
)


def keeps_dense(layer: Any) -> bool:
    """Whether ``layer`` stays dense by design (as in tfmot), so is neither pruned nor reported."""
    return type(layer) in _KEEP_DENSE


def register_prunable(layer_class: type, masked_class: type) -> None:
    """Make ``layer_class`` prunable through ``masked_class``.

    Args:
        layer_class: The plain Keras layer class.
        masked_class: A subclass of both :class:`prune.layers.PrunableLayer`
            and ``layer_class`` whose forward pass uses ``masked_weight``.

    Raises:
        ValueError: ``masked_class`` is not such a subclass.
    """
    if not (isinstance(masked_class, type) and issubclass(masked_class, PrunableLayer)):
        raise ValueError(f"masked_class must subclass prune.layers.PrunableLayer, got {masked_class!r}")
    register_twin(layer_class, masked_class)


def masked_class_for(layer: Any) -> type | None:
    """The masked class registered for ``layer``'s exact type, or ``None``.

    ``None`` too when the masked class has a ``can_prune(layer)`` classmethod
    that says no (``MaskedRNN`` for a cell type it does not know).
    """
    settle()  # masked_more's registrations, if Keras was first imported part-way through a prune import
    cls = MASKED_TWINS.get(type(layer))
    can_prune = getattr(cls, "can_prune", None)
    if cls is not None and can_prune is not None and not can_prune(layer):
        return None
    return cls


def _children(layer: Any) -> list[Any]:
    return sublayers(layer)


def _has_prunable(layer: Any) -> bool:
    stack = [layer]
    while stack:
        current = stack.pop()
        if (is_masked_layer(current) or masked_class_for(current) is not None or is_custom_prunable(current)
                or keeps_step(current)):  # keeps_step: a sparse layer inside (SparseMultiHeadAttention's projections)
            return True
        stack.extend(_children(current))
    return False


def unsupported(model: Any) -> list[tuple[Any, list[Any]]]:
    """``(layer, weights)`` for each outermost layer that stays dense for lack of a masked class.

    A layer with sublayers (an LSTM and its cell, a custom block) counts as one
    unit unless something inside it is prunable or sparse (``SparseMultiHeadAttention``'s
    projections), in which case it is a container and is searched further. Only matrix-like (>= 2-D) trainable
    weights count: biases and normalisation scales are not pruning targets.
    """
    out: list[tuple[Any, list[Any]]] = []
    stack = [model]
    seen: set[int] = set()
    while stack:
        layer = stack.pop()
        if id(layer) in seen:
            continue
        seen.add(id(layer))
        if is_masked_layer(layer) or masked_class_for(layer) is not None or is_custom_prunable(layer):
            continue  # masked, or prunable (a registered class, or tfmot's get_prunable_weights())
        if keeps_step(layer) or keeps_dense(layer):
            continue  # carries its own sparsity (SparseDense)
        if isinstance(layer, keras.Model) or _has_prunable(layer):
            stack.extend(reversed(_children(layer)))
            continue
        weights = [w for w in layer.trainable_weights if len(w.shape) >= 2]
        if weights:
            out.append((layer, weights))
    return out

