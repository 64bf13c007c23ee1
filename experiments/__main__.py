"""Command line of the sweep runner.

::

    python -m experiments run CONFIG.toml [--workers N] [--scheduler tcp://HOST:PORT]
                                          [--results DIR] [--dry-run] [--retry-failed]
    python -m experiments status CONFIG.toml [--results DIR]

``run`` validates the whole sweep (config, grid, data availability, results
folder, the Dask scheduler if given) before any run starts, takes the results
folder's lock (one ``run`` per folder at a time), then runs every cell not
finished yet, with a progress bar, and prints a summary. Exit status:

* 0: every run of the sweep finished (``ok``, or ``diverged``: a run whose loss
  became NaN or infinite is a result, kept out of the means);
* 1: some run failed (recorded in runs.csv; ``--retry-failed`` redoes it);
* 2: bad input, or the folder is in use by another ``run`` (nothing written);
* 3: the results cannot be written (disk full, permission, read-only file
  system): the message names the path and the cause; rerun to resume;
* 130: interrupted (Ctrl-C or SIGTERM): workers are stopped, finished runs
  are kept; rerun the same command to resume.

This module and everything it imports at start-up stay free of TensorFlow: it
is re-imported by spawned workers, and tfmot workers must set
``TF_USE_LEGACY_KERAS`` before TensorFlow is imported.
"""

from __future__ import annotations

import argparse
import errno
import io
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from experiments.config import ConfigError, RunConfig, SweepConfig, axis_names, load_sweep, to_dict

__all__ = ["main"]


class UsageError(Exception):
    """Bad input: reported as one line, exit status 2, nothing written."""


class StorageError(Exception):
    """The results folder cannot be written (permission, read-only): exit status 3, nothing written."""


EXIT_OK, EXIT_FAILED_RUNS, EXIT_USAGE, EXIT_STORAGE, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


