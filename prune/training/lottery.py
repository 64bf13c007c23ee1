"""Lottery tickets: iterative magnitude pruning (IMP) with rewinding, and its two controls.

IMP (Frankle and Carbin, "The Lottery Ticket Hypothesis: Finding Sparse,
Trainable Neural Networks", ICLR 2019) repeats, for ``L`` levels:

1. train the masked network;
2. prune ``rate`` of the *surviving* weights by magnitude, per weight
   (``scope="layer"``) or with one threshold over all masked weights
   (``scope="global"``);
3. rewind the survivors to their values at step ``k`` (``k = 0``: the original
   initialisation; ``k > 0``: "rewinding" of Frankle, Dziugaite, Roy and
   Carbin, "Linear Mode Connectivity and the Lottery Ticket Hypothesis",
   ICML 2020), with a fresh optimizer.

The two controls of Frankle and Carbin train the same number of weights:
**reinit** keeps the ticket's mask and draws fresh initial values
(:func:`reinit_values`), **random** keeps the rewind values and draws a random
mask with the same number of weights per layer (:func:`random_masks`).

The pieces here are small functions on a built model whose prunable layers are
prune's masked layers (:func:`prune.prune_low_magnitude`); the loop is yours,
or :func:`prune.training.imp.train_levels` (resumable levels in a store you supply)::

    model = prune.prune_low_magnitude(build())           # all-ones masks
    init = lottery.snapshot(model)                       # k = 0
    lottery.rewind(model, init)                          # fixes the masks: no schedule, no callback
    model.compile(opt(), loss)
    for sparsity in lottery.sparsity_path(0.9, rate=0.2)[1:]:
        model.fit(...)                                   # train the level
        keep = lottery.magnitude_masks(model, sparsity, scope="layer")
        lottery.rewind(model, init, keep, optimizer=model.optimizer)
    model.fit(...)                                       # the ticket at 90%

``SparseDense`` layers (:mod:`prune.layers.sparse`) are not supported: their
structure would have to grow back on rewinding; these functions refuse them by
name. Only the ``Unstructured()`` pattern takes part.

**Counts.** A level at sparsity ``s`` gives each weight of ``n`` entries
exactly ``round(s * n)`` zeros (``scope="layer"``), or ``round(s * N)`` over
all ``N`` masked entries (``scope="global"``): the engine's rule
(:mod:`prune.core.masks`), with ties pruned at the lower flat index first. The
level sparsities come from :func:`sparsity_path`: ``1 - s`` shrinks by
``1 - rate`` per level, in exact rational arithmetic, never jumping past a
stop or the target. open_lth instead prunes ``ceil(rate * remaining)`` weights
per level, globally; both remove ``rate`` of the survivors up to rounding.
"""

from __future__ import annotations

import math
import zlib
from fractions import Fraction
from typing import Any, Iterable, Mapping

import numpy as np
import tensorflow as tf

from prune.algorithms import LotteryLevel, Update
from prune.core import masks as _masks
from prune._internals import optimizer_variables
from prune.core.patterns import prune_lowest
from prune.core.scoring import ScoreContext, get_criterion
from prune.core.targets import MaskTarget, iter_layers, require_targets

__all__ = [
    "next_sparsity",
    "sparsity_path",
    "snapshot",
    "current_masks",
    "magnitude_masks",
    "random_masks",
    "reinit_values",
    "rewind",
    "reset_optimizer",
]



# -- the sparsity path, in exact arithmetic ------------------------------------------


