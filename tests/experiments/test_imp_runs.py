"""experiments.imp_runs: IMP levels as resumable stages, deterministic, and identical after a kill -9."""

from __future__ import annotations

import csv
import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from experiments.config import DatasetConfig, ImplementationConfig, ModelConfig, RunConfig, ScheduleConfig, TrainingConfig
from experiments.data import load
from experiments.imp_runs import train_imp
from experiments.tables import LEVEL_COLUMNS
from prune.training.imp import ImpParams, level_seed

REPO = Path(__file__).resolve().parents[2]


def _run(**changes) -> RunConfig:
    run = RunConfig(
        implementation=ImplementationConfig("masked"),
        dataset=DatasetConfig("synthetic", n_samples=200, n_features=8, n_classes=3),
        model=ModelConfig("mlp", (8,)),
        seed=3,
        training=TrainingConfig(epochs=1, batch_size=32, learning_rate=0.01),
        sparsity=0.75,
        schedule=ScheduleConfig("one_shot", begin=0.0),  # the masked runs need one; IMP does not use it
    )
    return dataclasses.replace(run, **changes)


def _rows(path: Path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_levels_have_exact_sparsities_resume_and_are_deterministic(tmp_path):
    run = _run(sparsity=0.5)
    data = load(run.dataset)
    lines: list[str] = []
    params = ImpParams(rate=0.5, rewind_step=3)
    out = train_imp(run, data, tmp_path, lines.append, params)
    table = tmp_path / "levels.csv"
    first = table.read_bytes()
    rows = _rows(table)
    assert list(rows[0]) == LEVEL_COLUMNS
    assert [(r["level"], r["variant"]) for r in rows] == [("0", "ticket"), ("1", "ticket"), ("1", "reinit"), ("1", "random")]
    # mlp 8-8-3: kernels of 64 and 24 entries, round(0.5 * n) zeros each, exactly.
    assert [float(r["sparsity"]) for r in rows] == [0.0, 0.5, 0.5, 0.5]
    assert all(float(r["remaining"]) == 1 - float(r["sparsity"]) for r in rows)
    assert all(r["status"] == "ok" for r in rows)
    assert len({r["test_loss"] for r in rows}) == 4  # four different networks
    # The result describes the last ticket.
    assert out["final"]["test_accuracy"] == float(rows[1]["test_accuracy"])
    assert int(out["report"]["nnz"].sum()) == 44 and out["levels"] == [
        {k: (float(v) if k not in ("level", "variant", "status") else int(v) if k == "level" else v) for k, v in r.items()}
        for r in rows
    ]
    assert (tmp_path / "checkpoint.weights.h5").exists()
    # The rewind point is the state after 3 steps, not the initialisation.
    import keras

    from experiments.models import initial_weights, seeded_model

    with np.load(tmp_path / "levels" / "00" / "rewind.npz") as z:
        kernel = next(z[k] for k in z.files if k.endswith("dense_0/kernel"))
    init = initial_weights(seeded_model(run, data, keras)[0], run.seed)[0]
    assert kernel.shape == init.shape and not np.array_equal(kernel, init)
    # A rerun finds every level done and trains nothing.
    lines.clear()
    train_imp(run, data, tmp_path, lines.append, params)
    assert [line for line in lines if "training" in line] == []
    assert sum("done before, skipped" in line for line in lines) == 2
    assert table.read_bytes() == first
    # Starting over in a fresh folder gives the same table, byte for byte.
    train_imp(run, data, tmp_path / "again", lines.append, params)
    assert (tmp_path / "again" / "levels.csv").read_bytes() == first
    # A level made for another path is refused, not silently reused.
    with pytest.raises(ValueError, match="was made for sparsity"):
        train_imp(run, data, tmp_path, lines.append, ImpParams(rate=0.2))


def test_global_levels_without_controls(tmp_path):
    run = _run(sparsity=0.5, distribution="global")
    train_imp(run, load(run.dataset), tmp_path, lambda line: None, ImpParams(rate=0.5, controls=()))
    rows = _rows(tmp_path / "levels.csv")
    assert [(r["level"], r["variant"], float(r["sparsity"])) for r in rows] == [("0", "ticket", 0.0), ("1", "ticket", 0.5)]
    with np.load(tmp_path / "levels" / "01" / "ticket.npz") as z:
        masks = [z[k] for k in z.files if k.startswith("m:")]
    assert sum(int((m == 0).sum()) for m in masks) == 44  # exact in total ...
    assert [int((m == 0).sum()) for m in masks] != [32, 12]  # ... and not split layer by layer


def test_level_seeds_depend_on_level_and_variant_only():
    assert level_seed(0, 1, "ticket") == level_seed(0, 1, "ticket")
    assert len({level_seed(s, n, v) for s in (0, 1) for n in (0, 1) for v in ("ticket", "reinit")}) == 8


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(rate=0.0), "rate must be a number in"),
        (dict(rate=1), "rate must be a number in"),
        (dict(rewind_step=-1), "rewind_step must be an integer"),
        (dict(rewind_step=1.5), "rewind_step must be an integer"),
        (dict(controls=("reinit", "reinit")), "controls must be distinct"),
        (dict(controls=("shuffle",)), "controls must be distinct names"),
        (dict(controls="random"), "controls must be a list"),
        (dict(stops=(1.0,)), r"stops\[0\] must be a sparsity"),
    ],
)
def test_imp_params_refuse_bad_values_naming_them(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ImpParams(**kwargs)


def test_runs_imp_cannot_do_are_refused_before_anything_is_written(tmp_path):
    data = load(_run().dataset)
    cases = [
        (_run(implementation=ImplementationConfig("sparse_tensor")), ImpParams(), "implementation 'masked' only"),
        (_run(distribution="erk"), ImpParams(), "distribution 'layer' or 'global'"),
        (_run(criterion="random"), ImpParams(), "criterion 'magnitude'"),
        (_run(), ImpParams(rewind_step=6), "at most the 5 steps"),
    ]
    for run, params, match in cases:
        with pytest.raises(ValueError, match=match):
            train_imp(run, data, tmp_path / "run", lambda line: None, params)
        assert not (tmp_path / "run").exists()


# -- kill -9 of the whole sweep in the middle of a level ----------------------------------------------------

SWEEP = """name = "impkill"
implementations = ["masked"]
sparsities = [0.875]
seeds = [1]
models = [{name = "mlp", widths = [32]}]
datasets = ["digits"]
methods = [{name = "imp", rate = 0.5, rewind_step = 2}]
[training]
epochs = 1
batch_size = 64
"""
# What a rerun may change: how long things took, and which process on which host did them.
VOLATILE = {
    "step_time_ms", "timed_steps", "latency_b1_ms", "latency_b256_ms", "peak_rss_mb", "startup_seconds",
    "fit_seconds", "eval_seconds", "total_seconds", "overhead_seconds", "hostname", "pid", "started_at", "ended_at",
}


def _sweep(config: Path, results: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"}
    return subprocess.Popen(
        [sys.executable, "-m", "experiments", "run", str(config), "--results", str(results)],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
    )


def _stable(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in VOLATILE} for r in rows]


@pytest.mark.slow
def test_sweep_killed_inside_an_imp_level_then_rerun_gives_the_same_runs_csv_rows(tmp_path):
    config = tmp_path / "impkill.toml"
    config.write_text(SWEEP)
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    reference = _sweep(config, whole)
    victim = _sweep(config, killed)

    def level_1_recorded() -> bool:  # levels.csv is rewritten (atomically) just after a level's folder lands
        tables = list((killed / "impkill" / "runs").glob("*/levels.csv"))
        return bool(tables) and any(r["level"] == "1" for r in _rows(tables[0]))

    deadline = time.monotonic() + 300
    while not level_1_recorded():
        assert victim.poll() is None, victim.stderr.read().decode()[-2000:]
        assert time.monotonic() < deadline, "level 1 never finished"
        time.sleep(0.02)
    os.killpg(victim.pid, signal.SIGKILL)  # the runner and its worker, inside level 2
    victim.wait()
    run_dir = next((killed / "impkill" / "runs").iterdir())
    assert not (run_dir / "result.json").exists() and not (run_dir / "levels" / "02").exists()
    assert [r["level"] for r in _rows(run_dir / "levels.csv")] == ["0", "1", "1", "1"]  # the committed levels only
    table = killed / "impkill" / "runs.csv"
    assert not table.exists() or _rows(table) == []  # the run was not finished, so it has no row yet
    rerun = _sweep(config, killed)
    assert rerun.wait(timeout=300) == 0, rerun.stderr.read().decode()[-2000:]
    assert reference.wait(timeout=300) == 0, reference.stderr.read().decode()[-2000:]
    rows, expected = _rows(table), _rows(whole / "impkill" / "runs.csv")
    assert len(rows) == 1 and rows[0]["status"] == "ok" and rows[0]["method"] == "imp"
    assert _stable(rows) == _stable(expected)
    assert float(rows[0]["sparsity"]) == pytest.approx(0.875, abs=0.005)
    levels = _rows(run_dir / "levels.csv")
    assert [r["level"] for r in levels] == ["0"] + ["1"] * 3 + ["2"] * 3 + ["3"] * 3
    assert levels == _rows(whole / "impkill" / "runs" / run_dir.name / "levels.csv")  # no timing columns: all equal
    assert not list((run_dir / "levels").glob(".*"))  # the half-written level was cleaned up
