"""What the runner's main process takes from the library, in one place.

The runner validates sweeps against the library's names (criteria, patterns,
distributions) and parameters (:class:`prune.imp.ImpParams`) in its main
process, which must never import TensorFlow. Today ``import prune`` (its
``__init__``) imports TensorFlow, so:

* the names are listed here, each beside the library registry it mirrors;
  ``tests/test_config.py`` checks that they equal the library's, so they cannot
  drift. Once ``prune``'s engine imports without TensorFlow, each line becomes
  the import noted beside it and nothing else in ``experiments/`` changes;
* :mod:`prune.imp`, which imports no TensorFlow itself, is loaded from its file
  without running ``prune/__init__.py`` when ``prune`` is not imported yet, and
  registered as ``sys.modules["prune.imp"]``, so ``from prune.imp import ...``
  later in a worker gets this same module and its one ``ImpParams`` class.
  Once ``import prune`` is light this becomes ``from prune import imp``.

Nothing else in ``experiments/`` spells these names.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType

__all__ = [
    "CRITERIA",
    "GRADIENT_CRITERIA",
    "DISTRIBUTIONS",
    "DST_DISTRIBUTION",
    "DST_METHODS",
    "IMP_SCOPES",
    "PATTERN_CLASSES",
    "POOLINGS",
    "REPORT_COLUMNS",
    "imp",
]

CRITERIA = ("magnitude", "random", "snip", "taylor", "movement")
"""``prune.scoring``'s registered criteria, in registration order (``criterion=`` of ``prune_low_magnitude``)."""
GRADIENT_CRITERIA = ("snip", "taylor", "movement")
"""The criteria whose ``prune.scoring.get_criterion(name).needs`` holds ``"gradient"``."""
DISTRIBUTIONS = ("layer", "global", "erk")
"""``prune.masks.SCOPES``: how the sparsity spreads over layers (``scope=`` of ``prune_low_magnitude``)."""
DST_DISTRIBUTION = {"layer": "uniform", "erk": "erk"}
"""The distributions sparse training starts from, as ``prune.dst.DISTRIBUTIONS`` spells them (``layer`` is ``uniform``)."""
DST_METHODS = {"set": False, "rigl": True}
"""``prune.dst.METHODS``, each saying whether it regrows by gradient (needs ``gradient_data``)."""
IMP_SCOPES = ("layer", "global")
"""The distributions the runner's IMP prunes by magnitude with (of ``prune.lottery.SCOPES``)."""
PATTERN_CLASSES = ("Block", "Channel", "NByM", "Unstructured")
"""``prune.patterns.patterns()``: the pattern classes (``experiments.axes.PATTERNS`` names them in sweep files)."""
POOLINGS = ("AVG", "MAX")
REPORT_COLUMNS = [
    "layer", "weight", "shape", "nnz", "size", "sparsity", "dense_flops", "nonzero_flops", "dense_bytes", "status"
]
"""``prune.report.REPORT_COLUMNS``: every run's weight report has the columns of ``prune.sparsity_report``.
(``prune.report`` imports Keras 3, which the tfmot process must not, so this one stays a checked copy.)"""
"""``prune.patterns.Block``'s poolings."""


def _light_module(name: str) -> ModuleType:
    """``prune.<name>``, a module that imports no TensorFlow, without importing ``prune`` itself if it is not yet."""
    full = f"prune.{name}"
    if full in sys.modules or "prune" in sys.modules:
        return importlib.import_module(full)
    package = importlib.util.find_spec("prune")
    if package is None or not package.submodule_search_locations:
        raise ImportError("the prune package is not installed")
    location = f"{list(package.submodule_search_locations)[0]}/{name}.py"
    spec = importlib.util.spec_from_file_location(full, location)
    module = importlib.util.module_from_spec(spec)
    sys.modules[full] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[full]
        raise
    return module


imp = _light_module("imp")
"""The library's IMP module (:mod:`prune.imp`): ``ImpParams``, ``CONTROLS``, ``train_levels``."""
