"""What one SET or RigL mask update costs, against one training step, masked and ``SparseDense``.

LeNet-300-100 shapes (784-300-100-10) at a given sparsity, random data. For each
implementation (masked layers, ``SparseDense`` layers) and method (SET, RigL),
times in rounds, interleaved:

    step        one compiled training step (``train_on_batch``), no update
    update      ``DynamicSparsity.update`` (read, scores, RigL's dense gradient on
                one batch, drop/grow, write, rebuild of the traced step if needed)
    next step   the first training step after an update (``SparseDense`` retraces
                when its backing variables were replaced)

Medians over rounds; TF thread counts are fixed and printed. The update runs
once every ΔT steps, so its amortised cost per step is ``update / ΔT``.

    .venv/bin/python benchmarks/dst_update.py
    .venv/bin/python benchmarks/dst_update.py --sparsity 0.98 --batch 64 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.get_logger().setLevel("ERROR")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import keras  # noqa: E402

import prune  # noqa: E402
import prune.training.dst  # noqa: E402
from prune.algorithms import get_algorithm  # noqa: E402
from prune.layers.sparse import SparseDense  # noqa: E402

SIZES = (784, 300, 100, 10)


def masked_model(sparsity: float) -> keras.Model:
    keras.utils.set_random_seed(0)
    layers = [keras.layers.Dense(n, activation="relu" if i < 2 else None, name=f"fc{i + 1}") for i, n in enumerate(SIZES[1:])]
    model = prune.prune_low_magnitude(keras.Sequential([keras.Input((SIZES[0],)), *layers]))
    prune.sparse_init(model, sparsity)
    return model


def sparse_model(masked: keras.Model) -> keras.Model:
    layers = [
        SparseDense.from_dense(l.kernel.numpy(), l.get_masks()["kernel"], bias=l.bias.numpy(), name=l.name, activation=l.activation)
        for l in prune.prunable_layers(masked)
    ]
    return keras.Sequential([keras.Input((SIZES[0],)), *layers])


def _ms(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sparsity", type=float, default=0.9)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    print(
        f"TF {tf.__version__}, Keras {keras.__version__}, {platform.processor() or platform.machine()}, "
        f"intra_op={tf.config.threading.get_intra_op_parallelism_threads()}, "
        f"inter_op={tf.config.threading.get_inter_op_parallelism_threads()}, "
        f"sparsity={args.sparsity}, batch={args.batch}, rounds={args.rounds}"
    )
    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.batch, SIZES[0])).astype("float32")
    y = rng.integers(0, SIZES[-1], size=args.batch).astype("int32")
    cases = {}
    for impl in ("masked", "SparseDense"):
        # the exchanges (each weight keeps its live count), so that every update of a case costs the same;
        # GraNet's updates shrink the masks along its schedule
        for method in (m for m in prune.training.dst.METHODS if get_algorithm(m).keeps_live):
            base = masked_model(args.sparsity)
            model = base if impl == "masked" else sparse_model(base)
            model.compile(keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            model.train_on_batch(x, y)  # trace and build the optimizer
            cb = prune.DynamicSparsity(method, update_every=1, drop_fraction=0.3, decay="constant", gradient_data=(x, y))
            cb.set_model(model)
            cb.update(1)  # warm up the update path (and SparseDense's dynamic variables)
            model.train_on_batch(x, y)
            cases[(impl, method)] = (model, cb, {"step": [], "update": [], "next step": []})
    order = list(cases)
    for r in range(args.rounds):
        rng.shuffle(order)
        for key in order:
            model, cb, times = cases[key]
            times["step"].append(_ms(lambda: model.train_on_batch(x, y)))
            times["update"].append(_ms(lambda: cb.update(2 + r)))
            times["next step"].append(_ms(lambda: model.train_on_batch(x, y)))
    print(f"\n{'implementation':<16}{'method':<8}{'step ms':>10}{'update ms':>12}{'next step ms':>14}{'update/step':>13}")
    for (impl, method), (_, _, times) in sorted(cases.items()):
        med = {k: float(np.median(v)) for k, v in times.items()}
        print(
            f"{impl:<16}{method:<8}{med['step']:>10.2f}{med['update']:>12.2f}{med['next step']:>14.2f}"
            f"{med['update'] / med['step']:>12.1f}x"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
