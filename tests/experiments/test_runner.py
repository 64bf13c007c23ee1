"""The sweep runner end to end, as real subprocesses with real Keras and tfmot.

Tiny sweeps (digits, a small MLP, one to three epochs) keep every test to
seconds; most of the cost is worker start-up (TensorFlow import).
"""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HAS_CONVERT = importlib.util.find_spec("prune.deploy.convert") is not None


def cli(*args: str, env: dict | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    """``python -m experiments ARGS`` from the repository root."""
    return subprocess.run(
        [sys.executable, "-m", "experiments", *args],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def sweep_file(
    tmp_path: Path, name: str, implementations: str, sparsities: str, epochs: int, datasets: str = '["digits"]'
) -> Path:
    p = tmp_path / f"{name}.toml"
    p.write_text(
        f'name = "{name}"\nimplementations = {implementations}\nsparsities = {sparsities}\n'
        f'models = [{{name = "mlp", widths = [48]}}]\ndatasets = {datasets}\n'
        f'[[schedules]]\nkind = "polynomial"\nbegin = 0\nend = 1\nfrequency = 5\n'
        f"[training]\nepochs = {epochs}\nbatch_size = 32\nlearning_rate = 0.01\n"
    )
    return p


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.mark.slow
def test_resume_after_kill_9(tmp_path):
    config = sweep_file(tmp_path, "resume", '["dense", "masked"]', "[0.3, 0.5, 0.7, 0.9]", epochs=3)
    results = tmp_path / "results"
    root = results / "resume"
    proc = subprocess.Popen(
        [sys.executable, "-m", "experiments", "run", str(config), "--results", str(results)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    interrupted = None
    deadline = time.time() + 180
    try:
        while time.time() < deadline and proc.poll() is None:
            rows = read_csv(root / "runs.csv") if (root / "runs.csv").exists() else []
            running = [
                d for d in (root / "runs").glob("*") if (d / "config.json").exists() and not (d / "result.json").exists()
            ] if rows else []
            if running:
                interrupted = running[0]
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.02)
    finally:
        proc.kill()
        proc.wait()
    assert interrupted is not None, "never caught a run in progress"
    worker = json.loads((interrupted / "config.json").read_text())["pid"]
    for _ in range(200):  # the orphaned worker notices its parent died and exits
        if not Path(f"/proc/{worker}").exists() or "zombie" in Path(f"/proc/{worker}/status").read_text():
            break
        time.sleep(0.05)
    assert not (interrupted / "result.json").exists()
    before = read_csv(root / "runs.csv")
    assert 1 <= len(before) < 5

    status = cli("status", str(config), "--results", str(results))
    assert status.returncode == 0
    assert f"{interrupted.name}" in status.stdout and "(interrupted)" in status.stdout

    done = cli("run", str(config), "--results", str(results))
    assert done.returncode == 0, done.stderr[-2000:]
    rows = read_csv(root / "runs.csv")
    ids = [r["run_id"] for r in rows]
    assert len(rows) == 5 and len(set(ids)) == 5
    assert all(r["status"] == "ok" for r in rows)
    assert interrupted.name in ids
    assert (interrupted / "log.txt").read_text().count(" start ") == 2  # it was redone
    curves = read_csv(root / "curves.csv")
    keys = [(c["run_id"], c["epoch"], c["metric"]) for c in curves]
    assert len(keys) == len(set(keys)) == 5 * 3 * 4
    assert {c["run_id"] for c in curves} == set(ids)

    # A further rerun skips everything and leaves the tables untouched.
    table = (root / "runs.csv").read_bytes()
    again = cli("run", str(config), "--results", str(results))
    assert again.returncode == 0 and "5 already done, 0 to run" in again.stdout
    assert (root / "runs.csv").read_bytes() == table


@pytest.mark.slow
def test_failed_run_is_recorded_and_the_sweep_goes_on(tmp_path):
    keras_home = tmp_path / "keras"
    (keras_home / "datasets").mkdir(parents=True)
    (keras_home / "datasets" / "mnist.npz").write_bytes(b"this is not an npz file")  # passes the cache check, fails to load
    config = sweep_file(tmp_path, "fail", '["dense"]', "[0.5]", epochs=1, datasets='["mnist", "digits"]')
    results = tmp_path / "results"
    env = {"KERAS_HOME": str(keras_home)}
    out = cli("run", str(config), "--results", str(results), env=env)
    assert out.returncode == 1, out.stderr[-2000:]
    rows = {r["dataset"]: r for r in read_csv(results / "fail" / "runs.csv")}
    assert rows["digits"]["status"] == "ok" and float(rows["digits"]["test_accuracy"]) > 0.1
    assert rows["mnist"]["status"] == "failed"
    assert "mnist.npz" in rows["mnist"]["error"] or "pickle" in rows["mnist"]["error"].lower()
    log = (results / "fail" / "runs" / rows["mnist"]["run_id"] / "log.txt").read_text()
    assert "Traceback" in log
    status = cli("status", str(config), "--results", str(results), env=env)
    assert "1 done, 1 failed, 0 missing" in status.stdout
    assert rows["mnist"]["run_id"] in status.stdout.split("failed:")[1]


def _runs_and_curves(root: Path) -> tuple[dict, list]:
    rows = {r["run_id"]: r for r in read_csv(root / "runs.csv")}
    curves = sorted((c["run_id"], c["epoch"], c["metric"], c["value"]) for c in read_csv(root / "curves.csv"))
    return rows, curves


@pytest.mark.slow
def test_same_config_twice_gives_identical_accuracy(tmp_path):
    # sparse_tensor joins when prune.convert exists (it landed beside this runner).
    impls = '["masked", {name = "sparse_tensor", matmul = "csr"}, "tfmot"]' if HAS_CONVERT else '["masked", "tfmot"]'
    config = sweep_file(tmp_path, "det", impls, "[0.7]", epochs=2)
    first, second = tmp_path / "a", tmp_path / "b"
    # The two sweeps run at the same time (half the wall time on 2 cores): sharing the machine must not
    # change a single number either.
    procs = [
        subprocess.Popen([sys.executable, "-m", "experiments", "run", str(config), "--results", str(results)],
                         cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for results in (first, second)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
    rows_a, curves_a = _runs_and_curves(first / "det")
    rows_b, curves_b = _runs_and_curves(second / "det")
    assert set(rows_a) == set(rows_b) and len(rows_a) == (3 if HAS_CONVERT else 2)
    for run_id, row in rows_a.items():
        assert row["status"] == "ok", row["error"]
        for col in ("test_accuracy", "test_loss", "train_loss", "nnz", "sparsity"):
            assert row[col] == rows_b[run_id][col], (run_id, col)
        assert abs(float(row["sparsity"]) - 0.7) < 0.01 and float(row["test_accuracy"]) > 0.5
        report = read_csv(first / "det" / "runs" / run_id / "sparsity_report.csv")
        assert int(row["nnz"]) == sum(int(r["nnz"]) for r in report)
    assert curves_a == curves_b
    if HAS_CONVERT:
        assert {r["matmul"] for r in rows_a.values() if r["implementation"] == "sparse_tensor"} == {"csr"}
    # Each row says which kernels ran: TensorFlow's CSR by choice here, nothing for the other implementations.
    kernels = {r["implementation"]: (r["native_kernel"], r["native_flags"]) for r in rows_a.values()}
    assert kernels == {"masked": ("", ""), "tfmot": ("", ""), **({"sparse_tensor": ("tensorflow", "")} if HAS_CONVERT else {})}


def test_the_native_kernels_first_load_is_charged_to_startup_not_fit(monkeypatch):
    """A run that uses SparseDense loads (on a machine's first use, builds) the native library before fit, and the
    time goes to startup_seconds; a run that does not use it neither loads it nor pays for it."""
    import time as _time

    from experiments import run_one
    from experiments.config import DatasetConfig, ImplementationConfig, ModelConfig, RunConfig, ScheduleConfig
    from prune import native

    calls = []

    def slow_load():
        calls.append(1)
        _time.sleep(0.2)

    monkeypatch.setattr(native, "load", slow_load)

    def run(name, matmul="auto"):
        return RunConfig(ImplementationConfig(name, matmul), DatasetConfig("digits"), ModelConfig("lenet300"), 0,
                         sparsity=0.5 if name != "dense" else 0.0, schedule=ScheduleConfig() if name != "dense" else None)

    assert run_one._native_startup(run("dense")) == 0.0 and calls == []
    assert run_one._native_startup(run("sparse_tensor", "csr")) == 0.0 and calls == []  # TensorFlow's kernels by choice
    assert run_one._native_startup(run("sparse_tensor")) >= 0.2 and calls == [1]
