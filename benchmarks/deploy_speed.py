"""Deployed speed (issue 38, item 4): each form a user can deploy a sparse MLP in, side by side, under the protocol.

Models (``--models``), seeded random weights, pruned to ``--sparsity`` (default 0.9) by magnitude in one shot with
prune's public API (``prune.prune_low_magnitude`` with ``prune.ConstantSparsity`` and ``prune.KeepDense``,
``prune.update_masks``), then ``prune.convert(masked, to="sparse", matmul=--tf-matmul)`` with the layers kept dense
back to plain ``Dense``:

    lenet300   784-300-100-10, relu; the output layer dense (as the study keeps it)
    mlp1024    1024-2048-2048-10, relu; the output layer dense
    ffn512     a transformer feed-forward pair 512 -> 2048 -> 512, both layers pruned, relu between (not gelu:
               PruneSparseFC fuses only none/relu/relu6, so a gelu would be a separate operator in every LiteRT
               form and the issue names no activation); run on ``--tokens`` tokens (input [tokens, 512])
    tiny       37-53-11, relu; the output layer dense (for tests and smoke runs only)

The MLPs run at ``--batches`` (default 1 and 8), ``ffn512`` at ``--tokens`` (default 1 and 16). Forms (:data:`FORMS`),
timed in ONE run, in interleaved rounds (a fresh random order each round):

    tf dense        the pruned model stripped (``prune.strip_pruning``: Dense holding its zeros) in a tf.function
    tf prune        SparseDense (``matmul`` ``--tf-matmul``, default "auto") for the pruned layers, in a tf.function
    litert dense    ``prune.export.to_tflite(stripped, sparsity=False)``: LiteRT, XNNPACK (the default delegates)
    litert sparse   ``to_tflite(stripped, sparsity=True)``: LiteRT's sparse weight format
    litert prune    ``to_tflite(sparse, kernels="prune")``: prune's PruneSparseFC operators, run by prune's LiteRT
                    delegate (``tflite_interpreter(kernels="auto")`` loads it), the other layers by XNNPACK

Every form's output is compared with the Keras model's (the stripped model called eagerly) before any timing; a form
that differs (``np.allclose`` with ``rtol``/``atol`` :data:`RTOL`/:data:`ATOL`), or cannot be built (prune's delegate
failing to compile, say), is refused: it is not timed, its row says why, and the script exits 1 after writing the
table. LiteRT: one interpreter per (model, form, batch), ``num_threads`` = the protocol's thread count, input resized,
tensors allocated and the input set once; a call is ``interpreter.invoke()``. TF: a call is the tf.function on a
resident ``tf.constant`` input (eager execution is synchronous on CPU: the returned tensor is computed; it is not copied
to NumPy). Each form's calls per round are scaled up front (doubling) until they take at least ``--min-ms``; each
round runs them back to back (:func:`protocol.interleaved`), and the table gives the median per call over
``--rounds`` rounds with its min-max, and each form's speed-up over LiteRT dense (the issue's targets are such
ratios), the flatbuffers' sizes, and the delegate's compiled vector path when ``prune.native.litert`` reports one.

Under ``benchmarks/protocol.py``: a busy machine is refused (exit 3) unless ``--allow-loaded``; TensorFlow's intra-op
threads fixed to ``--threads`` (default the usable cores, inter-op 1); the header states CPU, flags, load, threads
and the dense GEMM calibration. The issue's targets (:data:`TARGETS`, fixed here before any run) are listed under the
table with met / missed computed from it; on a loaded machine, at another sparsity or with fewer than 7 rounds they
are stated but not judged.

    .venv/bin/python benchmarks/deploy_speed.py                       # results/benchmarks/deploy_speed.{md,csv}
    .venv/bin/python benchmarks/deploy_speed.py --models tiny --rounds 1 --min-ms 1 --allow-loaded --out /tmp/ds
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import protocol  # noqa: E402

OUT = ROOT / "results" / "benchmarks" / "deploy_speed"
"""Default output prefix: ``deploy_speed.md`` and ``deploy_speed.csv``."""


@dataclass(frozen=True)
class Spec:
    """A model: layer widths after the input, the input width, and whether the last layer stays dense."""

    inputs: int
    widths: tuple[int, ...]
    keep_output_dense: bool
    unit: str  # what the leading dimension counts: "batch" or "tokens"
    label: str


MODELS = {
    "lenet300": Spec(784, (300, 100, 10), True, "batch", "LeNet-300-100 (784-300-100-10)"),
    "mlp1024": Spec(1024, (2048, 2048, 10), True, "batch", "MLP 1024-2048-2048-10"),
    "ffn512": Spec(512, (2048, 512), False, "tokens", "transformer FFN pair 512-2048-512 (relu)"),
    "tiny": Spec(37, (53, 11), True, "batch", "tiny 37-53-11 (smoke/test model)"),
}
DEFAULT_MODELS = ("lenet300", "mlp1024", "ffn512")
FORMS = ("tf dense", "tf prune", "litert dense", "litert sparse", "litert prune")
BASELINE = "litert dense"
RTOL, ATOL = 1e-4, 1e-4
"""Agreement with the Keras model required before a form is timed (float32 sums in other orders)."""
MIN_ROUNDS = 7
"""Fewer rounds than this make a smoke run: the targets are then not judged."""


@dataclass(frozen=True)
class Target:
    """One of issue 38's targets: ``litert prune`` at least ``speedup`` x LiteRT dense (median over median)."""

    model: str
    size: int | None  # batch / tokens; None: every size timed
    speedup: float
    text: str


