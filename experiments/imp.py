"""Lottery tickets in the runner: iterative magnitude pruning with rewinding, as resumable levels.

One run of method ``imp`` (Frankle and Carbin, ICLR 2019; Frankle et al.,
ICML 2020) trains ``1 + 3 (L - 1)`` networks of ``run.model`` on ``run.dataset``
with ``run.training``, each from a fresh optimizer:

* level 0: the dense network (all masks ones), from the run's initial weights
  (:func:`experiments.models.seeded_model`); the values after
  ``rewind_step`` steps (the initial weights for 0) are kept as the rewind point;
* level ``n > 0`` at sparsity ``path[n]`` (:func:`prune.lottery.sparsity_path`
  of ``run.sparsity``, ``rate`` and ``stops``):

  - ``ticket``: prune the level ``n - 1`` ticket's trained weights by
    magnitude (``run.distribution``: ``layer`` or ``global``), rewind the
    survivors to the rewind point, train;
  - ``reinit``: the ticket's mask, fresh initial values (:func:`prune.lottery.reinit_values`);
  - ``random``: a random mask with the ticket's per-layer counts
    (:func:`prune.lottery.random_masks`), the rewind point's values.

Each training is seeded from ``(run.seed, level, variant)``; the data order is
the run's (:func:`experiments.train.train`). Level ``n`` is written to
``run_dir/levels/NN/`` (the ticket's trained values and masks, the rewind
point at level 0, the rows) in a temporary folder renamed into place when the
level is complete, so a folder that exists is a finished level. A rerun skips
finished levels and starts at the first missing one; since every input of a
level is on disk and every training is seeded, the rows are identical to an
uninterrupted run's. ``run_dir/levels.csv`` is rewritten (atomically) after
every level.

The run's result (accuracy, sparsity report, latency, checkpoint) describes
the ticket at the last level, measured as :func:`experiments.implementations.train_keras3`
measures a masked run.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import zlib
from pathlib import Path
from typing import Any, Callable

import numpy as np

from experiments.config import RunConfig
from experiments.data import Data
from experiments.models import seeded_model
from experiments.store import atomic_write
from experiments.tables import LEVEL_COLUMNS, TableError, levels_text, read_level
from experiments.train import Diverged, TrainResult, make_optimizer, run_outcome, steps_per_epoch, train, weight_report

__all__ = ["ImpParams", "CONTROLS", "LEVEL_COLUMNS", "train_imp", "level_seed"]

CONTROLS = ("reinit", "random")
VARIANTS = ("ticket", *CONTROLS)


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
            ``"random"`` (random mask with the ticket's per-layer counts).
        stops: Sparsities no level may jump past; each is reached exactly
            (the run's sparsity is always the last level).
    """

    rate: float = 0.2
    rewind_step: int = 0
    controls: tuple[str, ...] = CONTROLS
    stops: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        r = self.rate
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(r) or not 0.0 < r < 1.0:
            raise ValueError(f"rate must be a number in (0, 1), got {r!r}")
        k = self.rewind_step
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(f"rewind_step must be an integer >= 0, got {k!r}")
        if isinstance(self.controls, str) or not isinstance(self.controls, (tuple, list)):
            raise ValueError(f"controls must be a list of {list(CONTROLS)}, got {self.controls!r}")
        bad = [c for c in self.controls if c not in CONTROLS]
        if bad or len(set(self.controls)) != len(self.controls):
            raise ValueError(f"controls must be distinct names from {list(CONTROLS)}, got {list(self.controls)!r}")
        if isinstance(self.stops, str) or not isinstance(self.stops, (tuple, list)):
            raise ValueError(f"stops must be a list of sparsities in (0, 1), got {self.stops!r}")
        for i, s in enumerate(self.stops):
            if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s) or not 0.0 < s < 1.0:
                raise ValueError(f"stops[{i}] must be a sparsity in (0, 1), got {s!r}")
        object.__setattr__(self, "controls", tuple(self.controls))
        object.__setattr__(self, "stops", tuple(float(s) for s in self.stops))


