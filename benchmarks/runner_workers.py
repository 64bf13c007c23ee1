"""Benchmark: the quickstart sweep with ``--workers 1`` and ``--workers 2``.

Target: two workers take at most 0.7x the wall time of one. Each setting runs
the whole sweep from scratch in its own temporary results folder, as the real
command line does (``python -m experiments run ...``). Per-run overhead comes
from the runs tables (``startup_seconds``, ``overhead_seconds``).

Under ``benchmarks/protocol.py``, as far as a script that runs whole sweeps can be:

* a busy machine is refused (exit 3) unless ``--allow-loaded``, before any sweep
  runs; the load during the run counts the sweeps' CPU as the run's own (each
  sweep is a child process, waited for, whose workers it waits for in turn);
* this process runs no TensorFlow, so it fixes no threads of its own: the runner
  fixes each worker's (intra-op = usable cores // workers, inter-op = 1;
  ``experiments/cluster.py``), and the table states them as the runs tables
  record them;
* the dense GEMM calibration runs in a child process (``protocol.dense_gemm_gflops``
  with TensorFlow's threads fixed at the usable cores and 1), in the same run,
  before the sweeps; the same child reports the native kernels' vector path
  (``protocol.machine()`` loads them through TensorFlow);
* the settings run ``--repeats`` times each (default 3), interleaved (1, 2 / 2, 1 /
  1, 2 ...); each figure is the median over the repeats, the wall time also with
  its min and max, and the ratio with the min and max of the paired repeats'
  ratios.

Writes ``--out`` (JSON: ``settings`` with the medians per setting, ``ratio``,
``sweeps`` with every sweep, ``protocol`` with the machine, load, threads and
calibration) and a Markdown table beside it (``.md``) headed by :func:`protocol.header`.

Usage::

    .venv/bin/python benchmarks/runner_workers.py [--config experiments/configs/quickstart.toml] [--repeats 3]
        [--out results/benchmarks/runner_workers.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

import protocol  # noqa: E402  (standard library only: this process stays free of TensorFlow)

TARGET = 0.7

# The dense calibration, in a child: this process must not import TensorFlow (its threads and memory would sit
# beside the sweeps' workers).
GEMM_CHILD = r"""
import json, os, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, sys.argv[1])
import protocol
import tensorflow as tf
intra, inter = protocol.fix_tf_threads()
g = protocol.dense_gemm_gflops()
native = protocol.machine().native  # prune.native's vector path: it loads through TensorFlow
print(json.dumps({"values": list(g.values), "threads": [intra, inter], "tf": tf.__version__, "native": native}))
"""


def calibrate() -> tuple[protocol.Samples, str, str]:
    """TensorFlow's dense GEMM in GFLOPS, measured in a child process; that child's threads, as text; and the
    native kernels' vector path (:attr:`protocol.Machine.native`), which only a process with TensorFlow can ask."""
    proc = subprocess.run([sys.executable, "-c", GEMM_CHILD, str(Path(__file__).resolve().parent)], cwd=REPO,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"the dense GEMM calibration failed:\n{proc.stderr[-3000:]}")
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    return (protocol.Samples(tuple(got["values"])),
            f"TensorFlow {got['tf']}, intra_op={got['threads'][0]}, inter_op={got['threads'][1]}", got["native"])


def _one(values: pd.Series):
    """The single value of a column, or the sorted distinct values when they differ."""
    distinct = sorted({int(v) for v in values.dropna()})
    return distinct[0] if len(distinct) == 1 else distinct


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
        found = list(Path(tmp).glob("*/runs.csv"))
        if len(found) != 1:
            raise SystemExit(f"the sweep with --workers {workers} wrote {len(found)} runs tables (exit status "
                             f"{proc.returncode}):\n{proc.stderr[-3000:]}")
        runs = pd.read_csv(found[0])
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
        intra_op_threads=_one(ok["intra_op_threads"]),
        inter_op_threads=_one(ok["inter_op_threads"]),
    )


def summarise(sweeps: list[dict], workers: int) -> dict:
    """One setting over its repeats: the existing keys as medians (counts as the worst repeat), the wall time's
    min and max, and how many repeats."""
    mine = [s for s in sweeps if s["workers"] == workers]
    wall = protocol.Samples(tuple(s["wall_seconds"] for s in mine))

    def med(key: str, digits: int) -> float:
        return round(float(statistics.median(s[key] for s in mine)), digits)

    return dict(
        workers=workers,
        wall_seconds=round(wall.median, 1),
        exit_status=next((s["exit_status"] for s in mine if s["exit_status"] != 0), 0),
        runs=max(s["runs"] for s in mine),
        failed=max(s["failed"] for s in mine),
        sum_fit_seconds=med("sum_fit_seconds", 1),
        mean_startup_seconds_per_run=med("mean_startup_seconds_per_run", 2),
        mean_overhead_seconds_per_run=med("mean_overhead_seconds_per_run", 2),
        worker_processes=max(s["worker_processes"] for s in mine),
        wall_seconds_min=wall.low,
        wall_seconds_max=wall.high,
        repeats=len(mine),
        intra_op_threads=mine[0]["intra_op_threads"],
        inter_op_threads=mine[0]["inter_op_threads"],
    )