def _fraction(name: str, value: Any, lo_open: bool = False) -> Fraction:
    """``value`` as an exact fraction of its decimal repr (0.2 -> 1/5), in [0, 1) or (0, 1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(float(value)) or not (0.0 < float(value) < 1.0 if lo_open else 0.0 <= float(value) < 1.0):
        raise ValueError(f"{name} must be in {'(0, 1)' if lo_open else '[0, 1)'}, got {value!r}")
    return Fraction(repr(float(value)))


def _stops(stops: Iterable[Any]) -> list[Fraction]:
    if isinstance(stops, (str, bytes)) or not isinstance(stops, Iterable):
        raise ValueError(f"stops must be a sequence of sparsities in (0, 1), got {stops!r}")
    stops = list(stops)
    return sorted(_fraction(f"stops[{i}]", s, lo_open=True) for i, s in enumerate(stops))


def _next(current: Fraction, rate: Fraction, target: Fraction, stops: list[Fraction]) -> Fraction:
    proposed = 1 - (1 - current) * (1 - rate)
    for bound in sorted({*(s for s in stops if s < target), target}):
        if current < bound < proposed:
            return bound
    return min(proposed, target)


def next_sparsity(current: float, rate: float, target: float, stops: Iterable[float] = ()) -> float:
    """The next level's sparsity: prune ``rate`` of the remaining weights, stopping at stops.

    ``1 - next = (1 - current) * (1 - rate)``, computed on the exact fractions
    of the arguments' decimal representations, then clamped to the first stop
    or to ``target`` that it would jump past.

    Reference: Frankle and Carbin, ICLR 2019 (``p%`` of the remaining weights
    per round).

    Args:
        current: The current sparsity, in [0, 1), at most ``target``.
        rate: Fraction of the remaining weights pruned, in (0, 1).
        target: The last level's sparsity, in [0, 1).
        stops: Sparsities in (0, 1) no level may jump past; those at or above
            ``target`` change nothing.

    Returns:
        The next sparsity (``target`` if ``current`` is already there).

    Raises:
        ValueError: naming the argument out of range.
    """
    c, r, t = _fraction("current", current), _fraction("rate", rate, lo_open=True), _fraction("target", target)
    if c > t:
        raise ValueError(f"current must be at most target ({target!r}), got {current!r}")
    return float(_next(c, r, t, _stops(stops)))


def sparsity_path(target: float, rate: float, stops: Iterable[float] = ()) -> list[float]:
    """Every level's sparsity from the dense network (level 0) to ``target``.

    Example: ``sparsity_path(0.5, 0.2)`` is ``[0.0, 0.2, 0.36, 0.488, 0.5]``;
    with ``stops=[0.3]`` it is ``[0.0, 0.2, 0.3, 0.44, 0.5]``.

    Args:
        target: The last level's sparsity, in [0, 1); 0 gives ``[0.0]``.
        rate: Fraction of the remaining weights pruned per level, in (0, 1).
        stops: Sparsities no level may jump past (each reached exactly).

    Returns:
        ``[0.0, s_1, ..., target]``, strictly increasing.

    Raises:
        ValueError: naming the argument out of range.
    """
    t, r, s = _fraction("target", target), _fraction("rate", rate, lo_open=True), _stops(stops)
    path = [Fraction(0)]
    while path[-1] < t:
        path.append(_next(path[-1], r, t, s))
    return [float(p) for p in path]


# -- the masked weights ------------------------------------------------------------------


def _targets(model: Any, what: str) -> list[MaskTarget]:
    """The masked weights of ``model`` (:func:`prune.core.targets.require_targets`), refusing ``SparseDense``."""
    targets = require_targets(model, what)
    for t in targets:
        if not t.stores_dense:
            raise ValueError(
                f"{what} supports masked layers only; layer {t.layer.name!r} is a SparseDense "
                "(rewinding would have to grow its structure back); prune it with prune.prune_low_magnitude instead"
            )
    return targets


def snapshot(model: Any) -> dict[str, np.ndarray]:
    """Copies of every trainable variable of ``model`` (kernels, biases, ...), by variable path.

    Taken at step 0 it is the original initialisation of Frankle and Carbin
    (ICLR 2019); taken after ``k`` steps it is the rewind point of Frankle et
    al. (ICML 2020). Non-trainable state (masks, step counters, batch-norm
    statistics) is not included.
    """
    out: dict[str, np.ndarray] = {}
    for v in model.trainable_variables:
        if v.path in out:
            raise ValueError(f"model has two trainable variables with path {v.path!r}; give its layers unique names")
        out[v.path] = np.array(v.numpy(), copy=True)
    return out


def current_masks(model: Any) -> dict[str, np.ndarray]:
    """The keep-masks (bool) of the masked weights, by key ``"layer/weight"``."""
    return {t.key: t.keep for t in _targets(model, "current_masks")}


def magnitude_masks(model: Any, sparsity: float, scope: str = "layer") -> dict[str, np.ndarray]:
    """The next level's keep-masks: prune the current weights by magnitude to ``sparsity``.

    Pruned entries stay pruned (the masks only shrink). With ``scope="layer"``
    each weight of ``n`` entries gets exactly ``round(sparsity * n)`` zeros;
    with ``scope="global"`` one magnitude threshold over all masked weights
    gives ``round(sparsity * N)`` zeros in total. Ties: the lower flat index
    (the earlier weight, globally) is pruned first. Nothing is written.

    Reference: Frankle and Carbin, ICLR 2019 (layerwise for fully connected
    networks; global for deeper ones).

    Args:
        model: A built model with masked layers, after training the level.
        sparsity: The next level's sparsity, in [0, 1) (:func:`sparsity_path`).
        scope: ``"layer"`` or ``"global"``.

    Returns:
        ``{"layer/weight": keep}``, bool arrays of the weights' shapes.

    Raises:
        ValueError: bad arguments, or a NaN or infinite weight (named).
    """
    _fraction("sparsity", sparsity)
    level = LotteryLevel(float(sparsity), scope)
    updates = [Update(t.key, t.weight, t.keep, layer=t.layer.name) for t in _targets(model, "magnitude_masks")]
    return {u.key: planned.keep for u, planned in zip(updates, level.plan(updates, 0))}


def _check_masks(name: str, masks: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    if not isinstance(masks, Mapping):
        raise ValueError(f"{name} must be a mapping of weight key to mask, got {type(masks).__name__}")
    if set(masks) != set(shapes):
        missing, extra = sorted(set(shapes) - set(masks)), sorted(set(masks) - set(shapes))
        raise ValueError(f"{name} must have exactly the keys {sorted(shapes)}; missing {missing}, unexpected {extra}")
    return {k: _masks.validate_mask(masks[k], shapes[k], name=f"{name}[{k!r}]") for k in shapes}


def random_masks(masks: Mapping[str, Any], seed: int) -> dict[str, np.ndarray]:
    """The "random" control: a uniformly random mask with each weight's number of kept entries.

    Positions come from NumPy's generator seeded with ``(seed, crc32(key))``
    (:func:`prune.core.scoring.random`), so each weight's mask depends only on the
    seed and its key.

    Reference: Frankle and Carbin, ICLR 2019, "random sparse networks" with
    the winning ticket's layerwise sparsities.

    Args:
        masks: ``{"layer/weight": keep}`` (bool or 0/1), e.g. the ticket's.
        seed: Integer seed.

    Returns:
        New bool masks with the same keys, shapes and kept counts.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    if not isinstance(masks, Mapping):
        raise ValueError(f"masks must be a mapping of weight key to mask, got {type(masks).__name__}")
    checked = {k: _masks.validate_mask(m, np.shape(m), name=f"masks[{k!r}]") for k, m in masks.items()}
    out = {}
    for key, keep in checked.items():
        scores = get_criterion("random")(ScoreContext(weight=np.zeros(keep.shape), seed=int(seed), key=key))
        zeros = int((~keep).sum())
        out[key] = prune_lowest(scores.reshape(-1), np.ones(keep.size, bool), zeros).reshape(keep.shape)
    return out