TARGETS = (
    Target("mlp1024", 1, 2.0, "1024-2048-2048 at 90%, batch 1: LiteRT with prune's ops >= 2x LiteRT dense"),
    Target("ffn512", 1, 2.0, "transformer FFN pair 512-2048-512 at 90%, 1 token: LiteRT with prune's ops >= 2x LiteRT dense"),
    Target("lenet300", None, 1.0, "LeNet-300-100 at 90%: LiteRT with prune's ops no slower than LiteRT dense (every batch timed)"),
)
"""Fixed before any run, from issue 38's Targets (all at sparsity :data:`TARGET_SPARSITY`)."""
TARGET_SPARSITY = 0.9
UNMEASURED_TARGETS = ("MobileNet-style model at 90%, batch 1: >= 1.5x LiteRT dense, once sparse convolutions exist "
                      "as LiteRT ops: not measured here (PruneSparseFC is fully-connected only)",)

COLUMNS = ["model", "unit", "size", "form", "status", "ms", "ms_min", "ms_max", "x_litert_dense", "calls_per_round",
           "rounds", "max_abs_diff", "flatbuffer_bytes", "prune_ops", "sparsity", "stored_weights", "kernel_weights",
           "tf_matmul", "intra_op_threads", "inter_op_threads", "litert_threads", "delegate_vector_path"]


