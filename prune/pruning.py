"""Schedule-driven mask updates over a model's prunable layers.

This is the glue between the pure pieces (schedule, criterion, top-k in
:mod:`prune.masks`) and the variables: read weights, score, select, then write
mask, weight and optimizer slots (:func:`prune.layers.masked.apply_mask`).
It runs eagerly, outside the compiled train step, once per scheduled update.
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from prune import masks as _masks
from prune.layers.masked import PrunableLayer, apply_mask

__all__ = ["iter_layers", "prunable_layers", "stepped_layers", "update_masks", "get_step"]


def iter_layers(model: Any) -> Iterator[Any]:
    """Every layer inside ``model`` (depth first, each once), ``model`` included."""
    seen: set[int] = set()
    stack = [model]
    while stack:
        layer = stack.pop()
        if id(layer) in seen:
            continue
        seen.add(id(layer))
        yield layer
        children = getattr(layer, "_layers", None)
        if children is None:
            children = getattr(layer, "layers", [])
        stack.extend(reversed(list(children)))


def prunable_layers(model: Any) -> list[PrunableLayer]:
    """The :class:`PrunableLayer` instances in ``model`` (or ``[model]`` if it is one)."""
    return [layer for layer in iter_layers(model) if isinstance(layer, PrunableLayer)]


def stepped_layers(model: Any) -> list[Any]:
    """Layers that keep a ``pruning_step`` counter: masked layers and ``SparseDense``."""
    return [layer for layer in iter_layers(model) if getattr(type(layer), "keeps_pruning_step", False)]


def get_step(model: Any) -> int:
    """The pruning step counter (number of training steps taken so far)."""
    layers = [layer for layer in stepped_layers(model) if layer.built]
    return int(layers[0].pruning_step.numpy()) if layers else 0


def _score(layer: PrunableLayer, name: str, weight: Any) -> np.ndarray:
    fn = _masks.get_criterion(layer.criterion)
    return fn(np.asarray(weight.numpy()), layer.seed, f"{layer.name}/{name}")


def update_masks(model: Any, step: int, optimizer: Any = None) -> list[str]:
    """Update the masks whose schedule fires at ``step``.

    Layers with ``scope="layer"`` are pruned each on its own; all layers with
    ``scope="global"`` are pruned together with one threshold, which requires
    them to share one schedule.

    Args:
        model: A model or layer containing prunable layers.
        step: The training step about to run.
        optimizer: Its slots for newly pruned entries are zeroed.

    Returns:
        Names (``layer/weight``) of the weights whose masks were recomputed.
    """
    layers = [layer for layer in prunable_layers(model) if layer.built and layer.pruning_schedule is not None]
    updated: list[str] = []
    global_group = [layer for layer in layers if layer.scope == "global"]
    for layer in layers:
        if layer.scope != "layer":
            continue
        if not layer.pruning_schedule.should_update(step):
            continue
        sparsity = layer.pruning_schedule(step)[1]
        for name in layer.prunable_weight_names:
            weight, mask_var = layer.weight_and_mask(name)
            keep = _masks.topk_mask(_score(layer, name, weight), sparsity, mask_var.numpy() != 0)
            apply_mask(weight, mask_var, keep, optimizer)
            updated.append(f"{layer.name}/{name}")
    if global_group:
        schedules = {repr(layer.pruning_schedule) for layer in global_group}
        if len(schedules) > 1:
            raise ValueError(f"layers with scope='global' must share one pruning_schedule, got {sorted(schedules)}")
        if global_group[0].pruning_schedule.should_update(step):
            sparsity = global_group[0].pruning_schedule(step)[1]
            entries = {}
            for layer in global_group:
                for name in layer.prunable_weight_names:
                    weight, mask_var = layer.weight_and_mask(name)
                    entries[f"{layer.name}/{name}"] = (weight, mask_var, _score(layer, name, weight))
            keep = _masks.global_masks(
                {k: v[2] for k, v in entries.items()}, sparsity, {k: v[1].numpy() != 0 for k, v in entries.items()}
            )
            for key, (weight, mask_var, _) in entries.items():
                apply_mask(weight, mask_var, keep[key], optimizer)
                updated.append(key)
    return updated
