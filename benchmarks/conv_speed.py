"""Sparse convolutions against TensorFlow's dense one: SparseConv2D's native kernels, layer by layer.

For each convolution (``--layers``: 1x1 pointwise 64->128, 128->256 and 256->256 at 14x14 and 7x7, the
MobileNet kind; 3x3 32->64 and 64->64 at 28x28 and 14x14, "same" padding, stride 1), each batch and sparsity,
times per application inside a compiled graph, net of a floor graph (``benchmarks/protocol.py``'s
``per_application``), of

    dense         keras.layers.Conv2D holding the pruned kernel (TensorFlow's dense convolution, oneDNN)
    unstructured  SparseConv2D(matmul="native") on a uniformly random kernel structure: 1x1 runs PruneSpmm over
                  [B*H*W, C_in]; k x k runs PruneConv2d, which forms the patches tile by tile in cache
    block 1x16    SparseConv2D(matmul="native") on whole 1 x 16 tiles along the output channels, at the same
                  density (1x1: the block kernels; k x k: the general kernels, PruneConv2d reads no block section)
    auto          SparseConv2D(matmul="auto") on the unstructured kernel: what the cost model picks, run-time

``forward`` is ``y = conv(x) + b``; ``train`` is one training step (forward, input and kernel gradients, Adam).
Medians of ``--rounds`` interleaved rounds with min-max; the header states the CPU, TF threads, the load (a busy
machine is refused unless ``--allow-loaded``) and TensorFlow's dense GEMM in GFLOPS in the same run. Writes
``results/benchmarks/conv_speed.csv`` and ``.md``.

    .venv/bin/python benchmarks/conv_speed.py
    .venv/bin/python benchmarks/conv_speed.py --layers 1x1:128-256@14 --batches 32 --sparsities 0.9
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

LAYERS = ("1x1:64-128@14", "1x1:128-256@14", "1x1:256-256@14", "1x1:64-128@7", "1x1:128-256@7", "1x1:256-256@7",
          "3x3:32-64@28", "3x3:64-64@28", "3x3:32-64@14", "3x3:64-64@14")
"""``KxK:C_in-C_out@H``: kernel, channels and the (square) input size; stride 1, "same" padding."""

FORMS = ("unstructured", "block 1x16", "auto")


def parse_layer(spec: str) -> tuple[int, int, int, int]:
    """``(k, c_in, c_out, size)`` from ``"3x3:32-64@28"``; a ValueError naming the spec otherwise."""
    try:
        kernel, rest = spec.split(":")
        kh, kw = (int(d) for d in kernel.split("x"))
        channels, size = rest.split("@")
        c_in, c_out = (int(d) for d in channels.split("-"))
        if kh != kw or min(kh, c_in, c_out, int(size)) < 1:
            raise ValueError
        return kh, c_in, c_out, int(size)
    except ValueError:
        raise ValueError(f"--layers entries must look like '3x3:32-64@28' (square kernel, positive sizes), got {spec!r}") from None


def tile_mask(rng: np.random.Generator, k: int, c_in: int, c_out: int, c: int, sparsity: float) -> np.ndarray:
    """A ``[k, k, c_in, c_out]`` mask of whole ``1 x c`` tiles along the output channels (``c = 1``: unstructured)."""
    rows, tiles = k * k * c_in, -(-c_out // c)
    keep = np.zeros(rows * tiles, bool)
    keep[rng.permutation(rows * tiles)[: rows * tiles - int(round(sparsity * rows * tiles))]] = True
    return np.repeat(keep.reshape(rows, tiles), c, 1)[:, :c_out].reshape(k, k, c_in, c_out)


def layer_for(form: str, w: np.ndarray, mask: np.ndarray, size: int):
    import keras

    from prune.layers.sparse_conv import SparseConv2D

    k, _, c_in, c_out = w.shape
    if form == "dense":
        layer = keras.layers.Conv2D(c_out, k, padding="same")
        layer.build((None, size, size, c_in))
        layer.kernel.assign(w * mask)
        return layer
    return SparseConv2D.from_dense(w, mask, matmul="auto" if form == "auto" else "native", padding="same",
                                   input_shape=(None, size, size, c_in))


def time_point(spec, batch, sparsity, forms, rounds, rng, min_ms, k_max):
    """{form: (forward, train)} as :class:`protocol.PerApplication` for one layer, batch and sparsity."""
    import tensorflow as tf

    k, c_in, c_out, size = parse_layer(spec)
    w = (rng.standard_normal((k, k, c_in, c_out)) * np.sqrt(2.0 / (k * k * c_in))).astype(np.float32)
    pool = [tf.constant(rng.standard_normal((batch, size, size, c_in)).astype(np.float32)) for _ in range(4)]
    masks = {"dense": np.ones(w.shape, bool), "unstructured": tile_mask(rng, k, c_in, c_out, 1, sparsity)}
    masks["auto"] = masks["unstructured"]
    if "block 1x16" in forms:
        masks["block 1x16"] = tile_mask(rng, k, c_in, c_out, 16, sparsity)
    out = {}
    for form in ("dense", *forms):
        layer = layer_for(form, w, masks[form] if form != "dense" else masks["unstructured"], size)
        out[form] = protocol.forward_and_train(layer, pool, rounds, min_ms, k_max)
    return out


def markdown(df: pd.DataFrame, header: str) -> str:
    lines = [header, "",
             "Milliseconds per application in graph (median, with min-max over the rounds) and speed-up over TF's "
             "dense convolution of the same shape (`x dense`, from medians). `< floor`: not resolved from the "
             "graph's own cost at the largest K tried.", ""]
    for mode in ("forward", "train"):
        lines += [f"## {mode}", "", "| layer | batch | sparsity | form | ms (min-max) | dense ms | x dense |",
                  "|---|---|---|---|---|---|---|"]
        for _, row in df[df["mode"] == mode].iterrows():
            ms = "< floor" if pd.isna(row["ms"]) else f"{row['ms']:.3f} ({row['ms_min']:.3f}-{row['ms_max']:.3f})"
            dense = "< floor" if pd.isna(row["dense_ms"]) else f"{row['dense_ms']:.3f}"
            xd = "-" if pd.isna(row["x_dense"]) else f"{row['x_dense']:.2f}"
            lines.append(f"| {row['layer']} | {row['batch']} | {row['sparsity']:.0%} | {row['form']} | {ms} | {dense} | {xd} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", default=",".join(LAYERS))
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--sparsities", default="0.5,0.8,0.9,0.95")
    parser.add_argument("--forms", default=",".join(FORMS))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--min-ms", type=float, default=20.0, help="each measurement repeats calls for this long")
    parser.add_argument("--k-max", type=int, default=256, help="most applications per graph call")
    parser.add_argument("--threads", type=int, default=0, help="TensorFlow's intra-op threads (default: the usable cores)")
    parser.add_argument("--out", default=str(ROOT / "results" / "benchmarks" / "conv_speed.csv"))
    protocol.add_arguments(parser)
    args = parser.parse_args(argv)
    layers = [s for s in args.layers.split(",") if s]
    try:  # bad input is refused before TensorFlow is imported or anything is written
        for spec in layers:
            parse_layer(spec)
    except ValueError as err:
        parser.error(str(err))
    forms = [f for f in args.forms.split(",") if f]
    unknown = sorted(set(forms) - set(FORMS))
    if unknown:
        parser.error(f"--forms: unknown {unknown}; choose from {list(FORMS)}")

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
    rows = []
    nan = float("nan")
    for spec in layers:
        for batch in (int(b) for b in args.batches.split(",")):
            for sparsity in (float(s) for s in args.sparsities.split(",")):
                res = time_point(spec, batch, sparsity, forms, args.rounds, rng, args.min_ms, args.k_max)
                for form in forms:
                    for mode, i in (("forward", 0), ("train", 1)):
                        got, dense = res[form][i], res["dense"][i]
                        ms = nan if got.ms is None else got.ms
                        d_ms = nan if dense.ms is None else dense.ms
                        rows.append(dict(layer=spec, batch=batch, sparsity=sparsity, form=form, mode=mode, ms=ms,
                                         ms_min=nan if got.low is None else got.low,
                                         ms_max=nan if got.high is None else got.high, k=got.k, dense_ms=d_ms,
                                         dense_min=nan if dense.low is None else dense.low,
                                         dense_max=nan if dense.high is None else dense.high, x_dense=d_ms / ms))
                print(f"{spec} batch={batch} sparsity={sparsity:.2f} " + " ".join(
                    f"{k}={v[0].text()}/{v[1].text()}" for k, v in res.items()), flush=True)
    load.stop()
    df = pd.DataFrame(rows)
    header = protocol.header(
        "Sparse convolutions (SparseConv2D, native kernels) against TensorFlow's dense convolution", mach, load, gemm,
        f"TensorFlow {tf.__version__}: intra_op={intra}, inter_op={inter}",
        [f"Per application in a graph, net of the floor (K from 8 up to {args.k_max}); medians of {args.rounds} "
         f"interleaved rounds, each >= {args.min_ms:g} ms of calls. Stride 1, 'same' padding, float32."],
    )
    write_results(df, Path(args.out), markdown(df, header))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
