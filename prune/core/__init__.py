"""The engine's values, NumPy only: patterns, criteria, schedules, distributions, counting, masks, mask targets.

Nothing here imports TensorFlow or Keras, so the experiment runner's main process, a config validator or a
notebook reads the registries in milliseconds (``import prune`` loads some of these; :mod:`prune.algorithms`, also NumPy only, loads on first use).
"""


def __getattr__(name: str) -> object:
    """``prune.core.<module>`` on first use (PEP 562), as for ``prune`` itself."""
    import importlib
    import importlib.util

    if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        value = importlib.import_module(f"{__name__}.{name}")
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
