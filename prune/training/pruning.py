"""The pruning engine: one mask-update path for every prunable thing.

**Protocol.** Every layer that answers the mask-target protocol
(:mod:`prune.core.targets`: ``mask_targets()``) and is a scheduled layer with a
schedule (:mod:`prune.layers.scheduled`: :func:`~prune.layers.scheduled.pruning_params_of`
gives its :class:`~prune.layers.scheduled.PruningParams`) takes part; the
scheduled layers are also the ones whose ``pruning_step`` counts the steps
(:func:`~prune.layers.scheduled.keeps_step`). Nothing else of a layer is read.
The engine pairs each :class:`prune.core.targets.MaskTarget` with the layer's
pruning parameters (schedule, pattern, criterion, scope, seed) in a
:class:`PruningEntry` and owns everything else::

    entries -> which schedules fire -> check (finite weights, gradients present)
            -> scores (criterion) -> keep-masks (pattern x distribution) -> install

so every criterion, pattern and distribution reaches every kind of layer, and
a masked model and a ``SparseDense`` model select the same masks. The
distributions (the layers' ``scope``) are the registry of
:mod:`prune.core.distributions`; the masks a schedule selects only shrink,
a rule that :meth:`prune.core.patterns.Pattern.select` and :func:`prune.core.masks.global_masks` keep
(pruned entries rank below every live one).

It runs eagerly, outside the compiled train step, once per scheduled update
(:class:`prune.UpdatePruningStep` calls :func:`update_masks` before a batch).
Every check runs before any variable changes.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from prune.core import distributions as _dist
from prune.core.notices import PruningWarning
from prune.core.scoring import ScoreContext, get_criterion
from prune.layers.optimizer_state import slots_for
from prune.core.patterns import Pattern
from prune.core import targets as _targets
from prune.layers.scheduled import keeps_step, pruning_params_of
from prune.core.targets import MaskTarget, mask_targets

__all__ = [
    "PruningEntry",
    "MaskUpdate",
    "prunable_layers",
    "prunable_entries",
    "stepped_layers",
    "update_masks",
    "get_step",
]


@dataclass
class PruningEntry:
    """One prunable weight under a schedule: its :class:`prune.core.targets.MaskTarget` and its layer's pruning parameters.

    Attributes:
        target: How to read and install its mask.
        schedule: ``step -> (should_update, sparsity)``.
        pattern: A :class:`prune.core.patterns.Pattern`.
        criterion: Registered criterion name.
        scope: Registered distribution name (:func:`prune.core.distributions.get_distribution`).
        seed: Seed given to the criterion.
    """

    target: MaskTarget
    schedule: Any
    pattern: Pattern
    criterion: str
    scope: str
    seed: int

    @property
    def key(self) -> str:
        """``"layer/weight"``, unique in the model."""
        return self.target.key

    @property
    def layer(self) -> Any:
        return self.target.layer

    @property
    def variable(self) -> Any:
        return self.target.variable

    @property
    def weight(self) -> np.ndarray:
        """Dense view of the weight's current values."""
        return self.target.weight

    @property
    def keep(self) -> np.ndarray:
        """Dense bool view of the current mask."""
        return self.target.keep

    def to_dense(self, array: np.ndarray) -> np.ndarray:
        """An array shaped like :attr:`variable` (a gradient, a slot) as the dense view."""
        return self.target.to_dense(array)

    def apply(self, keep: np.ndarray, optimizer: Any = None) -> bool:
        """Install ``keep``, which the engine selected as a subset of the current mask; returns ``retrace``."""
        return self.target.install(keep, optimizer)


class MaskUpdate(list):
    """The keys (``layer/weight``) whose masks were recomputed; ``retrace`` says
    whether a compiled train step traced before must be rebuilt (``SparseDense``
    replaced optimizer state)."""

    retrace: bool = False


def prunable_layers(model: Any) -> list[Any]:
    """The masked layers (:class:`prune.layers.PrunableLayer` with masks) in ``model``."""
    from prune.layers.masked import is_masked_layer

    return [layer for layer in _targets.iter_layers(model) if is_masked_layer(layer)]


def prunable_entries(model: Any) -> list[PruningEntry]:
    """A :class:`PruningEntry` for every mask target of the built scheduled layers in ``model`` that have a schedule."""
    entries = []
    for t in mask_targets(model):
        params = pruning_params_of(t.layer)
        if params is not None and params.pruning_schedule is not None:
            entries.append(
                PruningEntry(t, params.pruning_schedule, params.pattern, params.criterion, params.scope, params.seed)
            )
    return entries


def stepped_layers(model: Any) -> list[Any]:
    """Layers that keep a ``pruning_step`` counter: the scheduled layers (masked layers and ``SparseDense``)."""
    return [layer for layer in _targets.iter_layers(model) if keeps_step(layer)]


def get_step(model: Any) -> int:
    """The pruning step counter (number of training steps taken so far)."""
    layers = [layer for layer in stepped_layers(model) if layer.built]
    return int(layers[0].pruning_step.numpy()) if layers else 0


