"""MEST: drop by ``|w| + lambda * |g|``, grow at random.

Reference: Yuan, Ma, Zhang, Xu, Luo, Xu, Tian, Wang, Lin and Lin (et al.), "MEST: Accurate and Fast
Memory-Economic Sparse Training Framework on the Edge", NeurIPS 2021: the Elastic Mutation's removal score
``|W| + lambda |dL/dW|`` keeps weights that are small but still moving, and growth is random.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from prune.algorithms.base import Update, _fraction, register_algorithm
from prune.algorithms.set import SET

__all__ = ["MEST"]


@register_algorithm
class MEST(SET):
    """MEST's Elastic Mutation (Yuan et al., NeurIPS 2021): SET with the drop score ``|w| + lam * |g|``.

    ``g`` is the gradient of the loss with respect to the weight at the update (``gradient_data`` of
    :class:`prune.DynamicSparsity`); growth is random, as SET's. Not reproduced from the paper: its soft memory
    bound (``EM&S``: growing before dropping) and its data-efficient schedule. ``lam`` defaults to 1.0, which
    is this library's choice, not a value taken from the paper's code: tune it per model, since ``|w|`` and
    ``|g|`` have different scales.

    Args:
        lam: λ >= 0, the weight of ``|g|`` in the drop score (0: SET).
        **base: As :class:`prune.algorithms.SparseTraining`.
    """

    name = "mest"
    needs_gradient = True
    own_params = {"lam": 1.0}

    def __init__(self, lam: float = 1.0, **base: Any) -> None:
        super().__init__(**base)
        self.lam = _fraction("lam", lam, 0.0, float("inf"), False, "[0, inf)")

    def drop_scores(self, u: Update) -> np.ndarray:
        """``|w| + lam * |g|``: lower drops first."""
        return np.abs(np.asarray(u.weight, np.float64)) + self.lam * np.abs(np.asarray(u.gradient, np.float64))