class _QuietPipe(io.TextIOBase):
    """``sys.stdout`` that survives a closed reader (``status | head``): once a
    write fails with ``EPIPE``, output goes to ``/dev/null`` and the command
    carries on (a sweep keeps running and writing its results)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def _drop(self) -> None:
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())  # so the interpreter's final flush is silent too
            os.close(devnull)
        except (OSError, ValueError, io.UnsupportedOperation):
            pass
        self._stream = open(os.devnull, "w")

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._drop()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._drop()

    def isatty(self) -> bool:
        return self._stream.isatty()

    def fileno(self) -> int:
        return self._stream.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self._stream, "encoding", "utf-8")


def _storage_message(e: OSError) -> str:
    code = errno.errorcode.get(e.errno or 0, "")
    where = e.filename if e.filename is not None else "the results folder"
    hint = {
        errno.ENOSPC: "free some space",
        errno.EDQUOT: "free some space (disk quota exceeded)",
        errno.EACCES: "fix the permissions",
        errno.EPERM: "fix the permissions",
        errno.EROFS: "use a writable folder (--results)",
    }.get(e.errno or 0, "fix the cause")
    return f"I/O error on {str(where)!r}: {e.strerror or e} [{code}]; {hint}, then rerun the same command to resume"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m experiments", description="Run and inspect pruning sweeps.")
    sub = p.add_subparsers(dest="command", required=True)
    names = "\n".join(f"  {axis}: {', '.join(valid)}" for axis, valid in axis_names().items())
    run = sub.add_parser(
        "run",
        help="run every unfinished cell of a sweep",
        epilog=f"names a sweep file may use (from the registries):\n{names}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("config", help="sweep TOML file")
    run.add_argument("--workers", type=int, default=1, help="local worker processes (default 1)")
    run.add_argument("--scheduler", help="address of an existing Dask scheduler, e.g. tcp://127.0.0.1:8786")
    run.add_argument("--results", default="results", help="results root (default ./results)")
    run.add_argument("--dry-run", action="store_true", help="list the grid and write nothing")
    run.add_argument("--retry-failed", action="store_true", help="run failed runs again (default: keep them)")
    run.add_argument("--figures", action="store_true", help="then redraw the sweep's figures (else the command is printed)")
    sub.add_parser("figures", help="redraw a sweep's figures from its tables (figures CONFIG.toml --help)", add_help=False)
    st = sub.add_parser("status", help="done, failed and missing runs of a sweep")
    st.add_argument("config", help="sweep TOML file")
    st.add_argument("--results", default="results", help="results root (default ./results)")
    return p


def _check_writable(root: Path) -> None:
    p = root
    while not p.exists():
        if p.parent == p:
            break
        p = p.parent
    if not p.is_dir():
        raise UsageError(f"results folder {str(root)!r} cannot be created: {str(p)!r} is not a directory")
    if os.statvfs(p).f_flag & os.ST_RDONLY:
        raise StorageError(f"results folder {str(root)!r} cannot be written: {str(p)!r} is on a read-only file system")
    if not os.access(p, os.W_OK | os.X_OK):
        raise StorageError(f"results folder {str(root)!r} cannot be written: no write permission on {str(p)!r}")
    for name in ("runs.csv", "curves.csv"):
        f = root / name
        if f.exists() and not os.access(f, os.W_OK):
            raise StorageError(f"results file {str(f)!r} cannot be written: no write permission")


def _prepare(config_path: str) -> tuple[SweepConfig, list[RunConfig]]:
    from experiments.data import DataUnavailable, check_available
    from experiments.grid import expand

    try:
        sweep = load_sweep(config_path)
        runs = expand(sweep)
    except ConfigError as e:
        raise UsageError(f"invalid config {config_path}: {e}") from None
    for ds in sweep.datasets:
        try:
            check_available(ds)
        except DataUnavailable as e:
            raise UsageError(str(e)) from None
    for run in runs:  # checks that need the number of training examples (IMP's rewind_step)
        check = run.method.spec.check_data
        if check is not None:
            try:
                check(run, lambda ds=run.dataset: _train_examples(ds))
            except ConfigError as e:
                raise UsageError(f"invalid config {config_path}: {e} (grid cell {run.run_id})") from None
    return sweep, runs


def _train_examples(dataset: Any) -> int:
    from experiments.data import load

    return len(load(dataset).x_train)


def _describe(run: RunConfig) -> str:
    s = run.schedule
    sched = f"{s.kind}[{s.begin:g}-{s.end:g} {s.unit}]" if s else "-"
    return (
        f"{run.run_id:34s} {run.implementation.label:18s} {run.dataset.name:10s} {run.model.label:12s} "
        f"s={run.sparsity:<5g} {sched:28s} seed={run.seed}"
    ) + (f" {run.pattern.label}/{run.criterion}/{run.distribution}" if run.sparsity or s else "") + (
        f" method={run.method.name}" if run.method.name != "gmp" else ""
    )


def _read_store(root: Path) -> Any:
    """The sweep's store as ``run`` would see it, read-only (ValueError: a table that is not ours)."""
    from experiments.store import Store

    store = Store(root)
    if root.is_dir():
        try:
            store.read()
        except ValueError as e:
            raise UsageError(f"cannot use results folder {str(root)!r}: {e}") from None
    return store


