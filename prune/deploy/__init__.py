"""From a pruned model to a deployed one: conversion to sparse layers (:mod:`~prune.deploy.convert`), shrinking
pruned units away (:mod:`~prune.deploy.shrink`), TFLite and SavedModel export (:mod:`~prune.deploy.export`) and
the sparsity report (:mod:`~prune.deploy.report`)."""


def __getattr__(name: str) -> object:
    """``prune.deploy.<module>`` on first use (PEP 562), as for ``prune`` itself."""
    import importlib
    import importlib.util

    if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        value = importlib.import_module(f"{__name__}.{name}")
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
