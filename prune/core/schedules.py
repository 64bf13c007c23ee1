"""Pruning schedules: pure, immutable values ``schedule(step) -> (should_update, sparsity)``.

The protocol and the numbers are tensorflow-model-optimization's
(``tfmot.sparsity.keras.PruningSchedule``): for the same arguments our
``ConstantSparsity`` and ``PolynomialDecay`` return the same decisions and the
same float32 sparsities at every step (``tests/prune/core/test_schedules.py`` checks this
against tfmot itself, in a separate process). Unlike tfmot's, ours are frozen
dataclasses that validate when constructed, return plain Python values, and
round-trip through ``get_config`` / ``from_config``.

Schedules are evaluated in Python by the pruning callback, never inside the
compiled training step, so they cost nothing per step on the graph side.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
import warnings
from typing import Any, Callable

import numpy as np

from prune.core.notices import PruningWarning

__all__ = [
    "PruningSchedule",
    "ConstantSparsity",
    "PolynomialDecay",
    "OneShot",
    "CallableSchedule",
    "as_schedule",
    "register_schedule",
    "schedule_from_config",
]


def _check_sparsity(name: str, value: Any) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number in [0, 1), got {value!r}") from None
    if not (0.0 <= v < 1.0) or math.isnan(v):
        raise ValueError(f"{name} must be in [0, 1), got {value!r}")
    return v


def _check_int(name: str, value: Any, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return int(value)


def _in_range_and_turn(step: int, begin: int, end: int, frequency: int) -> bool:
    # tfmot's _should_prune_in_step: end == -1 means "no end".
    in_range = step >= begin and (end < 0 or step <= end)
    return bool(in_range and (step - begin) % frequency == 0)


def _as_step(step: Any) -> int:
    return int(np.asarray(step))


class PruningSchedule:
    """Base class: a pure function of the step, serialisable as a config dict.

    Subclasses are frozen dataclasses. ``get_config`` returns
    ``{"class_name": ..., "config": {field: value}}``, the form tfmot's
    schedules use and Keras's ``keras.saving.deserialize_keras_object``
    reads (the schedule classes are registered with Keras under their class
    names). ``from_config`` accepts that form or the bare fields and rebuilds
    an equal value.
    """

    def __call__(self, step: int) -> tuple[bool, float]:
        raise NotImplementedError

    def should_update(self, step: int) -> bool:
        """Whether masks are updated at ``step``; cheaper than ``self(step)`` for some schedules."""
        return bool(self(step)[0])

    def get_config(self) -> dict[str, Any]:
        """``{"class_name": <class name>, "config": <constructor arguments>}``, JSON-serialisable."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]
        return {"class_name": type(self).__name__, "config": fields}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "PruningSchedule":
        """Rebuild a schedule from :meth:`get_config` output, or from its ``"config"`` part alone."""
        return cls(**_unwrap(config, cls.__name__))


def _unwrap(config: Any, class_name: str) -> dict[str, Any]:
    """The constructor arguments in ``config``, which may be ``{"class_name", "config"}``."""
    if not isinstance(config, dict):
        raise ValueError(f"a {class_name} config must be a dict, got {config!r}")
    if set(config) == {"class_name", "config"}:
        if config["class_name"] != class_name:
            raise ValueError(f"config is for class_name {config['class_name']!r}, not {class_name!r}")
        return dict(config["config"])
    return dict(config)


@dataclasses.dataclass(frozen=True)
class ConstantSparsity(PruningSchedule):
    """Prune to ``target_sparsity`` every ``frequency`` steps in ``[begin_step, end_step]``.

    Args:
        target_sparsity: Fraction of zeros, in [0, 1).
        begin_step: First step at which masks are updated (>= 0).
        end_step: Last step at which masks may be updated; -1 means no end
            (tfmot's convention, kept for compatibility).
        frequency: Update masks every ``frequency`` steps (> 0).
    """

    target_sparsity: float
    begin_step: int
    end_step: int = -1
    frequency: int = 100

    def __post_init__(self) -> None:
        object.__setattr__(self, "target_sparsity", _check_sparsity("target_sparsity", self.target_sparsity))
        _validate_steps(self.begin_step, self.end_step, self.frequency, allow_no_end=True)

    def __call__(self, step: int) -> tuple[bool, float]:
        s = _as_step(step)
        return (
            _in_range_and_turn(s, self.begin_step, self.end_step, self.frequency),
            float(np.float32(self.target_sparsity)),
        )


