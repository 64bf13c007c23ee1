"""The pruning engine: one mask-update path for every prunable thing.

**Protocol.** Any layer with a ``pruning_entries()`` method takes part. It
returns one :class:`PruningEntry` per prunable weight: its key, a dense view of
its values and of its current keep-mask, its pruning parameters (schedule,
pattern, criterion, scope, seed), and an ``apply(keep, optimizer)`` that
installs a new (smaller) keep-mask. Masked layers
(:class:`prune.layers.PrunableLayer`, including the wrapper of custom layers
that implement tfmot's ``get_prunable_weights()``) write mask, weight and
optimizer slots; :class:`prune.layers.SparseDense` compacts its values,
indices and slots. The engine owns everything else::

    entries -> which schedules fire -> check (finite weights, gradients present)
            -> scores (criterion) -> keep-masks (pattern x scope) -> apply

so every criterion, pattern and scope reaches every kind of layer, and a
masked model and a ``SparseDense`` model select the same masks.

It runs eagerly, outside the compiled train step, once per scheduled update
(:class:`prune.UpdatePruningStep` calls :func:`update_masks` before a batch).
Every check runs before any variable changes.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from prune import distributions as _dist
from prune import masks as _masks
from prune.notices import PruningWarning
from prune.scoring import ScoreContext, get_criterion
from prune.optimizer_state import slots_for
from prune.patterns import Pattern, Unstructured

__all__ = [
    "PruningEntry",
    "MaskUpdate",
    "iter_layers",
    "prunable_layers",
    "prunable_entries",
    "stepped_layers",
    "update_masks",
    "compute_gradients",
    "get_step",
]


@dataclass
class PruningEntry:
    """One prunable weight, as a layer presents it to the engine.

    Values are read lazily (only for the weights whose schedule fires), so
    collecting the entries before every batch costs no variable reads.

    Attributes:
        key: ``"layer/weight"``, unique in the model; the random criterion's key.
        layer: The layer that owns the weight.
        variable: The trainable variable gradients and slots belong to.
        read: ``() -> (weight, keep)``: dense views of the current values (+0.0
            where pruned or absent) and of the keep-mask (bool, True = kept).
        schedule: ``step -> (should_update, sparsity)``.
        pattern: A :class:`prune.patterns.Pattern`.
        criterion: Registered criterion name.
        scope: ``"layer"``, ``"global"`` or ``"erk"``.
        seed: Seed given to the criterion.
        apply: ``apply(keep, optimizer) -> bool`` installs a keep-mask that is a
            subset of the current one; returns True when a compiled train step
            traced earlier must be retraced.
        to_dense: Maps an array of ``variable``'s shape (a gradient, a slot) to
            the dense view; the identity for masked layers.
    """

    key: str
    layer: Any
    variable: Any
    read: Callable[[], tuple[np.ndarray, np.ndarray]]
    schedule: Any
    pattern: Pattern
    criterion: str
    scope: str
    seed: int
    apply: Callable[[np.ndarray, Any], bool]
    to_dense: Callable[[np.ndarray], np.ndarray] = np.asarray
    _values: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False)

    def _read(self) -> tuple[np.ndarray, np.ndarray]:
        if self._values is None:
            self._values = self.read()
        return self._values

    @property
    def weight(self) -> np.ndarray:
        """Dense view of the weight's current values."""
        return self._read()[0]

    @property
    def keep(self) -> np.ndarray:
        """Dense bool view of the current mask."""
        return self._read()[1]


class MaskUpdate(list):
    """The keys (``layer/weight``) whose masks were recomputed; ``retrace`` says
    whether a compiled train step traced before must be rebuilt (``SparseDense``
    replaced optimizer state)."""

    retrace: bool = False


def iter_layers(model: Any) -> Iterator[Any]:
    """Every layer inside ``model`` (depth first, each once), ``model`` included."""
    seen: set[int] = set()
    stack = [model]
    while stack:
        layer = stack.pop()
        if id(layer) in seen:
            continue
        seen.add(id(layer))
        yield layer
        children = getattr(layer, "_layers", None)
        if children is None:
            children = getattr(layer, "layers", [])
        stack.extend(reversed(list(children)))


