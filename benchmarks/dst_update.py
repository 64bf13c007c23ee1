"""What one sparse-training mask update costs, against one training step, masked and ``SparseDense``.

LeNet-300-100 shapes (784-300-100-10) at a given sparsity, random data. For each
implementation (masked layers, ``SparseDense`` layers) and each exchange method
that keeps every weight's live count (SET, RigL, MEST: every update of a case
then costs the same; GraNet's updates shrink the masks along its schedule), times
in interleaved rounds (a fresh random order of the cases every round):

    step        one compiled training step (``train_on_batch``), no update
    update      ``DynamicSparsity.update`` (read, scores, RigL's dense gradient on
                one batch, drop/grow, write, rebuild of the traced step if needed)
    next step   the first training step after an update (``SparseDense`` retraces
                when its backing variables were replaced)

One untimed warm-up round runs first, after every case is built (building a case re-seeds, and a new global
seed makes the other models' compiled steps retrace once). Each is one call per round, timed by itself: an update and the step right after it
are one-off events that cannot be repeated back to back for ``min_ms``
(:func:`protocol.time_calls`), and the plain step is timed the same way so the three
compare. Medians over ``--rounds`` rounds with their min and max. The update runs
once every ΔT steps, so its amortised cost per step is ``update / ΔT``.

Under ``benchmarks/protocol.py``: a busy machine is refused (exit 3) unless
``--allow-loaded``, before TensorFlow is imported; TensorFlow's threads are fixed
(intra-op = ``--threads``, default the usable cores; inter-op = 1) and stated;
TensorFlow's dense GEMM in GFLOPS is measured in the same run. Writes ``--out``
(CSV: one row per implementation and method, each time with ``_min``/``_max``) and
a Markdown table beside it (``.md``) headed by :func:`protocol.header`.

    .venv/bin/python benchmarks/dst_update.py
    .venv/bin/python benchmarks/dst_update.py --sparsity 0.98 --batch 64 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import protocol  # noqa: E402

SIZES = (784, 300, 100, 10)
IMPLEMENTATIONS = ("masked", "SparseDense")
MEASURES = ("step", "update", "next step")


def masked_model(sparsity: float):
    import keras

    import prune

    keras.utils.set_random_seed(0)
    layers = [keras.layers.Dense(n, activation="relu" if i < 2 else None, name=f"fc{i + 1}") for i, n in enumerate(SIZES[1:])]
    model = prune.prune_low_magnitude(keras.Sequential([keras.Input((SIZES[0],)), *layers]))
    prune.sparse_init(model, sparsity)
    return model


def sparse_model(masked):
    import keras

    import prune
    from prune.layers.sparse import SparseDense

    layers = [
        SparseDense.from_dense(l.kernel.numpy(), l.get_masks()["kernel"], bias=l.bias.numpy(), name=l.name, activation=l.activation)
        for l in prune.prunable_layers(masked)
    ]
    return keras.Sequential([keras.Input((SIZES[0],)), *layers])


def _ms(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def exchange_methods() -> tuple[str, ...]:
    """The sparse-training methods whose every update keeps each weight's live count."""
    import prune.training.dst
    from prune.algorithms import get_algorithm

    return tuple(m for m in prune.training.dst.METHODS if get_algorithm(m).keeps_live)


