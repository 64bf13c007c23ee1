"""Wanda: prune by weight magnitude times input activation norm, within each output, with no weight update.

Reference: Sun, Liu, Bair and Kolter, "A Simple and Effective Pruning Approach for Large Language Models"
(Wanda), ICLR 2024, eq. (1) and Sec. 3: the score of weight ``W_ij`` (output ``i``, input ``j``) is
``|W_ij| * ||X_j||_2`` over the calibration tokens, compared within each output (the authors' ``prune_wanda``
in ``lib/prune.py``: ``|W| * sqrt(scaler_row)``, sorted along each row; for N:M, the ``n - m`` largest of
every ``n`` consecutive inputs kept). Their running mean over sequences scales every score of a layer alike,
so the plain sum of squares here gives the same masks.
"""

from __future__ import annotations

import numpy as np

from prune.algorithms.base import Update, register_algorithm
from prune.algorithms.oneshot import OneShotPruning

__all__ = ["Wanda"]


@register_algorithm
class Wanda(OneShotPruning):
    """Wanda (Sun et al. 2024): the entries of lowest ``|W_ij| * ||X_j||_2`` go, compared within each output.

    ``scope="row"`` (the default) is the paper's per-output comparison; ``"layer"`` ranks the whole layer at
    once (the paper's ablation, Table 7). See :class:`~prune.algorithms.oneshot.OneShotPruning` for the arguments.
    """

    name = "wanda"
    statistics = "norms"
    default_scope = "row"

    def scores(self, u: Update) -> np.ndarray:
        """``|W_ij| * ||X_j||_2`` on the ``[d_in, d_out]`` view (input ``j`` is the row)."""
        return np.abs(np.asarray(u.weight, np.float64)) * np.sqrt(u.inputs.sq_norms)[:, None]
