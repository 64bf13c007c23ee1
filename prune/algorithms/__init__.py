"""Sparse-training algorithms: one base (:class:`SparseTraining`), one registry, one file per algorithm.

NumPy only. Adding an algorithm is one file with a subclass and one :func:`register_algorithm` line, then an
import here; :class:`prune.DynamicSparsity` runs it by name and the experiment runner offers it in sweep files.

================  ==========================================  ========================================
name              drop / grow                                 reference
================  ==========================================  ========================================
``static``        never moves                                 Evci et al. 2020 (the baseline)
``set``           magnitude / random                          Mocanu et al. 2018
``rigl``          magnitude / ``|dense gradient|``, cosine    Evci et al. 2020
``mest``          ``|w| + lam |g|`` / random                  Yuan et al. 2021
``granet``        cubic magnitude pruning, then RigL's        Liu et al. 2021
                  exchange of ``ceil(fraction * live)``
================  ==========================================  ========================================
"""

from prune.algorithms.base import (
    DECAYS,
    DROPS,
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
from prune.algorithms.granet import GraNet
from prune.algorithms.mest import MEST
from prune.algorithms.rigl import RigL
from prune.algorithms.set import SET
from prune.algorithms.static import Static

__all__ = [
    "DECAYS",
    "DROPS",
    "GraNet",
    "MEST",
    "RigL",
    "SET",
    "SparseTraining",
    "Static",
    "Update",
    "algorithms",
    "cosine_drop_fraction",
    "drop_and_grow",
    "get_algorithm",
    "num_drop",
    "register_algorithm",
    "sign_drop_counts",
]
