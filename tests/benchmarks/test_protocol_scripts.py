"""fit_step.py, dst_update.py, runner_workers.py, oneshot_speed.py (and deployed_latency.py's refusal) under benchmarks/protocol.py: each runs end to end on the
tiniest work it takes and heads its Markdown table with the protocol's lines (no timing asserted), keeps the
columns other code reads, and refuses a machine kept busy by spinning processes (exit 3) before any work."""

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(BENCH))


HEADER_LINES = ("- CPU: ", "- Load: ", "- Threads: ", "- Dense calibration: ")

TINY_SWEEP = """name = "tiny"
implementations = ["dense"]
sparsities = [0.5]
models = [{name = "mlp", widths = [16]}]
datasets = ["digits"]
[[schedules]]
kind = "polynomial"
begin = 0
end = 1
frequency = 5
[training]
epochs = 1
batch_size = 64
learning_rate = 0.01
"""


def run(script: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH / script), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def assert_header(md: Path) -> str:
    text = md.read_text()
    lines = text.splitlines()
    for start in HEADER_LINES:
        assert any(line.startswith(start) for line in lines), f"{md.name} has no line starting {start!r}:\n{text[:2000]}"
    assert "under `benchmarks/protocol.py`" in text
    return text


@pytest.mark.slow
def test_fit_step_runs_tiny_and_keeps_its_columns(tmp_path):
    out = tmp_path / "fit_step.csv"
    proc = run("fit_step.py", "--rounds", "1", "--batch", "32", "--limit", "128", "--out", str(out), "--allow-loaded")
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = assert_header(out.with_suffix(".md"))
    assert "the tfmot child (tf-keras" in text  # the child's threads, as it reports them
    df = pd.read_csv(out)
    assert list(df.columns[:8]) == ["implementation", "median_step_ms", "ratio", "ratio_basis", "intra_threads",
                                    "inter_threads", "batch", "rounds"]  # the columns docs/kernels.md quotes
    assert {"median_step_ms_min", "median_step_ms_max", "ratio_min", "ratio_max"} <= set(df.columns)
    assert len(df) == 5 and (df["median_step_ms_min"] <= df["median_step_ms"]).all()
    assert (df["median_step_ms"] <= df["median_step_ms_max"]).all()


@pytest.mark.slow
def test_oneshot_speed_runs_tiny_in_a_child_process_and_states_the_target(tmp_path):
    out = tmp_path / "oneshot_speed.csv"
    proc = run("oneshot_speed.py", "--d", "32", "--seqs", "4", "--tokens", "8", "--rounds", "1", "--cases",
               "sparsegpt 2:4", "--out", str(out), "--allow-loaded")
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = assert_header(out.with_suffix(".md"))
    assert "Target met: the slowest SparseGPT run took" in text  # a 32 x 32 layer is far inside 5 s and 64 MB
    df = pd.read_csv(out)
    assert df["case"].tolist() == ["sparsegpt 2:4"] and df["zeros"].tolist() == [0.5]
    assert (df["solve_s"] <= df["total_s"]).all() and (df["extra_mb"] >= 0).all()
    bad = run("oneshot_speed.py", "--cases", "sparsegpt 90%", "--out", str(tmp_path / "x.csv"), "--allow-loaded")
    assert bad.returncode != 0 and "--cases: 'sparsegpt 90%' not among" in bad.stderr
    assert not (tmp_path / "x.csv").exists()


