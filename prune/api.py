"""The functional API: ``prune_low_magnitude``, ``strip_pruning``, ``is_pruned``.

Names follow tfmot so that porting is a change of import::

    import prune as sparsity   # was: tfmot.sparsity.keras
    model = sparsity.prune_low_magnitude(model, pruning_schedule=sparsity.PolynomialDecay(0.0, 0.9, 0, 1000))
    model.fit(x, y, callbacks=[sparsity.UpdatePruningStep()])
    final = sparsity.strip_pruning(model)

Sequential and functional models are cloned (as tfmot does), with every
registered layer replaced by its masked twin carrying the same weights.
Subclassed models cannot be re-traced, so their prunable attribute layers are
replaced in place on the same model object, built and with weights copied.
"""

from __future__ import annotations

from typing import Any, Callable

import keras
import numpy as np

from prune._internals import has_sublayers, layer_tracker
from prune import masks as _masks
from prune.layers.masked import PrunableLayer, PruneLowMagnitude, check_pruning_args, is_custom_prunable, is_masked_layer
from prune.patterns import pattern_from_args
from prune.pruning import iter_layers, prunable_layers
from prune.registry import masked_class_for, unsupported
from prune.schedules import ConstantSparsity, as_schedule

__all__ = ["prune_low_magnitude", "strip_pruning", "is_pruned", "unsupported_layers"]


def _copy_built(old: Any, new: Any) -> Any:
    """Build ``new`` like ``old`` and copy every variable ``old`` has, by name."""
    if not old.built:
        return new
    build_config = old.get_build_config()
    if build_config is None:
        raise ValueError(f"layer {old.name!r} is built but has no build config; cannot copy it")
    new.build_from_config(build_config)
    by_name = {v.name: v for v in new.weights}
    for v in old.weights:
        if v.name not in by_name:
            raise ValueError(f"cannot copy weight {v.name!r} of layer {old.name!r} into {type(new).__name__}")
        by_name[v.name].assign(v.value)
    return new


def _to_masked(layer: Any, params: dict[str, Any]) -> Any:
    cls = masked_class_for(layer)
    if cls is None:
        # tfmot's contract: a custom layer with get_prunable_weights() is wrapped.
        return PruneLowMagnitude.wrap(layer, params) if is_custom_prunable(layer) else layer
    config = layer.get_config()
    return _copy_built(layer, cls.from_config({**config, **params}))


def _to_plain(layer: Any) -> Any:
    if not is_masked_layer(layer):
        return layer
    if isinstance(layer, PruneLowMagnitude):
        return layer.strip()
    plain = layer.base_class.from_config(layer.plain_config(layer.get_config()))
    if not layer.built:
        return plain
    plain.build_from_config(layer.get_build_config())
    by_name = {v.name: v for v in plain.weights}
    for v in layer.weights:
        if v.name not in by_name:
            continue  # masks and the step counter have no place in the plain layer
        value = np.asarray(v.numpy())
        if v.name in layer.prunable_weight_names:  # +0.0 where pruned, never -0.0
            value = np.where(layer.weight_and_mask(v.name)[1].numpy() != 0, value, np.zeros_like(value))
        by_name[v.name].assign(value)
    return plain


def _is_graph_model(model: Any) -> bool:
    # Sequential and functional models (Functional is not public in Keras 3, so match it by name).
    return isinstance(model, keras.Sequential) or any(c.__name__ == "Functional" for c in type(model).__mro__)


def _convert(model: Any, fn: Callable[[Any], Any]) -> Any:
    """Apply ``fn`` to every layer: clone graph models, rebuild subclassed ones in place."""
    if isinstance(model, keras.layers.Layer) and not isinstance(model, keras.Model):
        return fn(model)
    if _is_graph_model(model):
        clone = keras.models.clone_model(model, clone_function=fn)
        return clone
    _replace_attributes(model, fn)
    return model


