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
block patterns need 2-D weights); ``--study mobilenet`` the MobileNet-style model's
two (issue 34: GMP at 50-90 % in ``fmnist_mobilenet_gmp``, dense widths in
``fmnist_mobilenet_small_dense``), at batch 1 and 32, its pruned pointwise
convolutions deployed as ``SparseConv2D`` on the native kernels
(:data:`SPARSE_CONVOLUTIONS`).

Latency is timed on the seed-0 run of each cell (the deployed structure is
the same shape for every seed; the accuracy is the mean over seeds with its
95% t interval, from the runs tables), three ways (:data:`RUNTIMES`): the
deployed Keras model in one ``tf.function``, and the same weights in LiteRT's
interpreter, dense and in LiteRT's sparse weight format, each checked against
the TF model's output first. Under ``benchmarks/protocol.py``: a busy machine
is refused, the CPU, load and dense GEMM head ``latency.md``, every (model,
runtime, batch) point is timed once per round in a fresh random order for at
least ``--min-ms``, medians with min-max over ``--rounds`` rounds. TensorFlow's
intra-op threads and LiteRT's threads are the same (``--threads``, default the
usable cores; inter-op 1) and written to the table.

The trained weights (``checkpoint.weights.h5``) are not committed. Retrain the
seed-0 runs into a scratch root and point ``--checkpoints`` at it: a copy of
each sweep file with ``seeds = [0]`` (and, for the methods sweep,
``methods = ["gmp"]``) gives the same run ids, and the runs reproduce the
committed accuracies (all 35 did, bit for bit, on 2026-12-02):

    .venv/bin/python -m experiments run COPY.toml --workers 2 --results /tmp/retrain   # for each sweep
    .venv/bin/python benchmarks/deployed_latency.py --checkpoints /tmp/retrain

    .venv/bin/python benchmarks/deployed_latency.py --checkpoints /tmp/retrain                 # times, table, figure
    .venv/bin/python benchmarks/deployed_latency.py --checkpoints /tmp/retrain --study lenet5  # LeNet-5's sweeps
    .venv/bin/python benchmarks/deployed_latency.py --figure-only   # redraws the figures from the table

Writes ``results/fmnist_<model>/latency.csv`` and ``latency.md``, then redraws that sweep's
figures (``python -m experiments figures``), which draw
``accuracy_vs_latency.{png,pdf}`` from it.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
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
    "mobilenet": {"methods": "fmnist_mobilenet_gmp", "small": "fmnist_mobilenet_small_dense"},
}
"""Each study's sweeps by role; ``methods`` names the study's folder, where ``latency.csv`` goes. LeNet-5's
methods sweep has one sparsity (90 %); ``gmp`` and ``small_sizes`` add the others. MobileNet's dense model
(alpha = 1) is in its small-dense sweep."""
BATCHES = {"lenet300": (1, 256), "lenet5": (1, 256), "mobilenet": (1, 32)}
"""The batches each study is timed at: MobileNet's at 1 and 32, the batches of issue 34's targets."""
SPARSE_CONVOLUTIONS = {"mobilenet": "native"}
"""Studies whose pruned convolutions deploy as ``SparseConv2D`` (``experiments.implementations.sparse_where_pruned``
with this ``matmul``), for every pruned layer. The others keep their convolutions ``Conv2D`` with their zeros and
their Dense layers ``SparseDense`` ``auto``, the form their committed tables timed. ``native``, not ``auto``: on
MobileNet at 90%, ``conv_model_speed.md`` (2026-12-03) measured native faster at batch 32 (12.3 against 14.6 ms)
and level at batch 1."""
RUNTIMES = ("tf", "litert", "litert_sparse")
"""Each model is timed three ways: as deployed in a ``tf.function`` (``tf``), and in LiteRT's interpreter, where a
user deploys at batch 1, from the same weights as a dense flatbuffer (``litert``: ``prune.export.to_tflite(plain,
sparsity=False)``) and with LiteRT's sparse weight format (``litert_sparse``: ``sparsity=True``; pruned models only)."""
COLUMNS = ["family", "target_sparsity", "run_id", "weights", "batch", "latency_ms", "latency_low_ms",
           "latency_high_ms", "litert_ms", "litert_low_ms", "litert_high_ms", "litert_sparse_ms",
           "litert_sparse_low_ms", "litert_sparse_high_ms", "rounds", "min_ms", "kernel", "accuracy", "accuracy_low",
           "accuracy_high", "seeds", "intra_op_threads", "inter_op_threads", "litert_threads", "cpu_model",
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


def _checkpoint(checkpoints: Path, sweep: str, run_id: str) -> Path:
    """A run's trained weights, or a FileNotFoundError that says how to make them."""
    path = checkpoints / sweep / "runs" / run_id / "checkpoint.weights.h5"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: the trained weights are not committed. Retrain seed 0 of "
            f"experiments/configs/{sweep}.toml into a scratch root (python -m experiments run COPY.toml --results "
            f"ROOT, COPY a copy with seeds = [0]) and pass --checkpoints ROOT")
    return path


