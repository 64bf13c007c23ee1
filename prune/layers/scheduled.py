"""The scheduled-layer contract: one value for a layer's pruning parameters, one mixin that keeps it and the step.

Every layer kind that the pruning engine (:mod:`prune.training.pruning`) drives, the
masked twins (:class:`prune.layers.PrunableLayer`) and
:class:`prune.layers.SparseDense` alike, is a :class:`ScheduledLayer`:

* its schedule, pattern, criterion, scope and seed are one frozen
  :class:`PruningParams`, validated once when it is made and serialised
  once (:meth:`PruningParams.get_config`, the layer config's keys
  ``pruning_schedule``, ``pattern``, ``criterion``, ``scope`` and ``seed``);
* it keeps a saved, non-trainable int64 ``pruning_step`` counter
  (:meth:`ScheduledLayer.add_step_counter` in ``build``), advanced inside
  the compiled step by every training-mode call
  (:meth:`ScheduledLayer.advance_step`).

**The protocol the engine reads.** A layer takes part in scheduled pruning
when it answers the mask-target protocol (:mod:`prune.core.targets`) and
:func:`pruning_params_of` gives it parameters with a schedule; it counts
steps when :func:`keeps_step` says so. Nothing else of the layer is read.

A new layer kind subclasses :class:`ScheduledLayer` (first, before the Keras
layer), calls :meth:`ScheduledLayer.add_step_counter` in ``build`` and
:meth:`ScheduledLayer.advance_step` in ``call``, answers ``mask_targets()``,
and is registered with one :func:`prune.layers.kinds.register_layer` call.

Imports neither TensorFlow nor Keras (its one import from :mod:`prune.training`, ``driving``, is NumPy only).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from prune.core.distributions import get_distribution
from prune.core.driving import require_driver
from prune.core.patterns import Pattern, as_pattern, serialize_pattern
from prune.core.schedules import PruningSchedule, as_schedule, serialize_schedule
from prune.core.scoring import get_criterion

__all__ = ["PRUNING_KEYS", "PruningParams", "ScheduledLayer", "check_pruning_args", "pruning_params_of", "keeps_step"]

PRUNING_KEYS = ("pruning_schedule", "pattern", "criterion", "scope", "seed")
"""The pruning keys of a scheduled layer's constructor and config, in this order."""


