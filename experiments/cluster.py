"""Where runs execute: a local pool of reused worker processes, or a Dask cluster.

Local (``--workers N``): runs are grouped by kind. ``keras3`` runs (dense,
masked, sparse_tensor) go to N spawned worker processes that import
TensorFlow once and are reused for every run; then ``legacy`` runs (tfmot) go
to N fresh processes that set ``TF_USE_LEGACY_KERAS=1`` before importing
TensorFlow. The two groups never overlap, so at most N workers exist at a time,
each with ``cores // N`` TensorFlow intra-op threads (inter-op 1), which
keeps the cores from being oversubscribed. Workers exit when the runner dies.

Dask (``--scheduler tcp://HOST:PORT``): the same task function is submitted to
an existing cluster. Dask worker processes are long-lived and hold Keras 3, so
they run dense/masked/sparse_tensor in-process and start one
``python -m experiments.tfmot_baseline`` subprocess per tfmot run. The results
directory must be reachable by the workers at the same path (shared file
system, or a local cluster). Results come back to the runner, which alone
writes the tables.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import multiprocessing
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from experiments.config import RunConfig, to_dict
from experiments.run_one import init_process, kind_of, run_task

__all__ = ["Job", "available_cores", "run_local", "run_dask", "WorkerDied"]


class WorkerDied(RuntimeError):
    """A worker process died (not a Python exception in a run); rerun to redo the unfinished runs."""


@dataclass(frozen=True)
class Job:
    """A run and its directory."""

    run: RunConfig
    run_dir: Path


def available_cores() -> int:
    """CPU cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def run_local(
    jobs: list[Job], workers: int, context: dict[str, Any], on_result: Callable[[Job, dict[str, Any]], None]
) -> None:
    """Run ``jobs`` on ``workers`` local processes, calling ``on_result`` in this process as each finishes.

    Raises:
        WorkerDied: a worker process crashed; finished runs were already reported.
    """
    threads = max(1, available_cores() // workers)
    groups: dict[str, list[Job]] = collections.defaultdict(list)
    for job in jobs:
        groups[kind_of(job.run)].append(job)
    ctx = multiprocessing.get_context("spawn")
    for kind in ("keras3", "legacy"):
        group = groups.get(kind, [])
        if not group:
            continue
        with cf.ProcessPoolExecutor(
            max_workers=min(workers, len(group)),
            mp_context=ctx,
            initializer=init_process,
            initargs=(kind, threads, time.time(), True),
        ) as pool:
            futures = {pool.submit(run_task, to_dict(j.run), str(j.run_dir), context, threads): j for j in group}
            broken = None
            for fut in cf.as_completed(futures):
                try:
                    record = fut.result()
                except cf.process.BrokenProcessPool as e:
                    broken = e
                    continue
                on_result(futures[fut], record)
            if broken is not None:
                raise WorkerDied(f"a {kind} worker process died ({broken}); rerun to redo the unfinished runs")


def _threads_per_worker(client: Any) -> int:
    cores = client.run(available_cores)  # {worker address: cores}
    info = client.scheduler_info()["workers"]
    per_host = collections.Counter(w.get("host", addr) for addr, w in info.items())
    counts = [max(1, c // per_host[info[a].get("host", a)]) for a, c in cores.items() if a in info]
    return max(1, min(counts)) if counts else 1


def run_dask(
    jobs: list[Job], address: str, context: dict[str, Any], on_result: Callable[[Job, dict[str, Any]], None]
) -> None:
    """Submit ``jobs`` to the Dask scheduler at ``address``; ``on_result`` runs here as each finishes.

    Raises:
        OSError: the scheduler cannot be reached (within 10 s).
    """
    from dask.distributed import Client, as_completed

    with Client(address, timeout="10s") as client:
        threads = _threads_per_worker(client)
        futures = {
            client.submit(
                run_task,
                to_dict(j.run),
                str(Path(j.run_dir).resolve()),
                context,
                threads,
                key=f"prune-run-{j.run.run_id}-{uuid.uuid4().hex[:8]}",
                pure=False,
            ): j
            for j in jobs
        }
        for fut in as_completed(futures):
            on_result(futures[fut], fut.result())
