"""Partially frozen embeddings: frozen vs trainable vs the three freezing recipes.

A seeded text-like task with a partly known vocabulary. Every word has a hidden
"true" vector; the label of a document is the sign of a fixed direction
applied to the mean true vector of its words. Known words get pretrained
vectors (a synthetic GloVe matrix generated from the seed, the true vectors
plus noise; or, with ``--glove PATH``, real GloVe vectors, which then *are*
the true vectors of the known words); unknown words start random, so they
must be trained for the model to use them.

Variants: ``frozen`` (no embedding row trains), ``trainable`` (every row
trains, pretrained rows drift), and ``partial`` with each method of
:class:`prune.layers.frozen.PartiallyFrozenEmbedding`, plus ``split`` with
:class:`prune.layers.freezing.LazyAdam`. Reported per variant: test accuracy, median
step time, optimizer state bytes, and whether the pretrained rows stayed
bitwise fixed.

Run::

    python -m experiments.partial_freezing                  # synthetic, < 1 min
    python -m experiments.partial_freezing --glove glove.6B.50d.txt.gz

Writes ``results/partial_freezing/results.csv`` (and ``config.json`` first).
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from prune.layers.embeddings import load_glove  # noqa: E402
from prune.layers.freezing import LazyAdam  # noqa: E402
from prune.layers.frozen import PartiallyFrozenEmbedding  # noqa: E402
from prune.layers.optimizer_state import slots_for  # noqa: E402


@dataclass(frozen=True)
class Config:
    """Experiment settings (all seeded)."""

    vocab: int = 3000
    known_fraction: float = 0.7
    dim: int = 32
    doc_len: int = 20
    train_docs: int = 4000
    test_docs: int = 2000
    pretrained_noise: float = 0.3
    epochs: int = 4
    batch_size: int = 64
    learning_rate: float = 0.01
    seed: int = 0
    glove: str | None = None

    def __post_init__(self) -> None:
        for name in ("vocab", "dim", "doc_len", "train_docs", "test_docs", "epochs", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not 0.0 < self.known_fraction < 1.0:
            raise ValueError(f"known_fraction must be in (0, 1), got {self.known_fraction!r}")


def _first_words(path: str, n: int) -> list[str]:
    """The first ``n`` words of a GloVe file (skipping a word2vec header)."""
    opener = gzip.open if open(path, "rb").read(2) == b"\x1f\x8b" else open
    words: list[str] = []
    with opener(path, "rt", encoding="utf-8") as f:
        for i, line in enumerate(f):
            parts = line.split(" ", 2)
            if i == 0 and len(parts) == 2 and all(p.strip().isdigit() for p in parts):
                continue
            words.append(parts[0])
            if len(words) == n:
                break
    return words


def make_task(cfg: Config) -> dict:
    """Vocabulary, pretrained matrix, known mask and train/test documents."""
    rng = np.random.default_rng(cfg.seed)
    n_known = int(round(cfg.known_fraction * cfg.vocab))
    if cfg.glove:
        known_words = _first_words(cfg.glove, n_known)
        vocab = known_words + [f"<oov{i}>" for i in range(cfg.vocab - len(known_words))]
        _, matrix, known = load_glove(cfg.glove, vocab, seed=cfg.seed)
        true = matrix.copy()  # the real vectors are the truth for known words
        scale = float(matrix[known].std())
        true[~known] = rng.normal(0.0, scale, size=(int((~known).sum()), matrix.shape[1]))
    else:
        true = rng.normal(size=(cfg.vocab, cfg.dim)).astype(np.float32)
        known = np.zeros(cfg.vocab, bool)
        known[rng.permutation(cfg.vocab)[:n_known]] = True
        # Synthetic "GloVe": truth plus noise for known words, random for the rest.
        matrix = true + cfg.pretrained_noise * rng.normal(size=true.shape).astype(np.float32)
        matrix[~known] = rng.normal(size=(int((~known).sum()), cfg.dim))
    matrix = matrix.astype(np.float32)
    direction = rng.normal(size=true.shape[1])
    # Zipf-like word frequencies, so some rows are rare (where lazy updates matter).
    freq = 1.0 / np.arange(1, cfg.vocab + 1) ** 0.7
    freq = freq[rng.permutation(cfg.vocab)]
    freq /= freq.sum()

    def docs(n: int) -> tuple[np.ndarray, np.ndarray]:
        x = rng.choice(cfg.vocab, size=(n, cfg.doc_len), p=freq).astype(np.int32)
        score = true[x].mean(axis=1) @ direction
        return x, (score > np.median(score)).astype(np.float32)

    x_train, y_train = docs(cfg.train_docs)
    x_test, y_test = docs(cfg.test_docs)
    return dict(matrix=matrix, known=known, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)


class _StepTimer(keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []
        self.epoch = 0

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self.epoch = epoch

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        self._t = time.perf_counter()

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if self.epoch > 0:  # skip the tracing epoch
            self.times.append(time.perf_counter() - self._t)


VARIANTS = (
    ("frozen", None, "adam"),
    ("trainable", None, "adam"),
    ("partial", "stop_gradient", "adam"),
    ("partial", "split", "adam"),
    ("partial", "gradient_mask", "adam"),
    ("partial", "split", "lazy_adam"),
)


def run_variant(cfg: Config, task: dict, variant: str, method: str | None, optimizer: str) -> dict:
    keras.utils.set_random_seed(cfg.seed)
    matrix, known = task["matrix"], task["known"]
    if variant == "frozen":
        emb = PartiallyFrozenEmbedding(matrix, np.ones_like(known), method="split", name="emb")
    elif variant == "trainable":
        emb = PartiallyFrozenEmbedding(matrix, np.zeros_like(known), method="split", name="emb")
    else:
        emb = PartiallyFrozenEmbedding(matrix, known, method=method, name="emb")
    model = keras.Sequential(
        [
            keras.Input((cfg.doc_len,), dtype="int32"),
            emb,
            keras.layers.GlobalAveragePooling1D(),
            keras.layers.Dense(1, activation="sigmoid", name="head"),
        ]
    )
    opt = LazyAdam(cfg.learning_rate) if optimizer == "lazy_adam" else keras.optimizers.Adam(cfg.learning_rate)
    model.compile(opt, "binary_crossentropy", metrics=["accuracy"])
    timer = _StepTimer()
    start = time.perf_counter()
    model.fit(
        task["x_train"], task["y_train"], batch_size=cfg.batch_size, epochs=cfg.epochs, verbose=0,
        callbacks=[timer], shuffle=True,
    )
    wall = time.perf_counter() - start
    loss, acc = model.evaluate(task["x_test"], task["y_test"], verbose=0, batch_size=512)
    final = emb.get_embeddings()
    pretrained_fixed = bool(np.array_equal(final[known].view(np.uint32), matrix[known].view(np.uint32)))
    state_bytes = sum(
        int(np.prod(s.shape)) * np.dtype(keras.backend.standardize_dtype(s.dtype)).itemsize
        for s in slots_for(opt, emb.trainable_variable)
    )
    return dict(
        variant=variant,
        method=method or "",
        optimizer=optimizer,
        test_accuracy=round(float(acc), 4),
        test_loss=round(float(loss), 4),
        median_step_ms=round(1000 * float(np.median(timer.times)), 3) if timer.times else float("nan"),
        fit_seconds=round(wall, 2),
        embedding_optimizer_bytes=state_bytes,
        pretrained_rows_bitwise_fixed=pretrained_fixed,
        seed=cfg.seed,
    )


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--glove", default=None, help="path of a GloVe text file (plain or .gz)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=Config.epochs)
    parser.add_argument("--out", default="results/partial_freezing")
    args = parser.parse_args(argv)
    cfg = Config(seed=args.seed, epochs=args.epochs, glove=args.glove)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(
        json.dumps(
            {"config": asdict(cfg), "versions": {"python": platform.python_version(), "tensorflow": tf.__version__,
                                                 "keras": keras.__version__, "numpy": np.__version__}},
            indent=2,
        )
    )
    task = make_task(cfg)
    rows = []
    for variant, method, optimizer in VARIANTS:
        row = run_variant(cfg, task, variant, method, optimizer)
        print(", ".join(f"{k}={v}" for k, v in row.items()), flush=True)
        rows.append(row)
    path = out / "results.csv"
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
