"""One run, in a worker process: config first, then train, measure, write, return the row.

Stages of a run directory ``results/<sweep>/runs/<run_id>/``:

1. ``config.json``: the resolved run config, its hash, seed, versions and git
   state, written before anything else.
2. ``log.txt``: one line per epoch and the error traceback of a failed run.
3. ``checkpoint.weights.h5`` (gitignored), ``sparsity_report.csv``.
4. ``result.json``: the row and curves, written atomically last. When it exists
   the run is finished and :func:`execute` returns it without running again.

Worker processes are long-lived and reused across runs of the same kind:
``keras3`` workers run dense, masked and sparse_tensor; ``legacy`` workers set
``TF_USE_LEGACY_KERAS=1`` before importing TensorFlow and run tfmot. A
``keras3`` process asked to run tfmot (a Dask worker) starts
``python -m experiments.tfmot_baseline`` for it. Which process kind and which
training function a run needs is read from its implementation's registry
entry (:data:`experiments.axes.IMPLEMENTATIONS`; a method may replace the
training, :data:`experiments.axes.METHODS`), so this module imports no
implementation: :mod:`experiments.tfmot_baseline` imports it, never the other
way round. Nothing in this module imports TensorFlow at import time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from experiments import axes, provenance
from experiments.config import RunConfig, from_dict, to_dict
from experiments.axis_registry import resolve
from experiments.store import STORAGE_ERRNOS, atomic_write, config_columns, named_os_error
from experiments.train import Diverged

__all__ = ["init_process", "execute", "run_task", "kind_of", "result_path", "ensure_legacy_keras", "trainer_of"]

_STATE: dict[str, Any] = {"kind": None, "startup": 0.0, "charged": False, "threads": (0, 0)}


def kind_of(run: RunConfig) -> str:
    """The process a run needs: its implementation's (``legacy`` for tfmot's tf-keras, ``keras3`` for the rest)."""
    return axes.IMPLEMENTATIONS.get(run.implementation.name).process


def trainer_of(run: RunConfig) -> str:
    """``"module:function"`` that trains ``run``: its method's own (``imp``), else its implementation's."""
    return run.method.spec.train or axes.IMPLEMENTATIONS.get(run.implementation.name).train


def ensure_legacy_keras() -> None:
    """Set ``TF_USE_LEGACY_KERAS=1``; fail if TensorFlow was already imported without it.

    Raises:
        RuntimeError: this process already imported TensorFlow with Keras 3.
    """
    if "tensorflow" in sys.modules and os.environ.get("TF_USE_LEGACY_KERAS") != "1":
        raise RuntimeError(
            "the tfmot baseline must run in its own process with TF_USE_LEGACY_KERAS=1 set before TensorFlow "
            "is imported; this process already imported TensorFlow with Keras 3"
        )
    os.environ["TF_USE_LEGACY_KERAS"] = "1"


def result_path(run_dir: Path) -> Path:
    """Where a finished run's row and curves are stored."""
    return Path(run_dir) / "result.json"


def _watch_parent(ppid: int) -> None:
    # A worker whose runner was killed (kill -9) exits instead of finishing its run:
    # the rerun redoes that run, and no orphan writes into the sweep meanwhile.
    while True:
        time.sleep(0.25)
        if os.getppid() != ppid:
            os._exit(3)


def init_process(
    kind: str, threads: int, launched_at: float | None = None, watch_parent: bool = False, stderr_path: str | None = None
) -> None:
    """Prepare a worker process: Keras flavour, thread counts, imports (paid once).

    Args:
        kind: ``keras3`` or ``legacy`` (sets ``TF_USE_LEGACY_KERAS=1`` before TensorFlow is imported).
        threads: TensorFlow intra-op threads (inter-op is 1).
        launched_at: ``time.time()`` when the process was requested; the start-up
            cost (spawn + imports) is charged to the process's first run.
        watch_parent: Exit when the parent process dies.
        stderr_path: Append this process's standard error (file descriptor 2:
            TensorFlow's C++ start-up lines, warnings) to this file instead of
            the console, so the runner's console shows the progress bar and the
            summary only. Errors of a run are in its ``log.txt`` either way.
    """
    if _STATE["kind"] is not None:
        return
    if stderr_path is not None:
        fd = os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 2)
        os.close(fd)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ["OMP_NUM_THREADS"] = str(threads)
    os.environ["TF_NUM_INTRAOP_THREADS"] = str(threads)
    os.environ["TF_NUM_INTEROP_THREADS"] = "1"
    if kind == "legacy":
        ensure_legacy_keras()
    t0 = time.time() if launched_at is None else launched_at
    if watch_parent:
        # A local pool worker: Ctrl-C reaches the whole process group; the runner
        # alone handles it (and terminates this process), so no traceback here.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    from experiments.train import configure_threads

    _STATE["threads"] = configure_threads(threads, 1)
    if kind == "legacy":
        import tensorflow_model_optimization  # noqa: F401
        import tf_keras  # noqa: F401
    else:
        import keras  # noqa: F401

        import prune  # noqa: F401
    _STATE.update(kind=kind, startup=time.time() - t0, charged=False)


