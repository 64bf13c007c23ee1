"""Speed of one fully connected layer: dense, masked and sparse (coo, csr, densify, native, auto).

For each layer size, batch and sparsity, times the forward pass and a full
training step (forward, backward, Adam update) of

    dense     keras.layers.Dense (all weights, the baseline)
    masked    prune.layers.MaskedDense (dense kernel times its mask)
    coo       SparseDense(matmul="coo")
    csr       SparseDense(matmul="csr")
    densify   SparseDense(matmul="dense")  (materialise W, dense matmul)
    native    SparseDense(matmul="native") (the compiled ops of prune.native)
    auto      SparseDense(matmul="auto")   (native or densify, by the cost model; coo/csr/densify without the library)

Two measures of each, both medians:

* ``forward`` / ``train_step``: one ``tf.function`` call, as a user times it.
  It includes the fixed cost of calling a compiled function and reading the
  result back (about 0.4 ms here, the same for every implementation), which
  caps every speed-up at small sizes.
* ``forward_graph`` / ``train_step_graph``: the cost of one application of the
  layer inside a compiled graph, as in a real model, where that fixed cost is
  paid once per model call and not per layer: ``benchmarks/protocol.py``'s
  ``per_application`` (K applications to distinct inputs, or K training steps,
  net of a floor graph that reads the same inputs and applies nothing; K grows
  until the time stands clear of the floor's spread). Implementations whose
  single call takes more than ``--graph-limit-ms`` are not measured this way
  (they cannot be the fastest anyway), and points that never stand clear of
  the floor are not reported: their rows are absent (the report counts them).

Under the benchmark protocol: a busy machine is refused unless
``--allow-loaded``; the CPU, TF threads, load and TensorFlow's dense GEMM in
GFLOPS (measured in the same run) head the report. One-call measures are
interleaved in a shuffled order within each round, each repeating calls for
``--min-ms``; medians over rounds with min and max. Writes
``results/benchmarks/layer_speed.csv`` (one row per size, batch, sparsity,
implementation and mode) and prints speed-ups vs dense and vs the ideal
``1 / density``.

    .venv/bin/python benchmarks/layer_speed.py                 # 1024x1024, 784x300, 4096x4096 (~10 min)
    .venv/bin/python benchmarks/layer_speed.py --sizes 784x300 --batches 32
    .venv/bin/python benchmarks/layer_speed.py --fit           # also refit prune.layers.kernels' cost model
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
import tensorflow as tf  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import keras  # noqa: E402

import protocol  # noqa: E402

from prune import native  # noqa: E402
from prune.layers import kernels
from prune.layers.masked import MaskedDense  # noqa: E402
from prune.layers.sparse import SparseDense  # noqa: E402

IMPLS = ("dense", "masked", "coo", "csr", "densify", "native", "auto")
SPARSITIES = (0.0, 0.5, 0.8, 0.9, 0.95, 0.98, 0.99)
BATCHES = (1, 32, 256)


def make_layer(impl: str, w: np.ndarray, mask: np.ndarray) -> keras.layers.Layer:
    n_in, n_out = w.shape
    if impl in ("dense", "masked"):
        layer = keras.layers.Dense(n_out) if impl == "dense" else MaskedDense(n_out)
        layer.build((None, n_in))
        layer.kernel.assign(w * mask if impl == "dense" else w)
        if impl == "masked":
            layer.set_mask("kernel", mask)
        return layer
    matmul = "dense" if impl == "densify" else impl
    return SparseDense.from_dense(w, mask, matmul=matmul)


GRAPH_K = 8  # layer applications per function for the in-graph measures
NATIVE = False  # set in main(): whether prune.native's library is loaded


def make_fns(layer: keras.layers.Layer, xs: list[tf.Tensor]):
    """One-call forward and train step, and their ``len(xs)``-fold in-graph versions."""
    optimizer = keras.optimizers.Adam(1e-4)
    optimizer.build(layer.trainable_variables)

    def loss_of(x):
        return tf.reduce_mean(tf.square(layer(x)))

    def step(x):
        with tf.GradientTape() as tape:
            loss = loss_of(x)
        grads = tape.gradient(loss, layer.trainable_variables)
        optimizer.apply(grads, layer.trainable_variables)
        return loss

    forward = tf.function(lambda: tf.reduce_sum(layer(xs[0])))
    forward_k = tf.function(lambda: tf.add_n([tf.reduce_sum(layer(x)) for x in xs]))
    train_step = tf.function(lambda: step(xs[0]))

    @tf.function
    def train_step_k():
        total = tf.constant(0.0)
        for x in xs:  # unrolled: K dependent steps (each reads the weights the previous one wrote)
            total += step(x)
        return total

    return {"forward": forward, "train_step": train_step, "forward_k": forward_k, "train_step_k": train_step_k,
            "apply": layer, "step": step}


def measure_point(n_in, n_out, batch, sparsity, impls, rounds, min_ms, rng, graph_limit_ms=50.0, k_max=256):
    w = (rng.standard_normal((n_in, n_out)) * np.sqrt(2.0 / n_in)).astype(np.float32)
    n = n_in * n_out
    mask = np.zeros(n, bool)
    mask[rng.permutation(n)[: n - int(round(sparsity * n))]] = True
    mask = mask.reshape(n_in, n_out)
    xs = [tf.constant(rng.standard_normal((batch, n_in)).astype(np.float32)) for _ in range(GRAPH_K)]
    one_call, graph = {}, {}
    for impl in impls:
        layer = make_layer(impl, w, mask)
        made = make_fns(layer, xs[:1])
        for mode in ("forward", "train_step"):
            fn = made[mode]
            fn().numpy()  # trace and warm up
            one_call[(impl, mode)] = lambda fn=fn: fn().numpy()
            t = time.perf_counter()
            fn().numpy()
            if (time.perf_counter() - t) * 1e3 <= graph_limit_ms:
                graph[(impl, mode)] = made["apply" if mode == "forward" else "step"]
    nnz = int(mask.sum())
    rows = []

    def row(impl, mode, median, low, high, reps, k=1):
        return dict(n_in=n_in, n_out=n_out, batch=batch, sparsity=sparsity, nnz=nnz, impl=impl, mode=mode,
                    median_ms=median, min_ms=low, max_ms=high, reps=reps, k=k,
                    auto_choice=kernels.choose_matmul(batch, n_in, n_out, nnz, native=NATIVE),
                    grad_rule=kernels.values_grad_rule(batch, n_in, n_out, nnz, native=NATIVE))

    got = protocol.interleaved({f"{i}/{m}": f for (i, m), f in one_call.items()}, rounds, min_ms,
                               seed=int(rng.integers(2**31)))
    for (impl, mode) in one_call:
        smp = got[f"{impl}/{mode}"]
        rows.append(row(impl, mode, smp.median, smp.low, smp.high, len(smp.values)))
    for (impl, mode), apply in graph.items():
        per = protocol.per_application(apply, xs, rounds=rounds, min_ms=min_ms, k_max=k_max)
        if per.resolved:
            rows.append(row(impl, mode + "_graph", per.ms, per.low, per.high, rounds, per.k))
        else:
            UNRESOLVED.append((n_in, n_out, batch, sparsity, impl, mode + "_graph"))
    return rows


UNRESOLVED: list[tuple] = []
"""In-graph points that never stood clear of the floor (rows absent; the report counts them)."""


def summarise(df: pd.DataFrame) -> pd.DataFrame:
    piv = df.pivot_table(index=["n_in", "n_out", "batch", "sparsity", "mode"], columns="impl", values="median_ms")
    out = pd.DataFrame(index=piv.index)
    for impl in piv.columns:
        out[f"{impl}_ms"] = piv[impl].round(3)
    for impl in piv.columns:
        if impl != "dense":
            out[f"x_{impl}"] = (piv["dense"] / piv[impl]).round(2)
    sparse_sparsity = out.index.get_level_values("sparsity").to_numpy()
    out["ideal_x"] = np.round(1.0 / np.maximum(1.0 - sparse_sparsity, 1e-9), 1)
    if "auto" in piv.columns:
        out["auto_vs_best_kernel"] = (piv["auto"] / piv[_auto_options(piv.columns)].min(axis=1)).round(2)
    return out.reset_index()


def _auto_options(columns) -> list[str]:
    """The kernels ``auto`` chooses from: native and densify with the library, else coo/csr/densify."""
    options = ("densify", "native") if "native" in columns and NATIVE else ("coo", "csr", "densify")
    return [c for c in options if c in columns]


def _crossover(sub: pd.DataFrame, impls: tuple[str, ...]) -> str:
    """Lowest measured sparsity from which the best of ``impls`` beats dense at every higher sparsity."""
    piv = sub.pivot_table(index="sparsity", columns="impl", values="median_ms").sort_index()
    if "dense" not in piv.columns or not set(impls) & set(piv.columns):
        return "n/a"  # not measured (an in-graph measure skipped for a slow single call)
    impls = tuple(i for i in impls if i in piv.columns)
    wins = (piv[list(impls)].min(axis=1) < piv["dense"]).to_numpy()
    for i in range(len(wins)):
        if wins[i:].all():
            return f"{piv.index[i]:.2f}"
    return "none"


def write_report(df: pd.DataFrame, path: Path, header: str = "") -> str:
    """Markdown summary: crossovers per size and batch, and the issue's targets (``header``: the protocol's lines)."""
    lines = [header or "# Layer speed: dense vs masked vs sparse", ""]
    lines.append(
        f"Medians of interleaved rounds (`benchmarks/layer_speed.py`); {_onednn_switches()}. `train_step` = forward + "
        "backward + Adam update. `forward` and `train_step` time one call of a compiled function (including the fixed "
        "cost of calling it); `*_graph` is one application inside a compiled graph, net of the graph's floor "
        f"(`protocol.per_application`; {len(UNRESOLVED)} in-graph points did not stand clear of the floor and are "
        "absent). Full data: `layer_speed.csv`; ratios per point: `layer_speed_summary.csv`."
    )
    lines += ["", "## Crossover sparsity (sparse faster than dense from here up)", ""]
    lines.append(
        "| size | batch | forward: native | forward: auto | forward in graph: native | forward in graph: auto "
        "| train step: native | train step: auto | train step in graph: native | train step in graph: auto |"
    )
    lines.append("|---|---|---|---|---|---|---|---|---|---|")
    for (n_in, n_out, batch), sub in df.groupby(["n_in", "n_out", "batch"]):
        m = {mode: sub[sub["mode"] == mode] for mode in ("forward", "forward_graph", "train_step", "train_step_graph")}
        lines.append(
            f"| {n_in}x{n_out} | {batch} | "
            + " | ".join(_crossover(m[mode], (impl,)) for mode in m for impl in ("native", "auto"))
            + " |"
        )
    piv = df.pivot_table(index=["n_in", "n_out", "batch", "sparsity", "mode"], columns="impl", values="median_ms")

    def ratio(size, batch, s, mode, num, den):
        try:
            return float(piv.loc[(size, size, batch, s, mode), num] / piv.loc[(size, size, batch, s, mode), den])
        except KeyError:
            return float("nan")

    ok = lambda c: "met" if c else "**not met**"  # noqa: E731
    lines += ["", "## Targets of issue 12 (this run; ratio = dense time / sparse time)", ""]
    lines.append("| target | measure | native | auto | status (native) |")
    lines.append("|---|---|---|---|---|")
    for size, batch, s, want, mode in (
        (1024, 256, 0.8, 2.0, "forward_graph"), (1024, 256, 0.8, 2.0, "forward"),
        (1024, 256, 0.9, 3.0, "forward_graph"), (1024, 256, 0.9, 3.0, "forward"),
        (1024, 256, 0.99, 8.0, "forward_graph"), (1024, 256, 0.99, 8.0, "forward"),
        (4096, 256, 0.9, 3.0, "forward_graph"), (4096, 256, 0.9, 3.0, "forward"),
        (1024, 256, 0.9, 2.0, "train_step_graph"), (1024, 256, 0.9, 2.0, "train_step"),
    ):
        nat, aut = ratio(size, batch, s, mode, "dense", "native"), ratio(size, batch, s, mode, "dense", "auto")
        what = "forward" if mode.startswith("forward") else "train step (forward, both gradients, Adam)"
        lines.append(
            f"| {size}x{size} {what} at {s:.0%}, batch {batch}: >= {want:g}x dense | {mode} | {nat:.2f}x | {aut:.2f}x "
            f"| {ok(nat >= want) if nat == nat else 'not measured'} |"
        )
    for batch in (1, 32):
        for mode in ("forward_graph", "forward"):
            sub = df[(df.n_in == 1024) & (df.n_out == 1024) & (df.batch == batch) & (df["mode"] == mode)]
            cross = _crossover(sub, ("native",))
            worst = min((ratio(1024, batch, s, mode, "dense", "native") for s in (0.8, 0.9, 0.95, 0.98, 0.99)),
                        default=float("nan"))
            met = cross != "none" and cross != "n/a" and float(cross) <= 0.8
            lines.append(
                f"| 1024x1024 forward at batch {batch}: faster than dense from 80% | {mode} | crossover {cross}, "
                f"worst ratio at >= 80%: {worst:.2f}x | {_crossover(sub, ('auto',))} | {ok(met)} |"
            )
    modes = piv.index.get_level_values("mode")
    options = _auto_options(piv.columns)
    for graph, label in ((False, "one call"), (True, "in graph")):
        sel = piv[modes.str.endswith("_graph") == graph]
        worst = sel["auto"] / sel[options].min(axis=1)
        n_bad = int((worst > 1.1).sum())
        lines.append(
            f"| auto within 1.10x of the fastest of {'/'.join(options)} | {label} | | worst {worst.max():.2f}x; "
            f"{n_bad} of {int(worst.notna().sum())} points over 1.1x | {ok(n_bad == 0)} (see noise floor) |"
        )
    chosen = df[df.impl == "auto"].set_index(["n_in", "n_out", "batch", "sparsity", "mode"])["auto_choice"]
    chosen = chosen[chosen.index.get_level_values("mode").isin(["forward", "train_step"])]
    rename = {"dense": "densify"}
    same = pd.Series([piv.loc[k, "auto"] / piv.loc[k, rename.get(c, c)] for k, c in chosen.items()], index=chosen.index)
    hit = pd.Series([rename.get(c, c) for c in chosen], index=chosen.index) == piv.loc[chosen.index, options].idxmin(axis=1)
    sel = piv[modes.isin(["forward", "train_step"])]
    gap = sel["auto"] / sel[options].min(axis=1)
    above = gap[(sel[options].max(axis=1) / sel[options].min(axis=1)) > same.quantile(0.9)]
    lines += [
        "",
        f"Noise floor (one-call measures): auto against the very kernel it ran (the same computation plus the run-time "
        f"switch) has median ratio {same.median():.2f}, 90th percentile {same.quantile(0.9):.2f}, max {same.max():.2f}. "
        f"Where the kernels auto chooses from differ by more than that 90th percentile, auto is within "
        f"{above.max():.2f}x of the fastest ({int((above > 1.1).sum())} of {len(above)} such points over 1.1x). "
        f"The cost model picked the measured-fastest of {'/'.join(options)} at {int(hit.sum())} of {len(hit)} points. "
        f"Native library: {'loaded' if NATIVE else 'not loaded (fallback)'}.",
    ]
    lines += ["", "## Forward and train step at batch 256 (ms, speed-up vs dense)", ""]
    cols = [c for c in IMPLS if c in piv.columns]
    lines.append(f"| size | sparsity | mode | {' | '.join(cols)} | native speed-up | auto speed-up | ideal 1/density |")
    lines.append("|---|---|---|" + "---|" * (len(cols) + 3))
    for (n_in, n_out, batch, sp, mode), row in piv.iterrows():
        if batch != 256:
            continue
        cells = " | ".join(f"{row[c]:.2f}" for c in cols)
        nat = row["dense"] / row["native"] if "native" in cols else float("nan")
        lines.append(
            f"| {n_in}x{n_out} | {sp:.2f} | {mode} | {cells} | {nat:.2f}x | {row['dense'] / row['auto']:.2f}x "
            f"| {1 / max(1 - sp, 1e-9):.0f}x |"
        )
    text = "\n".join(lines) + "\n"
    path.write_text(text)
    return text


def _onednn_switches() -> str:
    return ", ".join(f"{k}={os.environ.get(k, 'unset')}" for k in ("TF_ENABLE_ONEDNN_OPTS", "TF_ENABLE_ONEDNN_SPMM"))


def fit_cost_model(df: pd.DataFrame) -> dict[str, tuple[float, ...]]:
    """Non-negative least squares of forward times on the cost model's five terms (relative error weighting)."""
    from scipy.optimize import nnls

    fitted = {}
    fwd = df[df["mode"] == "forward"]
    for impl, kernel in (("densify", "dense"), ("coo", "coo"), ("csr", "csr"), ("native", "native")):
        sub = fwd[fwd.impl == impl]
        if sub.empty:
            continue
        a = np.array([kernels._terms(r.nnz, r.batch, r.n_in, r.n_out) for r in sub.itertuples()], float)
        y = sub["median_ms"].to_numpy() * 1e6  # ns
        weight = 1.0 / y  # fit relative error, so small points count as much as large ones
        coef, _ = nnls(a * weight[:, None], y * weight)
        fitted[kernel] = tuple(float(c) for c in coef)
    return fitted


