"""Command line of the sweep runner.

::

    python -m experiments run CONFIG.toml [--workers N] [--scheduler tcp://HOST:PORT]
                                          [--results DIR] [--dry-run] [--retry-failed]
    python -m experiments status CONFIG.toml [--results DIR]

``run`` validates the whole sweep (config, grid, data availability, results
folder) before any run starts, then runs every cell not finished yet, with a
progress bar, and prints a summary. Exit status: 0 when every run of the sweep
is ok, 1 when some run failed (recorded in runs.csv), 2 for bad input (nothing
written).

This module and everything it imports at start-up stay free of TensorFlow: it
is re-imported by spawned workers, and tfmot workers must set
``TF_USE_LEGACY_KERAS`` before TensorFlow is imported.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from experiments.config import ConfigError, RunConfig, SweepConfig, load_sweep, to_dict

__all__ = ["main"]


class UsageError(Exception):
    """Bad input: reported as one line, exit status 2, nothing written."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m experiments", description="Run and inspect pruning sweeps.")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run every unfinished cell of a sweep")
    run.add_argument("config", help="sweep TOML file")
    run.add_argument("--workers", type=int, default=1, help="local worker processes (default 1)")
    run.add_argument("--scheduler", help="address of an existing Dask scheduler, e.g. tcp://127.0.0.1:8786")
    run.add_argument("--results", default="results", help="results root (default ./results)")
    run.add_argument("--dry-run", action="store_true", help="list the grid and write nothing")
    run.add_argument("--retry-failed", action="store_true", help="run failed runs again (default: keep them)")
    sub.add_parser("figures", help="redraw a sweep's figures from its tables (figures SWEEP --help)", add_help=False)
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
    if not os.access(p, os.W_OK | os.X_OK):
        raise UsageError(f"results folder {str(root)!r} cannot be written: no write permission on {str(p)!r}")
    if os.statvfs(p).f_flag & os.ST_RDONLY:
        raise UsageError(f"results folder {str(root)!r} cannot be written: {str(p)!r} is on a read-only file system")
    for name in ("runs.csv", "curves.csv"):
        f = root / name
        if f.exists() and not os.access(f, os.W_OK):
            raise UsageError(f"results file {str(f)!r} cannot be written")


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
    return sweep, runs


def _describe(run: RunConfig) -> str:
    s = run.schedule
    sched = f"{s.kind}[{s.begin:g}-{s.end:g} {s.unit}]" if s else "-"
    return (
        f"{run.run_id:34s} {run.implementation.label:18s} {run.dataset.name:10s} {run.model.label:12s} "
        f"s={run.sparsity:<5g} {sched:28s} seed={run.seed}"
    )


def _state(runs: list[RunConfig], root: Path) -> dict[str, dict[str, str]]:
    from experiments.store import Store

    return Store(root).read() if (root / "runs.csv").exists() else {}


def cmd_status(args: argparse.Namespace) -> int:
    """Print done, failed and missing runs of a sweep (writes nothing)."""
    sweep, runs = _prepare(args.config)
    root = Path(args.results) / sweep.name
    rows = _state(runs, root)
    ids = {r.run_id for r in runs}
    done = [r for r in runs if rows.get(r.run_id, {}).get("status") == "ok"]
    failed = [r for r in runs if rows.get(r.run_id, {}).get("status") == "failed"]
    missing = [r for r in runs if r.run_id not in rows]
    print(f"sweep {sweep.name}: {len(runs)} runs: {len(done)} done, {len(failed)} failed, {len(missing)} missing")
    print(f"results: {root}")
    for title, group in (("failed", failed), ("missing", missing)):
        if group:
            print(f"\n{title}:")
            for r in group:
                extra = f"  error: {rows[r.run_id]['error']}" if title == "failed" else ""
                started = " (interrupted)" if title == "missing" and (root / "runs" / r.run_id / "config.json").exists() else ""
                print(f"  {_describe(r)}{started}{extra}")
    stray = sorted(set(rows) - ids)
    if stray:
        print(f"\n{len(stray)} rows in runs.csv belong to no cell of this config (an older version of it)")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """Run every unfinished cell of the sweep; see the module docstring."""
    if args.workers < 1:
        raise UsageError(f"--workers must be >= 1, got {args.workers}")
    if args.scheduler and args.workers != 1:
        raise UsageError("give either --workers (local processes) or --scheduler (Dask), not both")
    sweep, runs = _prepare(args.config)
    root = Path(args.results) / sweep.name
    if args.dry_run:
        rows = _state(runs, root)
        for r in runs:
            print(f"{_describe(r)} {rows.get(r.run_id, {}).get('status', 'todo')}")
        todo = sum(1 for r in runs if rows.get(r.run_id, {}).get("status") != "ok")
        print(f"{len(runs)} runs in the grid, {todo} not done; results would go to {root} (dry run: nothing written)")
        return 0
    _check_writable(root)
    return _execute(args, sweep, runs, root)


