"""Gradients of the prunable weights on one batch, for criteria and for RigL's growth.

* :func:`compute_gradients`: the gradient with respect to each stored
  variable, as a dense view (pruned entries get zero: the forward pass
  multiplies by the mask, and a ``SparseDense`` has no absent entries to
  differentiate). Criteria that need a gradient (SNIP, Taylor, movement) score
  with it.
* :func:`dense_gradients`: the gradient with respect to ``weight * mask``,
  pruned entries included, through each target's
  :meth:`~prune.core.targets.MaskTarget.dense_pass`. RigL grows where it is largest.

Both run one forward pass in inference mode (``training=False``: no dropout,
no step counted) and take the loss given or the compiled one.
:func:`batch_of` reads a ``gradient_data`` argument (a batch, or a callable
returning one), as :class:`prune.UpdatePruningStep` and
:class:`prune.DynamicSparsity` take it.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import numpy as np

from prune.core.targets import mask_targets, require_targets

__all__ = ["compute_gradients", "dense_gradients", "batch_of"]


def batch_of(gradient_data: Any, what: str) -> tuple[Any, Any]:
    """The ``(x, y)`` batch of a ``gradient_data`` argument: the pair itself, or what a callable returns.

    Raises:
        ValueError: ``gradient_data`` is ``None``, or not (or not returning) a pair; names ``what`` asked.
    """
    if gradient_data is None:
        raise ValueError(f"{what} need gradients: pass gradient_data=(x, y) or a callable returning one")
    data = gradient_data() if callable(gradient_data) else gradient_data
    if not isinstance(data, (tuple, list)) or len(data) != 2:
        raise ValueError(f"gradient_data for {what} must be (x, y) or a callable returning one, got {type(data).__name__}")
    return data[0], data[1]


def _loss_of(model: Any, loss: Callable[[Any, Any], Any] | None, what: str) -> Callable[[Any, Any, Any], Any]:
    if loss is None and getattr(model, "compiled_loss", None) is None and getattr(model, "loss", None) is None:
        raise ValueError(f"{what} needs loss=... or a compiled model (model.compile(loss=...))")
    if loss is not None:
        return lambda x, y, y_pred: loss(y, y_pred)
    return lambda x, y, y_pred: model.compute_loss(x=x, y=y, y_pred=y_pred, training=False)


def compute_gradients(model: Any, x: Any, y: Any, loss: Any = None) -> dict[str, np.ndarray]:
    """Gradients of the loss on one batch, by mask-target key, as dense views.

    Args:
        model: The model.
        x, y: One batch.
        loss: ``loss(y_true, y_pred) -> scalar``; default the compiled loss
            (``model.compute_loss``).

    Returns:
        ``{"layer/weight": gradient}`` for every prunable weight.
    """
    import tensorflow as tf

    value_of = _loss_of(model, loss, "compute_gradients")
    targets = mask_targets(model)
    variables = [t.variable for t in targets]
    with tf.GradientTape() as tape:
        value = value_of(x, y, model(x, training=False))
    grads = tape.gradient(value, variables)
    out = {}
    for t, g in zip(targets, grads):
        g = np.zeros(tuple(t.variable.shape), t.weight.dtype) if g is None else np.asarray(tf.convert_to_tensor(g))
        out[t.key] = t.to_dense(g)
    return out


def dense_gradients(model: Any, x: Any, y: Any, loss: Any = None) -> dict[str, np.ndarray]:
    """Dense gradients of every prunable weight (w.r.t. ``weight * mask``): RigL's grow score.

    Each target's :meth:`~prune.core.targets.MaskTarget.dense_pass` makes its layer
    compute with the dense weight for this one pass: masked layers set their
    masks to ones (pruned weights are stored as +0.0, so the forward pass is
    bitwise the masked one, and each stored weight's gradient is the masked
    weight's gradient, as rigl's ``compute_gradients(loss,
    var_list=masked_weights)``); a ``SparseDense`` computes with a dense weight
    scattered from its values, whose gradient is ``x^T . dy``. Everything is
    restored afterwards; no dense weight is kept.

    Args:
        model: The model.
        x, y: One batch.
        loss: ``loss(y_true, y_pred) -> scalar``; default the compiled loss.

    Returns:
        ``{"layer/weight": gradient}`` as dense arrays.
    """
    import tensorflow as tf

    value_of = _loss_of(model, loss, "dense_gradients")
    targets = require_targets(model, "dense_gradients", unstructured=False)
    with contextlib.ExitStack() as stack:
        with tf.GradientTape() as tape:
            sources = [stack.enter_context(t.dense_pass()) for t in targets]
            for s in sources:
                if isinstance(s, tf.Tensor):  # a tensor made for the pass; trainable variables are watched already
                    tape.watch(s)
            value = value_of(x, y, model(x, training=False))
        grads = tape.gradient(value, sources)
    return {
        t.key: np.zeros(t.shape) if g is None else np.asarray(tf.convert_to_tensor(g)) for t, g in zip(targets, grads)
    }