def markdown(header: str, settings: list[dict], ratio: float, ratio_min: float, ratio_max: float) -> str:
    lines = [header, "",
             "Wall time of the whole sweep from scratch, median over the repeats (min-max); the other columns are "
             "medians over the repeats of each sweep's figure (runs and failures: the worst repeat).", "",
             "| setting | wall s (min-max) | runs | failed | exit | sum of fit s | startup s per run | overhead s per run "
             "| worker processes | TF threads per worker (intra, inter) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for s in settings:
        lines.append(
            f"| `--workers {s['workers']}` | {s['wall_seconds']:.1f} ({s['wall_seconds_min']:.1f}-{s['wall_seconds_max']:.1f}) "
            f"| {s['runs']} | {s['failed']} | {s['exit_status']} | {s['sum_fit_seconds']:.1f} "
            f"| {s['mean_startup_seconds_per_run']:.2f} | {s['mean_overhead_seconds_per_run']:.2f} | {s['worker_processes']} "
            f"| {s['intra_op_threads']}, {s['inter_op_threads']} |")
    verdict = "OK" if ratio <= TARGET else "MISSED"
    lines += ["", f"wall(2 workers) / wall(1 worker) = {ratio:.2f} (paired repeats {ratio_min:.2f}-{ratio_max:.2f}); "
                  f"target <= {TARGET:.2f}: {verdict}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run both settings, interleaved, and write the table and the ratio."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=str(REPO / "experiments/configs/quickstart.toml"))
    p.add_argument("--repeats", type=int, default=3, help="sweeps per setting, interleaved (medians with min-max)")
    p.add_argument("--out", default=str(REPO / "results" / "benchmarks" / "runner_workers.json"),
                   help="the numbers as JSON; the Markdown table goes beside it (.md)")
    protocol.add_arguments(p)
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error(f"--repeats must be >= 1, got {args.repeats}")
    config = Path(args.config)

    load = protocol.start_or_refuse(args)
    if load is None:
        return protocol.REFUSED
    gemm, gemm_threads, native = calibrate()
    # protocol.machine() asks prune.native, which imports TensorFlow: here the child asked it
    mach = dataclasses.replace(protocol.machine(native=False), native=native)
    sweeps = []
    for r in range(args.repeats):
        for workers in ((1, 2) if r % 2 == 0 else (2, 1)):
            sweeps.append(dict(repeat=r, **run_sweep(config, workers)))
            print(json.dumps(sweeps[-1]), flush=True)
    load.stop()  # every sweep (and its workers) waited for: their CPU is in os.times(), the run's own

    settings = [summarise(sweeps, w) for w in (1, 2)]
    wall = {(s["repeat"], s["workers"]): s["wall_seconds"] for s in sweeps}
    paired = [wall[(r, 2)] / wall[(r, 1)] for r in range(args.repeats)]
    ratio = settings[1]["wall_seconds"] / settings[0]["wall_seconds"]
    threads = (f"this process runs no TensorFlow; each sweep worker: intra_op = usable cores // workers, inter_op = 1 "
               f"(experiments/cluster.py), recorded as (intra, inter) = "
               + ", ".join(f"({s['intra_op_threads']}, {s['inter_op_threads']}) with {s['workers']} worker(s)" for s in settings)
               + f"; the GEMM calibration child: {gemm_threads}")
    extra = [f"Sweep: `{config.name}`, run from scratch {args.repeats} time(s) per setting in a fresh results folder, "
             "the settings interleaved (1, 2 / 2, 1 / ...).",
             "The dense calibration runs in a child process before the sweeps (this process stays free of TensorFlow).",
             "The load counts the sweeps' CPU (their workers included) as this run's own."]
    header = protocol.header("Runner scaling: the sweep with 1 and 2 workers", mach, load, gemm, threads, extra)
    report = markdown(header, settings, ratio, min(paired), max(paired))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "settings": settings, "ratio": ratio, "ratio_min": min(paired), "ratio_max": max(paired), "sweeps": sweeps,
        "protocol": {"measured_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "machine": mach.describe(),
                     "native": mach.native, "load": load.describe(), "loaded": load.loaded, "threads": threads,
                     "dense_gemm_gflops": {"median": gemm.median, "min": gemm.low, "max": gemm.high,
                                           "rounds": len(gemm.values)}},
    }, indent=2) + "\n")
    out.with_suffix(".md").write_text(report)
    print(report)
    print(f"wrote {out} and {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
