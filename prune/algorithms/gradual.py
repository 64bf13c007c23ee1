"""Gradual (scheduled) pruning: each layer's schedule, pattern, criterion and distribution, as tfmot runs them.

Reference: Zhu and Gupta, "To prune, or not to prune: exploring the efficacy of pruning for model compression",
ICLR 2018 workshop (the polynomial schedule); tfmot's ``prune_low_magnitude`` (``pruning_impl.Pruning``), whose
masks the engine reproduces bit for bit (``tests/prune/training/test_tfmot_parity.py``).
"""

from __future__ import annotations

import warnings
from typing import Any, Sequence

import numpy as np

from prune.algorithms.base import MaskAlgorithm, Planned, Update, register_algorithm
from prune.core import distributions as _dist
from prune.core.notices import PruningWarning

__all__ = ["GradualPruning"]


def _group_plan(group: Sequence[Any], scope: str) -> tuple[Any, Any]:
    schedules = {repr(e.params.pruning_schedule) for e in group}
    if len(schedules) > 1:
        raise ValueError(f"weights with scope={scope!r} must share one pruning_schedule, got {sorted(schedules)}")
    patterns = {repr(e.params.pattern) for e in group}
    if len(patterns) > 1:
        raise ValueError(f"weights with scope={scope!r} must share one pattern, got {sorted(patterns)}")
    return group[0].params.pruning_schedule, group[0].params.pattern


@register_algorithm
class GradualPruning(MaskAlgorithm):
    """Prune every weight whose schedule fires to the schedule's sparsity, by its criterion, pattern and scope.

    Each weight carries its layer's settings in :attr:`Update.params` (a
    :class:`~prune.layers.scheduled.PruningParams`: ``pruning_schedule``, ``pattern``, ``criterion``, ``scope``,
    ``seed``). Weights with ``scope="layer"`` are pruned each on its own; all weights of a grouped distribution
    (``"global"``, ``"erk"``) together, and such a group must share one schedule and one pattern. The masks only
    shrink: :meth:`prune.core.patterns.Pattern.select` ranks pruned entries below every live one.

    :func:`prune.update_masks` runs it: :meth:`due` picks the weights whose schedule fires without reading a
    weight, the engine reads those (with their gradients and optimizer slots where the criterion needs them),
    and installs what :meth:`plan` returns.
    """

    name = "gradual"
    kind = "pruning"

    def _firing(self, items: Sequence[Any], step: int) -> list[tuple[list[Any], float, _dist.Distribution, Any]]:
        """``(weights, sparsity, distribution, pattern)`` for every group whose schedule fires at ``step``."""
        firing: list[tuple[list[Any], float, _dist.Distribution, Any]] = []
        grouped: dict[str, list[Any]] = {}
        for e in items:
            dist = _dist.get_distribution(e.params.scope)
            if dist.grouped:
                grouped.setdefault(dist.name, []).append(e)
            elif e.params.pruning_schedule.should_update(step):
                firing.append(([e], float(e.params.pruning_schedule(step)[1]), dist, e.params.pattern))
        for name, group in grouped.items():
            schedule, pattern = _group_plan(group, name)
            if schedule.should_update(step):
                firing.append((group, float(schedule(step)[1]), _dist.get_distribution(name), pattern))
        return firing

    def due(self, items: Sequence[Any], step: int) -> list[Any]:
        """The weights whose schedule fires at ``step`` (a grouped distribution fires as a whole); reads no weight.

        Raises:
            ValueError: a group of a grouped distribution that does not share one schedule and one pattern.
        """
        return [e for group, _, _, _ in self._firing(items, step) for e in group]

    def select(self, updates: Sequence[Update], step: int) -> list[Planned]:
        """Each weight's keep-mask at its schedule's sparsity; ``n`` is the entries newly pruned."""
        keep: dict[str, np.ndarray] = {}
        for group, sparsity, dist, pattern in self._firing(updates, step):
            scores = {u.key: self.criterion_scores(u.params.criterion, u, seed=u.params.seed, step=step) for u in group}
            if dist.configured:
                sparsity = _dist.configured_target(sparsity)  # ERK: 0.9, not the schedule's float32 0.8999999762
            seen = {u.key: u.pattern_shape or u.keep.shape for u in group}  # the shapes the pattern selects on
            chosen = dist.select({k: np.reshape(v, seen[k]) for k, v in scores.items()}, sparsity,
                                 {u.key: np.reshape(u.keep, seen[u.key]) for u in group}, pattern)
            keep.update({u.key: np.reshape(chosen[u.key], u.keep.shape) for u in group})
            for u in group:
                if u.keep.any() and not keep[u.key].any():
                    warnings.warn(
                        f"sparsity {sparsity:g} prunes every entry of {u.key!r} ({u.weight.size} entries; exact "
                        "counts prune round(sparsity * units) of them). tfmot keeps at least one: for its rule give "
                        "the pattern keep_one=True, e.g. pattern=prune.Unstructured(keep_one=True)",
                        PruningWarning,
                        stacklevel=5,
                    )
        missing = [u.key for u in updates if u.key not in keep]
        if missing:
            raise ValueError(f"no schedule fires at step {step} for {missing}; pass only the weights due() returns")
        return [Planned(keep[u.key], int((u.keep & ~keep[u.key]).sum())) for u in updates]
