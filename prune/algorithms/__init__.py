"""Every algorithm that changes masks: one base (:class:`MaskAlgorithm`), one registry, one file per algorithm.

NumPy only. Adding an algorithm is one file with a subclass and one :func:`register_algorithm` line, then an
import here. Its :attr:`~MaskAlgorithm.kind` says who runs it: :func:`prune.update_masks` (``"pruning"``),
:class:`prune.DynamicSparsity` by name (``"sparse_training"``; the experiment runner offers these in sweep files),
:func:`prune.training.lottery.magnitude_masks` (``"lottery"``), :func:`prune.oneshot` (``"oneshot"``).

================  ==========================================  ========================================
name              what changes the masks                      reference
================  ==========================================  ========================================
``gradual``       each layer's schedule, criterion, pattern,  Zhu and Gupta 2018; tfmot
                  distribution (masks only shrink)
``imp``           one level of iterative magnitude pruning    Frankle and Carbin 2019
``static``        never moves                                 Evci et al. 2020 (the baseline)
``set``           magnitude / random                          Mocanu et al. 2018
``rigl``          magnitude / ``|dense gradient|``, cosine    Evci et al. 2020
``mest``          ``|w| + lam |g|`` / random                  Yuan et al. 2021
``granet``        cubic magnitude pruning, then RigL's        Liu et al. 2021
                  exchange of ``ceil(fraction * live)``
``magnitude``     one shot after training: ``|w|``            (SparseGPT's and Wanda's baseline)
``wanda``         one shot: ``|w| * ||x||``, per output        Sun et al. 2024
``sparsegpt``     one shot: OBS with ``(X^T X)^-1``, updates  Frantar and Alistarh 2023
                  the kept weights
================  ==========================================  ========================================
"""

from prune.algorithms.base import (
    DECAYS,
    DROPS,
    KINDS,
    MaskAlgorithm,
    Planned,
    SparseTraining,
    Update,
    algorithms,
    cosine_drop_fraction,
    drop_and_grow,
    get_algorithm,
    num_drop,
    register_algorithm,
    sign_drop_counts,
)
from prune.algorithms.gradual import GradualPruning
from prune.algorithms.granet import GraNet
from prune.algorithms.mest import MEST
from prune.algorithms.oneshot import InputStatistics, Magnitude, OneShotPruning
from prune.algorithms.rigl import RigL
from prune.algorithms.set import SET
from prune.algorithms.sparsegpt import SparseGPT
from prune.algorithms.static import Static
from prune.algorithms.ticket import LotteryLevel
from prune.algorithms.wanda import Wanda

__all__ = [
    "DECAYS",
    "DROPS",
    "GradualPruning",
    "GraNet",
    "InputStatistics",
    "KINDS",
    "LotteryLevel",
    "MEST",
    "Magnitude",
    "MaskAlgorithm",
    "OneShotPruning",
    "Planned",
    "RigL",
    "SET",
    "SparseGPT",
    "SparseTraining",
    "Static",
    "Update",
    "Wanda",
    "algorithms",
    "cosine_drop_fraction",
    "drop_and_grow",
    "get_algorithm",
    "num_drop",
    "register_algorithm",
    "sign_drop_counts",
]