def prunable_layers(model: Any) -> list[Any]:
    """The masked layers (:class:`prune.layers.PrunableLayer` with masks) in ``model``."""
    from prune.layers.masked import is_masked_layer

    return [layer for layer in iter_layers(model) if is_masked_layer(layer)]


def prunable_entries(model: Any) -> list[PruningEntry]:
    """Every :class:`PruningEntry` of the built layers in ``model`` that have a schedule."""
    out: list[PruningEntry] = []
    for layer in iter_layers(model):
        fn = getattr(layer, "pruning_entries", None)
        if fn is None or not callable(fn) or not getattr(layer, "built", False):
            continue
        if getattr(layer, "pruning_schedule", None) is None:
            continue
        out.extend(fn())
    # Layers of nested models may share a name: the second "a/kernel" becomes "a/kernel#2" (traversal order).
    seen: dict[str, int] = {}
    for e in out:
        seen[e.key] = seen.get(e.key, 0) + 1
        if seen[e.key] > 1:
            e.key = f"{e.key}#{seen[e.key]}"
    return out


def stepped_layers(model: Any) -> list[Any]:
    """Layers that keep a ``pruning_step`` counter: masked layers and ``SparseDense``."""
    return [layer for layer in iter_layers(model) if getattr(type(layer), "keeps_pruning_step", False)]


def get_step(model: Any) -> int:
    """The pruning step counter (number of training steps taken so far)."""
    layers = [layer for layer in stepped_layers(model) if layer.built]
    return int(layers[0].pruning_step.numpy()) if layers else 0


def compute_gradients(model: Any, x: Any, y: Any, loss: Any = None) -> dict[str, np.ndarray]:
    """Gradients of the loss on one batch, by entry key, as dense views.

    The forward pass runs in inference mode (``training=False``: no dropout, no
    step counted). Pruned entries get a zero gradient (the forward pass
    multiplies by the mask; a ``SparseDense`` has no gradient for absent entries).

    Args:
        model: The model.
        x, y: One batch.
        loss: ``loss(y_true, y_pred) -> scalar``; default the compiled loss
            (``model.compute_loss``).

    Returns:
        ``{"layer/weight": gradient}`` for every prunable entry.
    """
    import tensorflow as tf

    entries = prunable_entries(model)
    if loss is None and getattr(model, "compiled_loss", None) is None and getattr(model, "loss", None) is None:
        raise ValueError("compute_gradients needs loss=... or a compiled model (model.compile(loss=...))")
    variables = [e.variable for e in entries]
    with tf.GradientTape() as tape:
        y_pred = model(x, training=False)
        value = loss(y, y_pred) if loss is not None else model.compute_loss(x=x, y=y, y_pred=y_pred, training=False)
    grads = tape.gradient(value, variables)
    out = {}
    for e, g in zip(entries, grads):
        g = np.zeros(tuple(e.variable.shape), e.weight.dtype) if g is None else np.asarray(tf.convert_to_tensor(g))
        out[e.key] = e.to_dense(g)
    return out


def _check_finite(entry: PruningEntry) -> None:
    if not np.all(np.isfinite(entry.weight)):
        bad = int((~np.isfinite(entry.weight)).sum())
        raise ValueError(
            f"weight {entry.key!r} (layer {entry.layer.name!r}) has {bad} NaN or infinite entries; "
            "no mask was changed"
        )


def _scores(entry: PruningEntry, step: int, gradients: Mapping[str, Any] | None, optimizer: Any) -> np.ndarray:
    crit = get_criterion(entry.criterion)
    grad = None
    if gradients is not None and entry.key in gradients:
        grad = np.asarray(gradients[entry.key])
        if grad.shape != entry.weight.shape:
            raise ValueError(f"gradients[{entry.key!r}] has shape {grad.shape}, expected {entry.weight.shape}")
    slots = {}
    if "slots" in crit.needs:
        slots = {s.path: entry.to_dense(np.asarray(s.numpy())) for s in slots_for(optimizer, entry.variable)}
    ctx = ScoreContext(weight=entry.weight, gradient=grad, slots=slots, step=int(step), seed=entry.seed, key=entry.key)
    scores = crit(ctx)
    if not np.all(np.isfinite(scores)):
        raise ValueError(f"criterion {entry.criterion!r} gave NaN or infinite scores for {entry.key!r}; no mask was changed")
    return scores