def _ints(text: str, flag: str, parser: argparse.ArgumentParser) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        parser.error(f"{flag}: {text!r} is not a comma-separated list of integers")
    if not values or any(v <= 0 for v in values):
        parser.error(f"{flag}: every entry must be a positive integer, got {text!r}")
    return tuple(sorted(set(values)))


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The arguments, every bad one refused here, naming the flag and the value, before anything runs."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(DEFAULT_MODELS), help=f"comma-separated, from {sorted(MODELS)}")
    p.add_argument("--sparsity", type=float, default=0.9, help="fraction of each pruned layer's weights removed, in (0, 1)")
    p.add_argument("--batches", default="1,8", help="batch sizes of the MLPs (comma-separated)")
    p.add_argument("--tokens", default="1,16", help="tokens (rows) of the feed-forward pair (comma-separated)")
    p.add_argument("--tf-matmul", default="auto", choices=("auto", "native"), help="the SparseDense kernel of 'tf prune'")
    p.add_argument("--rounds", type=int, default=MIN_ROUNDS, help=f"interleaved rounds (results: >= {MIN_ROUNDS})")
    p.add_argument("--min-ms", type=float, default=20.0, help="each form's calls in a round take at least this long")
    p.add_argument("--calls", type=int, default=0, help="calls per round for every form (0: scaled to --min-ms)")
    p.add_argument("--threads", type=int, default=0,
                   help="TensorFlow's intra-op threads and LiteRT's num_threads (default: the usable cores)")
    p.add_argument("--out", default=str(OUT), help="output prefix: writes PREFIX.md and PREFIX.csv")
    protocol.add_arguments(p)
    args = p.parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in MODELS]
    if unknown or not models:
        p.error(f"--models: unknown {unknown or args.models!r}; choose from {sorted(MODELS)}")
    args.models = tuple(dict.fromkeys(models))
    if not 0.0 < args.sparsity < 1.0:
        p.error(f"--sparsity must be in (0, 1), got {args.sparsity!r}")
    args.batches = _ints(args.batches, "--batches", p)
    args.tokens = _ints(args.tokens, "--tokens", p)
    if args.rounds < 1:
        p.error(f"--rounds must be at least 1, got {args.rounds}")
    if not args.min_ms > 0:
        p.error(f"--min-ms must be above 0, got {args.min_ms!r}")
    if args.calls < 0:
        p.error(f"--calls must be 0 (scaled) or more, got {args.calls}")
    if args.threads < 0:
        p.error(f"--threads must be 0 (the usable cores) or more, got {args.threads}")
    if not 0.0 < args.busy_threshold <= 1.0:
        p.error(f"--busy-threshold must be in (0, 1], got {args.busy_threshold!r}")
    out = Path(args.out)
    args.out = out.with_suffix("") if out.suffix in (".md", ".csv") else out
    return args


# -- models ------------------------------------------------------------------------------------------------------------


def build(name: str, sparsity: float, matmul: str):
    """``(plain, sparse, pruned)``: the masked model stripped, its deployed sparse form, the pruned layers' names."""
    import keras

    import prune

    spec = MODELS[name]
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    layers = [keras.layers.Dense(w, activation=None if i == len(spec.widths) - 1 else "relu", name=f"dense_{i}")
              for i, w in enumerate(spec.widths)]
    model = keras.Sequential([keras.Input((spec.inputs,)), *layers], name=name)
    for layer in layers:  # nonzero biases, so a dropped bias would show in the agreement check
        layer.bias.assign(rng.normal(0, 0.1, layer.bias.shape).astype(np.float32))
    policy = prune.KeepDense([layers[-1].name]) if spec.keep_output_dense else None  # None: every Dense pruned
    masked = prune.prune_low_magnitude(model, prune.ConstantSparsity(sparsity, 0), pruning_policy=policy)
    prune.update_masks(masked, 0)
    pruned = {layer.name for layer in prune.prunable_layers(masked)}
    expected = {layer.name for layer in (layers[:-1] if spec.keep_output_dense else layers)}
    if pruned != expected:
        raise RuntimeError(f"{name}: pruned layers {sorted(pruned)}, expected {sorted(expected)}")
    from conv_model_speed import sparse_form  # the runner's deployed form: kept layers plain Dense, no schedule

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", prune.ConversionWarning)
        sparse = sparse_form(masked, matmul)  # so the layers kept dense do not become PruneSparseFC
    return prune.strip_pruning(masked), sparse, pruned


def _litert_runtime() -> str:
    try:
        import ai_edge_litert
    except ImportError:
        import tensorflow as tf

        return f"tf.lite.Interpreter of TensorFlow {tf.__version__} (ai-edge-litert not installed)"
    return f"ai-edge-litert {ai_edge_litert.__version__}"


