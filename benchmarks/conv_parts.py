"""Where a pointwise (1x1) sparse convolution's time goes: PruneSpmm's parts on [B*H*W, C_in] x [C_in, C_out].

A 1x1 ``SparseConv2D`` is one ``PruneSpmm`` over the ``[batch * H * W, C_in]`` reshape of its input. For the
pointwise layers of ``conv_speed.py`` at batch 32 (``--layers``), this times the op in a compiled graph (four
distinct inputs per call, medians of interleaved rounds) with its ``profile`` attribute (``sparse_ops.cc``):

    full        the op
    checks      profile 1: the structure checks and the output allocation only
    gather      profile 2: that, plus the value gather into W^T's order
    no FMAs     profile 3: everything but the multiply-adds (the input tile transposes and the output
                write-back, which turn [positions, channels] rows into the kernel's [channels, positions] tiles)
    dense       tf.matmul with the pruned weight stored dense (what Conv2D's 1x1 GEMM does)

so ``full - no FMAs`` is the multiply-adds, and ``no FMAs - gather`` the transposes. Writes
``results/benchmarks/conv_parts.csv`` and ``.md``.

    .venv/bin/python benchmarks/conv_parts.py
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
from conv_speed import parse_layer  # noqa: E402

LAYERS = ("1x1:256-256@14", "1x1:128-256@14", "1x1:64-128@14", "1x1:256-256@7")
PARTS = {"full": 0, "checks": 1, "gather": 2, "no FMAs": 3}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", default=",".join(LAYERS))
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--sparsity", type=float, default=0.9)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--min-ms", type=float, default=30.0)
    parser.add_argument("--out", default=str(ROOT / "results" / "benchmarks" / "conv_parts.csv"))
    protocol.add_arguments(parser)
    args = parser.parse_args(argv)
    layers = [s for s in args.layers.split(",") if s]
    try:
        specs = [parse_layer(s) for s in layers]
    except ValueError as err:
        parser.error(str(err))
    if any(k != 1 for k, *_ in specs):
        parser.error("--layers: pointwise (1x1) layers only; PruneConv2d has no profile modes")

    import tensorflow as tf

    from peers import write_results
    from prune import native

    intra, inter = protocol.fix_tf_threads()
    load = protocol.start_or_refuse(args)
    if load is None:
        return protocol.REFUSED
    lib = native.load()
    if lib is None:
        raise SystemExit(f"the native library is not available: {native.status().reason}")
    gemm = protocol.dense_gemm_gflops()
    mach = protocol.machine()
    rng = np.random.default_rng(0)
    rows_out = []
    for spec, (_, c_in, c_out, size) in zip(layers, specs):
        rows = args.batch * size * size
        mask = rng.random((c_in, c_out)) >= args.sparsity
        idx = np.argwhere(mask)
        structure = tf.constant(native.structure(idx, c_in, c_out))
        values = tf.constant(rng.standard_normal(len(idx)).astype(np.float32))
        dense_w = tf.constant(np.where(mask, rng.standard_normal(mask.shape), 0.0).astype(np.float32))
        xs = [tf.constant(rng.standard_normal((rows, c_in)).astype(np.float32)) for _ in range(4)]
        fns = {name: tf.function(lambda p=p: tf.add_n([
            tf.reduce_sum(lib.prune_spmm(x, values, structure, n_in=c_in, n_out=c_out, profile=p)[:1]) for x in xs]))
            for name, p in PARTS.items()}
        fns["dense"] = tf.function(lambda: tf.add_n([tf.reduce_sum(tf.matmul(x, dense_w)[:1]) for x in xs]))
        for fn in fns.values():
            fn()
        got = protocol.interleaved({k: (lambda f=f: f().numpy()) for k, f in fns.items()}, args.rounds, args.min_ms)
        for part, s in got.items():  # per op call: four per graph call
            rows_out.append(dict(layer=spec, batch=args.batch, sparsity=args.sparsity, rows=rows, nnz=len(idx), part=part,
                                 ms=s.median / 4, ms_min=s.low / 4, ms_max=s.high / 4))
        print(spec, " ".join(f"{k}={v.median / 4:.3f}" for k, v in got.items()), flush=True)
    load.stop()
    df = pd.DataFrame(rows_out)
    header = protocol.header(
        "Where a pointwise sparse convolution's time goes (PruneSpmm's parts)", mach, load, gemm,
        f"TensorFlow {tf.__version__}: intra_op={intra}, inter_op={inter}",
        [f"Per op call in a graph of four calls (not net of the graph's floor); medians of {args.rounds} interleaved "
         f"rounds, each >= {args.min_ms:g} ms of calls; batch {args.batch}, {args.sparsity:.0%} sparse, unstructured."],
    )
    lines = [header, "", "| layer | rows | nnz | full | checks | + gather | all but FMAs | dense GEMM | FMAs | transposes | "
             "x dense (full) | x dense without transposes |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for spec in layers:
        d = df[df["layer"] == spec].set_index("part")["ms"]
        fma, trans = d["full"] - d["no FMAs"], d["no FMAs"] - d["gather"]
        r = df[df["layer"] == spec].iloc[0]
        lines.append(f"| {spec} | {r['rows']} | {r['nnz']} | {d['full']:.3f} | {d['checks']:.3f} | {d['gather']:.3f} | "
                     f"{d['no FMAs']:.3f} | {d['dense']:.3f} | {fma:.3f} | {trans:.3f} | {d['dense'] / d['full']:.2f} | "
                     f"{d['dense'] / (d['full'] - trans):.2f} |")
    lines += ["", "Times in ms per op call (medians); min-max per part are in the CSV. `FMAs` = full - all but FMAs; "
              "`transposes` = all but FMAs - gather (profile 2, which includes the checks); the last column is dense over the op without its "
              "transposes, the bound a kernel that reads NHWC rows without transposing them could approach."]
    write_results(df, Path(args.out), "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