def _model(results: Path, configs: Path, sweep: str, run_id: str, family: str, checkpoints: Path | None = None,
           conv_matmul: str | None = None):
    """The deployed Keras model of one run, rebuilt from its config and checkpoint (under ``checkpoints``, else
    ``results``); ``conv_matmul``: the study's :data:`SPARSE_CONVOLUTIONS` entry."""
    import keras

    import prune
    from experiments.data import load
    from experiments.implementations import masked_model
    from experiments.models import seeded_model
    from experiments.steps import steps_per_epoch

    weights = str(_checkpoint(checkpoints or results, sweep, run_id))
    run = _sweep_runs(configs / f"{sweep}.toml")[run_id]
    data = load(run.dataset)
    plain, _ = seeded_model(run, data, keras)
    if run.implementation.name == "dense":
        plain.load_weights(weights)
        return plain, data
    masked = masked_model(run, data, plain, steps_per_epoch(len(data.x_train), run.training.batch_size))
    masked.load_weights(weights)
    if family == "channel":
        return prune.shrink(prune.strip_pruning(masked)), data
    if conv_matmul is not None:
        from experiments.implementations import sparse_where_pruned

        return sparse_where_pruned(masked, conv_matmul), data
    return _sparse_deployed(masked, keras), data


def _sparse_deployed(masked, keras):
    """``SparseDense`` for the pruned Dense layers (``prune.convert``), plain layers for the rest
    (``prune.strip_pruning``): the dense output layer stays a ``Dense`` (``convert`` alone would make every
    fully connected layer a ``SparseDense``), and convolutions run as ``Conv2D`` with their zeros, not as
    masked layers multiplying their masks. ``convert`` also makes the convolutions ``SparseConv2D``; this form
    keeps them ``Conv2D``, the form its committed tables timed (``SparseConv2D`` is timed by ``conv_speed.py``)."""
    import warnings

    import prune
    from prune.layers.sparse import SparseDense

    pruned = {layer.name for layer in prune.prunable_layers(masked)}
    with warnings.catch_warnings():  # convert names the convolutions it leaves; they are stripped here
        warnings.simplefilter("ignore", prune.ConversionWarning)
        sparse = prune.convert(masked, to="sparse", matmul="auto")
    plain = prune.strip_pruning(masked)
    layers = [
        s if type(s) is SparseDense and s.name in pruned else p  # not SparseConv2D: see the docstring
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
    """The sparse layers' class and ``matmul`` (``SparseDense auto``: the layer picks its kernel per call;
    ``SparseConv2D native``), or ``Dense`` (plain, or shrunk)."""
    from prune.layers.sparse import SparseDense

    kinds = sorted({f"{type(layer).__name__} {layer.matmul}" for layer in model.layers if isinstance(layer, SparseDense)})
    return ", ".join(kinds) or "Dense"


def _tf_form(study: str) -> str:
    """The TF graph's sparse layers in a study, for the table's header."""
    if study in SPARSE_CONVOLUTIONS:
        return (f"SparseConv2D/SparseDense with matmul={SPARSE_CONVOLUTIONS[study]!r} for every pruned layer, "
                "the layers kept dense plain")
    return "SparseDense with matmul='auto' for pruned Dense layers, convolutions Conv2D with their zeros"


def _plain(model, family: str):
    """The model as plain Keras layers, for LiteRT: ``SparseDense`` back to ``Dense`` with its zeros."""
    import prune

    return model if family in ("dense", "small dense", "channel") else prune.strip_pruning(model)


def _litert(content: bytes, x: np.ndarray, threads: int):
    """A call of the flatbuffer ``content`` on the batch ``x`` in LiteRT, as a user deploys it: set the input,
    invoke, read the output (one interpreter per batch size, resized and allocated once)."""
    from prune.deploy.export import tflite_interpreter

    interp = tflite_interpreter(content, num_threads=threads)
    inp, out = interp.get_input_details()[0], interp.get_output_details()[0]
    interp.resize_tensor_input(inp["index"], x.shape)
    interp.allocate_tensors()
    x = np.ascontiguousarray(x, dtype=inp["dtype"])

    def call():
        interp.set_tensor(inp["index"], x)
        interp.invoke()
        return interp.get_tensor(out["index"])

    return call


def _litert_runtime() -> str:
    """The interpreter the LiteRT columns ran in (``prune.export.tflite_interpreter``'s choice)."""
    try:
        import ai_edge_litert
    except ImportError:
        import tensorflow as tf

        return f"tf.lite.Interpreter of TensorFlow {tf.__version__}; ai-edge-litert is not installed"
    return f"ai-edge-litert {ai_edge_litert.__version__}"


def measure(args: argparse.Namespace, threads: tuple[int, int]) -> pd.DataFrame:
    """Every deployed model of the study, timed as ``tf``/``litert``/``litert_sparse`` at each batch, interleaved
    (:func:`protocol.interleaved`: a fresh random order every round, each timing at least ``--min-ms``)."""
    import tensorflow as tf

    import protocol
    from experiments.provenance import cpu_model
    from experiments.stats import mean_ci
    from prune import native
    from prune.deploy.export import to_tflite

    results, configs = Path(args.results), Path(args.configs)
    checkpoints = Path(args.checkpoints) if args.checkpoints else None
    runs = _runs(results, args.study)
    cells, fns = [], {}
    for (family, cell), group in runs.groupby(["family", "cell"]):
        first = group.sort_values("seed").iloc[0]
        ci = mean_ci(group["test_accuracy"])
        try:
            model, data = _model(results, configs, first["sweep"], first["run_id"], family, checkpoints,
                                 SPARSE_CONVOLUTIONS.get(args.study))
        except ValueError as e:  # prune.shrink refuses what it cannot remove exactly (LeNet-5's padding='same')
            if family != "channel":
                raise
            print(f"skipped {family} {cell}: prune.shrink refuses it: {e}", flush=True)
            continue
        key = (family, cell)
        fn = tf.function(lambda x, m=model: m(x, training=False), reduce_retracing=True)
        plain = _plain(model, family)
        flat = {"litert": to_tflite(plain, sparsity=False)}
        if family not in ("dense", "small dense", "channel"):
            flat["litert_sparse"] = to_tflite(plain, sparsity=True)
        for b in BATCHES[args.study]:
            x = data.x_test[np.arange(b) % len(data.x_test)]
            xt = tf.constant(x)
            reference = np.asarray(fn(xt))
            fns[key, "tf", b] = lambda f=fn, xt=xt: np.asarray(f(xt))
            for runtime, content in flat.items():
                call = _litert(content, x, threads[0])
                got = call()
                if not np.allclose(got, reference, rtol=1e-4, atol=1e-4):  # the same model, or the row means nothing
                    raise RuntimeError(f"{family} {cell}: {runtime} differs from the TF model at batch {b} "
                                       f"(max |diff| {np.max(np.abs(got - reference)):.3g})")
                fns[key, runtime, b] = call
        cells.append(dict(key=key, family=family, target_sparsity=float(first["target_sparsity"]),
                          run_id=first["run_id"], weights=_weights(model), kernel=_kernel(model), accuracy=ci.mean,
                          accuracy_low=ci.low, accuracy_high=ci.high, seeds=ci.n))
        print(f"built {family:12s} {cell:>8s}: {cells[-1]['weights']:7d} weights, kernel {cells[-1]['kernel']}, "
              f"LiteRT {', '.join(flat)}", flush=True)
    print(f"timing {len(fns)} (model, runtime, batch) points over {args.rounds} rounds", flush=True)
    times = protocol.interleaved(fns, args.rounds, args.min_ms)
    status = native.status()
    rows = []
    for c in cells:
        for b in BATCHES[args.study]:
            row = {k: v for k, v in c.items() if k != "key"}
            row.update(batch=b, rounds=args.rounds, min_ms=args.min_ms, intra_op_threads=threads[0],
                       inter_op_threads=threads[1], litert_threads=threads[0], cpu_model=cpu_model(),
                       native_vector=getattr(status, "vector", "") or "")
            for runtime in RUNTIMES:
                got = times.get((c["key"], runtime, b))
                name = "latency" if runtime == "tf" else runtime
                row[f"{name}_ms"] = got.median if got else np.nan
                row[f"{name}_low_ms"] = got.low if got else np.nan
                row[f"{name}_high_ms"] = got.high if got else np.nan
            rows.append(row)
    return pd.DataFrame(rows, columns=COLUMNS)


def markdown(df: pd.DataFrame) -> str:
    """The table as Markdown: one row per model and batch, each runtime's median (min-max) in ms, and the TF form
    over LiteRT's dense interpreter of the same weights."""
    def cell(r, name):
        m = r[f"{name}_ms"]
        return "-" if pd.isna(m) else f"{m:.3f} ({r[f'{name}_low_ms']:.3f}-{r[f'{name}_high_ms']:.3f})"

    def ratio(r: dict) -> str:
        return "-" if pd.isna(r["latency_ms"]) or pd.isna(r["litert_ms"]) else f"{r['latency_ms'] / r['litert_ms']:.2f}x"

    lines = ["| family | target | weights | accuracy % (95% CI) | batch | TF graph, ms | LiteRT dense, ms | "
             "LiteRT sparse format, ms | TF / LiteRT dense |", "|---|---|---|---|---|---|---|---|---|"]
    for r in df.sort_values(["batch", "family", "weights"], ascending=[True, True, False]).to_dict("records"):
        lines.append(f"| {r['family']} | {r['target_sparsity']:g} | {r['weights']} | {100 * r['accuracy']:.2f} "
                     f"({100 * r['accuracy_low']:.2f}-{100 * r['accuracy_high']:.2f}, {r['seeds']} seeds) | {r['batch']} "
                     f"| {cell(r, 'latency')} | {cell(r, 'litert')} | {cell(r, 'litert_sparse')} | "
                     f"{ratio(r)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import protocol

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--min-ms", type=float, default=20.0, help="each timing calls the model for at least this long")
    p.add_argument("--threads", type=int, default=0,
                   help="TensorFlow's intra-op threads and LiteRT's threads (default: the usable cores)")
    p.add_argument("--study", choices=sorted(STUDIES), default="lenet300", help="the model whose sweeps are timed")
    p.add_argument("--figure-only", action="store_true", help="redraw the figures from the committed table")
    p.add_argument("--results", default=str(RESULTS), help="results root holding the study's sweeps")
    p.add_argument("--configs", default=str(ROOT / "experiments" / "configs"), help="folder of their sweep files")
    p.add_argument("--checkpoints", default="", help="results root holding the runs' checkpoint.weights.h5 "
                   "(default: --results)")
    protocol.add_arguments(p)
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds must be at least 1, got {args.rounds}")
    if args.threads < 0:
        p.error(f"--threads must be 0 (the usable cores) or more, got {args.threads}")
    if not args.min_ms > 0:
        p.error(f"--min-ms must be above 0, got {args.min_ms}")
    study = STUDIES[args.study]["methods"]
    table = Path(args.results) / study / "latency.csv"
    if not args.figure_only:
        load = protocol.start_or_refuse(args)
        if load is None:
            return protocol.REFUSED
        runs = _runs(Path(args.results), args.study)  # every checkpoint there before anything is timed or written
        firsts = runs.sort_values("seed").groupby(["family", "cell"]).head(1)
        try:
            for r in firsts.itertuples():
                _checkpoint(Path(args.checkpoints or args.results), r.sweep, r.run_id)
        except FileNotFoundError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        threads = protocol.fix_tf_threads(args.threads or None)
        gemm = protocol.dense_gemm_gflops()
        mach = protocol.machine()
        df = measure(args, threads)
        load.stop()
        head = protocol.header(
            f"Deployed latency of the {args.study} study's models", mach, load, gemm,
            f"TensorFlow intra_op={threads[0]}, inter_op={threads[1]}; LiteRT ({_litert_runtime()}) "
            f"num_threads={threads[0]}, default delegates (XNNPACK)",
            extra=[f"Seed 0 of each cell, rebuilt from its checkpoint; accuracy: mean over seeds with its 95% t "
                   f"interval, from the runs tables. {args.rounds} interleaved rounds, each timing at least "
                   f"{args.min_ms:g} ms of back-to-back calls; median (min-max) over rounds.",
                   f"TF graph: the deployed Keras model ({_tf_form(args.study)}) in a "
                   "tf.function, input a constant, output read back. LiteRT: the same weights, stripped to plain "
                   "layers, converted by prune.export.to_tflite (sparsity=False: dense; True: LiteRT's sparse weight "
                   "format); a call sets the input, invokes and reads the output. Each LiteRT model's output was "
                   "checked against the TF model's before timing."])
        table.parent.mkdir(parents=True, exist_ok=True)
        df.to_csv(table, index=False)
        table.with_suffix(".md").write_text(head + "\n" + markdown(df))
        print(head)
        print(f"wrote {table} and {table.with_suffix('.md')}")
    from experiments.figures import draw_figures

    skipped: list[str] = []  # MobileNet's GMP sweep has no dense run (it is in the small-dense sweep): no step-time figure
    for path in draw_figures(study, results_root=args.results, skipped=skipped):  # accuracy_vs_latency among them
        print(f"wrote {path}")
    for line in skipped:
        print(f"not drawn: {line}")
    if any(line.startswith("accuracy_vs_latency") for line in skipped):
        print("error: the accuracy-latency figure could not be drawn", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
