"""One reader for every table of a sweep, with a schema: nothing averaged or dropped silently.

``run``, ``status``, ``figures`` and the notebooks read a sweep's tables through
this module (``runs.csv`` and ``curves.csv`` via :class:`experiments.store.Store`,
which adds the repair from each run's ``result.json``; an IMP run's
``levels.csv`` and a SET/RigL run's ``mask_updates.csv`` here). What it checks:

* the file is text: a 0-byte file, NUL bytes or bytes that are not UTF-8 are
  named with the file (and the byte offset);
* the header: the columns the reader needs (a table this runner wrote, or for
  ``figures`` a hand-made one with at least :data:`FIGURE_RUN_COLUMNS`);
* every cell against the column's type (:data:`RUN_SCHEMA`, :data:`CURVE_SCHEMA`,
  :data:`LEVEL_SCHEMA`, :data:`MASK_UPDATE_SCHEMA`): ``int``, ``float``,
  ``bool`` or ``str``, and whether it may be empty; an ``ok`` run needs a
  ``test_accuracy``;
* duplicates by key (``run_id``; ``run_id, epoch, metric``): identical copies
  are dropped, copies that differ are a conflict.

What a run's ``result.json`` (or an IMP run's ``levels/NN/level.json``) holds
is restored from it; what nothing can restore is refused with a
:class:`TableError` naming the file, the line and the column. Optional string
columns the runner may add (:data:`OPTIONAL_RUN_COLUMNS`) may be absent from
older tables.

Nothing here imports TensorFlow or pandas: the runner's main process reads
the tables before any run starts.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import re
from pathlib import Path
from typing import Any, Iterable

__all__ = [
    "TableError",
    "Column",
    "RUN_SCHEMA",
    "CURVE_SCHEMA",
    "LEVEL_COLUMNS",
    "LEVEL_SCHEMA",
    "MASK_UPDATE_COLUMNS",
    "MASK_UPDATE_SCHEMA",
    "OPTIONAL_RUN_COLUMNS",
    "FIGURE_RUN_COLUMNS",
    "read_text",
    "split_rows",
    "header_difference",
    "row_problem",
    "levels_text",
    "read_levels",
    "read_mask_updates",
]


class TableError(ValueError):
    """A table that cannot be read or restored; the message names the file, and the line and column where one is at fault."""


@dataclasses.dataclass(frozen=True)
class Column:
    """The type of one column: ``kind`` is ``"str"``, ``"int"``, ``"float"`` or ``"bool"``; ``required``: never empty."""

    kind: str = "str"
    required: bool = False


_INT = ("seed", "epochs", "batch_size", "nnz", "size", "timed_steps", "schedule_frequency", "intra_op_threads",
        "inter_op_threads", "pid")
_FLOAT = ("target_sparsity", "learning_rate", "schedule_begin", "schedule_end", "test_accuracy", "test_loss",
          "train_accuracy", "train_loss", "sparsity", "dense_flops", "nonzero_flops", "model_bytes", "checkpoint_bytes",
          "step_time_ms", "latency_b1_ms", "latency_b256_ms", "peak_rss_mb", "startup_seconds", "fit_seconds",
          "eval_seconds", "total_seconds", "overhead_seconds", "val_accuracy", "val_loss", "weight_decay")
RUN_SCHEMA: dict[str, Column] = {
    **{c: Column("int") for c in _INT},
    **{c: Column("float") for c in _FLOAT},
    "git_dirty": Column("bool"),
    "run_id": Column("str", True),
    "implementation": Column("str", True),
    "status": Column("status", True),
    "seed": Column("int", True),
}
"""Types of the runs.csv columns; a column not listed is a string that may be empty."""
OPTIONAL_RUN_COLUMNS = {"native_kernel": "", "native_flags": "", "val_accuracy": "", "val_loss": "", "output_layer": "",
                        "lr_decay": "", "weight_decay": ""}
"""Columns the runner may write (``sparse_tensor`` runs: which kernel ran, with which build flags; runs with a
validation split: its final accuracy and loss; ``output_layer``, empty before it existed: ``pruned``; ``lr_decay``
and ``weight_decay``, empty before they existed: ``constant`` and 0); a table without them is complete, and gets
them empty."""
RUN_STATUSES = ("ok", "diverged", "failed")
FIGURE_RUN_COLUMNS = ["run_id", "implementation", "matmul", "target_sparsity", "seed", "status", "test_accuracy"]
"""The columns ``figures`` needs in a runs.csv it did not get from this runner (a hand-made table)."""
CURVE_SCHEMA: dict[str, Column] = {
    "run_id": Column("str", True), "epoch": Column("int", True), "metric": Column("str", True), "value": Column("float"),
}
LEVEL_COLUMNS = ["level", "variant", "sparsity", "remaining", "test_accuracy", "test_loss", "train_accuracy", "train_loss",
                 "status"]
LEVEL_SCHEMA: dict[str, Column] = {
    "level": Column("int", True), "variant": Column("str", True), "sparsity": Column("float", True),
    "remaining": Column("float", True), "test_accuracy": Column("float"), "test_loss": Column("float"),
    "train_accuracy": Column("float"), "train_loss": Column("float"), "status": Column("status", True),
}
MASK_UPDATE_COLUMNS = ["step", "key", "live", "dropped", "grown", "changed_fraction"]
MASK_UPDATE_SCHEMA: dict[str, Column] = {
    "step": Column("int", True), "key": Column("str", True), "live": Column("int", True),
    "dropped": Column("int", True), "grown": Column("int", True), "changed_fraction": Column("float", True),
}
_KIND_NAMES = {"int": "an integer", "float": "a number", "bool": "True or False", "status": f"one of {list(RUN_STATUSES)}"}


def read_text(path: Path) -> str | None:
    """The text of a table, or ``None`` if the file does not exist.

    Raises:
        TableError: the file holds NUL bytes or bytes that are not UTF-8 (a
            binary file), naming it and the offset.
    """
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return None
    nul = data.find(b"\x00")
    if nul >= 0:
        raise TableError(f"{path}: not a CSV table: a NUL byte at offset {nul} (a binary file?)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TableError(f"{path}: not a CSV table: byte {data[e.start]:#04x} at offset {e.start} is not UTF-8") from None


def split_rows(
    path: Path, text: str, columns: list[str], accept: Any = None
) -> tuple[list[str], list[tuple[int, dict[str, str]]], list[tuple[int, str]]]:
    """The header and rows of a CSV table's text, with their line numbers.

    Args:
        path: For messages.
        text: The file's text (not empty).
        columns: The columns this runner writes, in order.
        accept: ``accept(header) -> bool``: a header other than ``columns`` that is
            still readable (an older runner's, a hand-made table's); default none.

    Returns:
        ``(header, rows, torn)``: rows as ``(line, {column: cell})``, a row
        with too few or too many cells having ``None`` for the missing ones
        (:func:`row_problem` names them); ``torn`` the last line, if it lacks
        its newline (a write cut short), as ``(line, text)``, not in ``rows``.
        A file whose header line is missing (its first line is a row of
        ``columns``' width) gets ``columns`` as its header.

    Raises:
        TableError: a header that is neither ``columns`` nor accepted.
    """
    torn: list[tuple[int, str]] = []
    if not text.endswith("\n"):
        cut = text.rfind("\n") + 1
        torn = [(text.count("\n") + 1, text[cut:])]
        text = text[:cut]
    lines = text.splitlines(keepends=True)
    first = next(csv.reader(lines[:1]), [])
    body, start = lines[1:], 2
    if first == columns or (first and accept is not None and accept(first)):
        header = first
    elif len(first) == len(columns) and first[0] != columns[0]:  # header line lost: rows only
        header, body, start = columns, lines, 1
    elif not first and torn:  # only a torn first line
        header, body = columns, []
    else:
        raise TableError(f"{path} has columns {_shown(first)}, {header_difference(first, columns)}: "
                         "it was not written by this runner (or by another version of it); move it away")
    rows = []
    for i, cells in enumerate(csv.reader(body)):
        line = start + i
        if not cells:
            continue
        row: dict[str, Any] = dict(zip(header, cells))
        for c in header[len(cells):]:
            row[c] = None
        if len(cells) > len(header):
            row[None] = cells[len(header):]
        rows.append((line, row))
    return header, rows, torn


def _shown(names: list[str], limit: int = 6) -> str:
    return f"{names[:limit]}"[:-1] + (f", ... ({len(names)} in all)]" if len(names) > limit else "]")


def header_difference(header: list[str], columns: list[str]) -> str:
    """What sets a table's ``header`` apart from the ``columns`` it should have, for a message.

    Names the columns it lacks, those it has that ``columns`` does not, and
    any it repeats, e.g. ``"lacking ['test_accuracy']"``; a list longer than
    six names is cut, with its length.

    Args:
        header: The table's columns, as read from its first line.
        columns: The columns it should have, in order.

    Returns:
        The differences, joined with ``"; "``, or ``"in another order"`` if there is none.
    """
    missing = [c for c in columns if c not in header]
    unknown = [c for c in dict.fromkeys(header) if c not in columns]
    repeated = [c for c in dict.fromkeys(header) if header.count(c) > 1]
    parts = [
        f"lacking {_shown(missing)}" if missing else "",
        f"with columns not expected {_shown(unknown)}" if unknown else "",
        f"with columns repeated {_shown(repeated)}" if repeated else "",
    ]
    return "; ".join(p for p in parts if p) or "in another order"


def _cell_problem(column: str, kind: Column, value: Any) -> str | None:
    if value is None:
        return f"column {column!r} is missing (the line has too few cells)"
    if value == "":
        return f"column {column!r} is empty" if kind.required else None
    try:
        if kind.kind == "int":
            number = float(value)
            if not number.is_integer():
                raise ValueError
        elif kind.kind == "float":
            float(value)
        elif kind.kind == "bool":
            if value not in ("True", "False"):
                raise ValueError
        elif kind.kind == "status":
            if value not in RUN_STATUSES:
                raise ValueError
    except (ValueError, OverflowError):
        return f"column {column!r} holds {value!r}, not {_KIND_NAMES[kind.kind]}"
    return None


def row_problem(row: dict[Any, Any], schema: dict[str, Column]) -> str | None:
    """What is wrong with one row (its first fault), or ``None``.

    Columns of the row that ``schema`` does not list are strings that may be
    empty. A run with status ``ok`` needs a finite ``test_accuracy``.
    """
    if None in row:
        return f"the line has {len(row[None])} cells more than the header"
    for column, value in row.items():
        problem = _cell_problem(column, schema.get(column, Column()), value)
        if problem:
            return problem
    for column, kind in schema.items():
        if kind.required and column not in row:
            return f"column {column!r} is missing"
    if row.get("status") == "ok" and "test_accuracy" in row and not math.isfinite(float(row["test_accuracy"] or "nan")):
        return f"column 'test_accuracy' holds {row['test_accuracy']!r}, but status 'ok' needs a number"
    return None


def _typed_rows(path: Path, text: str, columns: list[str], schema: dict[str, Column]) -> list[dict[str, str]]:
    """Every row of a table written by one writer whose rows nothing else can restore: any fault is refused."""
    header, rows, torn = split_rows(path, text, columns)
    if header != columns:
        raise TableError(f"{path}: its header line is missing")
    if torn:
        line, cut = torn[0]
        raise TableError(f"{path}: line {line} is cut short ({cut[:40]!r}, no newline)")
    out = []
    for line, row in rows:
        problem = row_problem(row, schema)
        if problem:
            raise TableError(f"{path}: line {line}: {problem}")
        out.append(row)
    return out


# -- an IMP run's levels.csv ---------------------------------------------------------------


def levels_text(rows: Iterable[dict[str, Any]]) -> str:
    """``levels.csv`` for level rows as :mod:`experiments.imp_runs` records them (floats by ``repr``)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=LEVEL_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: repr(v) if isinstance(v, float) else v for k, v in r.items()})
    return buf.getvalue()


