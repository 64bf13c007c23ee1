"""Find and reset a Keras 3 optimizer's per-variable state ("slots").

A zero gradient does not keep a weight fixed once an optimizer has state for
it: SGD momentum, Adam's first moment, RMSprop's momentum, Lion's momentum and
the EMA copy all keep moving the weight after its gradient has become zero. So
whenever an entry is pruned (or frozen) after optimizer state exists, its slot
entries must be zeroed too. With zero slots and a zero gradient every Keras 3
optimizer computes an exactly zero update, and weight decay of an exact zero is
an exact zero.

Keras 3 stores slots as lists aligned with the optimizer's trainable
variables (``optimizer._momentums[i]`` belongs to ``optimizer._trainable_variables[i]``),
created by ``add_variable_from_reference``. Rather than hard-coding each
optimizer's attribute names, :func:`slots_for` scans the optimizer for lists of
variables aligned one-to-one with its trainable variables, which covers SGD,
Adam(W), Nadam, Adamax, RMSprop, Adagrad, Adadelta, Lion, Ftrl, the EMA copies
and gradient accumulators, and any user optimizer built the same way. It looks
through wrappers such as ``LossScaleOptimizer`` via ``inner_optimizer``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from prune._internals import OPTIMIZER_VARIABLES, optimizer_variables

__all__ = ["slots_for", "zero_slot_entries"]


def _inner(optimizer: Any) -> Any:
    while hasattr(optimizer, "inner_optimizer"):
        optimizer = optimizer.inner_optimizer
    return optimizer


def _index_of(optimizer: Any, variable: Any) -> int | None:
    for i, v in enumerate(optimizer_variables(optimizer)):
        if v is variable:
            return i
    return None


def slots_for(optimizer: Any, variable: Any) -> list[Any]:
    """Return the optimizer state variables that shadow ``variable``.

    Args:
        optimizer: A Keras 3 optimizer (or a wrapper with ``inner_optimizer``).
            An optimizer that is not built yet has no slots.
        variable: A model variable the optimizer trains.

    Returns:
        The slot variables with ``variable``'s shape, in a stable order. Empty
        when the optimizer is ``None``, unbuilt, or does not train ``variable``.
    """
    if optimizer is None:
        return []
    opt = _inner(optimizer)
    if not getattr(opt, "built", False):
        return []
    index = _index_of(opt, variable)
    if index is None:
        return []
    n = len(optimizer_variables(opt))
    found: list[Any] = []
    for name in sorted(vars(opt)):
        if name == OPTIMIZER_VARIABLES:
            continue
        value = getattr(opt, name)
        if not isinstance(value, (list, tuple)) or len(value) != n:
            continue
        slot = value[index]
        if slot is None or slot is variable or not hasattr(slot, "assign"):
            continue
        if tuple(slot.shape) == tuple(variable.shape):
            found.append(slot)
    return found


def zero_slot_entries(optimizer: Any, variable: Any, keep: np.ndarray | tf.Tensor) -> int:
    """Zero every slot entry of ``variable`` where ``keep`` is False.

    Args:
        optimizer: A Keras 3 optimizer, or ``None`` (then nothing happens).
        variable: The model variable whose slots to edit.
        keep: Boolean array of ``variable``'s shape; False entries are zeroed.

    Returns:
        The number of slot variables edited.
    """
    slots = slots_for(optimizer, variable)
    keep_t = tf.convert_to_tensor(np.asarray(keep, dtype=bool))
    for slot in slots:
        value = tf.convert_to_tensor(slot.value) if hasattr(slot, "value") else tf.convert_to_tensor(slot)
        # tf.where, not a multiply: x * 0 is -0.0 for negative x.
        slot.assign(tf.where(keep_t, value, tf.zeros_like(value)))
    return len(slots)