def cmd_status(args: argparse.Namespace) -> int:
    """Print done, diverged, failed and missing runs of a sweep (writes nothing).

    The counts are those ``run`` acts on: runs.csv repaired in memory exactly as
    ``run`` would repair it (rows, or columns the file lost, recovered from
    ``result.json``, a corrupt ``result.json`` without a row counted missing).
    """
    from experiments.lock import SweepLock

    sweep, runs = _prepare(args.config)
    root = Path(args.results) / sweep.name
    store = _read_store(root)
    rows = store.rows
    ids = {r.run_id for r in runs}
    by = {k: [r for r in runs if rows.get(r.run_id, {}).get("status") == k] for k in ("ok", "diverged", "failed")}
    missing = [r for r in runs if r.run_id not in rows]
    print(
        f"sweep {sweep.name}: {len(runs)} runs: {len(by['ok'])} done, {len(by['failed'])} failed, "
        f"{len(missing)} missing, {len(by['diverged'])} diverged"
    )
    print(f"results: {root}")
    holder = SweepLock(root).holder() if root.is_dir() else None
    if holder is not None:
        print(f"in progress: a run holds the folder ({SweepLock.describe(holder)})")
    for w in store.warnings:
        print(f"warning: {w} (run will move it aside)")
    for line in store.restored:
        print(f"warning: {line} (run will rewrite the file)")
    for line in store.repairs:
        print(f"note: {line} (run will rewrite the file)")
    for line in store.lost:
        print(f"warning: {line}; run will redo that run")
    for title, group in (("diverged", by["diverged"]), ("failed", by["failed"]), ("missing", missing)):
        if group:
            print(f"\n{title}:")
            for r in group:
                extra = f"  error: {rows[r.run_id]['error']}" if title != "missing" else ""
                started = " (interrupted)" if title == "missing" and (root / "runs" / r.run_id / "config.json").exists() else ""
                print(f"  {_describe(r)}{started}{extra}")
    stray = sorted(set(rows) - ids)
    if stray:
        print(f"\n{len(stray)} rows in runs.csv belong to no cell of this config (an older version of it)")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """Run every unfinished cell of the sweep; see the module docstring."""
    from experiments.lock import Locked, SweepLock

    if args.workers < 1:
        raise UsageError(f"--workers must be >= 1, got {args.workers}")
    if args.scheduler and args.workers != 1:
        raise UsageError("give either --workers (local processes) or --scheduler (Dask), not both")
    sweep, runs = _prepare(args.config)
    root = Path(args.results) / sweep.name
    if args.dry_run:
        rows = _read_store(root).rows
        for r in runs:
            print(f"{_describe(r)} {rows.get(r.run_id, {}).get('status', 'todo')}")
        todo = sum(1 for r in runs if rows.get(r.run_id, {}).get("status") not in ("ok", "diverged"))
        print(f"{len(runs)} runs in the grid, {todo} not done; results would go to {root} (dry run: nothing written)")
        return 0
    _check_writable(root)
    _read_store(root)  # a table that is not ours: refuse before writing anything (the lock file included)
    client = None
    if args.scheduler:  # reach it before anything is written
        from experiments.cluster import SchedulerUnreachable, connect

        try:
            client = connect(args.scheduler)
        except SchedulerUnreachable as e:
            raise UsageError(str(e)) from None
    lock = SweepLock(root, command="python -m experiments " + " ".join(sys.argv[1:]))
    try:
        try:
            lock.acquire()
        except Locked as e:
            raise UsageError(f"{e}; wait for it to finish (or stop it), then run again") from None
        if lock.took_over:
            print(f"note: took over the lock left by {lock.took_over}, which is no longer running", file=sys.stderr)
        return _execute(args, sweep, runs, root, client)
    finally:
        lock.release()
        if client is not None:
            client.close()