def _check_finite(entry: PruningEntry) -> None:
    if not np.all(np.isfinite(entry.weight)):
        bad = int((~np.isfinite(entry.weight)).sum())
        raise ValueError(
            f"weight {entry.key!r} (layer {entry.layer.name!r}) has {bad} NaN or infinite entries; "
            "no mask was changed"
        )


def _scores(entry: PruningEntry, step: int, gradients: Mapping[str, Any] | None, optimizer: Any) -> np.ndarray:
    crit = get_criterion(entry.criterion)
    grad = None
    if gradients is not None and entry.key in gradients:
        grad = np.asarray(gradients[entry.key])
        if grad.shape != entry.weight.shape:
            raise ValueError(f"gradients[{entry.key!r}] has shape {grad.shape}, expected {entry.weight.shape}")
    slots = {}
    if "slots" in crit.needs:
        slots = {s.path: entry.to_dense(np.asarray(s.numpy())) for s in slots_for(optimizer, entry.variable)}
    ctx = ScoreContext(weight=entry.weight, gradient=grad, slots=slots, step=int(step), seed=entry.seed, key=entry.key)
    scores = crit(ctx)
    if not np.all(np.isfinite(scores)):
        raise ValueError(f"criterion {entry.criterion!r} gave NaN or infinite scores for {entry.key!r}; no mask was changed")
    return scores


def _group_plan(group: list[PruningEntry], scope: str) -> tuple[Any, Pattern]:
    schedules = {repr(e.schedule) for e in group}
    if len(schedules) > 1:
        raise ValueError(f"weights with scope={scope!r} must share one pruning_schedule, got {sorted(schedules)}")
    patterns = {repr(e.pattern) for e in group}
    if len(patterns) > 1:
        raise ValueError(f"weights with scope={scope!r} must share one pattern, got {sorted(patterns)}")
    return group[0].schedule, group[0].pattern


def _warn_emptied(entry: PruningEntry, sparsity: float) -> None:
    warnings.warn(
        f"sparsity {sparsity:g} prunes every entry of {entry.key!r} ({entry.weight.size} entries; exact counts prune "
        f"round(sparsity * units) of them). tfmot keeps at least one: for its rule give the pattern keep_one=True, "
        "e.g. pattern=prune.Unstructured(keep_one=True)",
        PruningWarning,
        stacklevel=3,
    )


def update_masks(
    model: Any, step: int, optimizer: Any = None, gradients: Mapping[str, Any] | None = None
) -> MaskUpdate:
    """Update the masks whose schedule fires at ``step``, for every prunable layer kind.

    Weights with ``scope="layer"`` are pruned each on its own; all weights
    with ``scope="global"`` together with one threshold, and all with
    ``scope="erk"`` together with Erdős–Rényi-Kernel sparsities; each such
    group must share one schedule and one pattern.

    Args:
        model: A model or layer containing prunable layers.
        step: The training step about to run.
        optimizer: Its slots for newly pruned entries are zeroed (or shrunk).
        gradients: ``{"layer/weight": gradient}`` (dense views), e.g. from
            :func:`prune.compute_gradients`, for criteria that need gradients.

    Returns:
        The keys updated, a list with a ``retrace`` attribute.

    Raises:
        ValueError: a NaN or infinite weight or score, a missing gradient, or
            groups that do not share a schedule or pattern; raised before any
            variable changes.
    """
    entries = prunable_entries(model)
    firing: list[tuple[list[PruningEntry], float, _dist.Distribution, Pattern]] = []
    grouped: dict[str, list[PruningEntry]] = {}
    for e in entries:
        dist = _dist.get_distribution(e.scope)
        if dist.grouped:
            grouped.setdefault(dist.name, []).append(e)
        elif e.schedule.should_update(step):
            firing.append(([e], float(e.schedule(step)[1]), dist, e.pattern))
    for name, group in grouped.items():
        schedule, pattern = _group_plan(group, name)
        if schedule.should_update(step):
            firing.append((group, float(schedule(step)[1]), _dist.get_distribution(name), pattern))
    # Everything that can fail runs before anything is written.
    for group, _, _, _ in firing:
        for e in group:
            _check_finite(e)
    plans = []
    for group, sparsity, dist, pattern in firing:
        scores = {e.key: _scores(e, step, gradients, optimizer) for e in group}
        previous = {e.key: e.keep for e in group}
        if dist.configured:
            sparsity = _dist.configured_target(sparsity)  # ERK: 0.9, not the schedule's float32 0.8999999762
        keep = dist.select(scores, sparsity, previous, pattern)
        plans.extend((e, keep[e.key]) for e in group)
        for e in group:
            if e.keep.any() and not keep[e.key].any():
                _warn_emptied(e, sparsity)
    result = MaskUpdate()
    for e, keep in plans:
        result.retrace |= bool(e.apply(keep, optimizer))
        result.append(e.key)
    return result
