"""What structure buys SparseDense's native kernels: block shapes and N:M against unstructured and dense.

For a 1024x1024 layer (``--size``), each batch and sparsity, times per application
inside a compiled graph, net of a floor graph (``benchmarks/protocol.py``'s
``per_application``: K applications to distinct inputs, K grown until the time stands
clear of the floor's spread, so none can come out negative), of

    dense         keras.layers.Dense with the pruned weight (oneDNN's GEMM)
    unstructured  SparseDense(matmul="native") on a uniformly random structure (the general kernels)
    block RxC     SparseDense(matmul="native") on whole R x C tiles (R inputs x C outputs), kept
                  at random with the same density; with C in 4/8/16/32 the block kernels run
                  (prune/native/block_ops.h), as 1 x C tiles whatever R is
    nm N:M        N of every M consecutive inputs kept for each output (prune.NByM's axis), at
                  their own density (2:4 = 50%, 1:4 = 75%), with the general kernels, beside
                  unstructured at that density

``forward`` is ``y = x @ W + b``; ``train`` is one training step (forward, input and
values gradients, Adam update). Medians of ``--rounds`` interleaved rounds with min-max;
the header states the CPU, TF threads, the load (a busy machine is refused unless
``--allow-loaded``) and TensorFlow's dense GEMM in GFLOPS in the same run. Writes
``results/benchmarks/block_speed.csv`` and ``.md``.

    .venv/bin/python benchmarks/block_speed.py
    .venv/bin/python benchmarks/block_speed.py --batches 256 --sparsities 0.9 --shapes 1x16
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


def time_point(size, batch, masks, rounds, rng, min_ms, k_max):
    """{name: (forward, train)} as :class:`protocol.PerApplication`, per application in graph, for each (name, mask)."""
    import tensorflow as tf

    w = (rng.standard_normal((size, size)) * np.sqrt(2.0 / size)).astype(np.float32)
    pool = [tf.constant(rng.standard_normal((batch, size)).astype(np.float32)) for _ in range(8)]
    out = {}
    for name, (kind, mask) in masks.items():
        out[name] = protocol.forward_and_train(layer_for(kind, w, mask), pool, rounds, min_ms, k_max)
    return out


def markdown(df: pd.DataFrame, header: str) -> str:
    lines = [header, "",
             "Milliseconds per application in graph (median, with min-max over the rounds) and speed-up over dense "
             "(`x`, from medians). `< floor`: not resolved from the graph's own cost at the largest K tried.", ""]
    for mode in ("forward", "train"):
        lines += [f"## {mode}", "", "| batch | sparsity | pattern | ms (min-max) | dense ms | x dense | x unstructured |",
                  "|---|---|---|---|---|---|---|"]
        for _, row in df[df["mode"] == mode].iterrows():
            ms = "< floor" if pd.isna(row["ms"]) else f"{row['ms']:.3f} ({row['ms_min']:.3f}-{row['ms_max']:.3f})"
            dense = "< floor" if pd.isna(row["dense_ms"]) else f"{row['dense_ms']:.3f}"
            xd = "-" if pd.isna(row["x_dense"]) else f"{row['x_dense']:.2f}"
            xu = "-" if pd.isna(row["x_unstructured"]) else f"{row['x_unstructured']:.2f}"
            lines.append(f"| {row['batch']} | {row['sparsity']:.0%} | {row['pattern']} | {ms} | {dense} | {xd} | {xu} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--batches", default="1,32,256")
    parser.add_argument("--sparsities", default="0.8,0.9,0.95")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--nm", default="2:4,1:4", help="N:M patterns to measure ('' for none)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--min-ms", type=float, default=20.0, help="each measurement repeats calls for this long")
    parser.add_argument("--k-max", type=int, default=256, help="most applications per graph call")
    parser.add_argument("--threads", type=int, default=0, help="TensorFlow's intra-op threads (default: the usable cores)")
    parser.add_argument("--out", default=str(ROOT / "results" / "benchmarks" / "block_speed.csv"))
    protocol.add_arguments(parser)
    args = parser.parse_args(argv)

    import tensorflow as tf

    import prune  # noqa: F401
    from peers import write_results

    intra, inter = protocol.fix_tf_threads(args.threads or None)
    load = protocol.start_or_refuse(args)
    if load is None:
        return protocol.REFUSED
    gemm = protocol.dense_gemm_gflops()
    mach = protocol.machine()
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
            res = time_point(n, batch, masks, args.rounds, rng, args.min_ms, args.k_max)
            nan = float("nan")
            for name, pair in res.items():
                if name == "dense":
                    continue
                for mode, i in (("forward", 0), ("train", 1)):
                    got, dense, unstr = pair[i], res["dense"][i], res["unstructured"][i]
                    ms = nan if got.ms is None else got.ms
                    d_ms = nan if dense.ms is None else dense.ms
                    u_ms = nan if unstr.ms is None else unstr.ms
                    rows.append(dict(size=n, batch=batch, sparsity=sparsity, pattern=name, mode=mode, ms=ms,
                                     ms_min=nan if got.low is None else got.low, ms_max=nan if got.high is None else got.high,
                                     k=got.k, dense_ms=d_ms, x_dense=d_ms / ms, x_unstructured=u_ms / ms))
            print(f"batch={batch} sparsity={sparsity:.2f} " + " ".join(
                f"{k}={v[0].text()}/{v[1].text()}" for k, v in res.items()), flush=True)
    load.stop()
    df = pd.DataFrame(rows)
    header = protocol.header(
        "What structure buys SparseDense (native kernels)", mach, load, gemm,
        f"TensorFlow {tf.__version__}: intra_op={intra}, inter_op={inter}",
        [f"Layer {n}x{n}; per application in a graph, net of the floor (K from 8 up to {args.k_max}); medians of "
         f"{args.rounds} interleaved rounds, each >= {args.min_ms:g} ms of calls."],
    )
    write_results(df, Path(args.out), markdown(df, header))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