_LEVEL_DIR = re.compile(r"\d\d")


def read_level(path: Path) -> dict[str, Any]:
    """One ``levels/NN/level.json``.

    Raises:
        TableError: the file is not a complete level record (half-written, not JSON), naming it.
    """
    try:
        record = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TableError(f"{path}: not a complete level record ({type(e).__name__}: {e})") from None
    if not isinstance(record, dict) or not isinstance(record.get("rows"), list) or not record["rows"]:
        raise TableError(f"{path}: not a level record (expected an object with 'rows')")
    return record


def read_levels(run_dir: Path) -> tuple[str, list[str], bool]:
    """An IMP run's ``levels.csv`` text, checked against and restored from its ``levels/NN/level.json`` files.

    The level folders are the source: when every ``level.json`` is readable,
    the table is rebuilt from them (the same text :mod:`experiments.imp_runs`
    writes) and any difference from ``levels.csv`` (a torn or garbage file, a
    lost row) is reported as a repair. Without level folders (a table copied
    alone), ``levels.csv`` must pass :data:`LEVEL_SCHEMA` as it is. A
    ``level.json`` that cannot be read leaves that level's rows to
    ``levels.csv``, which must then be intact.

    Returns:
        ``(text, notes, rebuilt)``: the table's text, one line per repair or
        damaged level file (none when everything was intact), and whether
        ``text`` was rebuilt (it differs from the file, which should be rewritten).

    Raises:
        TableError: naming the file, line and column, when neither source holds a level's rows.
    """
    run_dir = Path(run_dir)
    path = run_dir / "levels.csv"
    folders = sorted(p for p in (run_dir / "levels").glob("*") if p.is_dir() and _LEVEL_DIR.fullmatch(p.name))
    records, damaged = {}, []
    for folder in folders:
        try:
            records[int(folder.name)] = read_level(folder / "level.json")
        except TableError as e:
            damaged.append((int(folder.name), str(e)))
    try:
        text = read_text(path)
    except TableError as e:  # binary: as good as missing when the level folders restore it
        if not folders or damaged:
            raise
        text, binary = None, str(e)
    else:
        binary = ""
    if folders and not damaged:
        rebuilt = levels_text([r for level in sorted(records) for r in records[level]["rows"]])
        if text == rebuilt and not binary:
            return text, [], False
        what = binary or ("missing" if text is None else "different from its level folders")
        return rebuilt, [f"{path}: {what}; rebuilt from {run_dir / 'levels'}/NN/level.json"], True
    if text is None:
        raise TableError(f"run {run_dir.name}: levels.csv missing ({str(path)!r} is not a file)")
    if not text:
        raise TableError(f"{path}: empty file (0 bytes)" + (f"; and {damaged[0][1]}" if damaged else ""))
    try:
        rows = _typed_rows(path, text, LEVEL_COLUMNS, LEVEL_SCHEMA)
    except TableError as e:
        raise TableError(f"{e}" + (f"; and {damaged[0][1]}" if damaged else "")) from None
    notes = [f"{message}; its rows are read from {path}" for _, message in damaged]
    for level, record in records.items():  # readable levels must agree with the table
        expected = levels_text(record["rows"]).splitlines()[1:]
        have = [",".join(r[c] for c in LEVEL_COLUMNS) for r in rows if int(float(r["level"])) == level]
        if [next(csv.reader([x])) for x in expected] != [next(csv.reader([x])) for x in have]:
            raise TableError(f"{path}: the rows of level {level} differ from {run_dir / 'levels' / f'{level:02d}' / 'level.json'}")
    return text, notes, False


def read_mask_updates(path: Path) -> str:
    """A SET/RigL run's ``mask_updates.csv``, every line checked against :data:`MASK_UPDATE_SCHEMA` (nothing restores it).

    Raises:
        TableError: the file is missing, empty or damaged, naming it and the line and column.
    """
    text = read_text(path)
    if text is None:
        raise TableError(f"run {Path(path).parent.name}: mask_updates.csv missing ({str(path)!r} is not a file)")
    if not text:
        raise TableError(f"{path}: empty file (0 bytes)")
    _typed_rows(Path(path), text, MASK_UPDATE_COLUMNS, MASK_UPDATE_SCHEMA)
    return text
