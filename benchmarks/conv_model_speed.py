"""Convnets end to end: the MobileNet-style model and LeNet-5 at 90%, as deployed, dense against sparse.

Each model (``--models``: the runner's ``mobilenet`` at alpha = 1 and ``lenet5``, 28 x 28 x 1 inputs, 10 classes,
seeded initial weights) is pruned to ``--sparsity`` by magnitude in one shot, every convolution but the first and
the depthwise ones (and mobilenet's pointwise convolutions only: its output layer stays dense; LeNet-5's hidden
Dense layers are pruned, its output layer not). Then, in one run, interleaved, each form is called on the same
batch (``--batches``) as a user deploys it:

    tf dense         the pruned model stripped (prune.strip_pruning): Conv2D/Dense holding their zeros, in a
                     tf.function
    prune native     prune.convert(to="sparse", matmul="native") for the pruned layers (SparseConv2D,
                     SparseDense), the kept ones plain, in a tf.function
    prune auto       the same with matmul="auto"
    litert dense     prune.export.to_tflite(stripped, sparsity=False) in LiteRT's interpreter
    litert sparse    to_tflite(stripped, sparsity=True): LiteRT's sparse weight format

and, for ``--train-batch``, one training step (forward, gradients, Adam) of ``tf dense`` and ``prune native``.
Every form's output is checked against the stripped model's before timing. Medians of ``--rounds`` interleaved
rounds with min-max; the header states the CPU, threads (TF and LiteRT alike), the load and the dense GEMM
calibration. Writes ``results/benchmarks/conv_model_speed.csv`` and ``.md``.

    .venv/bin/python benchmarks/conv_model_speed.py
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import protocol  # noqa: E402

MODELS = ("mobilenet", "lenet5")
FORMS = ("tf dense", "prune native", "prune auto", "litert dense", "litert sparse")


def pruned_model(name: str, sparsity: float):
    """The runner's model ``name`` with seeded weights, its prunable layers (but the first convolution and the output
    layer) pruned to ``sparsity`` by magnitude, as a masked model; and the names of the pruned layers."""
    import keras

    import prune
    from experiments.config import ModelConfig
    from experiments.models import build, initial_weights

    keras.utils.set_random_seed(0)
    plain = build(ModelConfig(name), (28, 28, 1), 10, keras)
    plain.set_weights(initial_weights(plain, 0))
    kernels = [layer.name for layer in plain.layers if hasattr(layer, "kernel")]
    keep = ["conv_0", kernels[-1]]
    masked = prune.prune_low_magnitude(plain, prune.ConstantSparsity(sparsity, 0), pruning_policy=prune.KeepDense(keep))
    prune.update_masks(masked, 0)
    return masked, {layer.name for layer in prune.prunable_layers(masked)}


def sparse_form(masked, matmul: str):
    """The runner's sparse form of ``masked`` (``experiments.implementations.sparse_where_pruned``), without a schedule."""
    from experiments.implementations import sparse_where_pruned
    from prune.layers.sparse import sparse_layers

    sparse = sparse_where_pruned(masked, matmul)
    for layer in sparse_layers(sparse):
        layer.pruning_schedule = None  # a fixed structure: the training rows time steps, not mask updates
    return sparse


