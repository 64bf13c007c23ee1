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
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from experiments.config import RunConfig, config_hash

__all__ = ["RUN_COLUMNS", "CURVE_COLUMNS", "CONFIG_COLUMNS", "Store", "config_columns", "atomic_write"]

CONFIG_COLUMNS = [
    "run_id",
    "config_hash",
    "sweep",
    "implementation",
    "matmul",
    "dataset",
    "model",
    "target_sparsity",
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
]
METRIC_COLUMNS = [
    "status",
    "error",
    # accuracy
    "test_accuracy",
    "test_loss",
    "train_accuracy",
    "train_loss",
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
    "intra_op_threads",
    "inter_op_threads",
    "worker_kind",
    "hostname",
    "pid",
    "started_at",
    "ended_at",
]
RUN_COLUMNS = CONFIG_COLUMNS + METRIC_COLUMNS
CURVE_COLUMNS = ["run_id", "epoch", "metric", "value"]


def config_columns(run: RunConfig, sweep: str) -> dict[str, Any]:
    """The config part of a run's row."""
    s = run.schedule
    return dict(
        run_id=run.run_id,
        config_hash=config_hash(run),
        sweep=sweep,
        implementation=run.implementation.name,
        matmul=run.implementation.matmul if run.implementation.name == "sparse_tensor" else "",
        dataset=run.dataset.name,
        model=run.model.label,
        target_sparsity=run.sparsity,
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
    )


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file and ``os.replace``."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", newline="") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _csv_text(rows: Iterable[dict[str, Any]], columns: list[str], header: bool) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, extrasaction="raise", lineterminator="\n")
    if header:
        writer.writeheader()
    for row in rows:
        writer.writerow({k: _cell(row.get(k, "")) for k in columns})
    return buf.getvalue()


def _cell(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return ""
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return value


def _read_rows(path: Path, columns: list[str]) -> tuple[list[dict[str, str]], bool]:
    """Complete rows of a CSV we wrote, and whether anything had to be dropped."""
    if not path.exists():
        return [], False
    text = path.read_text()
    dropped = False
    if text and not text.endswith("\n"):  # torn last write
        text = text[: text.rfind("\n") + 1]
        dropped = True
    rows = list(csv.DictReader(io.StringIO(text)))
    if rows and rows[0].keys() and list(rows[0].keys()) != columns:
        raise ValueError(f"{path} has columns {list(rows[0].keys())}, expected {columns}; move it away")
    good = [r for r in rows if None not in r and all(r.get(c) is not None for c in columns)]
    return good, dropped or len(good) != len(rows)


class Store:
    """The tables of one sweep directory; one instance, in one process, writes.

    Args:
        root: ``results/<sweep>``.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.runs_path = self.root / "runs.csv"
        self.curves_path = self.root / "curves.csv"
        self.rows: dict[str, dict[str, str]] = {}

    def read(self) -> dict[str, dict[str, str]]:
        """Rows by run_id, read-only (for ``status``); a torn last line is ignored."""
        rows, _ = _read_rows(self.runs_path, RUN_COLUMNS)
        self.rows = {r["run_id"]: r for r in rows}
        return self.rows

    def open(self) -> None:
        """Create the tables if missing and repair them after a crash."""
        self.root.mkdir(parents=True, exist_ok=True)
        rows, dirty = _read_rows(self.runs_path, RUN_COLUMNS)
        unique: dict[str, dict[str, str]] = {}
        for r in rows:
            if r["run_id"] in unique:
                dirty = True
            unique[r["run_id"]] = r
        if dirty or not self.runs_path.exists():
            atomic_write(self.runs_path, _csv_text(unique.values(), RUN_COLUMNS, header=True))
        curves, cdirty = _read_rows(self.curves_path, CURVE_COLUMNS)
        kept = [c for c in curves if c["run_id"] in unique]
        if cdirty or len(kept) != len(curves) or not self.curves_path.exists():
            atomic_write(self.curves_path, _csv_text(kept, CURVE_COLUMNS, header=True))
        self.rows = unique

    def _append(self, path: Path, text: str) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        try:
            data = text.encode()
            written = os.write(fd, data)
            while written < len(data):  # regular files write fully; be safe anyway
                written += os.write(fd, data[written:])
            os.fsync(fd)
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
        self.rows[run_id] = {k: str(_cell(row.get(k, ""))) for k in RUN_COLUMNS}

    def remove(self, run_ids: list[str]) -> None:
        """Drop runs (rows and curves), rewriting both files atomically."""
        drop = set(run_ids)
        self.rows = {k: v for k, v in self.rows.items() if k not in drop}
        atomic_write(self.runs_path, _csv_text(self.rows.values(), RUN_COLUMNS, header=True))
        curves, _ = _read_rows(self.curves_path, CURVE_COLUMNS)
        atomic_write(self.curves_path, _csv_text([c for c in curves if c["run_id"] not in drop], CURVE_COLUMNS, True))

    def frame(self) -> pd.DataFrame:
        """runs.csv as a DataFrame."""
        return pd.read_csv(self.runs_path) if self.runs_path.exists() else pd.DataFrame(columns=RUN_COLUMNS)
