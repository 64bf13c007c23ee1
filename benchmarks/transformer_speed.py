"""Transformer speed (issue 36, item 3): a feed-forward pair and an encoder block, dense and sparse, under the protocol.

Models (``--models``, :data:`MODELS`), seeded random weights (nonzero biases, so a dropped bias would show in the
agreement check):

    ffn256     the feed-forward pair 256 -> 1024 -> 256: Dense, gelu (exact), Dense; input [tokens, 256]
    ffn512     the same pair 512 -> 2048 -> 512; input [tokens, 512]
    block256   a post-norm transformer encoder block of width 256: keras.layers.MultiHeadAttention (4 heads of key_dim
               64, self-attention, no attention mask), residual + LayerNormalization, the pair 256 -> 1024 -> 256,
               residual + LayerNormalization; input [1, tokens, 256]
    block512   the same at width 512, 8 heads of key_dim 64, pair 512 -> 2048 -> 512; input [1, tokens, 512]
    tiny       a block of width 16, 2 heads of key_dim 8, pair 16 -> 24 -> 16 (tests and smoke runs only)
    tinyffn    the pair 16 -> 24 -> 16 (tests and smoke runs only)

at ``--tokens`` (default 1 16 256 4096). Forms (``--forms``, :data:`FORMS`):

    dense      the plain Keras model (every weight kept)
    2:4, 4:8   pruned with ``prune.NByM(2, 4)`` / ``prune.NByM(4, 8)`` (2 of every 4, 4 of every 8 weights zero along
               each kernel's input axis)
    70%, 90%   unstructured, by magnitude, per layer

(``NByM`` groups run along each kernel's inputs: a Dense kernel's first axis, the ``d_in`` of an ``EinsumDense``
kernel's ``[d_in, d_out]`` matrix for the attention's projections. The CSV's ``sparsity`` column is the fraction of
zeros in all the masks.)

Each pruned form is made in one shot through prune's public API: ``prune.prune_low_magnitude(model,
prune.ConstantSparsity(s, 0), pattern=...)``, ``prune.update_masks(masked, 0)``, then ``prune.convert(masked,
to="sparse")``: the Dense layers become ``SparseDense``, the attention ``SparseMultiHeadAttention`` (four
``SparseEinsumDense`` projections); the attention's score and value products stay dense in every form. Whatever
``convert`` cannot make sparse stays masked; the table's "sparse layers" column says, per form, which layers ran as
sparse layers (their type names, from ``prune.core.targets.iter_layers``) and which stayed masked, and the CSV gives
``sparse_share``, the fraction of the pruned kernels' entries held by sparse layers (``prune.sparsity_report``).

Before any timing, every form's compiled forward graph is run on each input and compared with its reference (pruned
forms: ``prune.strip_pruning(masked)`` called eagerly; dense: the Keras model called eagerly), ``np.allclose`` with
``rtol``/``atol`` :data:`RTOL`/:data:`ATOL`. A form that differs, or cannot be built or run, is refused: not timed, its
rows say why, and the script exits 1 after writing the table.

Two measurements (``--modes``):

    forward    a tf.function calling the model on a resident ``tf.constant`` input (eager execution is synchronous on
               CPU: the returned tensor is computed)
    train      one training step in a tf.function: loss = mean(square(model(x, training=True) - y)) against a fixed
               random target, gradients over the model's trainable variables, ``keras.optimizers.SGD(1e-4)``'s apply
               (the same step for the dense model and every sparse form)

Each point's calls per round are scaled up front (doubling) until they take at least ``--min-ms``; every point runs in
ONE run, in interleaved rounds (:func:`protocol.interleaved`, a fresh random order each round), and the table gives
the median per call over ``--rounds`` rounds with its min-max, and "x dense": dense's median over the form's, same
model, tokens and mode (above 1: faster).

Under ``benchmarks/protocol.py``: a busy machine is refused (exit 3) unless ``--allow-loaded``; TensorFlow's intra-op
threads fixed to ``--threads`` (default the usable cores, inter-op 1); the header states CPU, flags, prune's native
vector path, load, threads and the dense GEMM calibration. The issue's targets (:data:`TARGETS`, fixed here before any
run) are listed under the table with met / missed computed from it; on a loaded machine or with fewer than
:data:`MIN_ROUNDS` rounds they are stated but not judged.

    .venv/bin/python benchmarks/transformer_speed.py              # results/benchmarks/transformer_speed.{md,csv}
    .venv/bin/python benchmarks/transformer_speed.py --models tiny --tokens 1 5 --rounds 1 --min-ms 1 --allow-loaded \
        --out /tmp/ts
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
from deploy_speed import _ints, _scaled  # noqa: E402  (one home for the list parsing and the calls-per-round scaling)

OUT = ROOT / "results" / "benchmarks" / "transformer_speed"
"""Default output prefix: ``transformer_speed.md`` and ``transformer_speed.csv``."""


@dataclass(frozen=True)
class Spec:
    """A model: ``"ffn"`` (the pair alone, input [tokens, d]) or ``"block"`` (input [1, tokens, d])."""

    kind: str
    d: int
    hidden: int
    heads: int  # blocks only
    label: str


MODELS = {
    "ffn256": Spec("ffn", 256, 1024, 0, "feed-forward pair 256-1024-256 (gelu)"),
    "ffn512": Spec("ffn", 512, 2048, 0, "feed-forward pair 512-2048-512 (gelu)"),
    "block256": Spec("block", 256, 1024, 4, "encoder block d=256, 4 heads, pair 256-1024-256"),
    "block512": Spec("block", 512, 2048, 8, "encoder block d=512, 8 heads, pair 512-2048-512"),
    "tiny": Spec("block", 16, 24, 2, "tiny encoder block d=16, 2 heads, pair 16-24-16 (smoke/test model)"),
    "tinyffn": Spec("ffn", 16, 24, 0, "tiny feed-forward pair 16-24-16 (smoke/test model)"),
}
DEFAULT_MODELS = ("ffn256", "ffn512", "block256", "block512")
FORMS = {
    "dense": None,
    "2:4": ("NByM", (2, 4), 0.5),
    "4:8": ("NByM", (4, 8), 0.5),
    "70%": ("Unstructured", (), 0.7),
    "90%": ("Unstructured", (), 0.9),
}
"""Form -> ``(prune pattern class, its arguments, ConstantSparsity's sparsity)``; ``None``: the plain model."""
BASELINE = "dense"
MODES = ("forward", "train")
DEFAULT_TOKENS = (1, 16, 256, 4096)
ACTIVATION = "gelu"
LEARNING_RATE = 1e-4
RTOL, ATOL = 1e-4, 1e-4
"""Agreement with the reference required before a form is timed (float32 sums in other orders)."""
MIN_ROUNDS = 7
"""Fewer rounds than this make a smoke run: the targets are then not judged."""


@dataclass(frozen=True)
class Target:
    """One of issue 36's targets: ``form`` at least ``speedup`` x dense (median over median) in ``mode``.

    ``tokens`` is ``(">=", n)`` (every timed tokens count of at least n must hold) or ``("==", n)``.
    """

    models: tuple[str, ...]
    form: str
    mode: str
    tokens: tuple[str, int]
    speedup: float
    text: str


FFN, BLOCKS = ("ffn256", "ffn512"), ("block256", "block512")
TARGETS = (
    Target(FFN, "2:4", "forward", (">=", 256), 1.3, "feed-forward pair, 2:4, forward, >= 256 tokens: >= 1.3x dense"),
    Target(FFN, "4:8", "forward", (">=", 256), 1.3, "feed-forward pair, 4:8, forward, >= 256 tokens: >= 1.3x dense"),
    Target(FFN, "90%", "forward", (">=", 256), 2.5,
           "feed-forward pair, 90% unstructured, forward, >= 256 tokens: >= 2.5x dense"),
    Target(FFN, "2:4", "train", (">=", 256), 1.0,
           "feed-forward pair, 2:4, training step, >= 256 tokens: no slower than dense (>= 1.0x)"),
    Target(BLOCKS, "2:4", "forward", (">=", 256), 1.15,
           "full encoder block, 2:4, forward, >= 256 tokens: >= 1.15x dense"),
    Target(FFN + BLOCKS, "2:4", "forward", ("==", 1), 1.0,
           "feed-forward pair and encoder block, 2:4, forward, 1 token (decoding): no slower than dense (>= 1.0x)"),
)
"""Fixed before any run, from issue 36's targets; each holds for every model listed and every tokens count it names."""

COLUMNS = ["model", "tokens", "mode", "form", "status", "sparse_layers", "masked_layers", "sparse_share", "sparsity",
           "ms", "ms_min", "ms_max", "x_dense", "calls_per_round", "rounds", "max_abs_diff", "activation",
           "intra_op_threads", "inter_op_threads"]


def _names(values: list[str], flag: str, choices, parser: argparse.ArgumentParser) -> tuple[str, ...]:
    """Entries given space- or comma-separated, each one of ``choices``, in order, once each."""
    names = [v.strip() for text in values for v in text.split(",") if v.strip()]
    unknown = [v for v in names if v not in choices]
    if unknown or not names:
        parser.error(f"{flag}: unknown {unknown or values!r}; choose from {list(choices)}")
    return tuple(dict.fromkeys(names))


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The arguments, every bad one refused here, naming the flag and the value, before anything runs."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), help=f"from {list(MODELS)}")
    p.add_argument("--forms", nargs="+", default=list(FORMS), help=f"from {list(FORMS)}")
    p.add_argument("--tokens", nargs="+", default=[str(t) for t in DEFAULT_TOKENS],
                   help="tokens (rows) per input: [tokens, d] for the pairs, [1, tokens, d] for the blocks")
    p.add_argument("--modes", nargs="+", default=list(MODES), help=f"from {list(MODES)}")
    p.add_argument("--rounds", type=int, default=MIN_ROUNDS, help=f"interleaved rounds (results: >= {MIN_ROUNDS})")
    p.add_argument("--min-ms", type=float, default=20.0, help="each point's calls in a round take at least this long")
    p.add_argument("--threads", type=int, default=0, help="TensorFlow's intra-op threads (default: the usable cores)")
    p.add_argument("--out", default=str(OUT), help="output prefix: writes PREFIX.md and PREFIX.csv")
    protocol.add_arguments(p)
    args = p.parse_args(argv)
    args.models = _names(args.models, "--models", MODELS, p)
    args.forms = _names(args.forms, "--forms", FORMS, p)
    args.modes = _names(args.modes, "--modes", MODES, p)
    args.tokens = _ints(",".join(args.tokens), "--tokens", p)
    if args.rounds < 1:
        p.error(f"--rounds must be at least 1, got {args.rounds}")
    if not args.min_ms > 0:
        p.error(f"--min-ms must be above 0, got {args.min_ms!r}")
    if args.threads < 0:
        p.error(f"--threads must be 0 (the usable cores) or more, got {args.threads}")
    if not 0.0 < args.busy_threshold <= 1.0:
        p.error(f"--busy-threshold must be in (0, 1], got {args.busy_threshold!r}")
    out = Path(args.out)
    args.out = out.with_suffix("") if out.suffix in (".md", ".csv") else out
    return args


# -- models ------------------------------------------------------------------------------------------------------------


def build_dense(name: str):
    """The plain Keras model of ``name``, seeded (weights from Keras's initialisers, biases random nonzero)."""
    import keras

    spec = MODELS[name]
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    ffn_in = keras.layers.Dense(spec.hidden, activation=ACTIVATION, name="ffn_in")
    ffn_out = keras.layers.Dense(spec.d, name="ffn_out")
    if spec.kind == "ffn":
        inp = keras.Input((spec.d,))
        out = ffn_out(ffn_in(inp))
    else:
        inp = keras.Input((None, spec.d))
        att = keras.layers.MultiHeadAttention(spec.heads, spec.d // spec.heads, name="mha")(inp, inp)
        x = keras.layers.LayerNormalization(name="ln_1")(keras.layers.Add(name="res_1")([inp, att]))
        f = ffn_out(ffn_in(x))
        out = keras.layers.LayerNormalization(name="ln_2")(keras.layers.Add(name="res_2")([x, f]))
    model = keras.Model(inp, out, name=name)
    for v in model.weights:  # nonzero biases everywhere (Dense, the attention projections, LayerNorm's beta)
        if v.path.endswith("bias") or v.path.endswith("beta"):
            v.assign(rng.normal(0, 0.1, v.shape).astype(np.float32))
    return model


def build_form(dense, form: str):
    """``(model, reference, sparsity)`` of ``form``: the converted sparse model, the stripped masked model it must
    equal, and the fraction of the pruned weights' entries its masks removed."""
    import prune

    if FORMS[form] is None:
        return dense, dense, 0.0
    kind, pattern_args, sparsity = FORMS[form]
    masked = prune.prune_low_magnitude(dense, prune.ConstantSparsity(sparsity, 0),
                                       pattern=getattr(prune, kind)(*pattern_args))
    prune.update_masks(masked, 0)
    masks = [layer.weight_and_mask(w)[1].numpy() for layer in prune.prunable_layers(masked)
             for w in layer.prunable_weight_names]
    zeros = float(sum(np.sum(m == 0) for m in masks) / sum(m.size for m in masks))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", prune.ConversionWarning)  # what stays masked is stated in the table
        sparse = prune.convert(masked, to="sparse")
    from prune.core.targets import iter_layers

    for layer in iter_layers(sparse):  # a fixed structure: the train rows time steps, not mask updates
        if getattr(layer, "pruning_schedule", None) is not None:  # (as conv_model_speed.sparse_form does)
            layer.pruning_schedule = None
    return sparse, prune.strip_pruning(masked), zeros


def describe_layers(model) -> dict:
    """Which layers of ``model`` run as sparse layers and which stay masked (type names and layer names)."""
    import keras

    import prune
    from prune.core.targets import iter_layers

    sparse, masked = {}, {}
    for layer in iter_layers(model):
        if isinstance(layer, keras.Model):
            continue
        kind = type(layer).__name__
        if kind.startswith("Sparse") or hasattr(layer, "sparse_weight"):
            sparse.setdefault(kind, []).append(layer.name)
        elif isinstance(layer, prune.PrunableLayer):
            masked.setdefault(kind, []).append(layer.name)
    text = lambda d: "; ".join(f"{k}: {', '.join(v)}" for k, v in sorted(d.items()))  # noqa: E731
    share = np.nan
    try:
        report = prune.sparsity_report(model)
        if len(report):
            size = report["size"].astype(float)
            share = float(size[report["status"] == "sparse"].sum() / size.sum())
    except Exception as e:  # noqa: BLE001 - the columns stay NaN; the layer names above still say what ran sparse
        print(f"warning: sparsity_report failed on {model.name}: {type(e).__name__}: {e}", file=sys.stderr)
    return dict(sparse_layers=text(sparse) or "none", masked_layers=text(masked) or "none", sparse_share=share)


def _why(e: Exception) -> str:
    """``Type: message`` in one line: a Keras layer's own message rather than a traced function's traceback."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    for i, ln in enumerate(lines[:-1]):
        if "Exception encountered when calling" in ln:
            return f"{type(e).__name__}: {lines[i + 1]}"[:300]
    return f"{type(e).__name__}: {lines[-1] if lines and lines[0] == 'in user code:' else (lines or [''])[0]}"[:300]


def _inputs(spec: Spec, tokens: int, rng: np.random.Generator):
    shape = (tokens, spec.d) if spec.kind == "ffn" else (1, tokens, spec.d)
    return rng.standard_normal(shape).astype(np.float32), rng.standard_normal(shape).astype(np.float32)


def _train_steps(model):
    """``make(x, y)``: a compiled training step of ``model`` on that input and target, one per tokens count (one
    trace each), all with one ``SGD`` optimizer: mean square error to the target, gradients, the optimizer's apply."""
    import keras
    import tensorflow as tf

    optimizer = keras.optimizers.SGD(LEARNING_RATE)
    variables = model.trainable_variables
    optimizer.build(variables)

    def make(x, y):
        @tf.function
        def step():
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
            optimizer.apply(tape.gradient(loss, variables), variables)
            return loss

        return step

    return make


# -- the run -----------------------------------------------------------------------------------------------------------


def measure(args: argparse.Namespace, threads: tuple[int, int]) -> list[dict]:
    """Build every (model, form), check it at every tokens count, time the agreeing ones interleaved; one row each."""
    import tensorflow as tf

    rng = np.random.default_rng(1)
    fns, rows = {}, []
    for name in args.models:
        spec = MODELS[name]
        dense = build_dense(name)
        data = {t: _inputs(spec, t, rng) for t in args.tokens}
        consts = {t: (tf.constant(x), tf.constant(y)) for t, (x, y) in data.items()}
        built, why_not = {}, {}
        for form in args.forms:
            try:
                built[form] = build_form(dense, form)
            except Exception as e:  # noqa: BLE001 - the rows say why; other forms still run
                why_not[form] = f"refused: cannot build: {_why(e)}"
        # Check every form at every tokens count first: a training step changes the weights it is timed on.
        checked, new = {}, []
        for form in args.forms:
            info = dict(model=name, form=form, rounds=args.rounds, activation=ACTIVATION, intra_op_threads=threads[0],
                        inter_op_threads=threads[1])
            if form in built:
                info.update(describe_layers(built[form][0]) if form != BASELINE else
                            dict(sparse_layers="none (plain Keras)", masked_layers="none", sparse_share=0.0))
                info["sparsity"] = built[form][2]
            for t in args.tokens:
                status, diff = why_not.get(form, "timed"), np.nan
                if form in built:
                    try:
                        xt = consts[t][0]
                        graph = tf.function(lambda x, m=built[form][0]: m(x, training=False))  # one per shape
                        got = graph(xt).numpy()
                        reference = built[form][1](xt, training=False).numpy()  # called eagerly
                        diff = float(np.max(np.abs(got - reference))) if got.shape == reference.shape else np.inf
                        if got.shape != reference.shape or not np.allclose(got, reference, rtol=RTOL, atol=ATOL):
                            status = (f"refused: output differs from the stripped masked model (shape {got.shape} vs "
                                      f"{reference.shape}, max |diff| {diff:.3g})")
                    except Exception as e:  # noqa: BLE001
                        status = f"refused: cannot run: {_why(e)}"
                for mode in args.modes:
                    row = dict(info, tokens=t, mode=mode, status=status, max_abs_diff=diff)
                    rows.append(row)
                    if status == "timed":
                        new.append(row)
                if status == "timed":
                    checked[form, t] = graph
        steps = {form: _train_steps(built[form][0]) for form in {f for f, _ in checked} if "train" in args.modes}
        for row in new:
            form, t, mode = row["form"], row["tokens"], row["mode"]
            xt, yt = consts[t]
            if mode == "forward":
                call = lambda g=checked[form, t], xt=xt: g(xt)  # noqa: E731
            else:
                call = steps[form](xt, yt)
                try:
                    loss = float(call())
                    if not np.isfinite(loss):
                        raise FloatingPointError(f"loss {loss}")
                except Exception as e:  # noqa: BLE001
                    row["status"] = f"refused: training step fails: {_why(e)}"
                    continue
            n, batch = _scaled(call, 0, args.min_ms)
            row["calls_per_round"] = n
            fns[name, t, mode, form] = (n, batch)
        for r in rows:
            if r["model"] == name and r["tokens"] == args.tokens[0] and r["mode"] == args.modes[0]:
                print(f"{name} {r['form']}: sparse {r.get('sparse_layers', '-')}; masked {r.get('masked_layers', '-')}",
                      flush=True)
    print(f"timing {len(fns)} (model, tokens, mode, form) points over {args.rounds} interleaved rounds", flush=True)
    times = protocol.interleaved({k: b for k, (_, b) in fns.items()}, args.rounds, min_ms=1e-9)
    per_call = {k: protocol.Samples(tuple(v / fns[k][0] for v in s.values)) for k, s in times.items()}
    for row in rows:
        key = (row["model"], row["tokens"], row["mode"])
        got, base = per_call.get((*key, row["form"])), per_call.get((*key, BASELINE))
        if got is not None:
            row.update(ms=got.median, ms_min=got.low, ms_max=got.high)
            row["x_dense"] = base.median / got.median if base is not None else np.nan
    order = {k: i for i, k in enumerate((*args.models, *args.modes, *args.forms))}
    return sorted(rows, key=lambda r: (order[r["model"]], r["tokens"], order[r["mode"]], order[r["form"]]))


def judge(rows: list[dict], args: argparse.Namespace, judged: bool) -> list[str]:
    """The targets, each met / missed from the table (or why it is not judged)."""
    lines = []
    by = {(r["model"], r["tokens"], r["mode"], r["form"]): r for r in rows}
    for t in TARGETS:
        models = [m for m in t.models if m in args.models]
        op, n = t.tokens
        tokens = [s for s in args.tokens if (s >= n if op == ">=" else s == n)]
        if not (models and tokens and t.form in args.forms and BASELINE in args.forms and t.mode in args.modes):
            lines.append(f"- {t.text}: not measured (needs --models {'/'.join(t.models)}, --forms {t.form} and "
                         f"{BASELINE}, --modes {t.mode}, tokens {op} {n}).")
            continue
        points = [(m, s, by.get((m, s, t.mode, t.form), {}).get("x_dense", np.nan)) for m in models for s in tokens]
        if any(not np.isfinite(x) for _, _, x in points):
            missing = [f"{m} {s}" for m, s, x in points if not np.isfinite(x)]
            lines.append(f"- {t.text}: not measured ({t.form} or {BASELINE} not timed at {', '.join(missing)}).")
            continue
        got = ", ".join(f"{m} {s} tokens: {x:.2f}x" for m, s, x in points)
        if not judged:
            lines.append(f"- {t.text}: {got} -- NOT JUDGED (not a result run).")
        else:
            met = all(x >= t.speedup for _, _, x in points)
            lines.append(f"- {t.text}: {got} -- {'MET' if met else 'MISSED'} (needs >= {t.speedup:g}x at each).")
    return lines


def _counts(text: str) -> str:
    """The CSV's ``"SparseDense: a, b; SparseEinsumDense: q"`` as ``"SparseDense x2, SparseEinsumDense x1"``."""
    if ":" not in text:
        return text
    return ", ".join(f"{kind} x{len(names.split(','))}" for kind, names in (p.split(": ", 1) for p in text.split("; ")))


def markdown(rows: list[dict]) -> str:
    lines = ["| model | tokens | mode | form | sparse layers | ms median (min-max) | x dense | calls/round | status |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ms = f"{r['ms']:.4f} ({r['ms_min']:.4f}-{r['ms_max']:.4f})" if np.isfinite(r.get("ms", np.nan)) else "-"
        x = f"{r['x_dense']:.3f}x" if np.isfinite(r.get("x_dense", np.nan)) else "-"
        layers = _counts(r.get("sparse_layers", "-"))
        if r.get("masked_layers", "none") != "none":
            layers += f"; still masked: {_counts(r['masked_layers'])}"
        if r["form"] != BASELINE and "sparsity" in r:
            share = r.get("sparse_share", np.nan)
            layers += (f" ({share:.0%} of the pruned weights in sparse layers" if np.isfinite(share) else " (") + \
                f"; masks {r['sparsity']:.1%} zeros)"
        lines.append(f"| {r['model']} | {r['tokens']} | {r['mode']} | {r['form']} | {layers} | {ms} | {x} | "
                     f"{r.get('calls_per_round', '-')} | {r['status']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    load = protocol.start_or_refuse(args)
    if load is None:
        return protocol.REFUSED
    threads = protocol.fix_tf_threads(args.threads or None)
    import keras
    import pandas as pd
    import tensorflow as tf

    gemm = protocol.dense_gemm_gflops()
    mach = protocol.machine()
    rows = measure(args, threads)
    load.stop()
    judged = not load.loaded and args.rounds >= MIN_ROUNDS
    why = [w for w, on in (("the machine was loaded", load.loaded),
                           (f"{args.rounds} round(s) < {MIN_ROUNDS}", args.rounds < MIN_ROUNDS)) if on]
    smoke = [] if judged else ["NOT A RESULT: " + "; ".join(why) + " -- the targets below are not judged."]
    head = protocol.header(
        "Transformer speed: feed-forward pair and encoder block, dense and sparse (issue 36)", mach, load, gemm,
        f"TensorFlow {tf.__version__}, Keras {keras.__version__}: intra_op={threads[0]}, inter_op={threads[1]}",
        smoke + [
            "Models: " + "; ".join(f"{m}: {MODELS[m].label}" for m in args.models) + ". Seeded random weights; "
            f"activation between the pair's layers: {ACTIVATION} (exact). Blocks: MultiHeadAttention (key_dim d/heads, "
            "self-attention) + residual + LayerNormalization, then the pair + residual + LayerNormalization, on "
            "[1, tokens, d]; pairs on [tokens, d].",
            "Forms pruned in one shot: prune_low_magnitude(ConstantSparsity(s, 0), pattern=NByM(2, 4) / NByM(4, 8) / "
            "Unstructured()), update_masks, convert(to='sparse'); 'sparse layers' names the layers that ran sparse and "
            "those convert left masked (dense arithmetic on a kernel holding zeros), by type; the CSV's sparse_layers "
            "and masked_layers name each layer, sparse_share gives the fraction of the pruned weights' entries held by "
            "sparse layers and sparsity the fraction of zeros in the masks. Every form's compiled forward graph was "
            f"checked against its reference (strip_pruning of the masked model; rtol {RTOL:g}, atol "
            f"{ATOL:g}) at every tokens count before timing.",
            "forward: a tf.function on a resident input; train: one step in a tf.function (mean square error to a "
            f"fixed target, gradients over the trainable variables, SGD({LEARNING_RATE:g}) apply). "
            f"{args.rounds} interleaved round(s); each point's calls per round scaled to >= {args.min_ms:g} ms; "
            "median per call (min-max over rounds); 'x dense' = dense's median over the form's (above 1: faster)."])
    targets = ["", "## Targets (issue 36; thresholds fixed in benchmarks/transformer_speed.py before the run)", "",
               *judge(rows, args, judged)]
    df = pd.DataFrame(rows).reindex(columns=COLUMNS)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    csv, md = args.out.with_name(args.out.name + ".csv"), args.out.with_name(args.out.name + ".md")
    df.to_csv(csv, index=False)
    report = head + "\n" + markdown(rows) + "\n".join(targets) + "\n"
    md.write_text(report)
    print(report)
    print(f"wrote {md} and {csv}")
    refused = [f"{r['model']} {r['tokens']} tokens {r['mode']} {r['form']}: {r['status']}" for r in rows
               if r["status"] != "timed"]
    if refused:
        print("error: forms refused (not timed):\n  " + "\n  ".join(refused), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
