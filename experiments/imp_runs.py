"""Lottery tickets in the runner: the file-backed level store of :func:`prune.training.imp.train_levels`, and method ``imp``.

One run of method ``imp`` (Frankle and Carbin, ICLR 2019; Frankle et al.,
ICML 2020) trains ``1 + 3 (L - 1)`` networks of ``run.model`` on ``run.dataset``
with ``run.training``, each from a fresh optimizer:

* level 0: the dense network (all masks ones), from the run's initial weights
  (:func:`experiments.models.seeded_model`); the values after
  ``rewind_step`` steps (the initial weights for 0) are kept as the rewind point;
* level ``n > 0`` at sparsity ``path[n]`` (:func:`prune.training.lottery.sparsity_path`
  of ``run.sparsity``, ``rate`` and ``stops``):

  - ``ticket``: prune the level ``n - 1`` ticket's trained weights by
    magnitude (``run.distribution``: ``layer`` or ``global``), rewind the
    survivors to the rewind point, train;
  - ``reinit``: the ticket's mask, fresh initial values (:func:`prune.training.lottery.reinit_values`);
  - ``random``: a random mask with the ticket's per-layer counts
    (:func:`prune.training.lottery.random_masks`), the rewind point's values.

Each training is seeded from ``(run.seed, level, variant)``; the data order is
the run's (:func:`experiments.train.train`). Level ``n`` is written to
``run_dir/levels/NN/`` (the ticket's trained values and masks, the rewind
point at level 0, the rows) in a temporary folder renamed into place when the
level is complete, so a folder that exists is a finished level. A rerun skips
finished levels and starts at the first missing one; since every input of a
level is on disk and every training is seeded, the rows are identical to an
uninterrupted run's. ``run_dir/levels.csv`` is rewritten (atomically) after
every level.

The level loop is the library's (:func:`prune.training.imp.train_levels`, with the one
:class:`prune.training.imp.ImpParams`); this module owns the files (:class:`FileLevelStore`)
and says how the runner builds and trains a level's network. The run's result
(accuracy, sparsity report, latency, checkpoint) describes the ticket at the
last level, measured as every Keras 3 run is (:func:`experiments.train.measure_keras3`).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from experiments import axes
from experiments.config import RunConfig
from experiments.data import Data
from experiments.library_names import IMP_SCOPES
from experiments.library_names import imp as _imp
from experiments.models import seeded_model
from experiments.steps import steps_per_epoch
from experiments.store import atomic_write
from experiments.tables import LEVEL_COLUMNS, TableError, levels_text, read_level
from experiments.train import Diverged, TrainResult, make_optimizer, measure_keras3, train

__all__ = ["FileLevelStore", "train_imp", "train_method"]


def _check(run: RunConfig, params: _imp.ImpParams) -> None:
    """What a run must be for IMP, refused before any file is written."""
    if not isinstance(params, _imp.ImpParams):
        raise TypeError(f"params must be an ImpParams, got {type(params).__name__}")
    runs_on = axes.METHODS.get("imp").runs_on
    if run.implementation.name not in runs_on:
        raise ValueError(
            f"method 'imp' runs with implementation {' or '.join(map(repr, runs_on))} only (it rewinds masked weights), "
            f"got {run.implementation.name!r}"
        )
    if run.distribution not in IMP_SCOPES:
        raise ValueError(f"method 'imp' prunes with distribution 'layer' or 'global', got {run.distribution!r}")
    if run.pattern.name != "unstructured":
        raise ValueError(f"method 'imp' prunes single weights (pattern 'unstructured'), got {run.pattern.label!r}")
    if run.criterion != "magnitude":
        raise ValueError(f"method 'imp' prunes by magnitude (criterion 'magnitude'), got {run.criterion!r}")


# -- the levels on disk --------------------------------------------------------------


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _save_state(path: Path, values: Mapping[str, Any], masks: Mapping[str, Any]) -> None:
    arrays = {f"v:{k}": v for k, v in values.items()}
    arrays.update({f"m:{k}": m for k, m in masks.items()})
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)
        fh.flush()
        os.fsync(fh.fileno())


def _write_json(path: Path, payload: dict[str, Any]) -> None:
    with open(path, "w") as fh:
        json.dump(payload, fh, indent=1, sort_keys=True)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())


class FileLevelStore:
    """IMP's levels in ``levels/NN/`` folders (a :class:`prune.training.imp.LevelStore`).

    A level is written into a temporary folder (``level.json``, one ``.npz``
    per state: ``v:<path>`` values, ``m:<key>`` masks), fsynced, then renamed
    into place, so a folder that exists is a finished level; temporary folders
    left by a killed process are removed when the store is opened. A
    ``level.json`` that cannot be read (a half-written copy, a disk error) is
    logged by name, and its folder and every later one removed, so those
    levels are redone.

    Args:
        root: The ``levels`` folder (created).
        log: Writes one line to the run's log.
    """

    def __init__(self, root: Path, log: Callable[[str], None] = lambda line: None) -> None:
        self.root = Path(root)
        self.log = log
        self.root.mkdir(parents=True, exist_ok=True)
        for stale in self.root.glob(".*.tmp"):
            shutil.rmtree(stale, ignore_errors=True)

    def __str__(self) -> str:
        return str(self.root)

    def _folder(self, level: int) -> Path:
        return self.root / f"{level:02d}"

    def levels(self) -> list[int]:
        return sorted(int(p.name) for p in self.root.iterdir() if p.is_dir() and p.name.isdigit())

    def read(self, level: int) -> dict[str, Any] | None:
        if not self._folder(level).is_dir():
            return None
        try:
            return read_level(self._folder(level) / "level.json")
        except TableError as e:
            self.log(f"imp level {level}: {e}; redoing level {level} and the levels after it")
            for n in self.levels():
                if n >= level:
                    shutil.rmtree(self._folder(n))
            return None

    def state(self, level: int, name: str) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        with np.load(self._folder(level) / f"{name}.npz") as z:
            values = {k[2:]: z[k] for k in z.files if k.startswith("v:")}
            masks = {k[2:]: z[k] for k in z.files if k.startswith("m:")}
        return values, masks

    def write(self, level: int, record: dict[str, Any], states: Mapping[str, tuple[Mapping[str, Any], Mapping[str, Any]]]) -> None:
        tmp = self.root / f".{level:02d}.{os.getpid()}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for name, (values, masks) in states.items():
            _save_state(tmp / f"{name}.npz", values, masks)
        _write_json(tmp / "level.json", record)
        _fsync_dir(tmp)
        os.replace(tmp, self._folder(level))
        _fsync_dir(self.root)


# -- one training, as the runner trains --------------------------------------------------------------


def _masked_model(run: RunConfig, data: Data) -> tuple[Any, dict[str, float]]:
    """The run's model with all-ones masks and no schedule (the masks are fixed within a level)."""
    import keras

    import prune

    plain, positions = seeded_model(run, data, keras)
    from experiments.implementations import output_policy

    model = prune.prune_low_magnitude(plain, prune.ConstantSparsity(0.0, 0), seed=run.seed, **output_policy(run, plain))
    for layer in prune.prunable_layers(model):
        layer.pruning_schedule = None
    return model, positions


