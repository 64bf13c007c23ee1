"""The engine's values, NumPy only: patterns, criteria, schedules, distributions, counting, masks, mask targets.

Nothing here imports TensorFlow or Keras, so the experiment runner's main process, a config validator or a
notebook reads the registries in milliseconds (``import prune`` loads some of these; :mod:`prune.algorithms`, also NumPy only, loads on first use).
"""

from prune._lazy import submodules as _submodules

__getattr__ = _submodules(__name__)