def test_conv_speed_runs_tiny_and_keeps_its_columns(tmp_path):
    out = tmp_path / "conv_speed.csv"
    proc = run("conv_speed.py", "--layers", "1x1:8-16@5,3x3:4-8@6", "--batches", "1", "--sparsities", "0.9", "--rounds",
               "1", "--min-ms", "1", "--k-max", "8", "--out", str(out), "--allow-loaded")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_header(out.with_suffix(".md"))
    df = pd.read_csv(out)
    assert {"layer", "batch", "sparsity", "form", "mode", "ms", "ms_min", "ms_max", "dense_ms", "x_dense"} <= set(df.columns)
    assert len(df) == 2 * 3 * 2  # layers x forms x (forward, train)
    assert set(df["form"]) == {"unstructured", "block 1x16", "auto"} and set(df["mode"]) == {"forward", "train"}
    bad = run("conv_speed.py", "--layers", "3x3:32-64", "--out", str(tmp_path / "x.csv"), "--allow-loaded")
    assert bad.returncode != 0 and "--layers entries must look like '3x3:32-64@28'" in bad.stderr
    assert not (tmp_path / "x.csv").exists()


def test_conv_model_parts_times_every_layer_and_bounds_the_speed_up(tmp_path):
    out = tmp_path / "conv_model_parts.csv"
    proc = run("conv_model_parts.py", "--models", "lenet5", "--batches", "1", "--rounds", "1", "--min-ms", "1",
               "--out", str(out), "--allow-loaded")
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = assert_header(out.with_suffix(".md"))
    df = pd.read_csv(out)
    assert {"model", "batch", "form", "layer", "part", "pruned", "ms", "ms_min", "ms_max", "k"} <= set(df.columns)
    # LeNet-5's 8 layers in tf dense, its 3 pruned ones (conv_1, dense_0, dense_1) again in prune native, the model twice
    assert len(df) == 8 + 3 + 2
    assert sorted(df[df["form"] == "prune native"]["layer"]) == ["(whole model)", "conv_1", "dense_0", "dense_1"]
    assert set(df[df["pruned"]]["part"]) == {"conv 5x5 (pruned)", "Dense (pruned)"}
    assert "### lenet5, batch 1" in text and ("would run at most" in text or "no bound is given" in text)


def test_conv_model_parts_markdown_shares_parts_and_bounds_the_speed_up():
    import conv_model_parts

    rows = [("(whole model)", "(whole model)", False, "tf dense", 4.0), ("(whole model)", "(whole model)", False,
            "prune native", 2.5), ("dw_1", "depthwise 3x3", False, "tf dense", 1.0),
            ("bn_1", "batch norm", False, "tf dense", float("nan")),
            ("conv_1", "pointwise 1x1 (pruned)", True, "tf dense", 2.0),
            ("conv_1", "pointwise 1x1 (pruned)", True, "prune native", 0.5)]
    df = pd.DataFrame([dict(model="m", batch=1, layer=a, part=b, pruned=c, form=d, ms=e) for a, b, c, d, e in rows])
    lines = conv_model_parts.markdown(df).splitlines()
    assert "| pointwise 1x1 (pruned) | 1 | 2.000 | 0.500 | 50% |" in lines
    assert "| depthwise 3x3 | 1 | 1.000 | 1.000 | 25% |" in lines
    assert "| batch norm | 1 | - | - | - |" in lines  # hidden by the floor
    assert "| whole model, one graph | 3 | 4.000 | 2.500 | 100% |" in lines
    # whole 4.0 vs 2.5: 1.60x; pruned 2.0 of 4.0, so at most 4 / 2 = 2.00x; the pruned layer at 4x its dense speed
    assert lines[-1] == ("Whole model: prune native at 1.60x tf dense. The pruned layers alone take 2.000 ms dense (50% of "
                         "the dense model), so with them at zero time the model would run at most 2.00x faster; prune "
                         "native runs them at 4.00x their dense speed.")


@pytest.mark.slow
def test_dst_update_runs_tiny(tmp_path):
    out = tmp_path / "dst_update.csv"
    proc = run("dst_update.py", "--rounds", "1", "--batch", "8", "--methods", "set", "--out", str(out), "--allow-loaded")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_header(out.with_suffix(".md"))
    df = pd.read_csv(out)
    assert set(df["implementation"]) == {"masked", "SparseDense"} and set(df["method"]) == {"set"}
    for col in ("step_ms", "update_ms", "next_step_ms"):
        assert {col, f"{col}_min", f"{col}_max"} <= set(df.columns) and (df[col] > 0).all()


