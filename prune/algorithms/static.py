"""Static sparse training: the random mask installed at step 0 never moves.

Reference: Evci, Gale, Menick, Castro and Elsen, "Rigging the Lottery: Making All Tickets Winners", ICML 2020
("Static", the baseline of RigL's comparisons).
"""

from __future__ import annotations

from prune.algorithms.base import SparseTraining, register_algorithm

__all__ = ["Static"]


@register_algorithm
class Static(SparseTraining):
    """Static sparse training (Evci et al. 2020's baseline): :func:`prune.sparse_init`'s mask, never updated.

    It is registered so that a sweep names it as it names SET and RigL; :class:`prune.DynamicSparsity`, which
    runs only algorithms that move masks, refuses it.
    """

    name = "static"
    moves = False
