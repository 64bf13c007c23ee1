"""IMP's level step: prune the surviving weights by magnitude to the level's sparsity (the masks only shrink).

Reference: Frankle and Carbin, "The Lottery Ticket Hypothesis: Finding Sparse, Trainable Neural Networks",
ICLR 2019 (layerwise pruning for fully connected networks, global for deeper ones); the loop around it is
:mod:`prune.training.lottery` and :func:`prune.training.imp.train_levels`.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from prune.algorithms.base import MaskAlgorithm, Planned, Update, _fraction, register_algorithm
from prune.core import distributions as _dist
from prune.core.patterns import Unstructured

__all__ = ["LotteryLevel"]


@register_algorithm
class LotteryLevel(MaskAlgorithm):
    """One level of iterative magnitude pruning: keep-masks at ``sparsity`` by ``|w|``, spread by ``scope``.

    With ``scope="layer"`` each weight of ``n`` entries gets exactly ``round(sparsity * n)`` zeros; with
    ``scope="global"`` one magnitude threshold over all weights gives ``round(sparsity * N)`` zeros in total
    (any registered distribution works, ERK too). Pruned entries stay pruned; ties prune the lower flat index
    (the earlier weight, globally) first. Only the ``Unstructured()`` pattern takes part.

    Args:
        sparsity: The level's sparsity, in [0, 1) (:func:`prune.training.lottery.sparsity_path`).
        scope: A registered distribution name (:func:`prune.core.distributions.get_distribution`).

    Raises:
        ValueError: a bad argument, naming it and its value.
    """

    name = "imp"
    kind = "lottery"

    def __init__(self, sparsity: float, scope: str = "layer") -> None:
        self.sparsity = _fraction("sparsity", sparsity, 0.0, 1.0, False, "[0, 1)")
        if self.sparsity >= 1.0:
            raise ValueError(f"sparsity must be a number in [0, 1), got {sparsity!r}")
        self.distribution = _dist.get_distribution(scope)
        self.scope = scope

    def select(self, updates: Sequence[Update], step: int = 0) -> list[Planned]:
        """The level's keep-masks (``step`` is unused: a level happens once); ``n`` is the entries newly pruned."""
        scores = {u.key: self.criterion_scores("magnitude", u) for u in updates}
        keep = self.distribution.select(scores, self.sparsity, {u.key: u.keep for u in updates}, Unstructured())
        return [Planned(keep[u.key], int((u.keep & ~keep[u.key]).sum())) for u in updates]