def delegate_vector_path() -> str:
    """The prune-ops delegate's compiled vector path, or why it is unavailable (stated in the table, never fatal)."""
    from prune.native import litert

    try:
        return litert.delegate_vector_path()
    except Exception as e:  # noqa: BLE001 - the 'litert prune' rows then say why they were not timed
        return f"unavailable ({type(e).__name__}: {e})"


def _litert_call(content: bytes, x: np.ndarray, threads: int):
    """An interpreter on ``x`` (resized, allocated, the input set once): ``(invoke, output)``."""
    from prune.deploy.export import tflite_interpreter

    interp = tflite_interpreter(content, num_threads=threads, kernels="auto")
    inp, out = interp.get_input_details()[0], interp.get_output_details()[0]
    interp.resize_tensor_input(inp["index"], x.shape)
    interp.allocate_tensors()
    interp.set_tensor(inp["index"], np.ascontiguousarray(x, dtype=inp["dtype"]))
    interp.invoke()
    return interp.invoke, interp.get_tensor(out["index"]).copy()


def _scaled(fn, calls: int, min_ms: float):
    """``(n, batch)``: ``batch()`` calls ``fn`` n times; n given, or doubled until n calls take >= ``min_ms``."""
    import time

    def batch_of(n):
        def batch():
            for _ in range(n):
                fn()
        return batch

    if calls:
        return calls, batch_of(calls)
    n = 1
    while True:
        t0 = time.perf_counter()
        batch_of(n)()
        if (time.perf_counter() - t0) * 1e3 >= min_ms or n >= 1 << 22:
            return n, batch_of(n)
        n *= 2


# -- the run -----------------------------------------------------------------------------------------------------------