def level_seed(seed: int, level: int, variant: str) -> int:
    """The seed of one training, from ``(run seed, level, variant)`` only (so resumed levels are identical)."""
    rng = np.random.default_rng([int(seed), int(level), zlib.crc32(variant.encode())])
    return int(rng.integers(2**31 - 1))


def _check(run: RunConfig, params: ImpParams) -> list[float]:
    """Everything that can be refused, before any file is written; returns the level sparsities."""
    from prune.lottery import sparsity_path

    if not isinstance(params, ImpParams):
        raise TypeError(f"params must be an ImpParams, got {type(params).__name__}")
    if run.implementation.name != "masked":
        raise ValueError(
            f"method 'imp' runs with implementation 'masked' only (it rewinds masked weights), got {run.implementation.name!r}"
        )
    if run.distribution not in ("layer", "global"):
        raise ValueError(f"method 'imp' prunes with distribution 'layer' or 'global', got {run.distribution!r}")
    if run.pattern.name != "unstructured":
        raise ValueError(f"method 'imp' prunes single weights (pattern 'unstructured'), got {run.pattern.label!r}")
    if run.criterion != "magnitude":
        raise ValueError(f"method 'imp' prunes by magnitude (criterion 'magnitude'), got {run.criterion!r}")
    return sparsity_path(run.sparsity, params.rate, params.stops)


# -- one training ----------------------------------------------------------------------


def _masked_model(run: RunConfig, data: Data) -> tuple[Any, dict[str, float]]:
    """The run's model with all-ones masks and no schedule (the masks are fixed within a level)."""
    import keras

    import prune

    plain, positions = seeded_model(run, data, keras)
    model = prune.prune_low_magnitude(plain, prune.ConstantSparsity(0.0, 0), seed=run.seed)
    for layer in prune.prunable_layers(model):
        layer.pruning_schedule = None
    return model, positions


def _measured_sparsity(model: Any) -> float:
    import prune

    nnz = size = 0
    for layer in prune.prunable_layers(model):
        for name in layer.prunable_weight_names:
            value = np.asarray(layer.masked_weight(name))
            nnz += int(np.count_nonzero(value))
            size += int(value.size)
    return 1.0 - nnz / size if size else 0.0


def _save_state(path: Path, values: dict[str, np.ndarray], masks: dict[str, np.ndarray]) -> None:
    arrays = {f"v:{k}": v for k, v in values.items()}
    arrays.update({f"m:{k}": m for k, m in masks.items()})
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)
        fh.flush()
        os.fsync(fh.fileno())


def _load_state(path: Path) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    with np.load(path) as z:
        values = {k[2:]: z[k] for k in z.files if k.startswith("v:")}
        masks = {k[2:]: z[k] for k in z.files if k.startswith("m:")}
    return values, masks


class _Training:
    """One training of one variant at one level; the trained model and what was measured."""

    def __init__(
        self,
        run: RunConfig,
        data: Data,
        log: Callable[[str], None],
        level: int,
        variant: str,
        values: dict[str, np.ndarray] | None,
        masks: dict[str, np.ndarray] | None,
        snapshot_step: int | None = None,
    ) -> None:
        import keras

        from prune import lottery

        model, self.positions = _masked_model(run, data)
        if values is not None:
            lottery.rewind(model, values, masks)
        keras.utils.set_random_seed(level_seed(run.seed, level, variant))
        model.compile(make_optimizer(run.training, keras), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
        callbacks = []
        self.snapshot = lottery.snapshot(model) if snapshot_step == 0 else None
        if snapshot_step:
            callbacks.append(_snapshot_at(keras, snapshot_step, self))
        log(f"imp level {level} {variant}: training at sparsity {_measured_sparsity(model):.6f}")
        self.status = "ok"
        try:
            self.result = train(model, data, run, keras, callbacks, log)
        except Diverged as e:
            self.status = "diverged"
            self.result = TrainResult(e.curves, [], float("nan"), float("nan"), e.final, model)
        self.model = model
        self.sparsity = _measured_sparsity(model)

    def row(self, level: int, variant: str) -> dict[str, Any]:
        f = self.result.final
        return dict(
            level=level,
            variant=variant,
            sparsity=self.sparsity,
            remaining=1.0 - self.sparsity,
            test_accuracy=f.get("test_accuracy", float("nan")),
            test_loss=f.get("test_loss", float("nan")),
            train_accuracy=f.get("train_accuracy", float("nan")),
            train_loss=f.get("train_loss", float("nan")),
            status=self.status,
        )


def _snapshot_at(keras: Any, step: int, owner: _Training) -> Any:
    from prune import lottery

    class SnapshotAt(keras.callbacks.Callback):
        """Copies the trainable variables after ``step`` training steps (across ``fit`` calls)."""

        def __init__(self) -> None:
            super().__init__()
            self.steps = 0

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            self.steps += 1
            if self.steps == step:
                owner.snapshot = lottery.snapshot(self.model)

    return SnapshotAt()


# -- the levels on disk --------------------------------------------------------------


def _commit_level(levels: Path, level: int, files: Callable[[Path], None]) -> Path:
    """Write a level's files into a temporary folder, fsync, then rename it to ``levels/NN``."""
    final = levels / f"{level:02d}"
    tmp = levels / f".{level:02d}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    files(tmp)
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, final)
    fd = os.open(levels, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return final


def _write_json(path: Path, payload: dict[str, Any]) -> None:
    with open(path, "w") as fh:
        json.dump(payload, fh, indent=1, sort_keys=True)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())


