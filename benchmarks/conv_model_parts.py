"""Where a convnet's time goes: each layer of the MobileNet-style model and LeNet-5 timed alone, dense and sparse.

``conv_model_speed.py`` times the models whole. This script splits that time by layer, to show which parts set
it and how much pruning the pointwise convolutions can buy at most. Each model (``--models``) is pruned as there
(``conv_model_speed.pruned_model``: 90% of each pruned layer's weights, by magnitude, at seeded initial weights).
Then each layer is timed alone in a compiled graph (``protocol.per_application``: K applications per call on K
distinct inputs, net of a floor graph that reads the same inputs; medians of ``--rounds`` rounds with min-max).
The inputs are what the model's earlier layers give for ``--batches`` random 28 x 28 x 1 batches.

    tf dense       each layer of the stripped model (prune.strip_pruning)
    prune native   the pruned layers in conv_model_speed.sparse_form(masked, "native") (SparseConv2D,
                   SparseDense); the other layers are the same layers, timed once

The whole model is timed the same way, as one application. The table groups the layers by part (first
convolution, depthwise, pointwise, batch normalisation, ReLU6, pooling, Dense; pruned or kept) with each
part's share of the dense model's time in one graph. Its last line per model and batch is the bound that the
other layers set: the dense model's time over that time less the pruned layers' dense time is the speed-up if
the pruned layers took no time at all. A layer cheaper than the floor graph's spread (batch normalisation,
ReLU6, at K up to 256) is shown '-'. Writes ``results/benchmarks/conv_model_parts.csv`` and ``.md``.

    .venv/bin/python benchmarks/conv_model_parts.py
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
from conv_model_speed import MODELS, pruned_model, sparse_form  # noqa: E402

POOL = 4
"""Distinct inputs per layer (``per_application`` cycles through them)."""


def part_of(layer, pruned: bool) -> str:
    """The part a layer belongs to in the table: its kind (a convolution with its kernel size), pruned or kept."""
    import keras

    from prune.layers.sparse import SparseDense
    from prune.layers.sparse_conv import SparseConv2D

    if isinstance(layer, keras.layers.DepthwiseConv2D):
        kind = "depthwise 3x3" if tuple(layer.kernel_size) == (3, 3) else f"depthwise {layer.kernel_size}"
    elif isinstance(layer, (keras.layers.Conv2D, SparseConv2D)):
        kh, kw = layer.kernel_size if isinstance(layer, keras.layers.Conv2D) else layer.weight_shape[:2]
        kind = "pointwise 1x1" if (kh, kw) == (1, 1) else f"conv {kh}x{kw}"
    elif isinstance(layer, (keras.layers.Dense, SparseDense)):
        kind = "Dense"
    elif isinstance(layer, keras.layers.BatchNormalization):
        kind = "batch norm"
    elif isinstance(layer, keras.layers.ReLU):
        kind = "ReLU6"
    elif isinstance(layer, keras.layers.MaxPooling2D):
        kind = "max pooling"
    elif isinstance(layer, keras.layers.GlobalAveragePooling2D):
        kind = "global average pooling"
    else:
        kind = type(layer).__name__
    return f"{kind} ({'pruned' if pruned else 'kept'})" if kind in ("Dense", "pointwise 1x1") or kind.startswith("conv") else kind


def layer_inputs(model, batch: int, rng: np.random.Generator) -> list[list]:
    """For each layer of the Sequential ``model``, the ``POOL`` inputs it receives on ``POOL`` random batches."""
    import tensorflow as tf

    xs = [tf.constant(rng.standard_normal((batch, 28, 28, 1)).astype(np.float32)) for _ in range(POOL)]
    out = []
    for layer in model.layers:
        out.append(xs)
        xs = [layer(x, training=False) for x in xs]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--sparsity", type=float, default=0.9)
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--min-ms", type=float, default=20.0, help="each measurement repeats calls for this long")
    parser.add_argument("--out", default=str(ROOT / "results" / "benchmarks" / "conv_model_parts.csv"))
    parser.add_argument("--markdown-only", action="store_true", help="rewrite the .md from the CSV, timing nothing")
    protocol.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.markdown_only:
        rewrite_markdown(Path(args.out))
        return 0
    models = [m for m in args.models.split(",") if m]
    unknown = sorted(set(models) - set(MODELS))
    if unknown:
        parser.error(f"--models: unknown {unknown}; choose from {list(MODELS)}")
    if not 0.0 <= args.sparsity < 1.0:
        parser.error(f"--sparsity must be in [0, 1), got {args.sparsity!r}")
    try:
        batches = [int(v) for v in args.batches.split(",") if v]
    except ValueError:
        parser.error(f"--batches must be comma-separated integers, got {args.batches!r}")
    if not batches or min(batches) < 1:
        parser.error(f"--batches must be positive integers, got {args.batches!r}")
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")

    import tensorflow as tf

    import prune
    from peers import write_results

    intra, inter = protocol.fix_tf_threads()
    load = protocol.start_or_refuse(args)
    if load is None:
        return protocol.REFUSED
    gemm = protocol.dense_gemm_gflops()
    mach = protocol.machine()
    rng = np.random.default_rng(0)
    rows = []
    for name in models:
        masked, pruned = pruned_model(name, args.sparsity)
        forms = {"tf dense": prune.strip_pruning(masked), "prune native": sparse_form(masked, "native")}
        dense, sparse = forms["tf dense"], forms["prune native"]
        if [layer.name for layer in dense.layers] != [layer.name for layer in sparse.layers]:
            raise RuntimeError(f"{name}: the sparse form's layers are not the dense model's")
        for b in batches:
            inputs = layer_inputs(dense, b, rng)
            for form, model in forms.items():
                got = protocol.per_application(lambda x, m=model: m(x, training=False), inputs[0],
                                               rounds=args.rounds, min_ms=args.min_ms)
                rows.append(dict(model=name, batch=b, form=form, layer="(whole model)", part="(whole model)",
                                 pruned=False, ms=got.ms, ms_min=got.low, ms_max=got.high, k=got.k))
            for i, layer in enumerate(dense.layers):
                is_pruned = layer.name in pruned
                for form in forms if is_pruned else ("tf dense",):
                    timed = forms[form].layers[i]
                    got = protocol.per_application(lambda x, t=timed: t(x, training=False), inputs[i],
                                                   rounds=args.rounds, min_ms=args.min_ms)
                    rows.append(dict(model=name, batch=b, form=form, layer=layer.name, part=part_of(layer, is_pruned),
                                     pruned=is_pruned, ms=got.ms, ms_min=got.low, ms_max=got.high, k=got.k))
            print(f"timed {name} at batch {b}: {len(dense.layers)} layers", flush=True)
    load.stop()
    df = pd.DataFrame(rows)
    header = protocol.header(
        "Where a convnet's time goes: each layer alone, dense and sparse", mach, load, gemm,
        f"TensorFlow {tf.__version__}: intra_op={intra}, inter_op={inter}",
        [f"Each layer alone in a compiled graph (protocol.per_application: K applications on K distinct inputs, net "
         f"of the floor graph reading them), on the inputs the model's earlier layers give for {POOL} random "
         f"batches; medians of {args.rounds} rounds (min-max), each >= {args.min_ms:g} ms. {args.sparsity:.0%} of "
         "each pruned layer's weights removed by magnitude, at seeded initial weights. A layer that is not pruned "
         "is the same layer in both forms and is timed once. A '-' is a time the floor's spread hides."],
    )
    write_results(df, Path(args.out), header + "\n" + markdown(df))
    return 0


def markdown(df: pd.DataFrame) -> str:
    """Per model and batch: each part's summed ms, dense and sparse, its share of the dense model's time in one
    graph, and the bound the kept layers set (a part with a time the floor hides is '-' and counts in no sum)."""
    def total(frame: pd.DataFrame) -> float:
        return float(frame["ms"].sum()) if len(frame) and frame["ms"].notna().all() else float("nan")

    def ms(v: float) -> str:
        return "-" if pd.isna(v) else f"{v:.3f}"

    lines = []
    for (name, b), g in df.groupby(["model", "batch"], sort=False):
        whole = g[g["part"] == "(whole model)"].set_index("form")["ms"]
        layers = g[g["part"] != "(whole model)"]
        dense_pruned = total(layers[layers["pruned"] & (layers["form"] == "tf dense")])
        sparse_pruned = total(layers[layers["pruned"] & (layers["form"] == "prune native")])
        w_dense, w_sparse = float(whole.get("tf dense", np.nan)), float(whole.get("prune native", np.nan))
        lines += ["", f"### {name}, batch {b}", "",
                  "| part | layers | tf dense, ms | prune native, ms | share of the dense model |", "|---|---|---|---|---|"]
        for part, p in layers.groupby("part", sort=False):
            d = p[p["form"] == "tf dense"]
            s = p[p["form"] == "prune native"] if p["pruned"].any() else d
            share = total(d) / w_dense
            lines.append(f"| {part} | {len(d)} | {ms(total(d))} | {ms(total(s))} | "
                         f"{'-' if pd.isna(share) else f'{share:.0%}'} |")
        lines.append(f"| whole model, one graph | {len(layers[layers['form'] == 'tf dense'])} | {ms(w_dense)} | "
                     f"{ms(w_sparse)} | 100% |")
        lines.append("")
        if pd.isna(dense_pruned) or pd.isna(sparse_pruned) or pd.isna(w_dense) or pd.isna(w_sparse):
            lines.append("A pruned layer's time or the whole model's is hidden by the floor: no bound is given.")
            continue
        lines.append(f"Whole model: prune native at {w_dense / w_sparse:.2f}x tf dense. The pruned layers alone take "
                     f"{ms(dense_pruned)} ms dense ({dense_pruned / w_dense:.0%} of the dense model), so with them at zero "
                     f"time the model would run at most {w_dense / (w_dense - dense_pruned):.2f}x faster; prune native "
                     f"runs them at {dense_pruned / sparse_pruned:.2f}x their dense speed.")
    return "\n".join(lines) + "\n"


def rewrite_markdown(out: Path) -> None:
    """The Markdown table again from the committed CSV (its header lines kept): a new layout, the same times."""
    md = out.with_suffix(".md")
    head = md.read_text().split("\n### ")[0].rstrip("\n")
    md.write_text(head + "\n" + markdown(pd.read_csv(out)))


if __name__ == "__main__":
    raise SystemExit(main())
