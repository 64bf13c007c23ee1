"""The results tables of a sweep, written by one process only.

``results/<sweep>/runs.csv`` has one row per run (:data:`RUN_COLUMNS`) and
``results/<sweep>/curves.csv`` the per-epoch curves in long format
(:data:`CURVE_COLUMNS`). Only the runner's main process writes them (workers
return their rows), so rows never interleave. Each run's rows go to disk as one
``write`` on an ``O_APPEND`` descriptor followed by ``fsync``: curves first, then
the run row, which is the commit mark. After a crash (``kill -9``),
:meth:`Store.open` drops a torn last line and any curves whose run has no row,
by rewriting the file atomically (temporary file + ``os.replace``), so a rerun
that redoes those runs leaves no duplicates.

Every file can be damaged, and :meth:`Store.open` repairs or names it, reading
through :mod:`experiments.tables` (types per column, text only, named errors):

* every ``runs.csv`` row is checked against its run's ``result.json``, which
  wins where they differ (a damaged cell, a duplicate); a row without one must
  pass :data:`experiments.tables.RUN_SCHEMA`, or is refused with a
  :class:`experiments.tables.TableError` naming the file, line and column;
* ``runs.csv`` empty or without its header line: rebuilt from its rows plus
  each run's ``result.json``;
* ``runs.csv`` lacking columns (say ``test_accuracy``, dropped by an editor):
  rebuilt from the runs' ``result.json`` when every row has one, with a warning
  naming the file and the columns (:attr:`Store.restored`); otherwise refused
  with a :class:`experiments.tables.TableError` naming the file, the columns
  and a row without a ``result.json``;
* ``curves.csv``: each run's points are exactly its ``result.json``'s; points of
  a run without one are checked, and duplicates that agree dropped;
* an IMP run's ``levels.csv``: rebuilt from its ``levels/NN/level.json`` files
  when it differs; a run whose levels nothing restores is redone.
* A ``result.json`` that cannot be read as a run's record: moved aside to
  ``result.json.corrupt`` and named in a warning; its run counts as missing and
  is redone, the others are unaffected.
* A ``runs.csv`` with another header (not written by this runner): refused with
  a :class:`ValueError` naming the file, since it may be someone's data.

:meth:`Store.read` applies the same reconciliation in memory only (for
``status``), so ``status`` counts what ``run`` acts on.

One writer per folder: :class:`experiments.lock.SweepLock` (``fcntl.flock`` on
``<sweep>/.lock``, which names the holder's host and pid; re-exported here).
"""

from __future__ import annotations

import csv
import errno
import io
import json
import math
import os
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from experiments import axes, tables
from experiments.config import RunConfig, config_hash
from experiments.lock import Locked, SweepLock
from experiments.tables import OPTIONAL_RUN_COLUMNS, TableError

__all__ = [
    "RUN_COLUMNS",
    "CURVE_COLUMNS",
    "LAYER_COLUMNS",
    "layer_rows",
    "STORAGE_ERRNOS",
    "CONFIG_COLUMNS",
    "Store",
    "config_columns",
    "atomic_write",
    "named_os_error",
    "read_result",
]

