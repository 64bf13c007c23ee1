"""File sizes of a pruned LeNet-300-100 as deployed: .keras, gzip, TFLite, TFLite + int8.

For each sparsity, the 784-300-100-10 MLP (seeded Glorot weights; sizes do
not depend on training) is pruned by magnitude with ``prune.OneShot`` and
saved as:

* ``keras_masked``, ``keras_sparse``: the ``.keras`` file of the masked model
  (weights and masks) and of its ``SparseDense`` form (the compact store:
  float32 values, and int32 CSR row pointers and columns or a bitmap of the
  mask, whichever is smaller: ``prune.layers.sparse.store_format``);
* ``keras``, ``keras_gzip``: the stripped model's ``.keras`` file (dense
  kernels with zeros; what every form strips to) and that file gzipped (-9);
* ``tflite``: :func:`prune.deploy.export.to_tflite` with ``sparsity=False``;
* ``tflite_sparse``: with ``Optimize.EXPERIMENTAL_SPARSITY`` (the default);
* ``tflite_int8``: ``int8=True`` (dynamic-range int8 weights), ``sparsity=False``;
* ``tflite_int8_sparse``: ``int8=True`` with the sparsity optimisation.

``max_diff_sparse`` and ``max_diff_int8`` are the largest absolute
differences between the flatbuffers' outputs (LiteRT interpreter; the int8
one without default delegates) and Keras's, on 256 standard-normal inputs.

    python benchmarks/deployment_size.py [--sparsities 0,0.5,0.8,0.9,0.95] [--out results/benchmarks/deployment_size.csv]

Writes the CSV and a Markdown table beside it (``.md``).
"""

from __future__ import annotations

import argparse
import gzip
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import tensorflow as tf  # noqa: E402

import prune  # noqa: E402
from prune.deploy import export  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = ("keras_masked", "keras_sparse", "keras", "keras_gzip", "tflite", "tflite_sparse", "tflite_int8", "tflite_int8_sparse")


def lenet300(seed: int = 0) -> keras.Sequential:
    keras.utils.set_random_seed(seed)
    layers = [keras.layers.Dense(300, activation="relu"), keras.layers.Dense(100, activation="relu"), keras.layers.Dense(10)]
    return keras.Sequential([keras.Input((784,)), *layers])


def _keras_bytes(model: keras.Model, directory: str, name: str) -> bytes:
    path = os.path.join(directory, f"{name}.keras")
    model.save(path)
    return Path(path).read_bytes()


def measure(sparsity: float, x: np.ndarray) -> dict[str, float]:
    """One row of the table."""
    masked = prune.prune_low_magnitude(lenet300(), prune.OneShot(sparsity, 0))
    prune.update_masks(masked, 0)
    stripped = prune.strip_pruning(masked)
    expected = stripped.predict(x, verbose=0)
    row: dict[str, float] = {"sparsity": sparsity}
    with tempfile.TemporaryDirectory() as directory:
        row["keras_masked"] = len(_keras_bytes(masked, directory, "masked"))
        row["keras_sparse"] = len(_keras_bytes(prune.convert(masked, to="sparse"), directory, "sparse"))
        plain = _keras_bytes(stripped, directory, "stripped")
    row["keras"], row["keras_gzip"] = len(plain), len(gzip.compress(plain, compresslevel=9))
    row["tflite"] = len(export.to_tflite(stripped, sparsity=False))
    row["tflite_int8"] = len(export.to_tflite(stripped, sparsity=False, int8=True))
    sparse = export.to_tflite(stripped)
    int8 = export.to_tflite(stripped, int8=True)
    row["tflite_sparse"], row["tflite_int8_sparse"] = len(sparse), len(int8)
    row["max_diff_sparse"] = float(np.abs(export.run_tflite(sparse, x) - expected).max())
    row["max_diff_int8"] = float(np.abs(export.run_tflite(int8, x, default_delegates=False) - expected).max())
    return row


def markdown(df: pd.DataFrame) -> str:
    """The table in KiB, with the sizes relative to the dense model's .keras file."""
    dense = float(df.loc[df["sparsity"] == df["sparsity"].min(), "keras"].iloc[0])
    head = "| sparsity | " + " | ".join(f"`{c}` KiB" for c in COLUMNS) + " | max \\|Δ\\| float / int8 |"
    lines = [head, "|" + "---|" * (len(COLUMNS) + 2)]
    for _, r in df.iterrows():
        cells = [f"{r[c] / 1024:.0f} ({r[c] / dense:.2f})" for c in COLUMNS]
        lines.append(f"| {r['sparsity']:.0%} | " + " | ".join(cells) + f" | {r['max_diff_sparse']:.1e} / {r['max_diff_int8']:.1e} |")
    versions = f"TensorFlow {tf.__version__}, Keras {keras.__version__}"
    return (
        "# Deployment sizes: LeNet-300-100 (784-300-100-10)\n\n"
        f"Written by `benchmarks/deployment_size.py` ({versions}). In brackets: relative to the dense "
        "model's `.keras` file.\n\n" + "\n".join(lines) + "\n"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sparsities", default="0,0.5,0.8,0.9,0.95")
    parser.add_argument("--out", default=str(ROOT / "results" / "benchmarks" / "deployment_size.csv"))
    args = parser.parse_args(argv)
    x = np.random.default_rng(0).normal(size=(256, 784)).astype("float32")
    rows = [measure(float(s), x) for s in args.sparsities.split(",")]
    df = pd.DataFrame(rows, columns=["sparsity", *COLUMNS, "max_diff_sparse", "max_diff_int8"])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(out, index=False)
    out.with_suffix(".md").write_text(markdown(df))
    print(markdown(df))


if __name__ == "__main__":
    main()