def _execute(args: argparse.Namespace, sweep: SweepConfig, runs: list[RunConfig], root: Path) -> int:
    from tqdm import tqdm

    from experiments import provenance
    from experiments.cluster import Job, run_dask, run_local
    from experiments.run_one import result_path
    from experiments.store import Store, atomic_write
    from experiments.summary import format_summary, overhead, summarize

    store = Store(root)
    try:
        store.open()
    except (OSError, ValueError) as e:
        raise UsageError(f"cannot use results folder {str(root)!r}: {e}") from None
    atomic_write(root / "sweep.json", json.dumps(to_dict(sweep), indent=2, sort_keys=True) + "\n")
    commit, dirty = provenance.git_state()
    context = {"sweep": sweep.name, "git_commit": commit, "git_dirty": dirty}

    todo: list[Job] = []
    for run in runs:
        run_dir = root / "runs" / run.run_id
        row = store.rows.get(run.run_id)
        if row is not None and (row["status"] == "ok" or not args.retry_failed):
            continue
        done = result_path(run_dir)
        if row is not None:  # a failed run to retry
            done.unlink(missing_ok=True)
        elif done.exists():  # finished, but the runner died before writing its row
            record = json.loads(done.read_text())
            if record["row"]["status"] == "ok" or not args.retry_failed:
                store.add(record["row"], record["curves"])
                continue
            done.unlink()
        todo.append(Job(run, run_dir))

    finished = len(runs) - len(todo)
    bar = tqdm(total=len(runs), initial=finished, unit="run", desc=sweep.name, dynamic_ncols=True)
    failures = 0

    def on_result(job: Job, record: dict[str, Any]) -> None:
        nonlocal failures
        store.add(record["row"], record["curves"])
        if record["row"]["status"] != "ok":
            failures += 1
            bar.write(f"run {job.run.run_id} failed: {record['row']['error']}")
        bar.update(1)

    t0 = time.perf_counter()
    where = f"Dask scheduler {args.scheduler}" if args.scheduler else f"{args.workers} local worker(s)"
    bar.write(f"{len(runs)} runs, {finished} already done, {len(todo)} to run on {where}")
    try:
        if todo and args.scheduler:
            run_dask(todo, args.scheduler, context, on_result)
        elif todo:
            run_local(todo, args.workers, context, on_result)
    except OSError as e:
        bar.close()
        print(f"error: cannot reach the Dask scheduler {args.scheduler}: {e}", file=sys.stderr)
        return 2
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
        print("\nper-run cost by implementation, mean seconds (startup = process spawn + imports, charged to a worker's first run;")
        print("overhead = startup + everything outside fit and evaluate):")
        with pd.option_context("display.width", 200, "display.float_format", "{:.2f}".format):
            print(oh.to_string())
        if len(todo):
            print(f"sweep wall time per run: {wall / len(todo):.2f} s")
    failed = int((frame["status"] != "ok").sum())
    if failed:
        print(f"\n{failed} failed run(s); see `python -m experiments status {args.config}`", file=sys.stderr)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # inherited by the workers
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["figures"]:  # its own parser; it needs no TensorFlow
        from experiments.figures import main as figures_main

        return figures_main(argv[1:])
    args = _parser().parse_args(argv)
    try:
        return cmd_run(args) if args.command == "run" else cmd_status(args)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