@dataclasses.dataclass(frozen=True)
class PolynomialDecay(PruningSchedule):
    """Gradual pruning: sparsity rises from ``initial_sparsity`` to ``final_sparsity``.

    ``s(t) = s_f + (s_i - s_f) * (1 - p)**power`` with
    ``p = clip((t - begin_step) / (end_step - begin_step), 0, 1)``, evaluated in
    float32 exactly as tfmot does.

    Reference: Zhu & Gupta, "To prune, or not to prune: exploring the efficacy of
    pruning for model compression", 2017 (arXiv:1710.01878).

    Args:
        initial_sparsity: Sparsity at ``begin_step``, in [0, 1).
        final_sparsity: Sparsity from ``end_step`` on, in [0, 1).
        begin_step: First update step (>= 0).
        end_step: Last update step (> begin_step).
        power: Exponent of the decay (> 0); 3 in the paper.
        frequency: Update masks every ``frequency`` steps (> 0).
    """

    initial_sparsity: float
    final_sparsity: float
    begin_step: int
    end_step: int
    power: float = 3
    frequency: int = 100

    def __post_init__(self) -> None:
        object.__setattr__(self, "initial_sparsity", _check_sparsity("initial_sparsity", self.initial_sparsity))
        object.__setattr__(self, "final_sparsity", _check_sparsity("final_sparsity", self.final_sparsity))
        _validate_steps(self.begin_step, self.end_step, self.frequency, allow_no_end=False)
        if self.end_step == self.begin_step:
            raise ValueError(
                f"end_step must be > begin_step for PolynomialDecay, got begin_step={self.begin_step!r}, "
                f"end_step={self.end_step!r}"
            )
        if isinstance(self.power, bool) or not isinstance(self.power, (int, float)) or not math.isfinite(self.power):
            raise ValueError(f"power must be a finite number > 0, got {self.power!r}")
        if self.power <= 0:  # (1 - p) ** power: 0 never moves, < 0 divides by zero at end_step
            raise ValueError(f"power must be a finite number > 0, got {self.power!r}")
        if self.end_step - self.begin_step < self.frequency and self.initial_sparsity != self.final_sparsity:
            warnings.warn(
                f"PolynomialDecay updates masks only at begin_step={self.begin_step}, to initial_sparsity="
                f"{self.initial_sparsity:g}: end_step - begin_step = {self.end_step - self.begin_step} < frequency = "
                f"{self.frequency}, so final_sparsity={self.final_sparsity:g} is never reached (as in tfmot). Lower "
                "frequency or raise end_step",
                PruningWarning,
                stacklevel=3,
            )

    def sparsity_at(self, step: int) -> float:
        """The sparsity the schedule prescribes at ``step``.

        Computed with the same float32 TensorFlow scalar ops as tfmot, so the
        numbers agree to the bit: TF's float32 ``pow`` differs from NumPy's in
        the last place for some inputs.
        """
        return _polynomial_sparsity(self, _as_step(step))

    def should_update(self, step: int) -> bool:
        return _in_range_and_turn(_as_step(step), self.begin_step, self.end_step, self.frequency)

    def __call__(self, step: int) -> tuple[bool, float]:
        s = _as_step(step)
        return _in_range_and_turn(s, self.begin_step, self.end_step, self.frequency), self.sparsity_at(s)