@pytest.mark.slow
def test_runner_workers_runs_a_tiny_sweep_and_keeps_its_keys(tmp_path):
    config = tmp_path / "tiny.toml"
    config.write_text(TINY_SWEEP)
    out = tmp_path / "runner_workers.json"
    proc = run("runner_workers.py", "--config", str(config), "--repeats", "1", "--out", str(out), "--allow-loaded")
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = assert_header(out.with_suffix(".md"))
    assert "this process runs no TensorFlow" in text
    got = json.loads(out.read_text())
    assert [s["workers"] for s in got["settings"]] == [1, 2] and "ratio" in got  # what docs/runner.md quotes
    for s in got["settings"]:
        assert {"wall_seconds", "exit_status", "runs", "failed", "mean_overhead_seconds_per_run",
                "wall_seconds_min", "wall_seconds_max", "intra_op_threads"} <= set(s)
        assert s["exit_status"] == 0 and s["runs"] == 1 and s["failed"] == 0
    assert got["protocol"]["dense_gemm_gflops"]["median"] > 0


def test_each_script_refuses_a_machine_kept_busy_before_any_work(tmp_path, busy_machine):
    """A spinning process on every core and a tiny threshold: exit 3, 'refused:' on stderr, nothing written."""
    config = tmp_path / "tiny.toml"
    config.write_text(TINY_SWEEP)
    calls = {
        "fit_step.py": ["--rounds", "1", "--out", str(tmp_path / "fit_step.csv")],
        "dst_update.py": ["--rounds", "1", "--out", str(tmp_path / "dst_update.csv")],
        "runner_workers.py": ["--config", str(config), "--repeats", "1", "--out", str(tmp_path / "runner_workers.json")],
        "deployed_latency.py": ["--rounds", "1", "--results", str(tmp_path / "results")],
        "loop_limit.py": ["--out", str(tmp_path / "loop_limit.csv")],
        "conv_speed.py": ["--rounds", "1", "--out", str(tmp_path / "conv_speed.csv")],
        "conv_parts.py": ["--rounds", "1", "--out", str(tmp_path / "conv_parts.csv")],
        "conv_model_speed.py": ["--rounds", "1", "--out", str(tmp_path / "conv_model_speed.csv")],
        "conv_model_parts.py": ["--rounds", "1", "--out", str(tmp_path / "conv_model_parts.csv")],
        "deploy_speed.py": ["--models", "tiny", "--rounds", "1", "--out", str(tmp_path / "deploy_speed")],
        "transformer_speed.py": ["--models", "tiny", "--rounds", "1", "--out", str(tmp_path / "transformer_speed")],
        "nm_parts.py": ["--shapes", "37x53", "--rounds", "1", "--out", str(tmp_path / "nm_parts")],
    }
    for script, args in calls.items():
        proc = run(script, *args, "--busy-threshold", "0.01", timeout=120)
        assert proc.returncode == 3, f"{script}: exit {proc.returncode}\n{proc.stderr[-3000:]}"
        assert "refused: the machine is busy" in proc.stderr, proc.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.toml"]  # no table written


def test_deployed_latency_names_a_missing_checkpoint_before_any_work(tmp_path):
    """The trained weights are not committed: without them the script says which file and how to make it, in one
    line, and writes nothing (the committed table stays as it is)."""
    table = ROOT / "results" / "fmnist_lenet300" / "latency.csv"
    before = table.read_bytes()
    proc = run("deployed_latency.py", "--checkpoints", str(tmp_path), "--allow-loaded", timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {tmp_path}/fmnist_lenet300/") and "--checkpoints ROOT" in lines[0], lines
    assert table.read_bytes() == before and list(tmp_path.iterdir()) == []
