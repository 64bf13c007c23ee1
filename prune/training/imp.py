"""Iterative magnitude pruning's level loop, resumable, over a level store the caller supplies.

:mod:`prune.training.lottery` has the pieces (the sparsity path, magnitude masks,
rewinding, the controls); :func:`train_levels` is the loop of Frankle and
Carbin (ICLR 2019) with rewinding to step ``k`` (Frankle et al., ICML 2020):

* level 0 trains the dense network (all masks ones) and keeps its trainable
  values after ``rewind_step`` steps as the rewind point;
* level ``n > 0`` at sparsity ``path[n]`` (:func:`prune.training.lottery.sparsity_path`)
  prunes the level ``n - 1`` ticket's trained weights by magnitude, rewinds the
  survivors and trains (``ticket``); ``reinit`` trains the ticket's mask from
  fresh initial values, ``random`` a random mask with the ticket's per-layer
  counts from the rewind point.

The caller says how a model is built and trained (``build``, ``fit``) and
where levels live (a :class:`LevelStore`: list, read and atomically write
levels); the loop skips every finished level, so a rerun after a crash or a
``kill -9`` resumes at the first missing one and, with seeded training, gives
the rows of an uninterrupted run. This follows open_lth's
``lottery/runner.py``, whose level locations are an argument.

This module imports no TensorFlow at import time (its parameters are read by
config validators); the loop imports it when it runs.
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from typing import Any, Callable, Mapping, Protocol

import numpy as np

__all__ = [
    "CONTROLS",
    "VARIANTS",
    "LEVEL_KEYS",
    "ImpParams",
    "ParamError",
    "Trained",
    "LevelStore",
    "TicketDiverged",
    "Levels",
    "level_seed",
    "train_levels",
]

CONTROLS = ("reinit", "random")
"""The controls of Frankle and Carbin, in the order they are stored and trained."""
VARIANTS = ("ticket", *CONTROLS)
"""Every variant a level trains, in row order."""
LEVEL_KEYS = ("target_sparsity", "rows", "ticket")
"""The keys of a level record (:class:`LevelStore`), each of which :meth:`LevelStore.read` must return."""


class ParamError(ValueError):
    """A bad parameter, naming its field: ``path`` (``"stops[1]"``) and ``message`` (what is wrong)."""

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        self.message = message
        super().__init__(f"{path} {message}")


def _number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


@dataclasses.dataclass(frozen=True)
class ImpParams:
    """The parameters of iterative magnitude pruning with rewinding.

    Attributes:
        rate: Fraction of the remaining weights pruned per level, in (0, 1)
            (Frankle and Carbin's ``p``; 0.2 for LeNet-300-100).
        rewind_step: Survivors are rewound to their values after this many
            steps of level-0 training (0: the original initialisation;
            Frankle et al., ICML 2020, rewind to an early step ``k``).
        controls: Any of ``"reinit"`` (same mask, fresh initial values) and
            ``"random"`` (random mask with the ticket's per-layer counts), in any
            order; stored in :data:`CONTROLS`' order (each is seeded from its own
            name, so the order changes nothing, nor a run's hash).
        stops: Sparsities in (0, 1) no level may jump past, strictly
            increasing; each is reached exactly, so one run at the highest
            sparsity gives every lower one too.

    Raises:
        ParamError: naming the field and the value.
    """

    rate: float = 0.2
    rewind_step: int = 0
    controls: tuple[str, ...] = CONTROLS
    stops: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not _number(self.rate) or not 0.0 < self.rate < 1.0:
            raise ParamError("rate", f"must be a number in (0, 1), got {self.rate!r}")
        k = self.rewind_step
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ParamError("rewind_step", f"must be an integer >= 0, got {k!r}")
        if isinstance(self.controls, str) or not isinstance(self.controls, (tuple, list)):
            raise ParamError("controls", f"must be a list of {list(CONTROLS)}, got {self.controls!r}")
        if any(c not in CONTROLS for c in self.controls) or len(set(self.controls)) != len(self.controls):
            raise ParamError("controls", f"must be distinct names from {list(CONTROLS)}, got {list(self.controls)!r}")
        if isinstance(self.stops, str) or not isinstance(self.stops, (tuple, list)):
            raise ParamError("stops", f"must be a list of sparsities in (0, 1), got {self.stops!r}")
        for i, s in enumerate(self.stops):
            if not _number(s) or not 0.0 < s < 1.0:
                raise ParamError(f"stops[{i}]", f"must be a sparsity in (0, 1), got {s!r}")
        if list(self.stops) != sorted(set(self.stops)):
            raise ParamError("stops", f"must be strictly increasing, got {list(self.stops)!r}")
        object.__setattr__(self, "controls", tuple(c for c in CONTROLS if c in self.controls))
        object.__setattr__(self, "stops", tuple(float(s) for s in self.stops))


def level_seed(seed: int, level: int, variant: str) -> int:
    """The seed of one training, from ``(seed, level, variant)`` only (so a resumed level is identical)."""
    rng = np.random.default_rng([int(seed), int(level), zlib.crc32(variant.encode())])
    return int(rng.integers(2**31 - 1))


@dataclasses.dataclass
class Trained:
    """What the caller's ``fit`` reports about one training.

    Attributes:
        status: ``"ok"``, or ``"diverged"`` (the loop stops after a diverged ticket's level).
        metrics: Row values besides the loop's own (e.g. ``test_accuracy``), in column order.
        record: JSON-able data the store keeps for the ticket (curves, timings); ``{}`` if none.
    """

    status: str
    metrics: dict[str, float]
    record: dict[str, Any] = dataclasses.field(default_factory=dict)


class LevelStore(Protocol):
    """Where the levels of one IMP run live (:func:`train_levels` reads and writes nothing else).

    A level is a JSON-able record (``target_sparsity``, ``rows``, ``ticket``:
    the ticket's :attr:`Trained.record`) and named states, each
    ``(values, masks)``: ``"ticket"`` (the trained ticket, absent if it
    diverged) and, at level 0, ``"rewind"`` (the rewind point, masks ``{}``).
    """

    def levels(self) -> list[int]:
        """The finished levels."""
        ...

    def read(self, level: int) -> dict[str, Any] | None:
        """A finished level's record, or ``None`` if it is not finished (a damaged one is discarded)."""
        ...

    def state(self, level: int, name: str) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """A finished level's state ``name`` as ``(values, masks)``."""
        ...

    def write(
        self, level: int, record: dict[str, Any], states: Mapping[str, tuple[Mapping[str, Any], Mapping[str, Any]]]
    ) -> None:
        """Store a level, atomically: afterwards it is finished, with all of it, or absent."""
        ...


class TicketDiverged(RuntimeError):
    """The ticket of ``level`` diverged; the level is stored, later levels are not trained.

    Attributes:
        level: The level.
        record: Its stored record.
        rows: Every level's rows up to and including it.
    """

    def __init__(self, level: int, record: dict[str, Any], rows: list[dict[str, Any]]) -> None:
        super().__init__(f"imp ticket diverged at level {level}")
        self.level = level
        self.record = record
        self.rows = rows


@dataclasses.dataclass
class Levels:
    """The outcome of :func:`train_levels`.

    Attributes:
        rows: One per level and variant: ``level``, ``variant``, ``sparsity``
            (measured), ``remaining``, the caller's metrics, ``status``.
        record: The last level's stored record.
        level: The last level's number.
    """

    rows: list[dict[str, Any]]
    record: dict[str, Any]
    level: int


def _measured_sparsity(model: Any) -> float:
    import prune

    nnz = size = 0
    for layer in prune.prunable_layers(model):
        for name in layer.prunable_weight_names:
            value = np.asarray(layer.masked_weight(name))
            nnz += int(np.count_nonzero(value))
            size += int(value.size)
    return 1.0 - nnz / size if size else 0.0


def _snapshot_at(step: int, sink: dict[str, Any]) -> Any:
    import keras

    from prune.training import lottery

    class SnapshotAt(keras.callbacks.Callback):
        """Copies the trainable variables after ``step`` training steps (across ``fit`` calls)."""

        def __init__(self) -> None:
            super().__init__()
            self.steps = 0

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            self.steps += 1
            if self.steps == step:
                sink["values"] = lottery.snapshot(self.model)

    return SnapshotAt()


class _Run:
    """The loop's fixed arguments, and one training of one variant."""

    def __init__(self, build: Callable[[], Any], fit: Callable[..., Trained], seed: int, log: Callable[[str], None]):
        self.build, self.fit, self.seed, self.log = build, fit, seed, log

    def train(
        self, level: int, variant: str, values: Mapping[str, Any] | None, masks: Mapping[str, Any] | None,
        snapshot_step: int | None = None,
    ) -> tuple[Any, Trained, float, dict[str, Any]]:
        """Build, install ``values`` and ``masks``, seed, train; ``(model, trained, sparsity, rewind point)``."""
        import keras

        from prune.training import lottery

        model = self.build()
        if values is not None:
            lottery.rewind(model, values, masks)
        keras.utils.set_random_seed(level_seed(self.seed, level, variant))
        point: dict[str, Any] = {}
        if snapshot_step == 0:
            point["values"] = lottery.snapshot(model)
        callbacks = [_snapshot_at(snapshot_step, point)] if snapshot_step else []
        self.log(f"imp level {level} {variant}: training at sparsity {_measured_sparsity(model):.6f}")
        trained = self.fit(model, level, variant, callbacks)
        return model, trained, _measured_sparsity(model), point


def _row(level: int, variant: str, sparsity: float, trained: Trained) -> dict[str, Any]:
    return dict(level=level, variant=variant, sparsity=sparsity, remaining=1.0 - sparsity, **trained.metrics,
                status=trained.status)


def _level(run: _Run, store: LevelStore, params: ImpParams, scope: str, level: int, sparsity: float) -> None:
    from prune.training import lottery

    if level == 0:
        model, ticket, measured, point = run.train(0, "ticket", None, None, snapshot_step=params.rewind_step)
        rewind_values = point.get("values")  # None only if training diverged before rewind_step
        trainings = {"ticket": (model, ticket, measured)}
    else:
        rewind_values, _ = store.state(0, "rewind")
        previous, previous_masks = store.state(level - 1, "ticket")
        pruned = run.build()
        lottery.rewind(pruned, previous, previous_masks)
        keep = lottery.magnitude_masks(pruned, sparsity, scope=scope)
        trainings = {"ticket": run.train(level, "ticket", rewind_values, keep)[:3]}
        for variant in params.controls:
            seed = level_seed(run.seed, level, variant)
            if variant == "reinit":
                values, masks = lottery.reinit_values(pruned, seed), keep
            else:
                values, masks = rewind_values, lottery.random_masks(keep, seed)
            trainings[variant] = run.train(level, variant, values, masks)[:3]
    model, ticket, _ = trainings["ticket"]
    rows = [_row(level, v, trainings[v][2], trainings[v][1]) for v in VARIANTS if v in trainings]
    states = {}
    if ticket.status == "ok":
        states["ticket"] = (lottery.snapshot(model), lottery.current_masks(model))
    if level == 0 and rewind_values is not None:
        states["rewind"] = (rewind_values, {})
    store.write(level, dict(rows=rows, target_sparsity=sparsity, ticket=ticket.record), states)


def _checked(store: LevelStore, level: int, record: Any) -> dict[str, Any] | None:
    """``record`` as ``store.read(level)`` returned it, if it is ``None`` or a level record (see :class:`LevelStore`).

    Raises:
        ValueError: naming the store, the level and the missing or bad key.
    """
    if record is None:
        return None
    where = f"level {level} of store {store}: read({level}) returned"
    if not isinstance(record, Mapping):
        raise ValueError(f"{where} a {type(record).__name__}, not a level record (a dict with keys {list(LEVEL_KEYS)})")
    missing = [k for k in LEVEL_KEYS if k not in record]
    if missing:
        raise ValueError(
            f"{where} a record without {', '.join(repr(k) for k in missing)} (its keys: {sorted(map(str, record))}); "
            f"a level record has keys {list(LEVEL_KEYS)}, as train_levels gave them to write()"
        )
    rows = record["rows"]
    if not isinstance(rows, list) or not rows:
        raise ValueError(f"{where} a record whose 'rows' is {rows!r}, not a non-empty list of rows")
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping) or "status" not in row:
            raise ValueError(f"{where} a record whose rows[{i}] is {row!r}, not a row with a 'status'")
    return record if isinstance(record, dict) else dict(record)


def train_levels(
    build: Callable[[], Any],
    fit: Callable[[Any, int, str, list[Any]], Trained],
    target: float,
    params: ImpParams,
    store: LevelStore,
    *,
    scope: str = "layer",
    seed: int = 0,
    log: Callable[[str], None] = lambda line: None,
    progress: Callable[[list[dict[str, Any]]], None] | None = None,
) -> Levels:
    """Iterative magnitude pruning with rewinding to ``target``, resuming at the first level ``store`` lacks.

    References: Frankle and Carbin, "The Lottery Ticket Hypothesis: Finding
    Sparse, Trainable Neural Networks", ICLR 2019; Frankle, Dziugaite, Roy and
    Carbin, "Linear Mode Connectivity and the Lottery Ticket Hypothesis",
    ICML 2020 (rewinding to step ``k``).

    Args:
        build: Returns a fresh built model whose prunable layers are masked
            layers with all-ones masks and no schedule, at its initial values
            (the same values every call).
        fit: ``fit(model, level, variant, callbacks)`` compiles ``model`` with a
            fresh optimizer, trains it with ``callbacks`` added (the rewind
            snapshot) and returns :class:`Trained`. The loop seeds Keras with
            :func:`level_seed` just before.
        target: The last level's sparsity, in [0, 1).
        params: :class:`ImpParams`.
        store: Where the levels are (:class:`LevelStore`).
        scope: ``"layer"`` or ``"global"`` (:func:`prune.training.lottery.magnitude_masks`).
        seed: The run's seed (:func:`level_seed`).
        log: Writes one line of progress.
        progress: Called with every row so far after each level, finished
            before or now (e.g. to rewrite a table).

    Returns:
        :class:`Levels`.

    Raises:
        ValueError: bad arguments, a stored level made for another sparsity, or a
            record from ``store.read`` that is not a level record (not a dict, a key of
            :data:`LEVEL_KEYS` missing, ``rows`` not a non-empty list of rows with a
            ``status``), naming the store, the level and the key; raised before
            that level is trained or anything after it is written.
        TicketDiverged: a level's ticket diverged (the level is stored).
    """
    from prune.core import distributions
    from prune.training import lottery

    if not isinstance(params, ImpParams):
        raise TypeError(f"params must be an ImpParams, got {type(params).__name__}")
    if scope not in distributions.distributions():
        raise ValueError(f"scope must be one of {distributions.distributions()}, got {scope!r}")
    run = _Run(build, fit, seed, log)
    rows: list[dict[str, Any]] = []
    path = lottery.sparsity_path(target, params.rate, params.stops)
    record: dict[str, Any] = {}
    for level, sparsity in enumerate(path):
        record = _checked(store, level, store.read(level))
        if record is not None:
            if record["target_sparsity"] != sparsity:
                raise ValueError(
                    f"level {level} of {store} was made for sparsity {record['target_sparsity']!r}, this run asks "
                    f"{sparsity!r}; remove it to start over"
                )
            log(f"imp level {level} at sparsity {sparsity!r}: done before, skipped")
        else:
            _level(run, store, params, scope, level, sparsity)
            record = _checked(store, level, store.read(level))
            if record is None:
                raise RuntimeError(f"{store} did not keep level {level} it was given")
        rows.extend(record["rows"])
        if progress is not None:
            progress(list(rows))
        if record["rows"][0]["status"] == "diverged":
            raise TicketDiverged(level, record, rows)
    return Levels(rows, record, len(path) - 1)