@dataclasses.dataclass(frozen=True)
class OneShot(PruningSchedule):
    """Prune once, to ``sparsity``, at ``step``; masks stay fixed afterwards.

    Args:
        sparsity: Fraction of zeros, in [0, 1).
        step: The single update step (>= 0).
    """

    sparsity: float
    step: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "sparsity", _check_sparsity("sparsity", self.sparsity))
        _check_int("step", self.step, minimum=0)

    def __call__(self, step: int) -> tuple[bool, float]:
        return _as_step(step) == self.step, float(np.float32(self.sparsity))


@dataclasses.dataclass(frozen=True)
class CallableSchedule(PruningSchedule):
    """Adapter for any object called as ``schedule(step) -> (should_update, sparsity)``.

    Tensor results (as tfmot's schedules return) are converted to Python
    values. A model holding such a schedule saves and loads when the wrapped
    object does through Keras: a class with ``get_config`` (and, unless it
    is ``cls(**config)``, ``from_config``) registered with
    ``keras.saving.register_keras_serializable``. The config stores the
    object in Keras's own serialised form, under the registered class name
    ``"CallableSchedule"``.
    """

    fn: Callable[[int], tuple[Any, Any]]

    def __call__(self, step: int) -> tuple[bool, float]:
        should, sparsity = self.fn(_as_step(step))
        return bool(np.asarray(should)), float(np.asarray(sparsity))

    def get_config(self) -> dict[str, Any]:
        """``{"class_name": "CallableSchedule", "config": {"fn": <Keras-serialised fn>}}``.

        Raises:
            ValueError: the wrapped object has no ``get_config``.
        """
        if getattr(self.fn, "get_config", None) is None:
            raise ValueError(
                f"pruning_schedule {self.fn!r} has no get_config(); it cannot be saved. Give it get_config() and "
                "register its class with keras.saving.register_keras_serializable, or use one of "
                "prune.ConstantSparsity, prune.PolynomialDecay, prune.OneShot"
            )
        import keras  # deferred: schedules stay importable and cheap without Keras

        return {"class_name": "CallableSchedule", "config": {"fn": keras.saving.serialize_keras_object(self.fn)}}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "CallableSchedule":
        """Rebuild the wrapped object with ``keras.saving.deserialize_keras_object``.

        Raises:
            ValueError: its class is not registered with Keras.
        """
        import keras

        fn_config = _unwrap(config, cls.__name__).get("fn")
        if not isinstance(fn_config, dict):
            raise ValueError(f"a CallableSchedule config needs 'fn', a Keras-serialised object, got {fn_config!r}")
        registered = keras.saving.get_registered_object(fn_config.get("registered_name") or fn_config.get("class_name"))
        try:
            if registered is None:
                fn = keras.saving.deserialize_keras_object(fn_config)
            elif hasattr(registered, "from_config"):
                fn = registered.from_config(fn_config.get("config", {}))
            else:
                fn = registered(**fn_config.get("config", {}))
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"cannot rebuild the callable pruning_schedule {fn_config!r}: {exc}. Register its class with "
                "keras.saving.register_keras_serializable before loading"
            ) from exc
        if not callable(fn):
            raise ValueError(f"the callable pruning_schedule config {fn_config!r} did not give a callable, got {fn!r}")
        return cls(fn)


@functools.lru_cache(maxsize=4096)
def _polynomial_sparsity(schedule: "PolynomialDecay", step: int) -> float:
    import tensorflow as tf  # deferred: schedules stay importable and cheap without TF

    p = tf.math.minimum(
        1.0,
        tf.math.maximum(0.0, tf.math.divide(tf.cast(step - schedule.begin_step, tf.float32), schedule.end_step - schedule.begin_step)),
    )
    sparsity = tf.math.add(
        tf.math.multiply(schedule.initial_sparsity - schedule.final_sparsity, tf.math.pow(1 - p, schedule.power)),
        schedule.final_sparsity,
    )
    return float(sparsity.numpy())


