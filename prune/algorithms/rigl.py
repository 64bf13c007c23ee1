"""RigL: magnitude drop, growth where the dense gradient is largest, a cosine-decayed drop fraction.

Reference: Evci, Gale, Menick, Castro and Elsen, "Rigging the Lottery: Making All Tickets Winners", ICML 2020;
google-research/rigl (``rigl/sparse_optimizers.py``, ``rigl/rigl_tf2/mask_updaters.py``).
"""

from __future__ import annotations

from prune.algorithms.set import SET
from prune.algorithms.base import register_algorithm

__all__ = ["RigL"]


@register_algorithm
class RigL(SET):
    """RigL (Evci et al. 2020): SET's drop; grow where ``|dense gradient|`` is largest (the ``"gradient"``
    criterion); the drop fraction decays by a cosine to 0 at ``end_step`` (:func:`prune.algorithms.cosine_drop_fraction`).

    The dense gradient is the gradient with respect to ``weight * mask``, pruned entries included
    (:func:`prune.training.gradients.dense_gradients`). Arguments as :class:`prune.algorithms.SparseTraining`.
    """

    name = "rigl"
    needs_gradient = True
    default_decay = "cosine"
    grow_criterion = "gradient"
    paper = {"end": 0.75}  # "we stop updating the masks at 75% of training" (Evci et al. 2020, section 4)
