"""What structure buys SparseDense's native kernels: block shapes and N:M against unstructured and dense.

For a 1024x1024 layer (``--size``), each batch and sparsity, times per application
inside a compiled graph (``(T_K - T_1) / (K - 1)``, as ``benchmarks/layer_speed.py``'s
``*_graph`` measures) of

    dense         keras.layers.Dense with the pruned weight (oneDNN's GEMM)
    unstructured  SparseDense(matmul="native") on a uniformly random structure (the general kernels)
    block RxC     SparseDense(matmul="native") on whole R x C tiles (R inputs x C outputs), kept
                  at random with the same density; with C in 4/8/16/32 the block kernels run
                  (prune/native/block_ops.h), as 1 x C tiles whatever R is
    nm N:M        N of every M consecutive inputs kept for each output (prune.NByM's axis), at
                  their own density (2:4 = 50%, 1:4 = 75%), with the general kernels, beside
                  unstructured at that density

``forward`` is ``y = x @ W + b``; ``train`` is one training step (forward, input and
values gradients, Adam update). Medians of ``--rounds`` interleaved rounds; TF threads
stated in the output. Writes ``results/benchmarks/block_speed.csv`` and ``.md``.

    .venv/bin/python benchmarks/block_speed.py
    .venv/bin/python benchmarks/block_speed.py --batches 256 --sparsities 0.9 --shapes 1x16
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

SHAPES = ("1x8", "1x16", "1x32", "4x4", "4x8", "2x16")


def block_mask(rng: np.random.Generator, n_in: int, n_out: int, r: int, c: int, sparsity: float) -> np.ndarray:
    nr, nc = -(-n_in // r), -(-n_out // c)
    keep = np.zeros(nr * nc, bool)
    keep[rng.permutation(nr * nc)[: nr * nc - int(round(sparsity * nr * nc))]] = True
    return np.repeat(np.repeat(keep.reshape(nr, nc), r, 0), c, 1)[:n_in, :n_out]


def nm_mask(rng: np.random.Generator, n_in: int, n_out: int, n: int, m: int) -> np.ndarray:
    """N of every M consecutive inputs kept, per output."""
    scores = rng.random((n_in // m, m, n_out))
    ranks = np.argsort(np.argsort(-scores, axis=1), axis=1)
    return (ranks < n).reshape(n_in, n_out)


def layer_for(kind: str, w: np.ndarray, mask: np.ndarray):
    import keras

    from prune.layers.sparse import SparseDense

    if kind == "dense":
        layer = keras.layers.Dense(w.shape[1])
        layer.build((None, w.shape[0]))
        layer.kernel.assign(w * mask)
        return layer
    return SparseDense.from_dense(w, mask, matmul="native")


def time_point(size, batch, masks, rounds, graph_k, rng):
    """{name: (forward ms, train ms)} per application in graph for each (name, mask)."""
    import tensorflow as tf
    from layer_speed import make_fns

    w = (rng.standard_normal((size, size)) * np.sqrt(2.0 / size)).astype(np.float32)
    xs = [tf.constant(rng.standard_normal((batch, size)).astype(np.float32)) for _ in range(graph_k)]
    fns = {}
    for name, (kind, mask) in masks.items():
        made = make_fns(layer_for(kind, w, mask), xs)
        for key in ("forward", "forward_k", "train_step", "train_step_k"):
            made[key]().numpy()
            fns[(name, key)] = made[key]
    times = {k: [] for k in fns}
    keys = list(fns)
    for _ in range(rounds):
        rng.shuffle(keys)
        for key in keys:
            t = time.perf_counter()
            fns[key]().numpy()
            times[key].append((time.perf_counter() - t) * 1e3)
    med = {k: float(np.median(v)) for k, v in times.items()}
    return {name: tuple((med[(name, f"{m}_k")] - med[(name, m)]) / (graph_k - 1) for m in ("forward", "train_step"))
            for name in masks}


def markdown(df: pd.DataFrame, header: list[str]) -> str:
    lines = ["# What structure buys SparseDense (native kernels)", "", *header, "",
             "Milliseconds per application in graph (median) and speed-up over dense (`x`).", ""]
    for mode in ("forward", "train"):
        lines += [f"## {mode}", "", "| batch | sparsity | pattern | ms | x dense | x unstructured |", "|---|---|---|---|---|---|"]
        for _, row in df[df["mode"] == mode].iterrows():
            lines.append(f"| {row['batch']} | {row['sparsity']:.0%} | {row['pattern']} | {row['ms']:.3f} | "
                         f"{row['x_dense']:.2f} | {row['x_unstructured']:.2f} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--batches", default="1,32,256")
    parser.add_argument("--sparsities", default="0.8,0.9,0.95")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--nm", default="2:4,1:4", help="N:M patterns to measure ('' for none)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--graph-k", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / "results" / "benchmarks" / "block_speed.csv"))
    args = parser.parse_args(argv)

    import tensorflow as tf

    import prune  # noqa: F401
    from peers import machine, write_results
    from prune import native

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    st = native.status()
    header = [
        f"Machine: {machine()}; native kernels: {st.vector or st.reason} (flags `{st.flags}`).",
        f"TensorFlow {tf.__version__}: intra_op_threads={tf.config.threading.get_intra_op_parallelism_threads()}, "
        f"inter_op_threads={tf.config.threading.get_inter_op_parallelism_threads()}; {args.size}x{args.size}; "
        f"per application in graph ((T_{args.graph_k} - T_1) / {args.graph_k - 1}); medians of {args.rounds} "
        f"interleaved rounds; load average at the start {open('/proc/loadavg').read().split()[0]}.",
    ]
    print("\n".join(header), flush=True)
    rng = np.random.default_rng(0)
    n = args.size
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        points = [(float(s), None) for s in args.sparsities.split(",")]
        points += [(1 - int(p.split(":")[0]) / int(p.split(":")[1]), p) for p in args.nm.split(",") if p]
        for sparsity, nm in points:
            masks = {"dense": ("dense", np.ones((n, n), bool)),
                     "unstructured": ("sparse", block_mask(rng, n, n, 1, 1, sparsity))}
            if nm is None:
                for shape in args.shapes.split(","):
                    r, c = (int(d) for d in shape.split("x"))
                    masks[f"block {shape}"] = ("sparse", block_mask(rng, n, n, r, c, sparsity))
            else:
                masks[f"nm {nm}"] = ("sparse", nm_mask(rng, n, n, *(int(d) for d in nm.split(":"))))
            res = time_point(n, batch, masks, args.rounds, args.graph_k, rng)
            for name, (fwd, train) in res.items():
                if name == "dense":
                    continue
                for mode, ms, i in (("forward", fwd, 0), ("train", train, 1)):
                    rows.append(dict(size=n, batch=batch, sparsity=sparsity, pattern=name, mode=mode, ms=ms,
                                     dense_ms=res["dense"][i], x_dense=res["dense"][i] / ms,
                                     x_unstructured=res["unstructured"][i] / ms))
            print(f"batch={batch} sparsity={sparsity:.2f} " + " ".join(
                f"{k}={v[0]:.3f}/{v[1]:.3f}" for k, v in res.items()), flush=True)
    df = pd.DataFrame(rows)
    header[-1] += f" Load average at the end {open('/proc/loadavg').read().split()[0]}."
    write_results(df, Path(args.out), markdown(df, header))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