def check_pruning_args(pattern: Any, criterion: str, scope: str, seed: Any) -> Pattern:
    """Validate the pruning arguments shared by every prunable layer; returns the pattern.

    Args:
        pattern: A :mod:`prune.core.patterns` value, its serialised config, or ``None`` (unstructured).
        criterion: A registered criterion name (:func:`prune.criteria`).
        scope: A registered distribution name (:func:`prune.core.distributions.distributions`).
        seed: An integer.

    Returns:
        The pattern as a :class:`prune.core.patterns.Pattern`.

    Raises:
        ValueError: naming the argument and the value.
    """
    pattern = as_pattern(pattern)
    get_criterion(criterion)
    dist = get_distribution(scope)
    if not pattern.has_units and not dist.structured:
        raise ValueError(f"pattern {pattern!r} fixes the sparsity of every group and needs scope='layer', got scope={scope!r}")
    if getattr(pattern, "keep_one", False) and dist.grouped:
        raise ValueError(f"keep_one=True of pattern {pattern!r} is tfmot's rule per weight and needs scope='layer', got scope={scope!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    return pattern


@dataclass(frozen=True)
class PruningParams:
    """How the engine prunes one layer's weights: a validated, immutable value.

    Made from the layer's constructor arguments (or its saved config):
    ``pruning_schedule`` becomes a :class:`prune.PruningSchedule` (or stays
    ``None``), ``pattern`` a :class:`prune.core.patterns.Pattern`, ``seed`` an
    ``int``.

    Attributes:
        pruning_schedule: ``step -> (should_update, sparsity)``, or ``None``
            for masks that change only when set (a static or DST mask).
        pattern: Which entries are pruned together (default ``Unstructured()``).
        criterion: Registered criterion name (:func:`prune.criteria`).
        scope: Registered distribution name: ``"layer"``, ``"global"`` or ``"erk"``.
        seed: Seed given to the criterion (and, in ``SparseDense``, of its random structure).

    Raises:
        ValueError: a bad schedule, pattern, criterion, scope or seed, naming it.
    """

    pruning_schedule: PruningSchedule | None = None
    pattern: Pattern | None = None
    criterion: str = "magnitude"
    scope: str = "layer"
    seed: int = 0

    def __post_init__(self) -> None:
        schedule = None if self.pruning_schedule is None else as_schedule(self.pruning_schedule)
        pattern = check_pruning_args(self.pattern, self.criterion, self.scope, self.seed)
        object.__setattr__(self, "pruning_schedule", schedule)
        object.__setattr__(self, "pattern", pattern)
        object.__setattr__(self, "seed", int(self.seed))

    def as_kwargs(self) -> dict[str, Any]:
        """The five values by their constructor keyword, as objects (a schedule, a pattern)."""
        return {k: getattr(self, k) for k in PRUNING_KEYS}

    def get_config(self) -> dict[str, Any]:
        """The five keys of a layer's config, schedule and pattern serialised; :meth:`from_config` reads it back."""
        return {
            "pruning_schedule": None if self.pruning_schedule is None else serialize_schedule(self.pruning_schedule),
            "pattern": serialize_pattern(self.pattern),
            "criterion": self.criterion,
            "scope": self.scope,
            "seed": self.seed,
        }

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "PruningParams":
        """The parameters in ``config`` (a layer's config; keys other than :data:`PRUNING_KEYS` are ignored)."""
        return cls(**{k: config[k] for k in PRUNING_KEYS if k in config})

    @staticmethod
    def plain_config(config: dict[str, Any]) -> dict[str, Any]:
        """``config`` without the pruning keys."""
        return {k: v for k, v in config.items() if k not in PRUNING_KEYS}


def _param(key: str, doc: str) -> property:
    """A :class:`ScheduledLayer` attribute that reads ``pruning_params.<key>``; assigning it replaces
    :attr:`ScheduledLayer.pruning_params` by a validated copy (:meth:`ScheduledLayer._replace`)."""
    return property(lambda self: getattr(self.pruning_params, key), lambda self, value: self._replace(key, value), doc=doc)


class ScheduledLayer:
    """Mixin of every layer the engine drives: its :class:`PruningParams` and its ``pruning_step`` counter.

    Subclass it first, before the Keras layer (``class MyLayer(ScheduledLayer,
    keras.layers.Layer)``). The constructor takes the five pruning keywords
    (see :class:`PruningParams`) and passes everything else on. The five are
    attributes that read :attr:`pruning_params`; assigning one
    (``layer.pruning_schedule = None`` makes a mask static) replaces
    :attr:`pruning_params` by a validated copy.

    Args:
        pruning_schedule: A schedule (ours, tfmot's, or a config dict), or ``None``.
        pattern: A :mod:`prune.core.patterns` value (default ``Unstructured()``).
        criterion: Registered criterion name (:func:`prune.criteria`).
        scope: ``"layer"`` (own threshold), ``"global"`` (one threshold
            shared by every globally scoped weight in the model) or ``"erk"``
            (Erdős–Rényi-Kernel sparsities over every ``"erk"`` weight).
        seed: Seed of the random criterion.
    """

    pruning_params: PruningParams
    """The layer's pruning parameters, the one place they are kept."""

    def __init__(
        self,
        *args: Any,
        pruning_schedule: PruningSchedule | dict | Any | None = None,
        pattern: Pattern | dict | None = None,
        criterion: str = "magnitude",
        scope: str = "layer",
        seed: int = 0,
        **kwargs: Any,
    ) -> None:
        params = PruningParams(pruning_schedule, pattern, criterion, scope, seed)  # validated before anything is made
        super().__init__(*args, **kwargs)
        self.pruning_params = params

    # -- the parameters, read through one value -------------------------------------------
    def _replace(self, key: str, value: Any) -> None:
        if "pruning_params" not in self.__dict__:
            # The base Keras layer's __init__ setting an attribute of its own by that name (MultiHeadAttention's
            # dropout ``seed``): the pruning value replaces it once this mixin's __init__ has run, as it always did.
            return
        self.pruning_params = dataclasses.replace(self.pruning_params, **{key: value})

    pruning_schedule = _param("pruning_schedule", "The schedule, or ``None``; assigning one validates it and replaces :attr:`pruning_params`.")
    pattern = _param("pattern", "The :class:`prune.core.patterns.Pattern`.")
    criterion = _param("criterion", "The criterion name.")
    scope = _param("scope", "The distribution name.")
    seed = _param("seed", "The seed.")

    # -- the step counter ---------------------------------------------------------------
    def add_step_counter(self) -> None:
        """Create the saved, non-trainable int64 ``pruning_step`` variable; call it in ``build``."""
        self.pruning_step = self.add_weight(  # type: ignore[attr-defined]
            name="pruning_step", shape=(), initializer="zeros", dtype="int64", trainable=False
        )

    def advance_step(self, training: Any) -> None:
        """Count one training step, inside the compiled step (no eager op per batch).

        Called by ``call`` with its ``training`` argument; counts Python-true
        ``training`` only. A layer called several times in one training step
        (a shared layer) counts each call.

        Raises:
            ValueError: the layer has a schedule and nothing drives it (at trace time; :mod:`prune.core.driving`).
        """
        if isinstance(training, bool) and training and self.built:  # type: ignore[attr-defined]
            require_driver(self)  # Python, at trace time: no per-step cost (prune/core/driving.py)
            self.pruning_step.assign_add(1)

    # -- serialisation ------------------------------------------------------------------
    def get_config(self) -> dict[str, Any]:
        """The Keras layer's config plus :meth:`PruningParams.get_config`."""
        config = super().get_config()  # type: ignore[misc]
        config.update(self.pruning_params.get_config())
        return config

    @classmethod
    def plain_config(cls, config: dict[str, Any]) -> dict[str, Any]:
        """``config`` without the pruning keys: the base layer's config."""
        return PruningParams.plain_config(config)


def pruning_params_of(layer: Any) -> PruningParams | None:
    """The :class:`PruningParams` of a scheduled layer, ``None`` for any other layer (the engine's one read)."""
    return layer.pruning_params if isinstance(layer, ScheduledLayer) else None


def keeps_step(layer: Any) -> bool:
    """Whether ``layer`` keeps a ``pruning_step`` counter (every :class:`ScheduledLayer`)."""
    return isinstance(layer, ScheduledLayer)
