"""From a pruned model to a deployed one: conversion to sparse layers (:mod:`~prune.deploy.convert`), shrinking
pruned units away (:mod:`~prune.deploy.shrink`), TFLite and SavedModel export (:mod:`~prune.deploy.export`) and
the sparsity report (:mod:`~prune.deploy.report`)."""

from prune._lazy import submodules as _submodules

__getattr__ = _submodules(__name__)
