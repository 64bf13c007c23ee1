"""Accuracy against measured latency: large-sparse against small-dense on Fashion-MNIST (issue 22).

Zhu and Gupta (2017) found that a large pruned model beats a small dense one of
the same number of weights. A user deploys at a latency, not a size, so this
script times the trained models of the Fashion-MNIST study as they would be
deployed and puts them on one figure with their test accuracy:

* ``unstructured`` (GMP, ``fmnist_<model>``), ``block 1x16``, ``2:4``, ``3:4``
  (``fmnist_<model>_patterns``): the masked model converted by
  ``prune.convert(to="sparse", matmul="auto")`` to ``SparseDense`` layers, which
  pick their kernel (native general or block kernels, or a dense product) by
  the cost model; the output layer stays a plain ``Dense``. Convolutions
  (LeNet-5's) are stripped to plain ``Conv2D`` layers with their zeros.
* ``channel`` (``fmnist_<model>_patterns``): ``prune.shrink`` of the stripped
  model, a plain model with the pruned units and filters removed. A model that
  ``shrink`` refuses is skipped with its reason: LeNet-5's convolutions pad
  ('same'), so a removed filter whose bias gives a nonzero constant cannot be
  folded into the next layer's bias.
* ``small dense`` (``fmnist_<model>_small_dense``): the model's shape made
  narrower to the pruned model's weight counts.
* ``dense``: the model itself.

``--study lenet300`` (the default) times LeNet-300-100's three sweeps;
``--study lenet5`` LeNet-5's five (GMP at 90 % in ``fmnist_lenet5``, at 50-98 % in
``fmnist_lenet5_gmp``; small dense models in ``fmnist_lenet5_small_dense`` and
``fmnist_lenet5_small_dense_sizes``; its patterns sweep has 2:4 and channels:
block patterns need 2-D weights).

Latency is timed on the seed-0 run of each cell (the deployed structure is
the same shape for every seed; the accuracy is the mean over seeds with its
95% t interval, from the runs tables). One ``tf.function`` per model, a forward
pass on test images, every model timed once per round in a shuffled order,
``--reps`` calls per timing, median over ``--rounds`` rounds. TensorFlow's
thread counts are fixed (``--threads``, inter-op 1) and written to the table.

    .venv/bin/python benchmarks/deployed_latency.py                 # times, writes the table and the figure
    .venv/bin/python benchmarks/deployed_latency.py --study lenet5  # LeNet-5's sweeps
    .venv/bin/python benchmarks/deployed_latency.py --figure-only   # redraws the figures from the table

Writes ``results/fmnist_<model>/latency.csv``, then redraws that sweep's
figures (``python -m experiments figures``), which draw
``accuracy_vs_latency.{png,pdf}`` from it.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "results"
STUDIES = {
    "lenet300": {"methods": "fmnist_lenet300", "patterns": "fmnist_lenet300_patterns", "small": "fmnist_lenet300_small_dense"},
    "lenet5": {"methods": "fmnist_lenet5", "gmp": "fmnist_lenet5_gmp", "patterns": "fmnist_lenet5_patterns",
               "small": "fmnist_lenet5_small_dense", "small_sizes": "fmnist_lenet5_small_dense_sizes"},
}
"""Each study's sweeps by role; ``methods`` names the study's folder, where ``latency.csv`` goes. LeNet-5's
methods sweep has one sparsity (90 %); ``gmp`` and ``small_sizes`` add the others."""
BATCHES = (1, 256)
COLUMNS = ["family", "target_sparsity", "run_id", "weights", "batch", "latency_ms", "rounds", "reps", "kernel",
           "accuracy", "accuracy_low", "accuracy_high", "seeds", "intra_op_threads", "inter_op_threads", "cpu_model",
           "native_vector"]


def family_of(row: pd.Series, model: str = "lenet300") -> str:
    """The curve a run belongs to on the figure (``model``: the study's full-size model)."""
    if row["implementation"] == "dense":
        return "dense" if row["model"] == model else "small dense"
    pattern = str(row["pattern"])  # the runner's labels: unstructured, block1x16, 2:4, 3:4, channel
    return "block 1x16" if pattern == "block1x16" else pattern


def _runs(results: Path, study: str) -> pd.DataFrame:
    from experiments.figures import read_tables

    parts = []
    for key, sweep in STUDIES[study].items():
        runs, _ = read_tables(results / sweep)
        runs = runs[runs["status"] == "ok"].copy()
        if key == "methods":  # GMP is the unstructured curve; the other methods are not deployed differently
            runs = runs[(runs["implementation"] == "dense") | (runs["method"] == "gmp")]
        runs["sweep"] = sweep
        parts.append(runs)
    runs = pd.concat(parts, ignore_index=True)
    runs["family"] = runs.apply(family_of, axis=1, model=study)
    runs["cell"] = np.where(runs["family"] == "small dense", runs["model"], runs["target_sparsity"].astype(str))
    return runs


@functools.lru_cache(maxsize=None)
def _sweep_runs(config: Path) -> dict:
    """The runs of a sweep file by run id (expanded once per sweep, not once per timed model)."""
    from experiments.config import load_sweep
    from experiments.grid import expand

    return {r.run_id: r for r in expand(load_sweep(config))}


def _model(results: Path, configs: Path, sweep: str, run_id: str, family: str):
    """The deployed Keras model of one run, rebuilt from its config and checkpoint."""
    import keras

    import prune
    from experiments.data import load
    from experiments.implementations import masked_model
    from experiments.models import seeded_model
    from experiments.steps import steps_per_epoch

    folder = results / sweep / "runs" / run_id
    run = _sweep_runs(configs / f"{sweep}.toml")[run_id]
    data = load(run.dataset)
    plain, _ = seeded_model(run, data, keras)
    if run.implementation.name == "dense":
        plain.load_weights(str(folder / "checkpoint.weights.h5"))
        return plain, data
    masked = masked_model(run, data, plain, steps_per_epoch(len(data.x_train), run.training.batch_size))
    masked.load_weights(str(folder / "checkpoint.weights.h5"))
    if family == "channel":
        return prune.shrink(prune.strip_pruning(masked)), data
    return _sparse_deployed(masked, keras), data


def _sparse_deployed(masked, keras):
    """``SparseDense`` for the pruned Dense layers (``prune.convert``), plain layers for the rest
    (``prune.strip_pruning``): the dense output layer stays a ``Dense`` (``convert`` alone would make every
    fully connected layer a ``SparseDense``), and convolutions run as ``Conv2D`` with their zeros, not as
    masked layers multiplying their masks."""
    import warnings

    import prune
    from prune.layers.sparse import SparseDense

    pruned = {layer.name for layer in prune.prunable_layers(masked)}
    with warnings.catch_warnings():  # convert names the convolutions it leaves; they are stripped here
        warnings.simplefilter("ignore", prune.ConversionWarning)
        sparse = prune.convert(masked, to="sparse", matmul="auto")
    plain = prune.strip_pruning(masked)
    layers = [
        s if isinstance(s, SparseDense) and s.name in pruned else p
        for s, p in zip(sparse.layers, plain.layers, strict=True)
    ]
    return keras.Sequential([keras.Input(shape=masked.input_shape[1:]), *layers], name=masked.name)


def _weights(model) -> int:
    """Stored kernel weights of a deployed model (nonzeros of Dense kernels, values of SparseDense)."""
    from prune.layers.sparse import SparseDense

    total = 0
    for layer in model.layers:
        if isinstance(layer, SparseDense):
            total += int(np.count_nonzero(layer.to_dense()))
        elif hasattr(layer, "kernel"):
            total += int(np.count_nonzero(np.asarray(layer.kernel)))
    return total


def _kernel(model) -> str:
    """``SparseDense auto`` (the layer picks its kernel per call) or ``Dense`` (plain, or shrunk)."""
    from prune.layers.sparse import SparseDense

    return "SparseDense auto" if any(isinstance(layer, SparseDense) for layer in model.layers) else "Dense"


def measure(args: argparse.Namespace) -> pd.DataFrame:
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.get_logger().setLevel("ERROR")
    from experiments.provenance import cpu_model
    from experiments.stats import mean_ci
    from prune import native

    results, configs = Path(args.results), Path(args.configs)
    runs = _runs(results, args.study)
    cells = []
    for (family, cell), group in runs.groupby(["family", "cell"]):
        first = group.sort_values("seed").iloc[0]
        ci = mean_ci(group["test_accuracy"])
        try:
            model, data = _model(results, configs, first["sweep"], first["run_id"], family)
        except ValueError as e:  # prune.shrink refuses what it cannot remove exactly (LeNet-5's padding='same')
            if family != "channel":
                raise
            print(f"skipped {family} {cell}: prune.shrink refuses it: {e}", flush=True)
            continue
        fn = tf.function(lambda x, m=model: m(x, training=False), reduce_retracing=True)
        inputs = {b: tf.constant(data.x_test[np.arange(b) % len(data.x_test)]) for b in BATCHES}
        for b in BATCHES:
            for _ in range(3):
                np.asarray(fn(inputs[b]))
        cells.append(dict(family=family, target_sparsity=float(first["target_sparsity"]), run_id=first["run_id"],
                          weights=_weights(model), kernel=_kernel(model), accuracy=ci.mean, accuracy_low=ci.low,
                          accuracy_high=ci.high, seeds=ci.n, fn=fn, inputs=inputs, times={b: [] for b in BATCHES}))
        print(f"built {family:12s} {cell:>8s}: {cells[-1]['weights']:7d} weights, kernel {cells[-1]['kernel']}", flush=True)
    rng = np.random.default_rng(0)
    for r in range(args.rounds):
        for i in rng.permutation(len(cells)):
            c = cells[i]
            for b in BATCHES:
                t0 = time.perf_counter()
                for _ in range(args.reps):
                    np.asarray(c["fn"](c["inputs"][b]))
                c["times"][b].append((time.perf_counter() - t0) / args.reps * 1000.0)
        print(f"round {r + 1}/{args.rounds}", flush=True)
    status = native.status()
    rows = []
    for c in cells:
        for b in BATCHES:
            rows.append(dict(
                family=c["family"], target_sparsity=c["target_sparsity"], run_id=c["run_id"], weights=c["weights"],
                batch=b, latency_ms=float(np.median(c["times"][b])), rounds=args.rounds, reps=args.reps,
                kernel=c["kernel"], accuracy=c["accuracy"], accuracy_low=c["accuracy_low"],
                accuracy_high=c["accuracy_high"], seeds=c["seeds"],
                intra_op_threads=tf.config.threading.get_intra_op_parallelism_threads(),
                inter_op_threads=tf.config.threading.get_inter_op_parallelism_threads(),
                cpu_model=cpu_model(), native_vector=getattr(status, "vector", "") or "",
            ))
    return pd.DataFrame(rows, columns=COLUMNS)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--study", choices=sorted(STUDIES), default="lenet300", help="the model whose sweeps are timed")
    p.add_argument("--figure-only", action="store_true", help="redraw the figures from the committed table")
    p.add_argument("--results", default=str(RESULTS), help="results root holding the study's sweeps")
    p.add_argument("--configs", default=str(ROOT / "experiments" / "configs"), help="folder of their sweep files")
    args = p.parse_args(argv)
    for name in ("rounds", "reps", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    study = STUDIES[args.study]["methods"]
    table = Path(args.results) / study / "latency.csv"
    if not args.figure_only:
        df = measure(args)
        table.parent.mkdir(parents=True, exist_ok=True)
        df.to_csv(table, index=False)
        print(f"wrote {table}; intra_op_threads={args.threads}, inter_op_threads=1")
    from experiments.figures import draw_figures

    for path in draw_figures(study, results_root=args.results):  # the sweep's figures, accuracy_vs_latency among them
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