def _execute(args: argparse.Namespace, sweep: SweepConfig, runs: list[RunConfig], root: Path, client: Any) -> int:
    from tqdm import tqdm

    from experiments import provenance
    from experiments.cluster import Job, run_dask, run_local
    from experiments.run_one import result_path
    from experiments.store import Store, atomic_write
    from experiments.summary import format_summary, kernel_note, overhead, summarize

    store = Store(root)
    try:
        store.open()
    except ValueError as e:
        raise UsageError(f"cannot use results folder {str(root)!r}: {e}") from None
    for w in store.restored + store.warnings + store.lost:
        print(f"warning: {w}", file=sys.stderr)
    for line in store.repairs:
        print(f"note: {line}", file=sys.stderr)
    atomic_write(root / "sweep.json", json.dumps(to_dict(sweep), indent=2, sort_keys=True) + "\n")
    commit, dirty = provenance.git_state()
    context = {"sweep": sweep.name, "git_commit": commit, "git_dirty": dirty}

    todo: list[Job] = []
    for run in runs:
        run_dir = root / "runs" / run.run_id
        row = store.rows.get(run.run_id)
        if row is not None and (row["status"] in ("ok", "diverged") or not args.retry_failed):
            continue
        if row is not None:  # a failed run to retry
            result_path(run_dir).unlink(missing_ok=True)
        todo.append(Job(run, run_dir))

    finished = len(runs) - len(todo)
    bar = tqdm(total=len(runs), initial=finished, unit="run", desc=sweep.name, dynamic_ncols=True)
    failures = 0
    completed = 0

    def on_result(job: Job, record: dict[str, Any]) -> None:
        nonlocal failures, completed
        store.add(record["row"], record["curves"])
        completed += 1
        status = record["row"]["status"]
        if status == "diverged":
            bar.write(f"run {job.run.run_id} diverged: {record['row']['error']}")
        elif status != "ok":
            failures += 1
            bar.write(f"run {job.run.run_id} failed: {record['row']['error']}")
        bar.update(1)

    t0 = time.perf_counter()
    where = f"Dask scheduler {args.scheduler}" if args.scheduler else f"{args.workers} local worker(s)"
    bar.write(f"{len(runs)} runs, {finished} already done, {len(todo)} to run on {where}")
    try:
        if todo and client is not None:
            run_dask(todo, client, context, on_result)
        elif todo:
            run_local(todo, args.workers, context, on_result, worker_log=root / "workers.log")
    except KeyboardInterrupt:
        bar.close()
        print(
            f"\ninterrupted: {finished + completed} of {len(runs)} runs finished ({completed} in this session); "
            f"run `python -m experiments run {args.config}` again to resume",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    finally:
        bar.close()
    wall = time.perf_counter() - t0

    import pandas as pd

    frame = store.frame()
    frame = frame[frame["run_id"].isin({r.run_id for r in runs})]
    summary = summarize(frame)
    if not summary.empty:
        summary.to_csv(root / "summary.csv", index=False)
    print(f"\n{sweep.name}: {len(runs)} runs ({len(todo)} run now in {wall:.1f} s); results in {root}")
    print(format_summary(summary))
    oh = overhead(frame)
    if not oh.empty:
        print("\nper-run cost by implementation, mean seconds (startup = process spawn + imports, charged to a worker's first run,")
        print("plus the native kernels' first load or build, charged to the worker's first run that uses them, not to fit;")
        print("overhead = startup + everything outside fit and evaluate):")
        with pd.option_context("display.width", 200, "display.float_format", "{:.2f}".format):
            print(oh.to_string())
        if len(todo):
            print(f"sweep wall time per run: {wall / len(todo):.2f} s")
    note = kernel_note(frame)
    if note:
        print("\n" + note)
    diverged = int((frame["status"] == "diverged").sum())
    if diverged:
        print(f"\n{diverged} run(s) diverged (loss NaN, infinite or exploding; the error column says which): listed above, excluded from the means")
    failed = int((~frame["status"].isin(["ok", "diverged"])).sum())
    if failed:
        print(f"\n{failed} failed run(s); see `python -m experiments status {args.config}`", file=sys.stderr)
    figures_args = [args.config, *([] if Path(args.results) == Path("results") else ["--results", args.results])]
    print(f"\nfigures: python -m experiments figures {' '.join(figures_args)}")
    if args.figures:
        from experiments.figures import main as figures_main

        if figures_main(figures_args) != 0:
            return EXIT_USAGE
    return EXIT_FAILED_RUNS if failed else EXIT_OK


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # inherited by the workers
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["figures"]:  # its own parser; it needs no TensorFlow
        from experiments.figures import main as figures_main

        return figures_main(argv[1:])
    args = _parser().parse_args(argv)
    if not isinstance(sys.stdout, _QuietPipe):
        sys.stdout = _QuietPipe(sys.stdout)
    if args.command == "run":
        signal.signal(signal.SIGTERM, _interrupt)  # a cluster job cancelled: stop like Ctrl-C
    try:
        return cmd_run(args) if args.command == "run" else cmd_status(args)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except StorageError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_STORAGE
    except KeyboardInterrupt:  # before the sweep started (or status)
        print("\ninterrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except OSError as e:  # disk full, permission, read-only: a storage problem, not bad input
        print(f"error: {_storage_message(e)}", file=sys.stderr)
        return EXIT_STORAGE


if __name__ == "__main__":
    raise SystemExit(main())
