"""GraNet: gradual magnitude pruning to the target, with zero-cost neuroregeneration at every update.

Reference: Liu, Chen, Chen, Atashgahi, Yin, Kou, Shen, Pechenizkiy, Wang and Mocanu, "Sparse Training via
Boosting Pruning Plasticity with Neuroregeneration", NeurIPS 2021; VITA-Group/GraNet
(``CIFAR/sparselearning/core.py``: ``Masking.pruning`` and ``truncate_weights``).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from prune.core import distributions as _dist
from prune.algorithms.base import Update, _fraction, _positive_int, register_algorithm
from prune.algorithms.rigl import RigL
from prune.core.patterns import prune_lowest

__all__ = ["GraNet"]

SCOPES = ("global", "layer")
"""How the gradual pruning spreads the sparsity: over all weights by one magnitude threshold (GraNet), or each
weight at the scheduled sparsity (the paper's ``GraNet_uniform``)."""


@register_algorithm
class GraNet(RigL):
    """GraNet (Liu et al., NeurIPS 2021): at each update, prune by magnitude to the sparsity of a cubic schedule
    (Zhu and Gupta's, from ``initial_sparsity`` to ``final_sparsity`` between ``prune_begin_step`` and
    ``prune_end_step``), then drop ``ceil(fraction * live)`` more live entries by magnitude and regrow as many
    where ``|dense gradient|`` is largest (RigL's growth), the fraction decaying by a cosine to 0 at ``end_step``.

    As in the authors' code: the schedule's sparsity at update ``k = step // update_every`` is
    ``s_i + (s_f - s_i) * (1 - (1 - (k - k_0) / (k_f - k_0))^3)``; the regeneration drops ``ceil`` of the
    fraction (their ``magnitude_death``), and runs at every update, also after the pruning ends.
    Differences: the drop fraction decays to 0 (theirs to 0.005, ``CosineDecay(eta_min=0.005)``); the
    pruning only removes live entries (masks shrink) and ties break by index; it starts from
    :func:`prune.sparse_init`'s random mask at ``initial_sparsity`` (theirs: ERK or dense).

    Args:
        final_sparsity: The sparsity the schedule reaches, in [0, 1).
        initial_sparsity: The sparsity at the start (:meth:`start_sparsity`), in [0, final_sparsity]:
            0 is dense-to-sparse, the paper's 0.5 sparse-to-sparse.
        prune_begin_step: The first step of the schedule (default 0).
        prune_end_step: The step where it reaches ``final_sparsity``; default 110/160 of ``end_step`` (the
            authors' CIFAR setting: pruning ends at epoch 110 of 160, the regeneration runs to the end).
        scope: ``"global"`` (default, GraNet) or ``"layer"`` (``GraNet_uniform``).
        drop_fraction: The regeneration's fraction at step 0 (default 0.5, the authors' ``--prune-rate``).
        **base: As :class:`prune.algorithms.SparseTraining` (``decay`` defaults to ``"cosine"``, which needs ``end_step``).
    """

    name = "granet"
    keeps_live = False
    default_decay = "cosine"
    paper = {"drop_fraction": 0.5}  # the authors' --prune-rate
    own_params = {"initial_sparsity": 0.0, "scope": "global"}

    def __init__(
        self,
        final_sparsity: float = 0.9,
        initial_sparsity: float = 0.0,
        prune_begin_step: int = 0,
        prune_end_step: int | None = None,
        scope: str = "global",
        drop_fraction: float = 0.5,
        **base: Any,
    ) -> None:
        super().__init__(drop_fraction=drop_fraction, **base)
        self.final_sparsity = _fraction("final_sparsity", final_sparsity, 0.0, 1.0, False, "[0, 1)")
        if self.final_sparsity >= 1.0:
            raise ValueError(f"final_sparsity must be a number in [0, 1), got {final_sparsity!r}")
        self.initial_sparsity = _fraction("initial_sparsity", initial_sparsity, 0.0, self.final_sparsity, False,
                                          f"[0, final_sparsity={self.final_sparsity:g}]")
        if isinstance(prune_begin_step, bool) or not isinstance(prune_begin_step, (int, np.integer)) or prune_begin_step < 0:
            raise ValueError(f"prune_begin_step must be a non-negative integer, got {prune_begin_step!r}")
        self.prune_begin_step = int(prune_begin_step)
        end = (None if self.end_step is None else max(1, round(self.end_step * 110 / 160))) if prune_end_step is None \
            else _positive_int("prune_end_step", prune_end_step)
        if end is None:
            raise ValueError("GraNet needs prune_end_step (or end_step): the step where the sparsity reaches final_sparsity")
        if end <= self.prune_begin_step:
            raise ValueError(f"prune_end_step must be after prune_begin_step={self.prune_begin_step}, got {end}")
        self.prune_end_step = int(end)
        if scope not in SCOPES:
            raise ValueError(f"scope must be one of {list(SCOPES)}, got {scope!r}")
        self.scope = scope

    @classmethod
    def for_run(cls, sparsity: float, **settings: Any) -> "GraNet":
        """GraNet for a run whose final sparsity is ``sparsity``: its schedule's ``final_sparsity``."""
        return cls(final_sparsity=sparsity, **settings)

    def start_sparsity(self, target: float) -> float:
        """``initial_sparsity``: the schedule starts there and reaches ``final_sparsity`` (the run's target)."""
        return self.initial_sparsity

    def should_update(self, step: int) -> bool:
        """Every ``update_every`` steps after 0 (the pruning needs no ``end_step``; the regeneration ends there)."""
        return step > 0 and step % self.update_every == 0

    def fraction_at(self, step: int) -> float:
        """The regeneration's drop fraction: 0 from ``end_step`` on."""
        if self.end_step is not None and step >= self.end_step:
            return 0.0
        return super().fraction_at(step)

    def sparsity_at(self, step: int) -> float:
        """The schedule's sparsity at ``step``, by whole updates as the authors' code counts them."""
        k, k0, kf = (int(s) // self.update_every for s in (step, self.prune_begin_step, self.prune_end_step))
        if k <= k0:
            return self.initial_sparsity
        if k >= kf or kf == k0:
            return self.final_sparsity
        return self.initial_sparsity + (self.final_sparsity - self.initial_sparsity) * (1.0 - (1.0 - (k - k0) / (kf - k0)) ** 3)

    def live_counts(self, updates: Sequence[Update], step: int) -> dict[str, int]:
        """Live entries after the schedule's pruning: never more than now (the pruning only removes)."""
        sparsity = self.sparsity_at(step)
        now = {u.key: int(u.keep.sum()) for u in updates}
        if self.scope == "layer":
            zeros = _dist.uniform_zeros({u.key: u.weight.shape for u in updates}, sparsity)
            return {u.key: min(now[u.key], u.weight.size - zeros[u.key]) for u in updates}
        total = sum(u.weight.size for u in updates)
        keep_total = total - _dist.uniform_zeros({"all": (total,)}, sparsity)["all"]
        scores = np.concatenate([np.asarray(self.drop_scores(u), np.float64).reshape(-1) for u in updates])
        alive = np.concatenate([u.keep.reshape(-1).astype(bool) for u in updates])
        kept = prune_lowest(scores, alive, total - min(int(alive.sum()), keep_total))
        counts, start = {}, 0
        for u in updates:
            counts[u.key] = int(kept[start:start + u.weight.size].sum())
            start += u.weight.size
        return counts

    def drop_counts(self, u: Update, live: int, fraction: float) -> tuple[int, int | None]:
        """``ceil(fraction * live)`` (the authors' ``magnitude_death``), at most ``live``."""
        return min(live, math.ceil(fraction * live)), None