def train_fn(model, x, y):
    import keras
    import tensorflow as tf

    optimizer = keras.optimizers.Adam(1e-4)
    optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy()

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss

    step()
    return lambda: step().numpy()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--sparsity", type=float, default=0.9)
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--train-batch", type=int, default=32, help="training-step batch (0: no training rows)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--min-ms", type=float, default=100.0, help="each measurement repeats calls for this long")
    parser.add_argument("--out", default=str(ROOT / "results" / "benchmarks" / "conv_model_speed.csv"))
    protocol.add_arguments(parser)
    args = parser.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    unknown = sorted(set(models) - set(MODELS))
    if unknown:
        parser.error(f"--models: unknown {unknown}; choose from {list(MODELS)}")
    if not 0.0 <= args.sparsity < 1.0:
        parser.error(f"--sparsity must be in [0, 1), got {args.sparsity!r}")

    import tensorflow as tf

    import prune
    from deployed_latency import _litert, _litert_runtime
    from peers import write_results
    from prune.deploy.export import to_tflite

    intra, inter = protocol.fix_tf_threads()
    load = protocol.start_or_refuse(args)
    if load is None:
        return protocol.REFUSED
    gemm = protocol.dense_gemm_gflops()
    mach = protocol.machine()
    rng = np.random.default_rng(0)
    fns, info = {}, {}
    for name in models:
        masked, pruned = pruned_model(name, args.sparsity)
        plain = prune.strip_pruning(masked)
        tf_forms = {"tf dense": plain, "prune native": sparse_form(masked, "native"),
                    "prune auto": sparse_form(masked, "auto")}
        flat = {"litert dense": to_tflite(plain, sparsity=False), "litert sparse": to_tflite(plain, sparsity=True)}
        stored = sum(int(np.count_nonzero(layer.kernel.numpy())) for layer in plain.layers if hasattr(layer, "kernel"))
        info[name] = dict(pruned=",".join(sorted(pruned)), stored_weights=stored,
                          kernel_weights=sum(int(np.prod(layer.kernel.shape)) for layer in plain.layers if hasattr(layer, "kernel")))
        for b in (int(v) for v in args.batches.split(",")):
            x = rng.standard_normal((b, 28, 28, 1)).astype(np.float32)
            xt = tf.constant(x)
            reference = None
            for form, model in tf_forms.items():
                fn = tf.function(lambda x, m=model: m(x, training=False))
                got = np.asarray(fn(xt))
                reference = got if reference is None else reference
                if not np.allclose(got, reference, rtol=1e-4, atol=1e-5):
                    raise RuntimeError(f"{name} {form} differs from tf dense at batch {b}")
                fns[name, form, "forward", b] = lambda f=fn, xt=xt: np.asarray(f(xt))
            for form, content in flat.items():
                call = _litert(content, x, intra)
                if not np.allclose(call(), reference, rtol=1e-4, atol=1e-5):
                    raise RuntimeError(f"{name} {form} differs from tf dense at batch {b}")
                fns[name, form, "forward", b] = call
        if args.train_batch:
            x = tf.constant(rng.standard_normal((args.train_batch, 28, 28, 1)).astype(np.float32))
            y = tf.constant(rng.integers(0, 10, args.train_batch))
            for form in ("tf dense", "prune native"):
                fns[name, form, "train", args.train_batch] = train_fn(tf_forms[form], x, y)
        print(f"built {name}: {info[name]['stored_weights']} of {info[name]['kernel_weights']} kernel weights stored", flush=True)
    times = protocol.interleaved(fns, args.rounds, args.min_ms)
    load.stop()
    rows = []
    for (name, form, mode, b), s in times.items():
        dense = times[name, "tf dense", mode, b]
        rows.append(dict(model=name, form=form, mode=mode, batch=b, sparsity=args.sparsity, ms=s.median, ms_min=s.low,
                         ms_max=s.high, x_tf_dense=dense.median / s.median, **info[name]))
    df = pd.DataFrame(rows).sort_values(["model", "mode", "batch", "form"], kind="stable")
    header = protocol.header(
        "Convnets end to end: dense against sparse, as deployed", mach, load, gemm,
        f"TensorFlow {tf.__version__}: intra_op={intra}, inter_op={inter}; LiteRT num_threads={intra} "
        f"({_litert_runtime()})",
        [f"One call of the model on one batch (TF: a tf.function; LiteRT: set_tensor, invoke, get_tensor); medians "
         f"of {args.rounds} interleaved rounds, each >= {args.min_ms:g} ms of calls; {args.sparsity:.0%} of each "
         "pruned layer's weights removed by magnitude, at random initial weights (latency does not depend on them)."],
    )
    lines = [header, "", "| model | mode | batch | form | ms (min-max) | x tf dense |", "|---|---|---|---|---|---|"]
    for _, r in df.iterrows():
        lines.append(f"| {r['model']} | {r['mode']} | {r['batch']} | {r['form']} | {r['ms']:.3f} ({r['ms_min']:.3f}-"
                     f"{r['ms_max']:.3f}) | {r['x_tf_dense']:.2f} |")
    lines += ["", "Pruned layers: " + "; ".join(f"{m}: {v['pruned']} ({v['stored_weights']} of {v['kernel_weights']} "
                                                 "kernel weights stored)" for m, v in info.items())]
    write_results(df, Path(args.out), "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