CONFIG_COLUMNS = [
    "run_id",
    "config_hash",
    "sweep",
    "implementation",
    "matmul",
    "dataset",
    "model",
    "target_sparsity",
    "pattern",
    "criterion",
    "distribution",
    "method",
    "output_layer",
    "schedule",
    "schedule_begin",
    "schedule_end",
    "schedule_unit",
    "schedule_frequency",
    "seed",
    "optimizer",
    "learning_rate",
    "epochs",
    "batch_size",
    "lr_decay",
    "weight_decay",
]
METRIC_COLUMNS = [
    "status",
    "error",
    # accuracy
    "test_accuracy",
    "test_loss",
    "train_accuracy",
    "train_loss",
    # on the validation split held out of the training set (DatasetConfig.validation), empty without one
    "val_accuracy",
    "val_loss",
    # sparsity (over the weights in sparsity_report.csv: kernels of Dense and Conv layers)
    "sparsity",
    "nnz",
    "size",
    "dense_flops",
    "nonzero_flops",
    "model_bytes",
    "checkpoint_bytes",
    "layer_sparsity",
    # speed
    "step_time_ms",
    "timed_steps",
    "latency_b1_ms",
    "latency_b256_ms",
    "peak_rss_mb",
    # cost of the run itself
    "startup_seconds",
    "fit_seconds",
    "eval_seconds",
    "total_seconds",
    "overhead_seconds",
    # provenance
    "git_commit",
    "git_dirty",
    "keras_impl",
    "tensorflow_version",
    "keras_version",
    "tf_keras_version",
    "tfmot_version",
    "numpy_version",
    "python_version",
    "cpu_model",
    # the kernels a sparse_tensor run ran on: "native <vector path>", or "tensorflow (fallback: <reason>)" when the
    # native library did not load, or "tensorflow" for matmul coo/csr (prune.native.kernel_label); and the native
    # build's instruction-set flags. Empty for the other implementations.
    "native_kernel",
    "native_flags",
    "intra_op_threads",
    "inter_op_threads",
    "worker_kind",
    "hostname",
    "pid",
    "started_at",
    "ended_at",
]
RUN_COLUMNS = CONFIG_COLUMNS + METRIC_COLUMNS
AXIS_COLUMNS = ("pattern", "criterion", "distribution", "method")
"""Added with the pattern, criterion and distribution axes, then the method axis. A ``runs.csv`` written
before them has every other column; its rows are read with the defaults those runs used (empty for dense)."""
AXIS_DEFAULTS = {"pattern": "unstructured", "criterion": "magnitude", "distribution": "layer", "method": "gmp"}
CURVE_COLUMNS = ["run_id", "epoch", "metric", "value"]
LAYER_COLUMNS = ["run_id", "layer", "weight", "sparsity"]
"""``layer_sparsity.csv``, the tidy long form of runs.csv's ``layer_sparsity`` cells (one row per run and weight).
Derived from runs.csv: written with each run and rebuilt whenever ``run`` opens the folder."""
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS})
"""``OSError`` numbers that mean the results cannot be written (not a fault of the run)."""


def config_columns(run: RunConfig, sweep: str) -> dict[str, Any]:
    """The config part of a run's row."""
    s = run.schedule
    impl = axes.IMPLEMENTATIONS.get(run.implementation.name)
    prunes = impl.prunes
    return dict(
        run_id=run.run_id,
        config_hash=config_hash(run),
        sweep=sweep,
        implementation=run.implementation.name,
        matmul=run.implementation.matmul if impl.takes_matmul else "",
        dataset=run.dataset.name,
        model=run.model.label,
        target_sparsity=run.sparsity,
        pattern=run.pattern.label if prunes else "",
        criterion=run.criterion_used if prunes else "",
        distribution=run.distribution if prunes else "",
        method=run.method.name if prunes else "",
        output_layer=run.output_layer if prunes else "",
        schedule=s.kind if s else "none",
        schedule_begin=s.begin if s else "",
        schedule_end=(s.end if s.kind != "one_shot" else s.begin) if s else "",
        schedule_unit=s.unit if s else "",
        schedule_frequency=s.frequency if s else "",
        seed=run.seed,
        optimizer=run.training.optimizer,
        learning_rate=run.training.learning_rate,
        epochs=run.training.epochs,
        batch_size=run.training.batch_size,
        lr_decay=run.training.lr_decay,
        weight_decay=run.training.weight_decay,
    )


