"""The pruning engine: one mask-update path for every prunable thing.

**Protocol.** Every layer that answers the mask-target protocol
(:mod:`prune.core.targets`: ``mask_targets()``) and is a scheduled layer with a
schedule (:mod:`prune.layers.scheduled`: :func:`~prune.layers.scheduled.pruning_params_of`
gives its :class:`~prune.layers.scheduled.PruningParams`) takes part; the
scheduled layers are also the ones whose ``pruning_step`` counts the steps
(:func:`~prune.layers.scheduled.keeps_step`). Nothing else of a layer is read.
The engine pairs each :class:`prune.core.targets.MaskTarget` with the layer's
pruning parameters (schedule, pattern, criterion, scope, seed) in a
:class:`PruningEntry`; the selection is an algorithm like every other mask
change, :class:`prune.algorithms.GradualPruning` (:mod:`prune.algorithms.base`)::

    entries -> due (which schedules fire; no weight read) -> read weights, gradients, slots
            -> plan: check (finite weights) -> scores (criterion) -> keep-masks (pattern x distribution)
            -> install (the mask-target protocol)

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

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from prune.algorithms import GradualPruning, Update
from prune.core.scoring import get_criterion
from prune.layers.optimizer_state import slots_for
from prune.core import targets as _targets
from prune.layers.scheduled import PruningParams, keeps_step, pruning_params_of
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
        params: Its layer's :class:`~prune.layers.scheduled.PruningParams` (schedule, pattern, criterion,
            scope, seed), with a schedule.
    """

    target: MaskTarget
    params: PruningParams

    schedule = property(lambda self: self.params.pruning_schedule, doc="``step -> (should_update, sparsity)``.")
    pattern = property(lambda self: self.params.pattern, doc="A :class:`prune.core.patterns.Pattern`.")
    criterion = property(lambda self: self.params.criterion, doc="Registered criterion name.")
    scope = property(lambda self: self.params.scope, doc="Registered distribution name.")
    seed = property(lambda self: self.params.seed, doc="Seed given to the criterion.")

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
            entries.append(PruningEntry(t, params))
    return entries


def stepped_layers(model: Any) -> list[Any]:
    """Layers that keep a ``pruning_step`` counter: the scheduled layers (masked layers and ``SparseDense``)."""
    return [layer for layer in _targets.iter_layers(model) if keeps_step(layer)]


def get_step(model: Any) -> int:
    """The pruning step counter (number of training steps taken so far)."""
    layers = [layer for layer in stepped_layers(model) if layer.built]
    return int(layers[0].pruning_step.numpy()) if layers else 0


def _update(entry: PruningEntry, step: int, gradients: Mapping[str, Any] | None, optimizer: Any) -> Update:
    """What :class:`prune.algorithms.GradualPruning` sees of ``entry``: its weight, mask, settings, and the
    gradient and optimizer slots its criterion needs."""
    weight = entry.weight  # one read: a SparseDense weight is densified on each
    grad = None
    if gradients is not None and entry.key in gradients:
        grad = np.asarray(gradients[entry.key])
        if grad.shape != weight.shape:
            raise ValueError(f"gradients[{entry.key!r}] has shape {grad.shape}, expected {weight.shape}")
    slots = {}
    if "slots" in get_criterion(entry.criterion).needs:
        slots = {s.path: entry.to_dense(np.asarray(s.numpy())) for s in slots_for(optimizer, entry.variable)}
    return Update(entry.key, weight, entry.keep, grad, params=entry.params, slots=slots, layer=entry.layer.name,
                  pattern_shape=entry.target.pattern_shape)


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
    algorithm = GradualPruning()
    due = algorithm.due(prunable_entries(model), step)  # no weight read yet
    updates = [_update(e, step, gradients, optimizer) for e in due]
    plans = algorithm.plan(updates, step)  # everything that can fail runs before anything is written
    result = MaskUpdate()
    for e, planned in zip(due, plans):
        result.retrace |= bool(e.apply(planned.keep, optimizer))
        result.append(e.key)
    return result