def _owners(model: Any) -> dict[int, Any]:
    """The innermost layer holding each trainable variable (a wrapper's variables belong to its inner layer)."""
    owner: dict[int, Any] = {}
    for layer in iter_layers(model):  # parents first, so the deepest owner is written last
        if layer is model:
            continue
        for v in getattr(layer, "trainable_weights", []):
            owner[id(v)] = layer
    return owner


def reinit_values(model: Any, seed: int) -> dict[str, np.ndarray]:
    """The "reinit" control: fresh initial values of every trainable variable, from the layers' initializers.

    Each variable ``name`` of a layer is drawn from that layer's
    ``<name>_initializer`` (``kernel_initializer``, ``bias_initializer``, ...)
    with the seed replaced by one derived from ``(seed, crc32(path))``, so
    the values depend only on the seed and the variable's path. Use them with
    the ticket's masks in :func:`rewind`.

    Reference: Frankle and Carbin, ICLR 2019, "randomly reinitialized" control.

    Args:
        model: A built model.
        seed: Integer seed.

    Returns:
        ``{variable path: array}`` with the keys of :func:`snapshot`.

    Raises:
        ValueError: a bad seed, or a variable whose layer has no initializer for it.
    """
    import keras

    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    owner = _owners(model)
    plans = []
    for v in model.trainable_variables:
        layer = owner.get(id(v))
        init = getattr(layer, f"{v.name}_initializer", None) if layer is not None else None
        if init is None:
            raise ValueError(
                f"reinit_values: variable {v.path!r} has no '{v.name}_initializer' on its layer "
                f"{getattr(layer, 'name', None)!r}; cannot draw a fresh value"
            )
        plans.append((v, init))
    out: dict[str, np.ndarray] = {}
    for v, init in plans:
        config = init.get_config()
        if "seed" in config:
            derived = np.random.default_rng([int(seed) & 0xFFFFFFFF, zlib.crc32(v.path.encode())]).integers(2**31 - 1)
            config["seed"] = int(derived)
        fresh = type(init).from_config(config)
        out[v.path] = np.asarray(keras.ops.convert_to_numpy(fresh(tuple(v.shape), dtype=v.dtype)))
    return out