def _run_level(
    run: RunConfig, data: Data, log: Callable[[str], None], params: ImpParams, levels: Path, level: int, sparsity: float
) -> None:
    from prune import lottery

    if level == 0:
        ticket = _Training(run, data, log, 0, "ticket", None, None, snapshot_step=params.rewind_step)
        rewind_values = ticket.snapshot  # None only if training diverged before rewind_step
        trainings = {"ticket": ticket}
    else:
        rewind_values, _ = _load_state(levels / "00" / "rewind.npz")
        previous, previous_masks = _load_state(levels / f"{level - 1:02d}" / "ticket.npz")
        model, _ = _masked_model(run, data)
        lottery.rewind(model, previous, previous_masks)
        keep = lottery.magnitude_masks(model, sparsity, scope=run.distribution)
        trainings = {"ticket": _Training(run, data, log, level, "ticket", rewind_values, keep)}
        for variant in params.controls:
            seed = level_seed(run.seed, level, variant)
            if variant == "reinit":
                values, masks = lottery.reinit_values(model, seed), keep
            else:
                values, masks = rewind_values, lottery.random_masks(keep, seed)
            trainings[variant] = _Training(run, data, log, level, variant, values, masks)
    ticket = trainings["ticket"]
    rows = [trainings[v].row(level, v) for v in VARIANTS if v in trainings]
    r = ticket.result
    record = dict(
        rows=rows,
        target_sparsity=sparsity,
        ticket=dict(
            final=r.final,
            curves=[list(c) for c in r.curves],
            step_times=r.step_times,
            fit_seconds=r.fit_seconds,
            eval_seconds=r.eval_seconds,
        ),
    )

    def files(tmp: Path) -> None:
        if ticket.status == "ok":
            _save_state(tmp / "ticket.npz", lottery.snapshot(ticket.model), lottery.current_masks(ticket.model))
        if level == 0 and rewind_values is not None:
            _save_state(tmp / "rewind.npz", rewind_values, {})
        _write_json(tmp / "level.json", record)

    _commit_level(levels, level, files)


def _read_level(levels: Path, level: int) -> dict[str, Any]:
    return read_level(levels / f"{level:02d}" / "level.json")


def _finished_level(levels: Path, level: int, log: Callable[[str], None]) -> dict[str, Any] | None:
    """Level ``level``'s record if its folder is complete; a damaged ``level.json`` (a half-written copy, a
    disk error) is logged by name, and its folder and every later one removed, so those levels are redone."""
    if not (levels / f"{level:02d}").is_dir():
        return None
    try:
        return _read_level(levels, level)
    except TableError as e:
        log(f"imp level {level}: {e}; redoing level {level} and the levels after it")
        for folder in sorted(levels.iterdir()):
            if folder.is_dir() and folder.name.isdigit() and int(folder.name) >= level:
                shutil.rmtree(folder)
        return None