def _validate_steps(begin: Any, end: Any, frequency: Any, allow_no_end: bool) -> None:
    _check_int("begin_step", begin, minimum=0)
    _check_int("end_step", end)
    _check_int("frequency", frequency)
    if frequency <= 0:
        raise ValueError(f"frequency must be > 0, got {frequency!r}")
    if end == -1 and allow_no_end:
        return
    if end < 0:
        raise ValueError(f"end_step must be {'-1 or ' if allow_no_end else ''}>= 0, got {end!r}")
    if begin > end:
        raise ValueError(f"begin_step must be <= end_step, got begin_step={begin!r}, end_step={end!r}")


_REGISTRY: dict[str, type[PruningSchedule]] = {}


def register_schedule(cls: type[PruningSchedule], name: str | None = None) -> type[PruningSchedule]:
    """Register a schedule class so saved models can rebuild it. Usable as a decorator.

    The class is registered with Keras too, under the same name, so
    ``keras.saving.deserialize_keras_object(schedule.get_config())`` returns
    the schedule (as tfmot's tests do with ``custom_objects``): at once if
    Keras is imported, else when it is (:mod:`prune._lazy`), so that schedules
    stay importable without Keras.
    """
    if not (isinstance(cls, type) and issubclass(cls, PruningSchedule)):
        raise ValueError(f"cls must be a subclass of prune.PruningSchedule, got {cls!r}")
    key = name or cls.__name__
    _REGISTRY[key] = cls
    if "keras" in sys.modules:
        register_with_keras()
    return cls


def register_with_keras() -> None:
    """Put every registered schedule class into Keras's custom objects (needs Keras imported)."""
    import keras

    keras.saving.get_custom_objects().update(_REGISTRY)


for _cls in (ConstantSparsity, PolynomialDecay, OneShot, CallableSchedule):
    register_schedule(_cls)


def serialize_schedule(schedule: PruningSchedule) -> dict[str, Any]:
    """``{"class_name": ..., "config": ...}``, the same shape tfmot and Keras use."""
    config = schedule.get_config()
    if isinstance(config, dict) and set(config) == {"class_name", "config"}:
        return config
    return {"class_name": type(schedule).__name__, "config": config}  # a user schedule with flat get_config()


def schedule_from_config(config: dict[str, Any]) -> PruningSchedule:
    """Rebuild a schedule from ``{"class_name", "config"}`` (ours, tfmot's or Keras's serialised form)."""
    if not isinstance(config, dict) or "class_name" not in config:
        raise ValueError(f"pruning_schedule config must be a dict with 'class_name' and 'config', got {config!r}")
    name = config["class_name"]
    if name not in _REGISTRY:
        raise ValueError(f"unknown pruning_schedule class {name!r}; registered: {sorted(_REGISTRY)}")
    return _REGISTRY[name].from_config(dict(config.get("config", {})))


def as_schedule(schedule: Any) -> PruningSchedule:
    """Accept our schedules, tfmot's schedules, config dicts or any callable.

    tfmot's ``ConstantSparsity`` and ``PolynomialDecay`` are converted to ours
    through their ``get_config()`` (they have the same arguments and numbers),
    which needs no import of tfmot. Other callables are wrapped in
    :class:`CallableSchedule`.

    Raises:
        ValueError: ``schedule`` is none of these.
    """
    if isinstance(schedule, PruningSchedule):
        return schedule
    if isinstance(schedule, dict):
        return schedule_from_config(schedule)
    module = type(schedule).__module__ or ""
    if module.startswith("tensorflow_model_optimization") and hasattr(schedule, "get_config"):
        cfg = schedule.get_config()
        if cfg.get("class_name") in ("ConstantSparsity", "PolynomialDecay"):
            return schedule_from_config(cfg)
    if callable(schedule):
        return CallableSchedule(schedule)
    raise ValueError(
        f"pruning_schedule must be a schedule (e.g. prune.ConstantSparsity) or a callable "
        f"step -> (should_update, sparsity), got {schedule!r}"
    )
