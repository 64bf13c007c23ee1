"""Pruning while training, on Keras models: the mask-update engine (:mod:`~prune.training.pruning`), its callbacks
(:mod:`~prune.training.callbacks`), gradients and optimizer slots, sparse training (:mod:`~prune.training.dst`)
and lottery tickets (:mod:`~prune.training.lottery`, :mod:`~prune.training.imp`).

The modules import TensorFlow or Keras where they need them; ``import prune`` loads none of them (the public
names load on first use).
"""

from prune._lazy import submodules as _submodules

__getattr__ = _submodules(__name__)
