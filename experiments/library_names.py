"""What the runner's main process takes from the library, in one place.

The runner validates sweeps against the library's names (criteria, patterns,
distributions) and parameters (:class:`prune.training.imp.ImpParams`) in its main
process, which must never import TensorFlow. ``import prune`` and its engine
(:mod:`prune.core.scoring`, :mod:`prune.core.distributions`, :mod:`prune.core.patterns`,
:mod:`prune.training.imp`, ...) import neither TensorFlow nor Keras, so the names are
read from the library's registries here; a criterion, distribution or pattern
registered there is valid in a sweep file with no change to the runner.

Nothing else in ``experiments/`` spells these names.
"""

from __future__ import annotations

from prune.training import imp
from prune.algorithms import algorithms as _algorithms
from prune.algorithms import get_algorithm as _get_algorithm
from prune.core.counting import REPORT_COLUMNS as _REPORT_COLUMNS
from prune.core.distributions import distributions as _distributions
from prune.core.patterns import POOLINGS
from prune.core.patterns import patterns as _patterns
from prune.core.scoring import criteria as _criteria

__all__ = [
    "CRITERIA",
    "GRADIENT_CRITERIA",
    "DISTRIBUTIONS",
    "DST_DISTRIBUTION",
    "DST_METHODS",
    "SPARSE_TRAINING",
    "IMP_SCOPES",
    "PATTERN_CLASSES",
    "POOLINGS",
    "REPORT_COLUMNS",
    "imp",
]

CRITERIA = tuple(_criteria())
"""``prune.core.scoring``'s registered criteria (``criterion=`` of ``prune_low_magnitude``)."""
GRADIENT_CRITERIA = tuple(_criteria(needs="gradient"))
"""The criteria that score with a gradient (``needs`` holds ``"gradient"``)."""
DISTRIBUTIONS = tuple(_distributions())
"""``prune.core.distributions``' registry: how the sparsity spreads over layers (``scope=`` of ``prune_low_magnitude``)."""
DST_DISTRIBUTION = {name: name for name in _distributions(with_zeros=True)}
"""The distributions sparse training can start from (exact random zeros per weight), as ``prune.sparse_init`` takes them."""
SPARSE_TRAINING = {name: _get_algorithm(name) for name in _algorithms("sparse_training")}
"""``prune.algorithms``' registry: every sparse-training algorithm class by name (``static``, ``set``, ``rigl``,
``mest``, ``granet``, and any registered later). The runner offers each as a method, with its paper's settings
and its own parameters (:attr:`prune.algorithms.SparseTraining.paper`, ``own_params``)."""
DST_METHODS = {name: cls.needs_gradient for name, cls in SPARSE_TRAINING.items() if cls.moves}
"""The algorithms that move masks (``prune.training.dst.METHODS``), each saying whether it needs ``gradient_data``."""
IMP_SCOPES = ("layer", "global")
"""The distributions the runner's IMP prunes by magnitude with: Frankle and Carbin's (layerwise for fully connected
networks, global for deeper ones). ``prune.training.lottery.magnitude_masks`` takes every registered distribution (ERK too);
the runner offers these two, the ones its IMP sweeps were checked with (a test keeps them a subset of the library's)."""
PATTERN_CLASSES = tuple(_patterns())
"""``prune.core.patterns.patterns()``: the pattern classes (``experiments.axes.PATTERNS`` names them in sweep files)."""
REPORT_COLUMNS = _REPORT_COLUMNS
"""``prune.core.counting.REPORT_COLUMNS``: every run's weight report has the columns of ``prune.sparsity_report``."""