def _native_startup(run: RunConfig) -> float:
    """Seconds this run spent loading (on a machine's first use, building) the native kernels, before ``fit``.

    The library loads once per process, at the first ``SparseDense`` call; inside ``fit`` that first call would
    charge a build of about 20 s to the run's ``fit_seconds``. Loading it here charges it to
    ``startup_seconds`` instead (0 for every later run of the worker, and for runs that do not use it).
    """
    if not (axes.IMPLEMENTATIONS.get(run.implementation.name).takes_matmul and run.implementation.matmul in ("auto", "native")):
        return 0.0
    from prune import native

    t0 = time.perf_counter()
    native.load()
    return time.perf_counter() - t0


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _failed_metrics(error: str) -> dict[str, Any]:
    return {"status": "failed", "error": error}


def execute(run: RunConfig, run_dir: Path, context: dict[str, Any]) -> dict[str, Any]:
    """Run ``run`` in this (initialised) process, write its folder, return ``{"row", "curves"}``.

    A run that raises is returned (and stored) as ``status="failed"`` with its
    error; it does not raise, except for a storage error (disk full, no
    permission, read-only), which is raised naming the file, since it is not
    the run's fault and the run must be redone.

    Args:
        run: The run.
        run_dir: Its directory.
        context: ``sweep`` name, ``git_commit``, ``git_dirty`` from the runner.
    """
    try:
        return _execute(run, run_dir, context)
    except OSError as e:
        raise named_os_error(e, run_dir) from None


def _execute(run: RunConfig, run_dir: Path, context: dict[str, Any]) -> dict[str, Any]:
    from experiments.store import read_result

    run_dir = Path(run_dir)
    done = result_path(run_dir)
    try:
        record = read_result(done)
    except ValueError:
        record = None  # damaged: redo the run (the runner moves such files aside first)
    if record is not None:
        return record
    run_dir.mkdir(parents=True, exist_ok=True)
    started = _now()
    t_start = time.perf_counter()
    if context.get("git_commit") is None:
        context = {**context, **dict(zip(("git_commit", "git_dirty"), provenance.git_state()))}
    prov = dict(
        provenance.versions(),
        git_commit=context.get("git_commit", ""),
        git_dirty=bool(context.get("git_dirty", False)),
        cpu_model=provenance.cpu_model(),
        hostname=provenance.hostname(),
        pid=os.getpid(),
        worker_kind=_STATE["kind"],
        intra_op_threads=_STATE["threads"][0],
        inter_op_threads=_STATE["threads"][1],
        started_at=started,
    )
    cols = config_columns(run, context.get("sweep", ""))
    atomic_write(
        run_dir / "config.json",
        json.dumps(
            {"run_id": run.run_id, "config_hash": cols["config_hash"], "seed": run.seed, "run": to_dict(run), **prov},
            indent=2,
            sort_keys=True,
        )
        + "\n",
    )
    startup = 0.0 if _STATE["charged"] else float(_STATE["startup"])
    _STATE["charged"] = True
    startup += _native_startup(run)
    log_fh = open(run_dir / "log.txt", "a")

    def log(line: str) -> None:
        try:
            log_fh.write(f"{_now()} {line}\n")
            log_fh.flush()
        except OSError as e:
            raise named_os_error(e, run_dir / "log.txt") from None

    log(f"start {run.run_id} pid={os.getpid()} kind={_STATE['kind']} threads={_STATE['threads']}")
    curves: list[dict[str, Any]] = []
    try:
        from experiments.data import load
        from experiments.train import RssSampler

        with RssSampler() as rss:
            data = load(run.dataset)
            out = resolve(trainer_of(run))(run, data, run_dir, log)
        report = out["report"]
        report.to_csv(run_dir / "sparsity_report.csv", index=False)
        nnz, size = int(report["nnz"].sum()), int(report["size"].sum())
        total = time.perf_counter() - t_start
        metrics = dict(
            status="ok",
            error="",
            test_accuracy=out["final"]["test_accuracy"],
            test_loss=out["final"]["test_loss"],
            train_accuracy=out["final"]["train_accuracy"],
            train_loss=out["final"]["train_loss"],
            sparsity=1.0 - nnz / size if size else 0.0,
            nnz=nnz,
            size=size,
            dense_flops=float(report["dense_flops"].sum()),
            nonzero_flops=float(report["nonzero_flops"].sum()),
            model_bytes=out["model_bytes"],
            checkpoint_bytes=out["checkpoint_bytes"],
            layer_sparsity={f"{r.layer}/{r.weight}": round(float(r.sparsity), 6) for r in report.itertuples()},
            step_time_ms=float(np.median(out["step_times"]) * 1000.0) if out["step_times"] else float("nan"),
            timed_steps=len(out["step_times"]),
            latency_b1_ms=out["latency_b1_ms"],
            latency_b256_ms=out["latency_b256_ms"],
            peak_rss_mb=rss.peak / 2**20,
            startup_seconds=startup,
            fit_seconds=out["fit_seconds"],
            eval_seconds=out["eval_seconds"],
            total_seconds=total,
            overhead_seconds=startup + total - out["fit_seconds"] - out["eval_seconds"],
            keras_impl=out["keras_impl"],
            native_kernel=out.get("native_kernel", ""),
            native_flags=out.get("native_flags", ""),
            val_accuracy=out["final"].get("val_accuracy", ""),
            val_loss=out["final"].get("val_loss", ""),
        )
        curves = [dict(run_id=run.run_id, epoch=e, metric=m, value=v) for e, m, v in out["curves"]]
        log(f"done test_accuracy={metrics['test_accuracy']:.4f} sparsity={metrics['sparsity']:.4f}")
    except Diverged as e:  # a result: recorded with its curves, kept out of the means
        error = str(e).replace("\n", " ")[:500]
        total = time.perf_counter() - t_start
        metrics = dict(status="diverged", error=error, startup_seconds=startup, total_seconds=total, **e.final)
        curves = [dict(run_id=run.run_id, epoch=ep, metric=m, value=v) for ep, m, v in e.curves]
        log("diverged: " + error)
    except Exception as e:  # noqa: BLE001 - a failed run is recorded, the sweep goes on
        if isinstance(e, OSError) and e.errno in STORAGE_ERRNOS:
            log_fh.close()
            raise
        error = f"{type(e).__name__}: {e}".replace("\n", " ")[:500]
        log("FAILED " + error + "\n" + traceback.format_exc())
        total = time.perf_counter() - t_start
        metrics = dict(_failed_metrics(error), startup_seconds=startup, total_seconds=total)
    finally:
        log_fh.close()
    row = {**cols, **prov, **metrics, "ended_at": _now()}
    record = {"row": row, "curves": curves}
    atomic_write(done, json.dumps(record, sort_keys=True, default=_json_default) + "\n")
    return json.loads(done.read_text())