def _group_plan(group: list[PruningEntry], scope: str) -> tuple[Any, Pattern]:
    schedules = {repr(e.schedule) for e in group}
    if len(schedules) > 1:
        raise ValueError(f"weights with scope={scope!r} must share one pruning_schedule, got {sorted(schedules)}")
    patterns = {repr(e.pattern) for e in group}
    if len(patterns) > 1:
        raise ValueError(f"weights with scope={scope!r} must share one pattern, got {sorted(patterns)}")
    return group[0].schedule, group[0].pattern


def _erk_masks(
    scores: dict[str, np.ndarray], sparsity: float, previous: dict[str, np.ndarray], pattern: Pattern
) -> dict[str, np.ndarray]:
    if not pattern.has_units:
        raise ValueError(f"pattern {pattern!r} fixes each group's sparsity and cannot be used with scope='erk'")
    shapes = {k: tuple(v.shape) for k, v in scores.items()}
    sparsity = _dist.configured_target(sparsity)  # 0.9, not the schedule's float32 0.8999999762
    if isinstance(pattern, Unstructured):
        zeros = _dist.erk_zeros(shapes, sparsity)  # exact in total
        return {k: _masks.topk_mask(scores[k], zeros[k] / scores[k].size, previous[k]) for k in scores}
    per = _dist.erk_sparsities(shapes, sparsity)
    return {k: pattern.select(scores[k], per[k], previous[k]) for k in scores}


def _warn_emptied(entry: PruningEntry, sparsity: float) -> None:
    warnings.warn(
        f"sparsity {sparsity:g} prunes every entry of {entry.key!r} ({entry.weight.size} entries; exact counts prune "
        f"round(sparsity * units) of them). tfmot keeps at least one: for its rule give the pattern keep_one=True, "
        "e.g. pattern=prune.Unstructured(keep_one=True)",
        PruningWarning,
        stacklevel=3,
    )


def update_masks(
    model: Any, step: int, optimizer: Any = None, gradients: Mapping[str, Any] | None = None
) -> MaskUpdate:
    """Update the masks whose schedule fires at ``step``, for every prunable layer kind.

    Weights with ``scope="layer"`` are pruned each on its own; all weights
    with ``scope="global"`` together with one threshold, and all with
    ``scope="erk"`` together with Erdős–Rényi-Kernel sparsities; each such
    group must share one schedule and one pattern.

    Args:
        model: A model or layer containing prunable layers.
        step: The training step about to run.
        optimizer: Its slots for newly pruned entries are zeroed (or shrunk).
        gradients: ``{"layer/weight": gradient}`` (dense views), e.g. from
            :func:`compute_gradients`, for criteria that need gradients.

    Returns:
        The keys updated, a list with a ``retrace`` attribute.

    Raises:
        ValueError: a NaN or infinite weight or score, a missing gradient, or
            groups that do not share a schedule or pattern; raised before any
            variable changes.
    """
    entries = prunable_entries(model)
    firing: list[tuple[list[PruningEntry], float, str, Pattern]] = []
    for e in entries:
        if e.scope == "layer" and e.schedule.should_update(step):
            firing.append(([e], float(e.schedule(step)[1]), "layer", e.pattern))
    for scope in ("global", "erk"):
        group = [e for e in entries if e.scope == scope]
        if group:
            schedule, pattern = _group_plan(group, scope)
            if schedule.should_update(step):
                firing.append((group, float(schedule(step)[1]), scope, pattern))
    # Everything that can fail runs before anything is written.
    for group, _, _, _ in firing:
        for e in group:
            _check_finite(e)
    plans = []
    for group, sparsity, scope, pattern in firing:
        scores = {e.key: _scores(e, step, gradients, optimizer) for e in group}
        previous = {e.key: e.keep for e in group}
        if scope == "layer":
            keep = {group[0].key: pattern.select(scores[group[0].key], sparsity, previous[group[0].key])}
        elif scope == "global":
            keep = _masks.global_masks(scores, sparsity, previous, pattern)
        else:
            keep = _erk_masks(scores, sparsity, previous, pattern)
        plans.extend((e, keep[e.key]) for e in group)
        for e in group:
            if e.keep.any() and not keep[e.key].any():
                _warn_emptied(e, sparsity)
    result = MaskUpdate()
    for e, keep in plans:
        result.retrace |= bool(e.apply(keep, optimizer))
        result.append(e.key)
    return result
