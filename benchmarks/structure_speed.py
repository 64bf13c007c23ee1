"""What a sparsity structure buys SparseDense on this CPU, at equal density.

For one layer size and batch, builds ``SparseDense`` layers whose stored
entries follow each pattern's mask (selected by :mod:`prune.core.patterns` on random
scores) at the same sparsity, and times the forward pass of each kernel
(``coo``, ``csr``) against a dense ``keras.layers.Dense`` of the same shape:

    unstructured   Unstructured()
    n:m            NByM(m, n) with m/n = sparsity (2:4 at 50%, 3:4 at 75%, 9:10 at 90%)
    block4x4       Block((4, 4))
    channel        Channel()  (whole output columns; a shrunk Dense would be smaller still)

One ``tf.function`` call per measurement, implementations interleaved in a
shuffled order within each round, medians over rounds. TF thread counts are
fixed and printed. Writes ``results/benchmarks/structure_speed.csv`` and prints
a table of times and ratios to the unstructured layer of the same kernel.

    .venv/bin/python benchmarks/structure_speed.py                       # 1024x1024, batch 256
    .venv/bin/python benchmarks/structure_speed.py --size 784x300 --batch 32 --rounds 15
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.get_logger().setLevel("ERROR")  # one tf.function per layer is intended, not a retracing problem

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import keras  # noqa: E402

from prune.layers.sparse import SparseDense  # noqa: E402
from prune.core.patterns import Block, Channel, NByM, Unstructured  # noqa: E402

N_BY_M = {0.5: (2, 4), 0.75: (3, 4), 0.9: (9, 10)}


def patterns_at(sparsity: float) -> dict[str, object]:
    m, n = N_BY_M[sparsity]
    return {"unstructured": Unstructured(), f"{m}:{n}": NByM(m, n), "block4x4": Block((4, 4)), "channel": Channel()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="1024x1024")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--sparsities", default="0.5,0.75,0.9")
    p.add_argument("--rounds", type=int, default=21)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "results/benchmarks/structure_speed.csv"))
    args = p.parse_args(argv)
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    n_in, n_out = (int(d) for d in args.size.split("x"))
    print(
        f"TF {tf.__version__}, intra_op={args.threads}, inter_op=1, TF_ENABLE_ONEDNN_SPMM="
        f"{os.environ.get('TF_ENABLE_ONEDNN_SPMM')}, {platform.processor() or platform.machine()}, "
        f"size {n_in}x{n_out}, batch {args.batch}, {args.rounds} rounds"
    )
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((n_in, n_out)) * np.sqrt(2.0 / n_in)).astype(np.float32)
    x = tf.constant(rng.standard_normal((args.batch, n_in)).astype(np.float32))
    scores = rng.random((n_in, n_out))
    fns: dict[tuple, object] = {}
    dense = keras.layers.Dense(n_out)
    dense.build((None, n_in))
    dense.kernel.assign(w)
    fns[("dense", "-", 0.0)] = tf.function(lambda: tf.reduce_sum(dense(x)))
    nnz = {}
    for sparsity in (float(s) for s in args.sparsities.split(",")):
        for name, pattern in patterns_at(sparsity).items():
            keep = pattern.select(scores, sparsity)
            nnz[(name, sparsity)] = int(keep.sum())
            for matmul in ("coo", "csr"):
                layer = SparseDense.from_dense(w, keep, matmul=matmul)
                fns[(matmul, name, sparsity)] = tf.function(lambda layer=layer: tf.reduce_sum(layer(x)))
    for fn in fns.values():  # trace and warm up
        fn().numpy()
        fn().numpy()
    times: dict[tuple, list[float]] = {k: [] for k in fns}
    order = list(fns)
    for _ in range(args.rounds):
        rng.shuffle(order)
        for key in order:
            t = time.perf_counter()
            fns[key]().numpy()
            times[key].append((time.perf_counter() - t) * 1e3)
    rows = []
    for (impl, pattern, sparsity), ts in times.items():
        rows.append(
            dict(
                size=args.size,
                batch=args.batch,
                impl=impl,
                pattern=pattern,
                sparsity=sparsity,
                nnz=nnz.get((pattern, sparsity), n_in * n_out),
                median_ms=float(np.median(ts)),
                threads=args.threads,
                rounds=args.rounds,
            )
        )
    df = pd.DataFrame(rows)
    base = df[df["pattern"] == "unstructured"].set_index(["impl", "sparsity"])["median_ms"]
    dense_ms = float(df[df["impl"] == "dense"]["median_ms"].iloc[0])
    df["vs_unstructured"] = [
        r.median_ms / base[(r.impl, r.sparsity)] if r.impl != "dense" else float("nan") for r in df.itertuples()
    ]
    df["vs_dense"] = df["median_ms"] / dense_ms
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(args.out, index=False)
    with pd.option_context("display.width", 160, "display.max_rows", 100):
        print(df.drop(columns=["size", "batch", "threads", "rounds"]).round(3).to_string(index=False))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