def _json_default(value: Any) -> Any:
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, (np.bool_,)):
        return bool(value)
    raise TypeError(f"not JSON serialisable: {value!r}")


def run_task(run_data: dict[str, Any], run_dir: str, context: dict[str, Any], threads: int = 1) -> dict[str, Any]:
    """Entry point for pool and Dask workers: plain data in, ``{"row", "curves"}`` out.

    A process not initialised yet (a Dask worker) becomes a ``keras3``
    process: it runs dense, masked and sparse_tensor itself and sends each
    tfmot run to a fresh ``python -m experiments.tfmot_baseline`` subprocess.
    Local pool workers were initialised by the pool as ``keras3`` or
    ``legacy`` and receive only runs of their kind.
    """
    run = from_dict(RunConfig, run_data)
    if _STATE["kind"] is None:
        init_process("keras3", threads)
    if kind_of(run) == _STATE["kind"]:
        return execute(run, Path(run_dir), context)
    if kind_of(run) != "legacy":
        raise RuntimeError(f"a legacy-Keras worker was given a {run.implementation.name} run")
    return _execute_in_subprocess(run, Path(run_dir), context, threads)


def _execute_in_subprocess(run: RunConfig, run_dir: Path, context: dict[str, Any], threads: int) -> dict[str, Any]:
    run_dir.mkdir(parents=True, exist_ok=True)
    spec = run_dir / ".task.json"
    atomic_write(spec, json.dumps({"run": to_dict(run), "context": context}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_NUM_", "OMP_NUM"))}
    env["TF_USE_LEGACY_KERAS"] = "1"
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    t0 = time.time()
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.tfmot_baseline", str(spec), str(run_dir), str(threads)],
        env=env,
        capture_output=True,
        text=True,
    )
    from experiments.store import read_result

    done = result_path(run_dir)
    try:
        record = read_result(done)
    except ValueError as e:
        record = None
        proc = subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout, f"{proc.stderr}\n{e}")
    if record is not None:
        return record
    error = f"tfmot subprocess exited with {proc.returncode}: {proc.stderr.strip()[-400:]}".replace("\n", " ")
    cols = config_columns(run, context.get("sweep", ""))
    row = {**cols, **provenance.versions(), "status": "failed", "error": error, "total_seconds": time.time() - t0}
    record = {"row": row, "curves": []}
    atomic_write(done, json.dumps(record, sort_keys=True) + "\n")
    return record