def measure(args, rng: np.random.Generator, methods: tuple[str, ...]) -> dict[tuple[str, str], dict[str, protocol.Samples]]:
    """{(implementation, method): {measure: Samples (ms)}} over ``args.rounds`` interleaved rounds."""
    import keras

    import prune

    x = rng.normal(size=(args.batch, SIZES[0])).astype("float32")
    y = rng.integers(0, SIZES[-1], size=args.batch).astype("int32")
    cases = {}
    for impl in IMPLEMENTATIONS:
        for method in methods:
            base = masked_model(args.sparsity)
            model = base if impl == "masked" else sparse_model(base)
            model.compile(keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            model.train_on_batch(x, y)  # trace and build the optimizer
            cb = prune.DynamicSparsity(method, update_every=1, drop_fraction=0.3, decay="constant", gradient_data=(x, y))
            cb.set_model(model)
            cb.update(1)  # warm up the update path (and SparseDense's dynamic variables)
            model.train_on_batch(x, y)
            cases[(impl, method)] = (model, cb, {k: [] for k in MEASURES})
    order = list(cases)
    # Round 0 is warm-up, not timed: building a later case re-seeds (keras.utils.set_random_seed), and a changed
    # global seed makes every earlier model's compiled step retrace on its next call (50-100 ms, once).
    for r in range(args.rounds + 1):
        rng.shuffle(order)
        for key in order:
            model, cb, times = cases[key]
            got = {"step": _ms(lambda: model.train_on_batch(x, y)), "update": _ms(lambda: cb.update(2 + r)),
                   "next step": _ms(lambda: model.train_on_batch(x, y))}
            if r > 0:
                for k, v in got.items():
                    times[k].append(v)
    return {key: {k: protocol.Samples(tuple(v)) for k, v in times.items()} for key, (_, _, times) in cases.items()}


def markdown(df, header: str) -> str:
    lines = [header, "",
             "Milliseconds, median of the rounds (min-max); `update / step` from the medians: the number of training "
             "steps one update costs (at ΔT steps between updates it adds `update / step / ΔT` to training time).", "",
             "| implementation | method | step ms | update ms | next step ms | update / step |", "|---|---|---|---|---|---|"]
    for _, r in df.iterrows():
        cells = [f"{r[c]:.2f} ({r[c + '_min']:.2f}-{r[c + '_max']:.2f})" for c in ("step_ms", "update_ms", "next_step_ms")]
        lines.append(f"| {r['implementation']} | {r['method']} | " + " | ".join(cells) + f" | {r['update_per_step']:.1f}x |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sparsity", type=float, default=0.9)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--threads", type=int, default=0, help="TensorFlow's intra-op threads (default: the usable cores)")
    p.add_argument("--methods", default="", help="comma-separated subset of the exchange methods (default: all of them)")
    p.add_argument("--out", default=str(ROOT / "results" / "benchmarks" / "dst_update.csv"))
    protocol.add_arguments(p)
    args = p.parse_args(argv)
    if args.rounds < 1 or args.batch < 1 or args.threads < 0:
        p.error(f"--rounds and --batch must be >= 1 and --threads >= 0, got {args.rounds}, {args.batch}, {args.threads}")

    load = protocol.start_or_refuse(args)  # before TensorFlow is imported: a busy machine is refused at once
    if load is None:
        return protocol.REFUSED
    import keras
    import pandas as pd
    import tensorflow as tf

    import prune  # noqa: F401  (sets the oneDNN switches before any graph is built)
    from peers import write_results

    tf.get_logger().setLevel("ERROR")
    intra, inter = protocol.fix_tf_threads(args.threads or None)
    available = exchange_methods()
    methods = tuple(m.strip() for m in args.methods.split(",") if m.strip()) or available
    unknown = [m for m in methods if m not in available]
    if unknown:
        load.stop()
        p.error(f"--methods: {', '.join(unknown)} not among the exchange methods {', '.join(available)}")
    gemm = protocol.dense_gemm_gflops()
    mach = protocol.machine()
    print(f"TF {tf.__version__}, Keras {keras.__version__}, intra_op={intra}, inter_op={inter}, "
          f"sparsity={args.sparsity}, batch={args.batch}, rounds={args.rounds}", flush=True)
    got = measure(args, np.random.default_rng(0), methods)
    load.stop()

    rows = []
    for (impl, method), s in sorted(got.items()):
        row = dict(implementation=impl, method=method)
        for name, col in (("step", "step_ms"), ("update", "update_ms"), ("next step", "next_step_ms")):
            row.update({col: s[name].median, f"{col}_min": s[name].low, f"{col}_max": s[name].high})
        row["update_per_step"] = s["update"].median / s["step"].median
        rows.append(row)
    df = pd.DataFrame(rows).assign(sparsity=args.sparsity, batch=args.batch, rounds=args.rounds,
                                   intra_threads=intra, inter_threads=inter)
    header = protocol.header(
        "What one sparse-training mask update costs (LeNet-300-100 shapes)", mach, load, gemm,
        f"TensorFlow {tf.__version__} (Keras {keras.__version__}): intra_op={intra}, inter_op={inter}",
        [f"784-300-100-10 at {args.sparsity:.0%} sparsity, batch {args.batch} of random data, Adam; "
         f"methods {', '.join(methods)} (drop fraction 0.3, constant); one call of each measure per round, "
         f"medians of {args.rounds} interleaved rounds with min-max, after one untimed warm-up round."],
    )
    write_results(df, Path(args.out), markdown(df, header))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