def _replace_attributes(parent: Any, fn: Callable[[Any], Any]) -> None:
    # Subclassed models: swap attribute layers, keeping Keras's tracking in step.
    # Keras locks a built layer's state; replace_tracked_value is its own way of
    # swapping one tracked layer for another.
    tracker = layer_tracker(parent)
    for attr, value in list(vars(parent).items()):
        if attr.startswith("_") or not isinstance(value, keras.layers.Layer):
            continue
        new = fn(value)
        if new is value:
            if isinstance(value, keras.Model) or has_sublayers(value):
                _replace_attributes(value, fn)
            continue
        if tracker is not None:
            locked = tracker.locked
            tracker.unlock()
            try:
                tracker.replace_tracked_value("layers", value, new)
                object.__setattr__(parent, attr, new)
            finally:
                if locked:
                    tracker.lock()
        else:
            setattr(parent, attr, new)
    for attr, value in list(vars(parent).items()):
        if attr.startswith("_") or not isinstance(value, (list, tuple)):
            continue
        if any(isinstance(v, keras.layers.Layer) for v in value):
            raise ValueError(
                f"attribute {attr!r} of {type(parent).__name__} holds a list of layers; prune layers in lists "
                "by wrapping them when you build the model: prune.prune_low_magnitude(keras.layers.Dense(...))"
            )


def prune_low_magnitude(
    to_prune: Any,
    pruning_schedule: Any = None,
    *,
    criterion: str = "magnitude",
    scope: str = "layer",
    seed: int = 0,
    pattern: Any = None,
    block_size: tuple[int, int] = (1, 1),
    block_pooling_type: str = "AVG",
    sparsity_m_by_n: tuple[int, int] | None = None,
) -> Any:
    """Give every prunable layer a mask and a schedule.

    Args:
        to_prune: A Keras layer, a Sequential or functional model (cloned), or
            a subclassed model (changed in place and returned).
        pruning_schedule: A :class:`prune.PruningSchedule`, a tfmot schedule, or
            any ``step -> (should_update, sparsity)`` callable. Defaults to
            tfmot's default, ``ConstantSparsity(0.5, begin_step=0)``.
        criterion: ``"magnitude"`` (default) or ``"random"``, or a registered name.
        scope: ``"layer"`` (default, a threshold per weight) or ``"global"``.
        seed: Seed for the random criterion.
        pattern: A :mod:`prune.patterns` value: ``prune.Unstructured()``
            (default), ``prune.Block((r, c), "AVG")``, ``prune.NByM(m, n)``,
            ``prune.Channel()``. Or, as in tfmot:
        block_size: ``(r, c)``: ``(1, 1)`` is unstructured, anything else is
            ``Block(block_size, block_pooling_type)`` (2-D weights only).
        block_pooling_type: ``"AVG"`` or ``"MAX"``, how a block's scores pool.
        sparsity_m_by_n: ``(m, n)``: ``m`` zeros in every ``n`` consecutive
            weights along the input dimension, i.e. ``NByM(m, n)``.

    Returns:
        The pruned layer or model. Unsupported layers stay dense; see
        :func:`unsupported_layers` and :func:`prune.sparsity_report`.

    Raises:
        ValueError: bad schedule, criterion, scope or seed, before anything is built.
    """
    schedule = as_schedule(ConstantSparsity(0.5, 0) if pruning_schedule is None else pruning_schedule)
    _masks.get_criterion(criterion)
    _masks.check_scope(scope)
    pattern = pattern_from_args(pattern, block_size, block_pooling_type, sparsity_m_by_n)
    check_pruning_args(pattern, criterion, scope, seed)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    if not isinstance(to_prune, keras.layers.Layer):
        raise ValueError(f"to_prune must be a Keras 3 layer or model, got {type(to_prune).__module__}.{type(to_prune).__name__}")
    if is_masked_layer(to_prune) or (isinstance(to_prune, keras.Model) and prunable_layers(to_prune)):
        raise ValueError(f"to_prune {to_prune.name!r} is already pruned; strip_pruning it first")
    params = {"pruning_schedule": schedule, "pattern": pattern, "criterion": criterion, "scope": scope, "seed": int(seed)}
    if not isinstance(to_prune, keras.Model) and masked_class_for(to_prune) is None and not is_custom_prunable(to_prune):
        raise ValueError(
            f"to_prune is a {type(to_prune).__name__}, which is not prunable; register it with prune.register_prunable"
        )
    return _convert(to_prune, lambda layer: _to_masked(layer, params))


def strip_pruning(model: Any) -> Any:
    """Replace masked layers by the plain Keras layers, with the zeros in place.

    The result has no masks, counters or ``prune`` classes and loads without
    custom objects.
    """
    return _convert(model, _to_plain)


def is_pruned(model: Any) -> bool:
    """Whether ``model`` (or layer) contains any masked layer."""
    return bool(prunable_layers(model))


def unsupported_layers(model: Any) -> list[str]:
    """Names of the layers with matrix-like weights that stay dense: no masked class is registered."""
    return [layer.name for layer, _ in unsupported(model)]
