"""What a sparsity structure buys SparseDense's TensorFlow kernels on this CPU, at equal density.

For one layer size and batch, builds ``SparseDense`` layers whose stored
entries follow each pattern's mask (selected by :mod:`prune.core.patterns` on random
scores) at the same sparsity, and times the forward pass of each TensorFlow kernel
(``coo``, ``csr``) against a dense ``keras.layers.Dense`` of the same shape:

    unstructured   Unstructured()
    n:m            NByM(m, n) with m/n = sparsity (2:4 at 50%, 3:4 at 75%, 9:10 at 90%)
    block4x4       Block((4, 4))
    channel        Channel()  (whole output columns; a shrunk Dense would be smaller still)

Under ``benchmarks/protocol.py``: each time is per application inside a compiled graph, net of a floor
graph (:func:`protocol.per_application`: K applications to distinct inputs, K grown from 8 until the time
stands clear of the floor's spread, so none can come out negative; a time that never does is left empty in
the CSV and written ``< floor`` in the report), median of ``--rounds`` interleaved rounds with min-max. The
report's header states the CPU and its flags, TensorFlow's threads (fixed before anything runs), the load
before and during the run (a busy machine is refused, exit code 3, unless ``--allow-loaded``; then the
header says LOADED) and TensorFlow's dense GEMM in GFLOPS measured in the same run.

Writes ``results/benchmarks/structure_speed.csv`` (``--out``; columns size, batch, impl, pattern, sparsity,
nnz, median_ms, ms_min, ms_max, k, threads, rounds, vs_unstructured, vs_dense: ``median_ms`` is the net
time per application, the ``vs_`` columns are time ratios of medians, < 1 = faster) and the report beside it
(``.md``), also printed.

    .venv/bin/python benchmarks/structure_speed.py                       # 1024x1024, batch 256
    .venv/bin/python benchmarks/structure_speed.py --size 784x300 --batch 32 --rounds 15
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

N_BY_M = {0.5: (2, 4), 0.75: (3, 4), 0.9: (9, 10)}


def patterns_at(sparsity: float) -> dict[str, object]:
    from prune.core.patterns import Block, Channel, NByM, Unstructured

    m, n = N_BY_M[sparsity]
    return {"unstructured": Unstructured(), f"{m}:{n}": NByM(m, n), "block4x4": Block((4, 4)), "channel": Channel()}


def markdown(df: pd.DataFrame, header: str) -> str:
    lines = [header, "",
             "Milliseconds per application in a graph, net of the floor: median (min-max over the rounds); K: "
             "applications per graph call. `vs unstructured` and `vs dense`: time over the unstructured layer's "
             "of the same kernel, and over dense's (ratios of medians; < 1 = faster). `< floor`: not resolved at "
             "the largest K tried.", "",
             "| sparsity | kernel | pattern | nnz | ms (min-max) | K | vs unstructured | vs dense |",
             "|---|---|---|---|---|---|---|---|"]
    for _, r in df.iterrows():
        ms = "< floor" if pd.isna(r["median_ms"]) else f"{r['median_ms']:.3f} ({r['ms_min']:.3f}-{r['ms_max']:.3f})"
        vu = "-" if pd.isna(r["vs_unstructured"]) else f"{r['vs_unstructured']:.2f}"
        vd = "-" if pd.isna(r["vs_dense"]) else f"{r['vs_dense']:.2f}"
        sparsity = "-" if r["impl"] == "dense" else f"{r['sparsity']:.0%}"
        lines.append(f"| {sparsity} | {r['impl']} | {r['pattern']} | {r['nnz']} | {ms} | {r['k']} | {vu} | {vd} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="1024x1024")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--sparsities", default="0.5,0.75,0.9")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--min-ms", type=float, default=20.0, help="each measurement repeats calls for this long")
    p.add_argument("--k-max", type=int, default=256, help="most applications per graph call")
    p.add_argument("--threads", type=int, default=0, help="TensorFlow's intra-op threads (default: the usable cores)")
    p.add_argument("--out", default=str(ROOT / "results/benchmarks/structure_speed.csv"),
                   help="the CSV; the report goes beside it as .md")
    protocol.add_arguments(p)
    args = p.parse_args(argv)
    n_in, n_out = (int(d) for d in args.size.split("x"))
    sparsities = [float(s) for s in args.sparsities.split(",")]
    if unknown := [s for s in sparsities if s not in N_BY_M]:
        p.error(f"--sparsities: each must be one of {sorted(N_BY_M)} (an N:M pattern of that density), got {unknown}")

    load = protocol.start_or_refuse(args)  # before TensorFlow loads: a busy machine is refused at once
    if load is None:
        return protocol.REFUSED

    import tensorflow as tf

    intra, inter = protocol.fix_tf_threads(args.threads or None)
    import keras

    import prune  # noqa: F401  (sets TF_ENABLE_ONEDNN_SPMM before any graph is built)
    from peers import write_results
    from prune.layers.sparse import SparseDense

    tf.get_logger().setLevel("ERROR")  # a tf.function per K and layer is intended, not a retracing problem
    gemm = protocol.dense_gemm_gflops()
    mach = protocol.machine()
    timing = dict(rounds=args.rounds, min_ms=args.min_ms, k_max=args.k_max)
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((n_in, n_out)) * np.sqrt(2.0 / n_in)).astype(np.float32)
    pool = [tf.constant(rng.standard_normal((args.batch, n_in)).astype(np.float32)) for _ in range(8)]
    scores = rng.random((n_in, n_out))
    dense = keras.layers.Dense(n_out)
    dense.build((None, n_in))
    dense.kernel.assign(w)
    got = {("dense", "-", 0.0): protocol.per_application(dense, pool, **timing)}
    nnz = {}
    print(f"dense {got[('dense', '-', 0.0)].text()}", flush=True)
    for sparsity in sparsities:
        for name, pattern in patterns_at(sparsity).items():
            keep = pattern.select(scores, sparsity)
            nnz[(name, sparsity)] = int(keep.sum())
            for matmul in ("coo", "csr"):
                layer = SparseDense.from_dense(w, keep, matmul=matmul)
                got[(matmul, name, sparsity)] = res = protocol.per_application(layer, pool, **timing)
                print(f"{matmul} {name} {sparsity:.2f}: {res.text()}", flush=True)
    load.stop()
    nan = float("nan")
    rows = []
    for (impl, pattern, sparsity), res in got.items():
        rows.append(dict(
            size=args.size, batch=args.batch, impl=impl, pattern=pattern, sparsity=sparsity,
            nnz=nnz.get((pattern, sparsity), n_in * n_out),
            median_ms=nan if res.ms is None else res.ms,
            ms_min=nan if res.low is None else res.low, ms_max=nan if res.high is None else res.high, k=res.k,
            threads=intra, rounds=args.rounds,
        ))
    df = pd.DataFrame(rows)
    base = df[df["pattern"] == "unstructured"].set_index(["impl", "sparsity"])["median_ms"]
    dense_ms = float(df[df["impl"] == "dense"]["median_ms"].iloc[0])
    df["vs_unstructured"] = [
        r.median_ms / base[(r.impl, r.sparsity)] if r.impl != "dense" else nan for r in df.itertuples()
    ]
    df["vs_dense"] = df["median_ms"] / dense_ms
    header = protocol.header(
        "What a sparsity structure buys SparseDense's TensorFlow kernels", mach, load, gemm,
        f"TensorFlow {tf.__version__}: intra_op={intra}, inter_op={inter}; "
        f"TF_ENABLE_ONEDNN_SPMM={os.environ.get('TF_ENABLE_ONEDNN_SPMM')}",
        [f"Layer {n_in}x{n_out}, batch {args.batch}; per application in a graph, net of the floor (K from 8 up "
         f"to {args.k_max}); medians of {args.rounds} interleaved rounds, each >= {args.min_ms:g} ms of calls."],
    )
    write_results(df, Path(args.out), markdown(df, header))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