def measure(args: argparse.Namespace, threads: tuple[int, int], vector: str) -> list[dict]:
    """Build every (model, form, size), check it against Keras, time the agreeing ones interleaved; one row each."""
    import tensorflow as tf

    from prune.deploy.export import prune_ops, to_tflite

    rng = np.random.default_rng(1)
    fns, rows = {}, []
    for name in args.models:
        spec = MODELS[name]
        plain, sparse, pruned = build(name, args.sparsity, args.tf_matmul)
        kernels = [layer.kernel.numpy() for layer in plain.layers if hasattr(layer, "kernel")]
        info = dict(model=name, unit=spec.unit, sparsity=args.sparsity,
                    stored_weights=int(sum(np.count_nonzero(k) for k in kernels)),
                    kernel_weights=int(sum(k.size for k in kernels)), tf_matmul=args.tf_matmul,
                    intra_op_threads=threads[0], inter_op_threads=threads[1], litert_threads=threads[0],
                    delegate_vector_path=vector)
        flat, why_not = {}, {}
        for form, make in (("litert dense", lambda: to_tflite(plain, sparsity=False)),
                           ("litert sparse", lambda: to_tflite(plain, sparsity=True)),
                           ("litert prune", lambda: to_tflite(sparse, kernels="prune"))):
            try:
                flat[form] = make()
            except Exception as e:  # noqa: BLE001 - the row says why; other forms still run
                why_not[form] = f"export failed: {type(e).__name__}: {e}"
        graphs = {"tf dense": tf.function(lambda x, m=plain: m(x, training=False)),
                  "tf prune": tf.function(lambda x, m=sparse: m(x, training=False))}
        sizes = args.tokens if spec.unit == "tokens" else args.batches
        for size in sizes:
            x = rng.standard_normal((size, spec.inputs)).astype(np.float32)
            xt = tf.constant(x)
            reference = plain(xt, training=False).numpy()  # the Keras model, called eagerly
            for form in FORMS:
                row = dict(info, size=size, form=form, status="timed", max_abs_diff=np.nan, rounds=args.rounds,
                           flatbuffer_bytes=len(flat[form]) if form in flat else np.nan,
                           prune_ops=prune_ops(flat[form]) if form in flat else np.nan)
                rows.append(row)
                if form in why_not:
                    row["status"] = f"refused: {why_not[form]}"
                    continue
                try:
                    if form in graphs:
                        g = graphs[form]
                        got = g(xt).numpy()
                        call = lambda g=g, xt=xt: g(xt)  # noqa: E731
                    else:
                        call, got = _litert_call(flat[form], x, threads[0])
                except Exception as e:  # noqa: BLE001 - e.g. prune's delegate failing to build or to prepare
                    row["status"] = f"refused: cannot run: {type(e).__name__}: {str(e).splitlines()[0][:300]}"
                    continue
                diff = float(np.max(np.abs(got - reference))) if got.shape == reference.shape else np.inf
                row["max_abs_diff"] = diff
                if got.shape != reference.shape or not np.allclose(got, reference, rtol=RTOL, atol=ATOL):
                    row["status"] = (f"refused: output differs from the Keras model (shape {got.shape} vs "
                                     f"{reference.shape}, max |diff| {diff:.3g})")
                    continue
                if form == "litert prune" and row["prune_ops"] != len(pruned):
                    row["status"] = (f"refused: {row['prune_ops']} PruneSparseFC operators for {len(pruned)} "
                                     "pruned layers")
                    continue
                n, batch = _scaled(call, args.calls, args.min_ms)
                row["calls_per_round"] = n
                fns[name, size, form] = (n, batch)
        print(f"built {name}: {info['stored_weights']} of {info['kernel_weights']} kernel weights stored; "
              f"flatbuffers {', '.join(f'{f} {len(c)} B' for f, c in flat.items())}", flush=True)
    print(f"timing {len(fns)} (model, size, form) points over {args.rounds} interleaved rounds", flush=True)
    times = protocol.interleaved({k: b for k, (_, b) in fns.items()}, args.rounds, min_ms=1e-9)
    per_call = {k: protocol.Samples(tuple(v / fns[k][0] for v in s.values)) for k, s in times.items()}
    for row in rows:
        got = per_call.get((row["model"], row["size"], row["form"]))
        base = per_call.get((row["model"], row["size"], BASELINE))
        if got is not None:
            row.update(ms=got.median, ms_min=got.low, ms_max=got.high)
            row["x_litert_dense"] = base.median / got.median if base is not None else np.nan
    return rows


def judge(rows: list[dict], args: argparse.Namespace, judged: bool) -> list[str]:
    """The targets, each met / missed from the table (or why it is not judged)."""
    lines = []
    by = {(r["model"], r["size"], r["form"]): r for r in rows}
    for t in TARGETS:
        if t.model not in args.models:
            lines.append(f"- {t.text}: not measured (model not in --models).")
            continue
        sizes = sorted({r["size"] for r in rows if r["model"] == t.model})
        sizes = sizes if t.size is None else [s for s in sizes if s == t.size]
        pairs = [(s, by.get((t.model, s, "litert prune"), {}).get("x_litert_dense", np.nan)) for s in sizes]
        if not pairs or any(not np.isfinite(x) for _, x in pairs):
            lines.append(f"- {t.text}: not measured (litert prune or litert dense not timed at "
                         f"{MODELS[t.model].unit} {t.size if t.size is not None else sizes}).")
            continue
        got = ", ".join(f"{MODELS[t.model].unit} {s}: {x:.2f}x" for s, x in pairs)
        if not judged or args.sparsity != TARGET_SPARSITY:
            lines.append(f"- {t.text}: {got} -- NOT JUDGED ({'not a result run' if not judged else f'sparsity {args.sparsity:g}, target at {TARGET_SPARSITY:g}'}).")
        else:
            met = all(x >= t.speedup for _, x in pairs)
            lines.append(f"- {t.text}: {got} -- {'MET' if met else 'MISSED'} (needs >= {t.speedup:g}x).")
    lines += [f"- {t}." for t in UNMEASURED_TARGETS]
    return lines


