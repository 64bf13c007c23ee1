"""Pruning while training, on Keras models: the mask-update engine (:mod:`~prune.training.pruning`), its callbacks
(:mod:`~prune.training.callbacks`), gradients and optimizer slots, sparse training (:mod:`~prune.training.dst`)
and lottery tickets (:mod:`~prune.training.lottery`, :mod:`~prune.training.imp`).

The modules import TensorFlow or Keras where they need them; ``import prune`` loads none of them (the public
names load on first use).
"""


def __getattr__(name: str) -> object:
    """``prune.training.<module>`` on first use (PEP 562), as for ``prune`` itself."""
    import importlib
    import importlib.util

    if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        value = importlib.import_module(f"{__name__}.{name}")
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