def named_os_error(e: OSError, path: Path | str) -> OSError:
    """``e`` with ``path`` as its filename if it has none (a failed ``write`` or ``fsync`` names no file)."""
    if e.filename is not None or e.errno is None:
        return e
    named = type(e)(e.errno, e.strerror, str(path))
    named.__cause__ = e
    return named


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file and ``os.replace``.

    Raises:
        OSError: naming ``path`` (the temporary file is removed).
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", newline="") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as e:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise named_os_error(e, path) from None


def _csv_text(rows: Iterable[dict[str, Any]], columns: list[str], header: bool) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, extrasaction="raise", lineterminator="\n")
    if header:
        writer.writeheader()
    for row in rows:
        writer.writerow({k: _cell(row.get(k, "")) for k in columns})
    return buf.getvalue()


def layer_rows(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """:data:`LAYER_COLUMNS` rows of runs' ``layer_sparsity`` (a dict, or its JSON as runs.csv holds it).

    Raises:
        ValueError: a cell that is neither empty nor a JSON object of numbers, naming the run.
    """
    out = []
    for row in rows:
        cell = row.get("layer_sparsity", "")
        if cell in ("", None) or (isinstance(cell, float) and math.isnan(cell)):
            continue
        try:
            per = json.loads(cell) if isinstance(cell, str) else dict(cell)
            items = sorted((str(k), float(v)) for k, v in per.items())
        except (TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"run {row.get('run_id')!r}: layer_sparsity {cell!r} is not an object of numbers ({e})") from None
        for key, value in items:
            layer, _, weight = key.rpartition("/")
            out.append(dict(run_id=row["run_id"], layer=layer, weight=weight, sparsity=value))
    return out


def _cell(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return ""
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return value


def _row_cells(row: dict[str, Any]) -> dict[str, str]:
    """A result row as runs.csv cells; a row from before the axes gets their defaults (empty for dense)."""
    cells = {k: str(_cell(row.get(k, ""))) for k in RUN_COLUMNS}
    if row.get("implementation") != "dense":
        for c in AXIS_COLUMNS:
            if c not in row:
                cells[c] = AXIS_DEFAULTS[c]
    return cells


def _runner_header(header: list[str]) -> bool:
    """A header of this runner's columns only, each once: one it wrote, perhaps before some columns existed (the
    axes, the optional string columns), or one that has lost columns (:meth:`Store._missing_columns` names them,
    and restores them from the runs' ``result.json`` where it can)."""
    known = set(RUN_COLUMNS) | set(OPTIONAL_RUN_COLUMNS)
    return len(set(header)) == len(header) and set(header) <= known


def _hand_made(header: list[str]) -> bool:
    """A table ``figures`` may read although this runner did not write it: columns each once, with ``run_id`` or
    of this runner's only, so a first line of data is not taken for a header (:meth:`Store._missing_columns`
    then names any of :data:`tables.FIGURE_RUN_COLUMNS` it lacks)."""
    return len(set(header)) == len(header) and ("run_id" in header or _runner_header(header))


_NEEDED_RUN_COLUMNS = [c for c in RUN_COLUMNS if c not in AXIS_COLUMNS and c not in OPTIONAL_RUN_COLUMNS]
"""The runs.csv columns a table must have (the others have the defaults an older runner ran with)."""


def _parse(path: Path, columns: list[str], accept: Any = None) -> tuple[list[str], list[tuple[int, dict]], list, bool]:
    """``(header, rows, torn, damaged)`` of a table (see :func:`tables.split_rows`); a missing file has no rows.

    ``damaged``: empty (0 bytes), header line lost, or a torn last line.
    """
    text = tables.read_text(path)
    if not text:
        return columns, [], [], text == ""
    header, rows, torn = tables.split_rows(path, text, columns, accept)
    return header, rows, torn, bool(torn) or (bool(rows) and rows[0][0] == 1)


def _read_rows(path: Path, columns: list[str]) -> list[dict[str, str]]:
    """The complete rows of a table the runner already reconciled (for :meth:`Store.remove`)."""
    _, rows, _, _ = _parse(path, columns)
    return [r for _, r in rows if tables.row_problem(r, {}) is None]


def read_result(path: Path) -> dict[str, Any] | None:
    """A run's ``result.json`` record, or ``None`` if the file is absent.

    Raises:
        ValueError: the file exists but is not a complete record (truncated,
            not JSON, missing ``row``/``curves``); the message names the file.
    """
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return None
    try:
        record = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if (
        not isinstance(record, dict)
        or not isinstance(record.get("row"), dict)
        or not isinstance(record.get("curves"), list)
        or not isinstance(record["row"].get("run_id"), str)
        or not isinstance(record["row"].get("status"), str)
    ):
        raise ValueError(f"{path}: not a run record (expected an object with 'row' and 'curves')")
    if record["row"]["run_id"] != Path(path).parent.name:
        raise ValueError(f"{path}: holds run {record['row']['run_id']!r}, not {Path(path).parent.name!r}")
    return record


class Store:
    """The tables of one sweep directory; one instance, in one process, writes.

    Args:
        root: ``results/<sweep>``.
        hand_made: Read (never write) a ``runs.csv`` that this runner did not
            write, as long as it has :data:`experiments.tables.FIGURE_RUN_COLUMNS`
            (``figures`` reads such tables); its cells are checked all the same.

    Attributes (after :meth:`read` or :meth:`open`):
        rows: Rows by run_id, as runs.csv cells.
        header: runs.csv's columns (:data:`RUN_COLUMNS`, or a hand-made table's).
        curves: curves.csv's rows of those runs.
        warnings: Unreadable ``result.json`` files (moved aside by :meth:`open`).
        repairs: One line per cell, row or point restored from a ``result.json``
            (or dropped as a duplicate).
        restored: One line per column runs.csv lacked that every row's ``result.json``
            restored (the table is rebuilt from them): a warning, as the file lost data.
        lost: One line per row or point that was damaged and that no
            ``result.json`` restores (a torn last line): ``run`` redoes those
            runs, ``figures`` refuses.
    """

    def __init__(self, root: Path, hand_made: bool = False) -> None:
        self.root = Path(root)
        self.runs_path = self.root / "runs.csv"
        self.curves_path = self.root / "curves.csv"
        self.layers_path = self.root / "layer_sparsity.csv"
        self.hand_made = hand_made
        self.rows: dict[str, dict[str, str]] = {}
        self.header: list[str] = RUN_COLUMNS
        self.curves: list[dict[str, str]] = []
        self.warnings: list[str] = []
        self.repairs: list[str] = []
        self.lost: list[str] = []
        self.restored: list[str] = []
        self.corrupt: list[Path] = []
        self._records: dict[str, dict[str, Any]] = {}

    def _results(self) -> dict[str, dict[str, Any]]:
        """Every readable ``runs/*/result.json`` by run_id; unreadable ones go to :attr:`corrupt`."""
        records: dict[str, dict[str, Any]] = {}
        self.corrupt = []
        runs = self.root / "runs"
        if not runs.is_dir():
            return records
        for path in sorted(runs.glob("*/result.json")):
            try:
                record = read_result(path)
            except ValueError as e:
                self.corrupt.append(path)
                self.warnings.append(str(e))
                continue
            if record is not None:
                records[record["row"]["run_id"]] = record
        return records

    def _reconcile(self) -> tuple[dict[str, dict[str, str]], bool]:
        """runs.csv's rows, each checked against its run's ``result.json`` (which wins) or, without one, against
        :data:`experiments.tables.RUN_SCHEMA`; and whether the file must be rewritten."""
        path = self.runs_path
        header, rows, torn, dirty = _parse(path, RUN_COLUMNS, _hand_made if self.hand_made else _runner_header)
        self.header = header
        dirty |= header != RUN_COLUMNS
        self._records = self._results()
        missing = self._missing_columns(header, rows)
        unique: dict[str, dict[str, str]] = {}
        lines: dict[str, int] = {}
        for line, r in rows:
            run_id = r.get("run_id") or ""
            record = self._records.get(run_id)
            if record is not None:  # the run's own record is the truth: restore every cell that differs
                cells = _row_cells(record["row"])
                diff = [c for c in header if c in cells and r.get(c) != cells[c]]
                if diff or None in r:
                    shown = ", ".join(f"{c}={r.get(c)!r}" for c in diff[:3]) or "extra cells"
                    self.repairs.append(f"{path}: line {line} (run {run_id}): {shown} restored from its result.json")
                dirty |= bool(diff) or None in r or run_id in unique
                unique[run_id] = cells
                continue
            if not self.hand_made:
                for c in (*AXIS_COLUMNS, *OPTIONAL_RUN_COLUMNS):  # an older runner's table: the defaults it ran with
                    if c not in header:
                        r[c] = "" if c in OPTIONAL_RUN_COLUMNS or r.get("implementation") == "dense" else AXIS_DEFAULTS[c]
            problem = tables.row_problem(r, tables.RUN_SCHEMA)
            if problem:
                raise TableError(
                    f"{path}: line {line} (run {run_id!r}): {problem}; no {self.root / 'runs' / (run_id or '?') / 'result.json'} "
                    "to restore it from: fix or delete that line"
                )
            if run_id in unique:
                if unique[run_id] != r:
                    diff = [c for c in header if unique[run_id].get(c) != r.get(c)]
                    raise TableError(
                        f"{path}: lines {lines[run_id]} and {line} both hold run {run_id!r}, with different {diff[:4]}, and "
                        "no result.json says which is right: delete one of them"
                    )
                self.repairs.append(f"{path}: line {line} repeats line {lines[run_id]} (run {run_id}); dropped")
                dirty = True
                continue
            unique[run_id], lines[run_id] = r, line
        for line, cut in torn:
            run_id = cut.split(",", 1)[0]
            if run_id not in self._records:
                self.lost.append(f"{path}: line {line} is cut short ({cut[:40]!r}...) and no result.json restores it")
        for run_id, record in self._records.items():
            if run_id not in unique:  # finished, but the runner died (or runs.csv was lost) before its row
                unique[run_id] = _row_cells(record["row"])
                dirty = True
        if missing:  # every row came from its result.json, which has every column
            self.header = header + [c for c in RUN_COLUMNS if c not in header]
        return unique, dirty

    def _missing_columns(self, header: list[str], rows: list[tuple[int, dict[str, str]]]) -> list[str]:
        """The columns runs.csv needs and lacks (:data:`tables.FIGURE_RUN_COLUMNS` for a hand-made table), each
        restored from the runs' ``result.json`` (one line in :attr:`restored`) when every row has one.

        Raises:
            TableError: some row has no readable ``result.json``, naming the file, the columns and that row.
        """
        needed = tables.FIGURE_RUN_COLUMNS if self.hand_made else _NEEDED_RUN_COLUMNS
        missing = [c for c in needed if c not in header]
        if not missing:
            return []
        what = f"column {missing[0]!r}" if len(missing) == 1 else f"columns {missing}"
        if "run_id" in missing:
            raise TableError(
                f"{self.runs_path} lacks {what}, so its rows cannot be matched to their runs' result.json: put the "
                "column back, or move the file away (`run` then rebuilds it from the runs/<run_id>/result.json files)"
            )
        orphans = [(line, r.get("run_id") or "") for line, r in rows if (r.get("run_id") or "") not in self._records]
        if orphans:
            line, run_id = orphans[0]
            record = self.root / "runs" / (run_id or "?") / "result.json"
            why = f"{record} cannot be read" if record in self.corrupt else f"no {record}"
            raise TableError(
                f"{self.runs_path} lacks {what}, and {len(orphans)} of its {len(rows)} rows have no result.json to "
                f"restore it from (line {line}, run {run_id!r}: {why}): put the column back, or delete those rows "
                "(their runs are then redone)"
            )
        self.restored.append(
            f"{self.runs_path} lacked {what}: restored for its {len(rows)} rows from their runs/<run_id>/result.json"
        )
        return missing

    def _reconcile_curves(self, rows: dict[str, dict[str, str]]) -> tuple[list[dict[str, str]], bool]:
        """curves.csv's points of ``rows``' runs: a run with a ``result.json`` gets exactly its curves; points
        of other runs are checked against :data:`experiments.tables.CURVE_SCHEMA`, duplicates dropped."""
        path = self.curves_path
        _, curves, torn, dirty = _parse(path, CURVE_COLUMNS)
        by_run: dict[str, dict[tuple[str, str], dict[str, str]]] = {}
        lines: dict[tuple[str, str, str], int] = {}
        for line, c in curves:
            run_id = c.get("run_id") or ""
            if run_id not in rows:
                dirty = True  # orphan curves of a run without a row
                continue
            points = by_run.setdefault(run_id, {})
            key = (str(c.get("epoch")), str(c.get("metric")))
            if run_id not in self._records:
                problem = tables.row_problem(c, tables.CURVE_SCHEMA)
                if problem:
                    raise TableError(f"{path}: line {line} (run {run_id!r}): {problem}; no result.json to restore it from")
                if key in points and points[key] != c:
                    raise TableError(
                        f"{path}: lines {lines[(run_id, *key)]} and {line} give run {run_id!r} two values of {key[1]} "
                        f"at epoch {key[0]}, and no result.json says which is right: delete one of them"
                    )
            dirty |= key in points
            points[key] = c
            lines.setdefault((run_id, *key), line)
        for line, cut in torn:
            run_id = cut.split(",", 1)[0]
            if run_id in rows and run_id not in self._records:
                self.lost.append(f"{path}: line {line} is cut short ({cut[:40]!r}...) and no result.json restores it")
        out: list[dict[str, str]] = []
        for run_id in rows:
            have = by_run.get(run_id, {})
            record = self._records.get(run_id)
            if record is not None:
                want = {
                    (str(c.get("epoch")), str(c.get("metric"))): {k: str(_cell(c.get(k, ""))) for k in CURVE_COLUMNS}
                    for c in record["curves"]
                }
                if have != want:
                    if have:
                        self.repairs.append(f"{path}: the points of run {run_id} restored from its result.json")
                    dirty, have = True, want
            out.extend(have.values())
        return out, dirty

    def corrupt_ids(self) -> list[str]:
        """Run ids whose ``result.json`` could not be read."""
        return [p.parent.name for p in self.corrupt]

    def read(self) -> dict[str, dict[str, str]]:
        """Rows by run_id (and :attr:`curves`), as :meth:`open` would repair them, writing nothing (``status``, ``figures``).

        Raises:
            TableError: a table that is not ours, not text, or damaged where no ``result.json`` restores it;
                the message names the file, the line and the column.
        """
        self.warnings, self.repairs, self.lost, self.restored = [], [], [], []
        self.rows, _ = self._reconcile()
        self.curves, _ = self._reconcile_curves(self.rows)
        return self.rows

    def open(self) -> None:
        """Create the tables if missing and repair them after a crash or damage (see the module docstring).

        Raises:
            ValueError: ``runs.csv`` or ``curves.csv`` was not written by this runner.
            OSError: a file cannot be read or written.
        """
        if self.hand_made:
            raise ValueError("a Store reading a hand-made table writes nothing; use read()")
        self.root.mkdir(parents=True, exist_ok=True)
        self.warnings, self.repairs, self.lost, self.restored = [], [], [], []
        unique, dirty = self._reconcile()
        for path in self.corrupt:
            aside = path.with_name("result.json.corrupt")
            os.replace(path, aside)
            fate = "its row in runs.csv is kept" if path.parent.name in unique else "its run will be redone"
            self.warnings.append(f"moved {str(path)!r} aside to {aside.name!r}; {fate}")
        for run_id in self._check_levels(unique):
            del unique[run_id]
            dirty = True
        if dirty or not self.runs_path.exists():
            atomic_write(self.runs_path, _csv_text(unique.values(), RUN_COLUMNS, header=True))
        curves, cdirty = self._reconcile_curves(unique)
        if cdirty or not self.curves_path.exists():
            atomic_write(self.curves_path, _csv_text(curves, CURVE_COLUMNS, header=True))
        self.rows, self.curves, self.header = unique, curves, RUN_COLUMNS
        self._write_layers()

    def _write_layers(self) -> None:
        """Rewrite ``layer_sparsity.csv`` from the rows (it is derived, so whatever it held before is replaced)."""
        atomic_write(self.layers_path, _csv_text(layer_rows(self.rows.values()), LAYER_COLUMNS, header=True))

    def _check_levels(self, rows: dict[str, dict[str, str]]) -> list[str]:
        """Check every IMP run's ``levels.csv`` against its level folders and rewrite it where they restore it
        (:func:`experiments.tables.read_levels`). Returns the runs that nothing restores: their
        ``result.json`` is moved aside to ``result.json.redo``, so the run is redone, and
        :func:`experiments.imp_runs.train_imp` redoes the level whose ``level.json`` is damaged, and those after it."""
        redo = []
        for run_id, row in rows.items():
            run_dir = self.root / "runs" / run_id
            if row.get("method") != "imp" or not ((run_dir / "levels.csv").exists() or (run_dir / "levels").is_dir()):
                continue
            try:
                text, notes, rebuilt = tables.read_levels(run_dir)
            except TableError as e:
                result = run_dir / "result.json"
                if result.exists():
                    os.replace(result, result.with_name("result.json.redo"))
                self.warnings.append(f"{e}; run {run_id} will be redone from its first damaged level")
                redo.append(run_id)
                continue
            self.repairs.extend(notes)
            if rebuilt:
                atomic_write(run_dir / "levels.csv", text)
        return redo

    def _append(self, path: Path, text: str) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        try:
            data = text.encode()
            written = os.write(fd, data)
            while written < len(data):  # regular files write fully; be safe anyway
                written += os.write(fd, data[written:])
            os.fsync(fd)
        except OSError as e:
            raise named_os_error(e, path) from None
        finally:
            os.close(fd)

    def add(self, row: dict[str, Any], curves: list[dict[str, Any]]) -> None:
        """Append one run: its curves, then its row. A run already present is replaced atomically."""
        run_id = row["run_id"]
        if run_id in self.rows:
            self.remove([run_id])
        if curves:
            self._append(self.curves_path, _csv_text(curves, CURVE_COLUMNS, header=False))
        self._append(self.runs_path, _csv_text([row], RUN_COLUMNS, header=False))
        self.rows[run_id] = _row_cells(row)
        self._append(self.layers_path, _csv_text(layer_rows([row]), LAYER_COLUMNS, header=False))  # after the row:
        # a crash between the two leaves the row without its layers, and the next open rebuilds them

    def remove(self, run_ids: list[str]) -> None:
        """Drop runs (rows and curves), rewriting both files atomically."""
        drop = set(run_ids)
        self.rows = {k: v for k, v in self.rows.items() if k not in drop}
        atomic_write(self.runs_path, _csv_text(self.rows.values(), RUN_COLUMNS, header=True))
        curves = _read_rows(self.curves_path, CURVE_COLUMNS)
        atomic_write(self.curves_path, _csv_text([c for c in curves if c["run_id"] not in drop], CURVE_COLUMNS, True))
        self._write_layers()

    def frame(self) -> pd.DataFrame:
        """runs.csv as a DataFrame."""
        return pd.read_csv(self.runs_path) if self.runs_path.exists() else pd.DataFrame(columns=RUN_COLUMNS)