def reset_optimizer(optimizer: Any) -> None:
    """Put every variable of a built optimizer back at its initial value, in place.

    The values come from a new optimizer of the same config built on the same
    variables (iterations 0, Adam's moments 0, Adagrad's accumulators at
    ``initial_accumulator_value``), so the next step is bitwise the first step
    of a fresh optimizer, and a compiled train step stays valid.
    """
    if not getattr(optimizer, "built", False):
        return
    fresh = type(optimizer).from_config(optimizer.get_config())
    fresh.build(optimizer_variables(optimizer))
    old, new = list(optimizer.variables), list(fresh.variables)
    if len(old) != len(new) or any(tuple(a.shape) != tuple(b.shape) for a, b in zip(old, new)):
        raise ValueError(f"cannot reset optimizer {optimizer.name!r}: a fresh copy has other variables")
    for a, b in zip(old, new):
        a.assign(b.value)


def rewind(model: Any, values: Mapping[str, Any], masks: Mapping[str, Any] | None = None, optimizer: Any = None) -> None:
    """Install ``masks`` and set every trainable variable to ``values``: survivors rewound, pruned +0.0.

    Masks may grow as well as shrink (the "random" control draws a new mask),
    so this bypasses the rule "masks only shrink" of schedules. The layers'
    pruning schedules are removed (``pruning_schedule=None``), since the
    level's mask is fixed: train without :class:`prune.UpdatePruningStep`.
    Everything is checked before anything is written.

    References: Frankle and Carbin, ICLR 2019 (rewind to initialisation);
    Frankle et al., ICML 2020 (rewind to step ``k``).

    Args:
        model: A built model with masked layers.
        values: ``{variable path: array}`` for every trainable variable, from
            :func:`snapshot` or :func:`reinit_values`.
        masks: ``{"layer/weight": keep}`` for every masked weight; default the
            current masks.
        optimizer: If given, reset to its initial state (:func:`reset_optimizer`),
            so the level starts fresh. Otherwise train with a new optimizer.

    Raises:
        ValueError: keys, shapes or values that do not match the model.
    """
    targets = _targets(model, "rewind")
    shapes = {t.key: t.shape for t in targets}
    keep = _check_masks("masks", masks, shapes) if masks is not None else {t.key: t.keep for t in targets}
    if not isinstance(values, Mapping):
        raise ValueError(f"values must be a mapping of variable path to array, got {type(values).__name__}")
    variables = {v.path: v for v in model.trainable_variables}
    if set(values) != set(variables):
        missing, extra = sorted(set(variables) - set(values)), sorted(set(values) - set(variables))
        raise ValueError(f"values must have exactly the model's trainable variables; missing {missing}, unexpected {extra}")
    arrays = {}
    for path, v in variables.items():
        a = np.asarray(values[path])
        if a.shape != tuple(v.shape):
            raise ValueError(f"values[{path!r}] has shape {a.shape}, expected {tuple(v.shape)}")
        if not np.all(np.isfinite(a)):
            raise ValueError(f"values[{path!r}] has NaN or infinite entries")
        arrays[path] = a
    mask_of = {t.variable.path: keep[t.key] for t in targets}
    for t in targets:
        t.install(keep[t.key], optimizer)  # mask, and slots zeroed where the mask changes
    for path, v in variables.items():
        value = tf.constant(arrays[path], dtype=v.dtype)
        if path in mask_of:
            value = tf.where(tf.constant(mask_of[path]), value, tf.zeros_like(value))  # +0.0, never -0.0
        v.assign(value)
    for layer in {id(t.layer): t.layer for t in targets}.values():
        layer.pruning_schedule = None
    if optimizer is not None:
        reset_optimizer(optimizer)