def train_imp(run: RunConfig, data: Data, run_dir: Path, log: Callable[[str], None], params: ImpParams) -> dict[str, Any]:
    """Run iterative magnitude pruning with rewinding for ``run``, resuming at the first unfinished level.

    References: Frankle and Carbin, "The Lottery Ticket Hypothesis: Finding
    Sparse, Trainable Neural Networks", ICLR 2019; Frankle, Dziugaite, Roy and
    Carbin, "Linear Mode Connectivity and the Lottery Ticket Hypothesis",
    ICML 2020 (rewinding to step ``k``).

    Args:
        run: Uses ``sparsity`` (the last level), ``seed``, ``training``,
            ``model``, ``dataset`` and ``distribution`` (``layer`` or
            ``global``); needs implementation ``masked``. Its schedule is not used.
        data: The loaded dataset.
        run_dir: The run's folder; levels go to ``run_dir/levels/``, the
            table to ``run_dir/levels.csv``.
        log: Writes one line to the run's log.
        params: :class:`ImpParams`.

    Returns:
        The keys of :func:`experiments.implementations.train_keras3`'s result,
        describing the ticket at the last level, plus ``levels`` (the rows of
        ``levels.csv`` as dicts).

    Raises:
        ValueError: a run or parameters IMP cannot run, before anything is written.
        Diverged: the ticket of some level diverged (its level is kept on disk).
    """
    import keras
    import tensorflow as tf

    import prune
    from experiments.implementations import _kernels, _variable_bytes
    from prune import lottery

    path = _check(run, params)
    total_steps = run.training.epochs * steps_per_epoch(len(data.x_train), run.training.batch_size)
    if params.rewind_step > total_steps:
        raise ValueError(f"rewind_step must be at most the {total_steps} steps of level-0 training, got {params.rewind_step}")
    levels = Path(run_dir) / "levels"
    levels.mkdir(parents=True, exist_ok=True)
    for stale in levels.glob(".*.tmp"):
        shutil.rmtree(stale, ignore_errors=True)
    rows: list[dict[str, Any]] = []
    for level, sparsity in enumerate(path):
        record = _finished_level(levels, level, log)
        if record is not None:
            if record["target_sparsity"] != sparsity:
                raise ValueError(
                    f"{levels / f'{level:02d}'} was made for sparsity {record['target_sparsity']!r}, this run asks "
                    f"{sparsity!r}; remove {levels} to start over"
                )
            log(f"imp level {level} at sparsity {sparsity!r}: done before, skipped")
        else:
            _run_level(run, data, log, params, levels, level, sparsity)
            record = _read_level(levels, level)
        rows.extend(record["rows"])
        atomic_write(Path(run_dir) / "levels.csv", levels_text(rows))
        t = record["ticket"]
        curves = [(int(e), str(m), float(v)) for e, m, v in t["curves"]]
        if record["rows"][0]["status"] == "diverged":
            raise Diverged(f"imp ticket diverged at level {level}", curves, t["final"], max([c[0] for c in curves] or [0]))

    # The ticket at the last level, measured as train_keras3 measures a masked run.
    values, masks = _load_state(levels / f"{len(path) - 1:02d}" / "ticket.npz")
    model, positions = _masked_model(run, data)
    lottery.rewind(model, values, masks)
    model.compile(make_optimizer(run.training, keras), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    result = TrainResult(curves, list(t["step_times"]), t["fit_seconds"], t["eval_seconds"], t["final"], model)
    kernels = _kernels(prune.strip_pruning(model))
    report = weight_report(
        [(layer, w, value, positions.get(layer, 1.0), "pruned") for layer, ws in kernels.items() for w, value in ws]
    )
    predict = tf.function(lambda x: model(x, training=False), reduce_retracing=True)
    out = run_outcome(
        result, report, predict, data.x_test, model, Path(run_dir) / "checkpoint.weights.h5", _variable_bytes(model), "keras"
    )
    out["kernels"] = {layer: ws[0][1] for layer, ws in kernels.items()}
    out["levels"] = rows
    return out
