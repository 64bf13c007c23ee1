"""Where runs execute: a local pool of reused worker processes, or a Dask cluster.

Local (``--workers N``): N slots, each holding one spawned worker process
that imports TensorFlow once and is reused for every following run of its
kind: ``keras3`` (dense, masked, sparse_tensor) or ``legacy`` (tfmot, with
``TF_USE_LEGACY_KERAS=1`` set before TensorFlow is imported). Keras 3 runs go
first; a slot whose next run is of the other kind replaces its process. At most
N workers exist at a time, each with ``cores // N`` TensorFlow intra-op threads
(inter-op 1), so the cores are not oversubscribed. Workers exit when the
runner dies (they watch their parent), so a ``kill -9`` leaves no orphan
writing into the sweep.

Dask (``--scheduler tcp://HOST:PORT``): the same task function is submitted to
an existing cluster. Dask worker processes are long-lived and hold Keras 3, so
they run dense/masked/sparse_tensor in-process and start one
``python -m experiments.tfmot_baseline`` subprocess per tfmot run. The results
directory must be reachable by the workers at the same path (shared file
system, or a local cluster). Results come back to the runner, which alone
writes the tables.

Interrupts and I/O errors: local workers ignore SIGINT (Ctrl-C reaches the
whole process group); the runner catches it, terminates its worker processes
and returns at once. A task that fails to write its run's files because the
disk is full or not writable (``ENOSPC``, ``EDQUOT``, ``EACCES``, ``EPERM``,
``EROFS``) stops the sweep with that ``OSError``, since every following run
would fail the same way; any other error of a task is recorded as a failed run.
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

from experiments import axes
from experiments.config import RunConfig, to_dict
from experiments.run_one import init_process, kind_of, run_task
from experiments.store import STORAGE_ERRNOS, config_columns

__all__ = ["Job", "SchedulerUnreachable", "available_cores", "connect", "run_local", "run_dask"]



class SchedulerUnreachable(Exception):
    """The Dask scheduler address is malformed or nothing answers there."""


def _is_storage_error(e: BaseException) -> bool:
    return isinstance(e, OSError) and e.errno in STORAGE_ERRNOS


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


def _spawn(kind: str, threads: int, stderr_path: str | None) -> cf.ProcessPoolExecutor:
    # One process per slot: a pool of one, so a crash is pinned to the run it was doing.
    return cf.ProcessPoolExecutor(
        max_workers=1,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=init_process,
        initargs=(kind, threads, time.time(), True, stderr_path),
    )


def _died(job: Job, context: dict[str, Any], error: BaseException) -> dict[str, Any]:
    row = {
        **config_columns(job.run, context.get("sweep", "")),
        "status": "failed",
        "error": f"worker process failed while running it ({type(error).__name__}: {error}; its stderr is in workers.log)"[:500],
    }
    return {"row": row, "curves": []}


def _order(job: Job) -> tuple[bool, bool, bool]:
    # Keras 3 runs first (one kind switch per slot), and within a kind the long runs
    # of a method with its own training (imp: many trainings) first and the short
    # dense runs last, so the slots finish close together (a shorter tail).
    run = job.run
    return (kind_of(run) == "legacy", run.method.spec.train is None, not axes.IMPLEMENTATIONS.get(run.implementation.name).prunes)


def run_local(
    jobs: list[Job],
    workers: int,
    context: dict[str, Any],
    on_result: Callable[[Job, dict[str, Any]], None],
    worker_log: Path | None = None,
) -> None:
    """Run ``jobs`` on ``workers`` local processes, calling ``on_result`` in this process as each finishes.

    There are ``workers`` slots, each holding one live worker process of one
    kind, reused for as long as the next run is of the same kind. Runs are
    taken in order, Keras 3 runs first and dense runs last within a kind; when
    a slot's next run is of the other kind its process is replaced, so the
    tfmot runs start while the last Keras 3 runs are still finishing in other
    slots, and never more than ``workers`` processes exist. A run whose worker process dies (crash, out of memory) is
    reported as failed, and its slot gets a fresh process. Workers write their
    standard error (TensorFlow's C++ log lines) to ``worker_log`` if given.
    """
    threads = max(1, available_cores() // workers)
    pending = collections.deque(sorted(jobs, key=_order))
    slots: list[tuple[str, cf.ProcessPoolExecutor] | None] = [None] * min(workers, len(pending))
    running: dict[cf.Future, tuple[int, Job]] = {}

    def submit(i: int) -> None:
        job = pending.popleft()
        kind = kind_of(job.run)
        slot = slots[i]
        if slot is None or slot[0] != kind:
            if slot is not None:
                slot[1].shutdown(wait=True)
            slots[i] = slot = (kind, _spawn(kind, threads, None if worker_log is None else str(worker_log)))
        fut = slot[1].submit(run_task, to_dict(job.run), str(job.run_dir), context, threads)
        running[fut] = (i, job)

    try:
        for i in range(len(slots)):
            submit(i)
        while running:
            done, _ = cf.wait(list(running), return_when=cf.FIRST_COMPLETED)
            for fut in done:
                i, job = running.pop(fut)
                try:
                    record = fut.result()
                except cf.process.BrokenProcessPool as e:
                    record = _died(job, context, e)
                    slots[i][1].shutdown(wait=False)  # type: ignore[index]
                    slots[i] = None
                except Exception as e:  # noqa: BLE001
                    if _is_storage_error(e):
                        raise
                    record = _died(job, context, e)
                on_result(job, record)
                if pending:
                    submit(i)
    except BaseException:
        # Ctrl-C, a full disk, an error in on_result: stop now, not after the runs in flight.
        _stop_workers()
        for slot in slots:
            if slot is not None:
                slot[1].shutdown(wait=False, cancel_futures=True)
        raise
    else:
        for slot in slots:
            if slot is not None:
                slot[1].shutdown(wait=True, cancel_futures=True)


def _stop_workers(grace: float = 2.0) -> None:
    """Terminate this process's worker processes (SIGTERM, then SIGKILL after ``grace`` seconds)."""
    children = multiprocessing.active_children()
    for p in children:
        p.terminate()
    deadline = time.monotonic() + grace
    for p in children:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join(1.0)


def _threads_per_worker(client: Any) -> int:
    cores = client.run(available_cores)  # {worker address: cores}
    info = client.scheduler_info()["workers"]
    per_host = collections.Counter(w.get("host", addr) for addr, w in info.items())
    counts = [max(1, c // per_host[info[a].get("host", a)]) for a, c in cores.items() if a in info]
    return max(1, min(counts)) if counts else 1


def connect(address: str) -> Any:
    """A ``dask.distributed.Client`` connected to the scheduler at ``address`` (within 10 s).

    Raises:
        SchedulerUnreachable: ``address`` is malformed or nothing answers there;
            the message names the address and the cause.
    """
    from dask.distributed import Client

    try:
        return Client(address, timeout="10s")
    except Exception as e:  # noqa: BLE001 - ValueError (bad address), OSError/TimeoutError (no answer)
        raise SchedulerUnreachable(f"cannot reach the Dask scheduler {address!r}: {type(e).__name__}: {e}") from None


def run_dask(
    jobs: list[Job], client: Any, context: dict[str, Any], on_result: Callable[[Job, dict[str, Any]], None]
) -> None:
    """Submit ``jobs`` through ``client`` (see :func:`connect`); ``on_result`` runs here as each finishes.

    A task that raised a storage error (disk full, permission) stops the sweep
    with it; on Ctrl-C the pending tasks are cancelled.
    """
    from dask.distributed import as_completed

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
    try:
        for fut in as_completed(futures):
            job = futures[fut]
            try:
                record = fut.result()
            except Exception as e:  # noqa: BLE001 - the task died (worker lost, import error): record it, go on
                if _is_storage_error(e):
                    raise
                record = _died(job, context, e)
            on_result(job, record)
    except BaseException:
        client.cancel(list(futures))
        raise
