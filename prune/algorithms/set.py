"""SET: magnitude drop, random growth, a constant drop fraction.

Reference: Mocanu, Mocanu, Stone, Nguyen, Gibescu and Liotta, "Scalable training of artificial neural networks
with adaptive sparse connectivity inspired by network science", Nature Communications 9, 2383, 2018.
"""

from __future__ import annotations

from prune.algorithms.base import SparseTraining, register_algorithm

__all__ = ["SET"]


@register_algorithm
class SET(SparseTraining):
    """SET (Mocanu et al. 2018): every ``update_every`` steps, drop the ``drop_fraction`` of live weights of
    smallest magnitude and regrow as many at random positions; the base's hooks, unchanged.

    ``drop="per_sign"`` is SET's own drop (``set_mlp.py``): the same fraction of the positive and of the
    negative weights. Arguments as :class:`prune.algorithms.SparseTraining`.
    """

    name = "set"