def markdown(rows: list[dict]) -> str:
    lines = ["| model | rows | form | ms per call, median (min-max) | x LiteRT dense | calls/round | flatbuffer | "
             "max abs diff vs Keras | status |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ms = f"{r['ms']:.4f} ({r['ms_min']:.4f}-{r['ms_max']:.4f})" if np.isfinite(r.get("ms", np.nan)) else "-"
        x = f"{r['x_litert_dense']:.3f}x" if np.isfinite(r.get("x_litert_dense", np.nan)) else "-"
        size = f"{r['flatbuffer_bytes'] / 1024:.1f} KiB" if np.isfinite(r["flatbuffer_bytes"]) else "-"
        diff = f"{r['max_abs_diff']:.2g}" if np.isfinite(r["max_abs_diff"]) else "-"
        lines.append(f"| {r['model']} | {r['unit']} {r['size']} | {r['form']} | {ms} | {x} | "
                     f"{r.get('calls_per_round', '-')} | {size} | {diff} | {r['status']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    load = protocol.start_or_refuse(args)
    if load is None:
        return protocol.REFUSED
    threads = protocol.fix_tf_threads(args.threads or None)
    import pandas as pd
    import tensorflow as tf

    gemm = protocol.dense_gemm_gflops()
    mach = protocol.machine()
    vector = delegate_vector_path()
    rows = measure(args, threads, vector)
    load.stop()
    judged = not load.loaded and args.rounds >= MIN_ROUNDS
    smoke = [] if judged else [
        "NOT A RESULT: " + "; ".join(w for w, on in (("the machine was loaded", load.loaded),
                                                      (f"{args.rounds} round(s) < {MIN_ROUNDS}", args.rounds < MIN_ROUNDS)) if on)
        + " -- the targets below are not judged."]
    head = protocol.header(
        "Deployed speed: TF and LiteRT, dense and sparse, with prune's kernels (issue 38)", mach, load, gemm,
        f"TensorFlow {tf.__version__}: intra_op={threads[0]}, inter_op={threads[1]}; LiteRT ({_litert_runtime()}) "
        f"num_threads={threads[0]}, default delegates (XNNPACK); prune's LiteRT delegate for PruneSparseFC "
        f"(vector path: {vector})",
        smoke + [
            f"Models with seeded random weights, {args.sparsity:.0%} of each pruned layer's weights removed by magnitude "
            "(MLPs: output layer dense; FFN pair: both layers pruned, relu between). "
            f"{args.rounds} interleaved round(s); "
            + (f"{args.calls} calls per round for every form (--calls)" if args.calls else
               f"each form's calls per round scaled to >= {args.min_ms:g} ms")
            + "; median per call (min-max over rounds).",
            "A call: LiteRT `interpreter.invoke()` with the input set once; TF a tf.function on a resident input. "
            f"Every form's output was checked against the Keras model (rtol {RTOL:g}, atol {ATOL:g}) before timing; "
            f"'tf prune' is SparseDense matmul={args.tf_matmul!r}. 'x LiteRT dense' = LiteRT dense's median over "
            "the form's (above 1: faster)."])
    targets = ["", "## Targets (issue 38; thresholds fixed in benchmarks/deploy_speed.py before the run)", "",
               *judge(rows, args, judged)]
    df = pd.DataFrame(rows).reindex(columns=COLUMNS)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    csv, md = args.out.with_name(args.out.name + ".csv"), args.out.with_name(args.out.name + ".md")
    df.to_csv(csv, index=False)
    report = head + "\n" + markdown(rows) + "\n".join(targets) + "\n"
    md.write_text(report)
    print(report)
    print(f"wrote {md} and {csv}")
    refused = [f"{r['model']} {r['unit']} {r['size']} {r['form']}: {r['status']}" for r in rows if r["status"] != "timed"]
    if refused:
        print("error: forms refused (not timed):\n  " + "\n  ".join(refused), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