def main() -> None:
    global NATIVE, GRAPH_K
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1024x1024,784x300,4096x4096")
    parser.add_argument(
        "--big-sparsities", default="0.9,0.95,0.98,0.99",
        help="sparsities for sizes above 4M weights (the low-sparsity COO points would take minutes each)",
    )
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)))
    parser.add_argument("--sparsities", default=",".join(map(str, SPARSITIES)))
    parser.add_argument("--impls", default=",".join(IMPLS))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--min-ms", type=float, default=20.0, help="each one-call measurement repeats calls for this long")
    parser.add_argument("--k-max", type=int, default=256, help="most applications per graph call (in-graph measures)")
    parser.add_argument("--threads", type=int, default=0, help="TensorFlow's intra-op threads (default: the usable cores)")
    parser.add_argument("--graph-k", type=int, default=GRAPH_K,
                        help="distinct inputs per point (at least 2; the in-graph measures cycle through them)")
    parser.add_argument("--graph-limit-ms", type=float, default=50.0,
                        help="skip the in-graph measures of an implementation whose single call is slower")
    parser.add_argument("--out", default="results/benchmarks/layer_speed.csv")
    parser.add_argument("--fit", action="store_true", help="print a cost model refitted to these forward times")
    parser.add_argument("--report-only", action="store_true", help="rewrite the .md report and the _summary.csv from an existing csv")
    protocol.add_arguments(parser)
    args = parser.parse_args()

    if args.graph_k < 2:
        parser.error(f"--graph-k must be at least 2, got {args.graph_k}")
    GRAPH_K = args.graph_k
    if args.report_only:
        df = pd.read_csv(args.out)
        NATIVE = "native" in set(df.impl)
        out = Path(args.out)
        summarise(df).to_csv(out.with_name(out.stem + "_summary.csv"), index=False)  # the .md cites it: keep them one
        old = out.with_suffix(".md")
        text = old.read_text() if old.is_file() else ""
        header = text.split("\n\nMedians of interleaved rounds")[0] if "benchmarks/protocol.py" in text else ""
        print(write_report(df, old, header))  # the measuring run's protocol header, kept
        return
    intra, inter = protocol.fix_tf_threads(args.threads or None)
    load = protocol.start_or_refuse(args)
    if load is None:
        raise SystemExit(protocol.REFUSED)
    gemm = protocol.dense_gemm_gflops()
    NATIVE = native.load() is not None
    print(f"prune.native: {native.status()}", flush=True)
    print(f"TF {tf.__version__}, Keras {keras.__version__}; {protocol.machine(native=False).describe()}; "
          f"intra_op={intra} inter_op={inter}; {_onednn_switches()}", flush=True)
    sizes = [tuple(int(v) for v in s.split("x")) for s in args.sizes.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    sparsities = [float(s) for s in args.sparsities.split(",")]
    big = [float(s) for s in args.big_sparsities.split(",")]
    impls = [i for i in args.impls.split(",") if i != "native" or NATIVE]
    rng = np.random.default_rng(0)
    rows = []
    t0 = time.perf_counter()
    for n_in, n_out in sizes:
        for batch in batches:
            for sparsity in sparsities if n_in * n_out <= 4 << 20 else big:
                point = measure_point(n_in, n_out, batch, sparsity, impls, args.rounds, args.min_ms, rng,
                                      args.graph_limit_ms, args.k_max)
                rows += point
                fwd = {r["impl"]: r["median_ms"] for r in point if r["mode"] == "forward"}
                stp = {r["impl"]: r["median_ms"] for r in point if r["mode"] == "train_step"}
                print(
                    f"{n_in}x{n_out} b={batch:<3} s={sparsity:<4} auto->{point[0]['auto_choice']:<5} "
                    f"fwd " + " ".join(f"{k}={v:.3f}" for k, v in fwd.items())
                    + " | step " + " ".join(f"{k}={v:.3f}" for k, v in stp.items())
                    + " | in graph fwd " + " ".join(
                        f"{r['impl']}={r['median_ms']:.3f}" for r in point if r["mode"] == "forward_graph"
                    )
                    + f"  [{time.perf_counter() - t0:.0f}s]",
                    flush=True,
                )
    load.stop()
    header = protocol.header(
        "Layer speed: dense vs masked vs sparse", protocol.machine(), load, gemm,
        f"TensorFlow {tf.__version__}, Keras {keras.__version__}: intra_op={intra}, inter_op={inter}",
        [f"Medians of {args.rounds} interleaved rounds, each >= {args.min_ms:g} ms of calls; in-graph K from 8 up "
         f"to {args.k_max}."],
    )
    df = pd.DataFrame(rows)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(out, index=False)
    if args.fit:  # before the report, which needs every implementation (a fit run may time only densify/native)
        for k, coef in fit_cost_model(df).items():
            print(f"fitted {k}: " + ", ".join(f"{c:.4g}" for c in coef), flush=True)
    summary = summarise(df)
    summary.to_csv(out.with_name(out.stem + "_summary.csv"), index=False)
    with pd.option_context("display.width", 250, "display.max_columns", 40, "display.max_rows", 500):
        print(summary.to_string(index=False))
    print(write_report(df, out.with_suffix(".md"), header))
    print(f"wrote {out} ({len(df)} rows) in {time.perf_counter() - t0:.0f}s")


if __name__ == "__main__":
    main()