def _fit(run: RunConfig, data: Data, log: Callable[[str], None]) -> Callable[..., Any]:
    """``fit`` for :func:`prune.training.imp.train_levels`: :func:`experiments.train.train`, the run's optimizer and data order."""
    import keras

    spe = steps_per_epoch(len(data.x_train), run.training.batch_size)

    def fit(model: Any, level: int, variant: str, callbacks: list[Any]) -> Any:
        model.compile(make_optimizer(run.training, keras, spe), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
        status = "ok"
        try:
            r = train(model, data, run, keras, callbacks, log)
        except Diverged as e:
            status = "diverged"
            r = TrainResult(e.curves, [], float("nan"), float("nan"), e.final, model)
        f = r.final
        metrics = {k: f.get(k, float("nan")) for k in ("test_accuracy", "test_loss", "train_accuracy", "train_loss")}
        record = dict(
            final=r.final,
            curves=[list(c) for c in r.curves],
            step_times=r.step_times,
            fit_seconds=r.fit_seconds,
            eval_seconds=r.eval_seconds,
        )
        return _imp.Trained(status, metrics, record)

    return fit


def _curves(record: dict[str, Any]) -> list[tuple[int, str, float]]:
    return [(int(e), str(m), float(v)) for e, m, v in record["ticket"]["curves"]]


def train_imp(run: RunConfig, data: Data, run_dir: Path, log: Callable[[str], None], params: _imp.ImpParams) -> dict[str, Any]:
    """Run method ``imp`` for ``run`` (:func:`prune.training.imp.train_levels`), resuming at the first unfinished level.

    Args:
        run: Uses ``sparsity`` (the last level), ``seed``, ``training``,
            ``model``, ``dataset`` and ``distribution`` (``layer`` or
            ``global``); needs implementation ``masked``. Its schedule is not used.
        data: The loaded dataset.
        run_dir: The run's folder; levels go to ``run_dir/levels/``, the
            table to ``run_dir/levels.csv`` (rewritten atomically after every level).
        log: Writes one line to the run's log.
        params: :class:`prune.training.imp.ImpParams`.

    Returns:
        The keys of :func:`experiments.implementations.train_keras3`'s result,
        describing the ticket at the last level, plus ``levels`` (the rows of
        ``levels.csv`` as dicts).

    Raises:
        ValueError: a run or parameters IMP cannot run, before anything is written.
        Diverged: the ticket of some level diverged (its level is kept on disk).
    """
    import keras

    import prune
    from prune.training import lottery

    _check(run, params)
    spe = steps_per_epoch(len(data.x_train), run.training.batch_size)
    total_steps = run.training.epochs * spe
    if params.rewind_step > total_steps:
        raise ValueError(f"rewind_step must be at most the {total_steps} steps of level-0 training, got {params.rewind_step}")
    run_dir = Path(run_dir)
    store = FileLevelStore(run_dir / "levels", log)
    try:
        done = _imp.train_levels(
            lambda: _masked_model(run, data)[0],
            _fit(run, data, log),
            run.sparsity,
            params,
            store,
            scope=run.distribution,
            seed=run.seed,
            log=log,
            progress=lambda rows: atomic_write(run_dir / "levels.csv", levels_text(rows)),
        )
    except _imp.TicketDiverged as e:
        curves = _curves(e.record)
        raise Diverged(str(e), curves, e.record["ticket"]["final"], max([c[0] for c in curves] or [0])) from None

    # The ticket at the last level, measured as every Keras 3 run is.
    t = done.record["ticket"]
    values, masks = store.state(done.level, "ticket")
    model, positions = _masked_model(run, data)
    lottery.rewind(model, values, masks)
    model.compile(make_optimizer(run.training, keras, spe), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    result = TrainResult(_curves(done.record), list(t["step_times"]), t["fit_seconds"], t["eval_seconds"], t["final"], model)
    out = measure_keras3(
        result, model, prune.strip_pruning(model), positions, "pruned", data.x_test, run_dir / "checkpoint.weights.h5"
    )
    out["levels"] = done.rows
    return out


def train_method(run: RunConfig, data: Data, run_dir: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """``imp``'s ``train`` entry of :data:`experiments.axes.METHODS`: :func:`train_imp` with the run's own parameters."""
    return train_imp(run, data, Path(run_dir), log, run.method.params)
