"""The layer benchmark script runs end to end on a tiny layer and writes every measure (no timing asserted)."""

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]


def test_layer_speed_writes_every_implementation_and_measure(tmp_path):
    out = tmp_path / "layer_speed.csv"
    cmd = [
        sys.executable, str(ROOT / "benchmarks" / "layer_speed.py"), "--sizes", "12x8", "--batches", "3",
        "--sparsities", "0.0,0.75", "--rounds", "2", "--min-ms", "0.1", "--k-max", "32", "--graph-k", "2",
        "--out", str(out), "--allow-loaded",  # tests run beside tests: the table says LOADED
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "TF_ENABLE_ONEDNN_SPMM=" in proc.stdout and "intra_op=" in proc.stdout  # settings stated
    df = pd.read_csv(out)
    impls = {"dense", "masked", "coo", "csr", "densify", "auto"}
    if os.environ.get("PRUNE_NATIVE", "1").strip() != "0":  # the native kernels are measured when they load
        impls.add("native")
    assert set(df["impl"]) == impls
    one_call = df[df["mode"].isin(["forward", "train_step"])]
    assert len(one_call) == 2 * len(impls) * 2  # sparsities x implementations x one-call measures
    assert (one_call["median_ms"] > 0).all()
    # In-graph measures are net of the graph's floor: on a layer this small some never stand clear of it and
    # are absent (the report counts them); those reported are positive, never a difference lost in the noise.
    in_graph = df[df["mode"].isin(["forward_graph", "train_step_graph"])]
    assert len(in_graph) <= 2 * len(impls) * 2 and (in_graph["median_ms"] > 0).all()
    assert (in_graph["min_ms"] > 0).all() and (in_graph["k"] >= 8).all()
    report = out.with_suffix(".md").read_text()
    assert "## Crossover sparsity" in report and "in graph" in report and "## Targets of issue 12" in report
    assert "- CPU: " in report and "- Load: " in report and "Dense calibration" in report
    assert f"{2 * len(impls) * 2 - len(in_graph)} in-graph points did not stand clear of the floor" in report


def test_peer_and_block_benchmarks_run_on_a_tiny_layer(tmp_path):
    """peers.py states its settings and skips torch with a note when no interpreter has it; block_speed.py
    writes every pattern in both modes (no timing asserted)."""
    out = tmp_path / "peers.csv"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "peers.py"), "--sizes", "24", "--batches", "2",
           "--sparsities", "0.5", "--rounds", "1", "--k-max", "8", "--min-ms", "0.1", "--torch-python",
           str(tmp_path / "no-python"), "--out", str(out), "--allow-loaded"]  # tests run beside tests: loaded
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = out.with_suffix(".md").read_text()
    assert "intra_op=" in report and "single-threaded" in report and "torch not measured" in report
    assert "Dense calibration: TensorFlow's [256, 1024] x [1024, 1024] GEMM at" in report and "- Load: " in report
    assert {"dense", "scipy"} <= set(pd.read_csv(out).columns)
    out = tmp_path / "block_speed.csv"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "block_speed.py"), "--size", "32", "--batches", "2",
           "--sparsities", "0.5", "--shapes", "1x16", "--nm", "2:4", "--rounds", "1", "--k-max", "8", "--min-ms", "0.1",
           "--out", str(out), "--allow-loaded"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    df = pd.read_csv(out)
    assert set(df["pattern"]) == {"unstructured", "block 1x16", "nm 2:4"} and set(df["mode"]) == {"forward", "train"}
