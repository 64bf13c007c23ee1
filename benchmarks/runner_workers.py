"""Benchmark: the quickstart sweep with ``--workers 1`` and ``--workers 2``.

Target: two workers take at most 0.7x the wall time of one. Each setting runs
the whole sweep from scratch in its own temporary results folder, as the real
command line does (``python -m experiments run ...``). Per-run overhead comes
from the runs tables (``startup_seconds``, ``overhead_seconds``).

Usage::

    python benchmarks/runner_workers.py [--config experiments/configs/quickstart.toml] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parent.parent


def run_sweep(config: Path, workers: int) -> dict:
    """Run the sweep once from scratch; wall time and per-run costs."""
    with tempfile.TemporaryDirectory(prefix=f"runner_w{workers}_") as tmp:
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "experiments", "run", str(config), "--workers", str(workers), "--results", tmp],
            cwd=REPO,
            capture_output=True,
            text=True,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
        )
        wall = time.perf_counter() - t0
        (runs_csv,) = Path(tmp).glob("*/runs.csv")
        runs = pd.read_csv(runs_csv)
    ok = runs[runs["status"] == "ok"]
    return dict(
        workers=workers,
        wall_seconds=round(wall, 1),
        exit_status=proc.returncode,
        runs=len(runs),
        failed=int((runs["status"] != "ok").sum()),
        sum_fit_seconds=round(float(ok["fit_seconds"].sum()), 1),
        mean_startup_seconds_per_run=round(float(ok["startup_seconds"].mean()), 2),
        mean_overhead_seconds_per_run=round(float(ok["overhead_seconds"].mean()), 2),
        worker_processes=int(ok["pid"].nunique()),
    )


def main() -> int:
    """Run both settings and print a table and the ratio."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=str(REPO / "experiments/configs/quickstart.toml"))
    p.add_argument("--out", help="also write the numbers as JSON here")
    args = p.parse_args()
    rows = [run_sweep(Path(args.config), w) for w in (1, 2)]
    table = pd.DataFrame(rows).set_index("workers")
    ratio = rows[1]["wall_seconds"] / rows[0]["wall_seconds"]
    print(f"{Path(args.config).name} on {os.cpu_count()} cores ({platform.processor() or platform.machine()})")
    print(table.to_string())
    print(f"\nwall(2 workers) / wall(1 worker) = {ratio:.2f} (target <= 0.70): {'OK' if ratio <= 0.7 else 'MISSED'}")
    if args.out:
        Path(args.out).write_text(json.dumps({"settings": rows, "ratio": ratio}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
