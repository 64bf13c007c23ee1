"""The base of every algorithm that changes masks, and their registry.

NumPy only: the runner's main process and config validation read the registry without TensorFlow.

An algorithm is a subclass of :class:`MaskAlgorithm` plus one :func:`register_algorithm` line, as in
JaxPruner (``BaseUpdater`` and ``register_algorithm``). The base owns one update over every masked weight::

    when (due / should_update) -> check -> score -> select (pattern x distribution, or drop and grow)

and the caller owns the rest: it reads the weights and their keep-masks through the mask-target protocol
(:mod:`prune.core.targets`), takes the dense gradient or the optimizer slots when the algorithm needs them,
and installs what :meth:`MaskAlgorithm.plan` returns. Three callers, one per kind of algorithm:

* ``kind = "pruning"``: :class:`prune.algorithms.GradualPruning` (Zhu and Gupta's schedules, tfmot's
  ``prune_low_magnitude``), run by :func:`prune.update_masks` with each layer's own
  :class:`~prune.layers.scheduled.PruningParams`;
* ``kind = "sparse_training"``: :class:`SparseTraining` (SET, RigL, static, MEST, GraNet), run by
  :class:`prune.DynamicSparsity`. SET is the base; RigL overrides the grow score; MEST the drop score;
  GraNet the live count (a gradual-pruning schedule) and the drop count;
* ``kind = "lottery"``: :class:`prune.algorithms.LotteryLevel`, IMP's level step, run by
  :func:`prune.training.lottery.magnitude_masks`;
* ``kind = "oneshot"``: :class:`prune.algorithms.OneShotPruning` (magnitude, Wanda, SparseGPT: pruning after
  training, from calibration data), run by :func:`prune.oneshot`.

Scores are names of :mod:`prune.core.scoring`'s criteria registry (``drop = "magnitude"``,
``grow = "random"`` or ``"gradient"``), so a new criterion is usable by a new algorithm with no change here.

The arithmetic of one exchange is here too (:func:`drop_and_grow`, :func:`num_drop`,
:func:`cosine_drop_fraction`, :func:`sign_drop_counts`); see :mod:`prune.training.dst` for the references to rigl's code.
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, NamedTuple, Sequence

import numpy as np

from prune.core.patterns import prune_lowest
from prune.core.scoring import ScoreContext, get_criterion

__all__ = [
    "KINDS",
    "MaskAlgorithm",
    "Planned",
    "Update",
    "SparseTraining",
    "register_algorithm",
    "algorithms",
    "get_algorithm",
    "cosine_drop_fraction",
    "num_drop",
    "sign_drop_counts",
    "drop_and_grow",
    "DECAYS",
    "DROPS",
]

KINDS = ("pruning", "sparse_training", "lottery", "oneshot")
"""The kinds of :class:`MaskAlgorithm`: who runs it (see the module's docstring)."""
DECAYS = ("constant", "cosine")
"""How the drop fraction moves over training: fixed, or :func:`cosine_drop_fraction` to 0 at ``end_step``."""
DROPS = ("magnitude", "per_sign")
"""Which live entries a drop counts over: both signs together (rigl's), or each sign apart (Mocanu et al.'s SET)."""


# -- the arithmetic of one update, on host arrays ---------------------------------------------------------


def cosine_drop_fraction(step: int, drop_fraction: float, end_step: int) -> float:
    """RigL's drop fraction at ``step``: ``f/2 * (1 + cos(pi * min(step, end_step) / end_step))``.

    This is ``tf.keras.experimental.CosineDecay(f, end_step, alpha=0)`` as used
    by rigl's ``CosineUpdateSchedule`` (``rigl/rigl_tf2/mask_updaters.py``),
    and ``tf.train.cosine_decay`` in ``SparseRigLOptimizer`` with
    ``begin_step=0``: ``f`` at step 0, ``f/2`` at ``end_step/2``, 0 from
    ``end_step`` on.

    Reference: Evci et al., "Rigging the Lottery: Making All Tickets Winners",
    ICML 2020, eq. (1) with ``alpha = f``, ``T_end = end_step``.
    """
    t = min(max(int(step), 0), int(end_step))
    return float(drop_fraction) * 0.5 * (1.0 + math.cos(math.pi * t / int(end_step)))


def num_drop(live: int, fraction: float) -> int:
    """How many live entries an update drops (and grows): ``floor(live * fraction)``, as rigl."""
    return int(math.floor(int(live) * float(fraction)))


def sign_drop_counts(weight: np.ndarray, keep: np.ndarray, fraction: float) -> tuple[int, int]:
    """SET's per-sign drop counts: ``(floor(positive * fraction), floor(negative * fraction))`` of the live entries.

    Mocanu et al. (2018) remove a fraction of the positive weights (the
    smallest) and of the negative weights (those closest to zero) separately
    (``set_mlp.py``'s ``largestNegative`` and ``smallestPositive``). A live
    entry at exactly ``+0.0`` or ``-0.0`` counts as positive here.
    """
    weight, keep = np.asarray(weight), np.asarray(keep).astype(bool)
    negative = int((keep & (weight < 0)).sum())
    return num_drop(int(keep.sum()) - negative, fraction), num_drop(negative, fraction)


def drop_and_grow(
    weight: np.ndarray,
    keep: np.ndarray,
    n: int,
    grow_scores: np.ndarray,
    n_negative: int | None = None,
    drop_scores: np.ndarray | None = None,
    n_grow: int | None = None,
) -> np.ndarray:
    """One update of one weight: drop ``n`` live entries of lowest drop score, grow as many (or ``n_grow``).

    Args:
        weight: The weight (dense view).
        keep: Its current keep-mask (bool, True = live).
        n: Entries to drop, ``0 <= n <= live``; with ``n_negative``, the positive (and zero) live entries to drop.
        grow_scores: Higher grows first (SET: random, RigL: ``|dense gradient|``).
        n_negative: SET's per-sign drop (:func:`sign_drop_counts`): the negative
            live entries to drop, those closest to zero; ``n + n_negative`` grow.
            ``None`` (default): drop over both signs by the drop score, as rigl does.
        drop_scores: Lower drops first; default ``|weight|`` (the ``"magnitude"`` criterion).
        n_grow: Entries to grow, when not the number dropped (GraNet prunes more than it regrows).

    Returns:
        The new keep-mask, with ``live - dropped + grown`` live entries.

    Raises:
        ValueError: ``n``, ``n_negative`` or ``n_grow`` out of range, or shapes that differ.
    """
    weight = np.asarray(weight)
    keep = np.asarray(keep).astype(bool)
    grow_scores = np.asarray(grow_scores, np.float64)
    drop = (get_criterion("magnitude")(ScoreContext(weight=weight)) if drop_scores is None
            else np.asarray(drop_scores, np.float64))
    if keep.shape != weight.shape or grow_scores.shape != weight.shape or drop.shape != weight.shape:
        raise ValueError(
            f"weight, keep, grow_scores and drop_scores must have one shape, got {weight.shape}, {keep.shape}, "
            f"{grow_scores.shape}, {drop.shape}"
        )
    alive = keep.reshape(-1)
    drop = drop.reshape(-1)
    groups = [(alive, n, "n")]
    if n_negative is not None:
        negative = weight.reshape(-1) < 0
        groups = [(alive & ~negative, n, "n"), (alive & negative, n_negative, "n_negative")]
    kept = np.zeros_like(alive)
    for members, count, name in groups:
        size = int(members.sum())
        if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or not 0 <= count <= size:
            raise ValueError(f"{name} must be an integer in [0, {size}] (the live entries it drops from), got {count!r}")
        kept |= prune_lowest(drop, members, int((~members).sum()) + int(count))
    dropped = int(n) + (0 if n_negative is None else int(n_negative))
    grown = dropped if n_grow is None else n_grow
    room = int((~kept).sum())
    if isinstance(grown, bool) or not isinstance(grown, (int, np.integer)) or not 0 <= grown <= room:
        raise ValueError(f"n_grow must be an integer in [0, {room}] (the entries not kept), got {grown!r}")
    candidates = np.flatnonzero(~kept)  # the just dropped included, as in rigl
    order = np.argsort(-grow_scores.reshape(-1)[candidates], kind="stable")
    new = kept.copy()
    new[candidates[order[:grown]]] = True
    return new.reshape(keep.shape)


# -- the base ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Update:
    """What an algorithm sees of one masked weight at one update.

    Attributes:
        key: ``"layer/weight"``, unique in the model.
        weight: The weight's dense view (pruned entries are +0.0).
        keep: Its keep-mask (bool, True = live).
        gradient: The dense gradient (with respect to ``weight * mask``, pruned entries included), when the
            algorithm or criterion needs one; else ``None``.
        rng: A generator seeded by ``(seed, step, key)`` (:meth:`SparseTraining.rng`): the same draws on every
            machine and rerun; ``None`` for an algorithm that draws nothing.
        params: The weight's own pruning settings, for algorithms that read them per weight
            (:class:`prune.algorithms.GradualPruning`: an object with ``pruning_schedule``, ``pattern``,
            ``criterion``, ``scope`` and ``seed``, e.g. a :class:`~prune.layers.scheduled.PruningParams`).
        slots: The optimizer's slots of the weight as dense views, by slot path, for criteria that need them.
        layer: The name of the layer that holds it (for messages).
        inputs: For one-shot methods (``kind = "oneshot"``), the statistics of the weight's inputs on the
            calibration data (:class:`prune.algorithms.oneshot.InputStatistics`); there ``weight`` and ``keep``
            are the 2-D view ``[d_in, d_out]``. ``None`` elsewhere.
        pattern_shape: The shape a pattern selects on (:attr:`prune.core.targets.MaskTarget.pattern_shape`;
            ``None``: the weight's own).
    """

    key: str
    weight: np.ndarray
    keep: np.ndarray
    gradient: np.ndarray | None = None
    rng: np.random.Generator | None = None
    params: Any = None
    slots: Mapping[str, np.ndarray] = field(default_factory=dict)
    layer: str = ""
    inputs: Any = None
    pattern_shape: tuple[int, ...] | None = None


class Planned(NamedTuple):
    """One weight's part of a plan: its new keep-mask, and ``n``, the entries the update exchanged or pruned."""

    keep: np.ndarray
    n: int


def _positive_int(name: str, value: Any, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer{' or None' if allow_none else ''}, got {value!r}")
    return int(value)


def _fraction(name: str, value: Any, lo: float, hi: float, lo_open: bool, text: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise ValueError(f"{name} must be a number in {text}, got {value!r}")
    v = float(value)
    if not ((lo < v if lo_open else lo <= v) and v <= hi):
        raise ValueError(f"{name} must be a number in {text}, got {value!r}")
    return v


class MaskAlgorithm:
    """Base of every algorithm that changes masks: when, check, score, select; the caller reads and installs.

    A subclass sets :attr:`name` and :attr:`kind` and overrides :meth:`select` (and, where it differs from
    the default, :meth:`due`/:meth:`should_update`, :meth:`check` or :meth:`scores`). :meth:`plan` runs the
    hooks in order and writes nothing: everything that can fail runs before the caller installs a mask.
    """

    name: ClassVar[str] = ""
    """The registered name (``DynamicSparsity(method=...)``, sweep files)."""
    kind: ClassVar[str] = ""
    """One of :data:`KINDS`: which caller runs it."""
    needs_gradient: ClassVar[bool] = False
    """Whether every update needs the dense gradient of each weight."""
    paper: ClassVar[dict[str, Any]] = {}
    """The paper's settings where they differ from the constructor's defaults (a runner offers these)."""
    own_params: ClassVar[dict[str, Any]] = {}
    """The algorithm's own keyword arguments beyond its base's, with their defaults, for a runner to offer."""

    # -- when --------------------------------------------------------------------------------------------------
    def should_update(self, step: int) -> bool:
        """Whether the algorithm changes masks before training step ``step`` (default: always when asked)."""
        return True

    def due(self, items: Sequence[Any], step: int) -> list[Any]:
        """Those of ``items`` whose masks change at ``step``, reading no weight: all of them when
        :meth:`should_update`. ``items`` are anything with ``key`` (and ``params`` where the algorithm reads them)."""
        return list(items) if self.should_update(step) else []

    # -- check, score, select --------------------------------------------------------------------------------
    def check(self, updates: Sequence[Update]) -> None:
        """Refuses what the update cannot use (non-finite weights; a missing or non-finite gradient when
        :attr:`needs_gradient`), naming the weight, before anything is written."""
        for u in updates:
            if not np.all(np.isfinite(u.weight)):
                bad = int((~np.isfinite(u.weight)).sum())
                where = f" (layer {u.layer!r})" if u.layer else ""
                raise ValueError(f"weight {u.key!r}{where} has {bad} NaN or infinite entries; no mask was changed")
            if self.needs_gradient:
                if u.gradient is None:
                    raise ValueError(f"method {self.name!r} needs the gradient of {u.key!r}; none was given")
                if not np.all(np.isfinite(u.gradient)):
                    raise ValueError(f"the gradient of {u.key!r} has NaN or infinite entries; no mask was changed")

    def criterion_scores(self, name: str, u: Update, seed: int = 0, step: int = 0) -> np.ndarray:
        """The :mod:`prune.core.scoring` criterion ``name`` on ``u`` (float64; checked finite)."""
        crit = get_criterion(name)
        ctx = ScoreContext(weight=u.weight, gradient=u.gradient, slots=dict(u.slots), step=int(step), seed=int(seed),
                           key=u.key)
        scores = np.asarray(crit(ctx), np.float64)
        if not np.all(np.isfinite(scores)):
            raise ValueError(f"criterion {name!r} gave NaN or infinite scores for {u.key!r}; no mask was changed")
        return scores

    def select(self, updates: Sequence[Update], step: int) -> list[Planned]:
        """The new keep-mask of every weight (in the order given), after :meth:`check`. Subclasses define it."""
        raise NotImplementedError(f"{type(self).__qualname__} must define select(updates, step)")

    def plan(self, updates: Sequence[Update], step: int = 0) -> list[Planned]:
        """:meth:`check`, then :meth:`select`: one :class:`Planned` per update, in order; writes nothing.

        ``step`` is the training step about to run (an algorithm that runs once, as IMP's level step, ignores it).
        """
        self.check(updates)
        return self.select(updates, step)


class SparseTraining(MaskAlgorithm):
    """Base of the algorithms that move masks during training; its hooks, unchanged, are SET's.

    Every ``update_every`` steps, drop the ``drop_fraction`` of live weights of lowest drop score (magnitude)
    and regrow as many where the grow score (random) is highest (:class:`prune.algorithms.SET`).

    A subclass sets :attr:`name` and overrides one or more hooks: :meth:`live_counts` (how many entries stay
    live before the exchange), :meth:`drop_counts` (how many of those are exchanged), :meth:`drop_scores` and
    :meth:`grow_scores`. The hooks see one :class:`Update` per weight; :meth:`plan` runs them.

    Args:
        update_every: ΔT, steps between updates (positive integer).
        drop_fraction: Fraction of the live entries dropped at an update, in (0, 1].
        end_step: No update from this step on; required by the cosine decay.
        decay: ``"constant"`` or ``"cosine"`` (:func:`cosine_drop_fraction`); default the class's
            :attr:`default_decay` (the paper's).
        seed: Seed of the random scores (SET's growth).
        drop: ``"magnitude"`` (rigl's: the smallest drop scores over both signs) or ``"per_sign"``
            (Mocanu et al.'s SET: the same fraction of the positive and of the negative entries,
            :func:`sign_drop_counts`).

    Raises:
        ValueError: a bad argument, naming it and its value.
    """

    kind = "sparse_training"
    default_decay: ClassVar[str] = "constant"
    drop_criterion: ClassVar[str] = "magnitude"
    """A :mod:`prune.core.scoring` criterion: lower drops first."""
    grow_criterion: ClassVar[str] = "random"
    """A :mod:`prune.core.scoring` criterion: higher grows first (``"random"``, ``"gradient"``)."""
    moves: ClassVar[bool] = True
    """False for an algorithm that never changes a mask after its start (static sparse training)."""
    paper: ClassVar[dict[str, Any]] = {}
    """The paper's settings where they differ from the base's (``update_every=100``, ``drop_fraction=0.3``,
    ``decay=default_decay``, ``end=1.0``): ``end`` is the fraction of the training steps after which no update
    runs (RigL: 0.75). An experiment runner offers these as the method's defaults."""
    keeps_live: ClassVar[bool] = True
    """Whether every update keeps each weight's number of live entries (an exchange); False when a schedule
    shrinks them (GraNet)."""

    def __init__(
        self,
        update_every: int = 100,
        drop_fraction: float = 0.3,
        end_step: int | None = None,
        decay: str | None = None,
        seed: int = 0,
        drop: str = "magnitude",
    ) -> None:
        self.update_every = _positive_int("update_every", update_every)
        self.drop_fraction = _fraction("drop_fraction", drop_fraction, 0.0, 1.0, True, "(0, 1]")
        self.end_step = _positive_int("end_step", end_step, allow_none=True)
        decay = self.default_decay if decay is None else decay
        if decay not in DECAYS:
            raise ValueError(f"decay must be one of {list(DECAYS)}, got {decay!r}")
        if decay == "cosine" and self.end_step is None:
            raise ValueError("decay='cosine' needs end_step (the step where the drop fraction reaches 0), got end_step=None")
        if drop not in DROPS:
            raise ValueError(f"drop must be one of {list(DROPS)}, got {drop!r}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise ValueError(f"seed must be an integer, got {seed!r}")
        self.decay, self.drop, self.seed = decay, drop, int(seed)

    @classmethod
    def for_run(cls, sparsity: float, **settings: Any) -> "SparseTraining":
        """The algorithm for a training run whose final sparsity is ``sparsity``: ``cls(**settings)``.

        The exchanges keep the sparsity :func:`prune.sparse_init` installed (:meth:`start_sparsity`), so they
        ignore ``sparsity``; an algorithm with a schedule of its own (GraNet) takes it as its target.
        """
        return cls(**settings)

    # -- when --------------------------------------------------------------------------------------------------
    def should_update(self, step: int) -> bool:
        """Whether the masks move before training step ``step``: every ``update_every`` steps after 0, before ``end_step``."""
        return (self.moves and step > 0 and step % self.update_every == 0
                and (self.end_step is None or step < self.end_step))

    def fraction_at(self, step: int) -> float:
        """The drop fraction an update at ``step`` uses."""
        if self.decay == "cosine":
            return cosine_drop_fraction(step, self.drop_fraction, self.end_step)  # type: ignore[arg-type]
        return self.drop_fraction

    def start_sparsity(self, target: float) -> float:
        """The sparsity :func:`prune.sparse_init` installs before training, for a run whose final sparsity is ``target``."""
        return float(target)

    # -- the hooks -----------------------------------------------------------------------------------------------
    def live_counts(self, updates: Sequence[Update], step: int) -> dict[str, int]:
        """Live entries per weight before the exchange; the base keeps each weight's count."""
        return {u.key: int(u.keep.sum()) for u in updates}

    def drop_counts(self, u: Update, live: int, fraction: float) -> tuple[int, int | None]:
        """``(n, n_negative)``: entries exchanged (drop then grow) of ``live``; ``n_negative`` for ``drop="per_sign"``."""
        if self.drop == "per_sign":
            return sign_drop_counts(u.weight, u.keep, fraction)
        return num_drop(live, fraction), None

    def _criterion(self, name: str, u: Update) -> np.ndarray:
        if name == "random":  # the update's own draws: (seed, step, key), not the criterion's (seed, key)
            rng = u.rng if u.rng is not None else self.rng(0, u.key)
            return rng.random(u.weight.shape)
        return self.criterion_scores(name, u, seed=self.seed)

    def drop_scores(self, u: Update) -> np.ndarray:
        """Lower drops first: :attr:`drop_criterion`."""
        return self._criterion(self.drop_criterion, u)

    def grow_scores(self, u: Update) -> np.ndarray:
        """Higher grows first: :attr:`grow_criterion`."""
        return self._criterion(self.grow_criterion, u)

    # -- the loop -----------------------------------------------------------------------------------------------
    def select(self, updates: Sequence[Update], step: int) -> list[Planned]:
        """The new keep-mask of every weight at ``step``, and its exchanged count ``n``; writes nothing.

        Steps (after :meth:`check`): :meth:`live_counts` (a schedule may shrink a weight first, by drop score),
        then per weight :meth:`drop_counts` of the live entries dropped by :meth:`drop_scores` and as many
        grown by :meth:`grow_scores` (:func:`drop_and_grow`).
        """
        fraction = self.fraction_at(step)
        live = self.live_counts(updates, step)
        out = []
        for u in updates:
            keep = u.keep.astype(bool)
            drop = self.drop_scores(u)
            now = int(keep.sum())
            if live[u.key] < now:  # a schedule prunes first: keep the live[key] live entries of highest drop score
                keep = prune_lowest(np.asarray(drop, np.float64).reshape(-1), keep.reshape(-1),
                                    keep.size - live[u.key]).reshape(keep.shape)
            shrunk = dataclasses.replace(u, keep=keep)
            n, n_negative = self.drop_counts(shrunk, live[u.key], fraction)
            new = drop_and_grow(u.weight, keep, n, self.grow_scores(u), n_negative=n_negative, drop_scores=drop)
            out.append(Planned(new, n + (n_negative or 0)))
        return out

    def rng(self, step: int, key: str) -> np.random.Generator:
        """The generator of :attr:`Update.rng`: seeded by ``(seed, step, key)``."""
        return np.random.default_rng([self.seed & 0xFFFFFFFF, int(step), zlib.crc32(key.encode())])


# -- the registry ----------------------------------------------------------------------------------------------

_REGISTRY: dict[str, type[MaskAlgorithm]] = {}


def register_algorithm(cls: type[MaskAlgorithm]) -> type[MaskAlgorithm]:
    """Make ``cls`` reachable by its :attr:`MaskAlgorithm.name` (from ``DynamicSparsity``, the engine and sweep files).

    Usable as a class decorator. Raises ``ValueError`` for a name taken by another class, a class that is not a
    :class:`MaskAlgorithm`, or a :attr:`MaskAlgorithm.kind` outside :data:`KINDS`.
    """
    if not (isinstance(cls, type) and issubclass(cls, MaskAlgorithm)):
        raise ValueError(f"cls must be a subclass of MaskAlgorithm, got {cls!r}")
    name = cls.name
    if not isinstance(name, str) or not name.isidentifier() or name != name.lower():
        raise ValueError(f"an algorithm's name must be a lower-case identifier, got {name!r}")
    if cls.kind not in KINDS:
        raise ValueError(f"algorithm {name!r} has kind {cls.kind!r}; a kind must be one of {list(KINDS)}")
    if name in _REGISTRY and _REGISTRY[name] is not cls:
        raise ValueError(f"algorithm {name!r} is registered already (by {_REGISTRY[name].__qualname__})")
    _REGISTRY[name] = cls
    return cls


def algorithms(kind: str | None = None, moving: bool | None = None, needs_gradient: bool | None = None) -> list[str]:
    """Registered algorithm names, sorted.

    Args:
        kind: Only those of this :attr:`MaskAlgorithm.kind` (one of :data:`KINDS`); ``None``: every kind.
        moving: Only sparse-training algorithms whose :attr:`SparseTraining.moves` is this.
        needs_gradient: Only those whose :attr:`MaskAlgorithm.needs_gradient` is this.
    """
    if kind is not None and kind not in KINDS:
        raise ValueError(f"kind must be one of {list(KINDS)} or None, got {kind!r}")
    return sorted(
        n for n, c in _REGISTRY.items()
        if (kind is None or c.kind == kind)
        and (moving is None or (issubclass(c, SparseTraining) and c.moves == moving))
        and (needs_gradient is None or c.needs_gradient == needs_gradient)
    )


def get_algorithm(name: str, arg: str = "method", kind: str | None = None) -> type[MaskAlgorithm]:
    """The class registered as ``name`` (of ``kind``, when given).

    An unknown name raises ``ValueError`` naming ``arg`` and the valid names (those of ``kind``).
    """
    if name not in _REGISTRY or (kind is not None and _REGISTRY[name].kind != kind):
        raise ValueError(f"{arg} must be one of {algorithms(kind)}, got {name!r}")
    return _REGISTRY[name]
