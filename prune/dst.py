"""Sparse training: a fixed sparse mask from step 0, or one that moves (SET, RigL).

Three methods, on the masked layers (:func:`prune.prunable_layers`) and on
:class:`prune.layers.SparseDense`:

* **Static sparse training**: :func:`sparse_init` installs a random mask at an
  exact sparsity per weight (uniform, or Erdős–Rényi-Kernel over all masked
  weights) before training; train it with no callback and it never changes.
* **SET** (Mocanu et al., "Scalable training of artificial neural networks with
  adaptive sparse connectivity inspired by network science", Nature
  Communications 9, 2383, 2018): every ``update_every`` steps, drop the
  ``drop_fraction`` of live weights with the smallest magnitude and regrow as
  many at random positions.
* **RigL** (Evci, Gale, Menick, Castro and Elsen, "Rigging the Lottery: Making
  All Tickets Winners", ICML 2020): drop by magnitude as SET does, regrow where
  the magnitude of the *dense* gradient (the gradient with respect to
  ``weight * mask``, pruned entries included) is largest, with the drop
  fraction decaying by a cosine to zero at ``end_step``.

One update of one weight (:func:`drop_and_grow`), as in google-research/rigl
(``rigl/sparse_optimizers.py``, ``SparseSETOptimizer._get_update_op``;
``rigl/rigl_tf2/mask_updaters.py``, ``MaskUpdater.generic_mask_update``) and
jaxpruner (``SET._update_masks``):

1. ``n = floor(live * fraction)`` (rigl casts ``live * fraction`` to int32);
2. keep the ``live - n`` live entries of largest magnitude
   (:func:`prune.patterns.prune_lowest`: ties drop the lower flat index first);
3. among every entry not kept by step 2, grow the ``n`` of highest grow score
   (ties to the lower flat index, as ``tf.math.top_k``).

Step 3 does **not** exclude the entries just dropped in step 2: rigl lifts
only the kept entries' grow scores to ``min - 1`` and lets every other entry
compete, and jaxpruner does the same. An entry dropped and regrown in one
update is therefore simply kept: rigl's ``new_connections`` is ``grown and
previously pruned`` (``reinit_when_same=False``), so its value and optimizer
state stay. Every entry that *was* pruned and grows starts at exactly +0.0
(rigl's ``grow_init='zeros'``, its default) with its optimizer slots zeroed
(rigl's ``reset_momentum``), so its first update is a fresh one. Each weight
keeps exactly its number of live entries at every update.

Differences from rigl, each on purpose: no ``1e-5`` noise is added to the drop
scores (ties break by index instead, so results depend only on the seed); SET's
random grow scores come from NumPy's generator seeded with ``(seed, step,
weight key)``, not from stateless TF ops; the first update is after
``update_every`` training steps (rigl's TF2 code also updates at step 0, before
any training).

The masks here grow. The rule "masks only shrink" (:mod:`prune.masks`) is a
rule of schedules: :func:`prune.update_masks` never revives an entry. Sparse
training revives entries on purpose, through this module only.

Masks are read and installed through the mask-target protocol
(:mod:`prune.targets`), so every prunable layer kind takes part: a
``SparseDense`` layer moves its stored structure (new entries at +0.0 with zero
slots), and its dense gradient (RigL) is computed at update steps only
(:func:`prune.gradients.dense_gradients`). Only the ``Unstructured()`` pattern
takes part; a structured one is refused with the layer's name.
"""

from __future__ import annotations

import math
import zlib
from typing import Any, Callable, Mapping

import keras
import numpy as np

from prune import distributions as _dist
from prune.driving import attach, detach
from prune.gradients import batch_of, dense_gradients
from prune.patterns import prune_lowest
from prune.scoring import ScoreContext, get_criterion
from prune.targets import require_targets

__all__ = [
    "METHODS",
    "DynamicSparsity",
    "cosine_drop_fraction",
    "num_drop",
    "sign_drop_counts",
    "drop_and_grow",
    "sparse_init",
    "dense_gradients",
]

METHODS = ("set", "rigl")
DECAYS = ("constant", "cosine")
DROPS = ("magnitude", "per_sign")


def __getattr__(name: str) -> Any:
    if name == "DISTRIBUTIONS":  # the former tuple ("uniform", "erk"): the registry's distributions with exact zeros
        return tuple(_dist.distributions(with_zeros=True))
    raise AttributeError(f"module 'prune.dst' has no attribute {name!r}")


# -- the arithmetic, on host arrays ----------------------------------------------


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
    weight: np.ndarray, keep: np.ndarray, n: int, grow_scores: np.ndarray, n_negative: int | None = None
) -> np.ndarray:
    """One SET/RigL update of one weight: drop ``n`` live entries by magnitude, grow ``n``.

    Args:
        weight: The weight (dense view).
        keep: Its current keep-mask (bool, True = live).
        n: Entries to drop and to grow, ``0 <= n <= live``; with ``n_negative``,
            the positive (and zero) live entries to drop.
        grow_scores: Higher grows first (SET: random, RigL: ``|dense gradient|``).
        n_negative: SET's per-sign drop (:func:`sign_drop_counts`): the negative
            live entries to drop, those closest to zero; ``n + n_negative`` grow.
            ``None`` (default): drop over both signs by magnitude, as rigl does.

    Returns:
        The new keep-mask, with as many live entries as ``keep``.

    Raises:
        ValueError: ``n`` or ``n_negative`` out of range or shapes that differ.
    """
    weight = np.asarray(weight)
    keep = np.asarray(keep).astype(bool)
    grow_scores = np.asarray(grow_scores, np.float64)
    if keep.shape != weight.shape or grow_scores.shape != weight.shape:
        raise ValueError(
            f"weight, keep and grow_scores must have one shape, got {weight.shape}, {keep.shape}, {grow_scores.shape}"
        )
    alive = keep.reshape(-1)
    drop_scores = get_criterion("magnitude")(ScoreContext(weight=weight)).reshape(-1)
    groups = [(alive, n, "n")]
    if n_negative is not None:
        negative = weight.reshape(-1) < 0
        groups = [(alive & ~negative, n, "n"), (alive & negative, n_negative, "n_negative")]
    kept = np.zeros_like(alive)
    for members, count, name in groups:
        size = int(members.sum())
        if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or not 0 <= count <= size:
            raise ValueError(f"{name} must be an integer in [0, {size}] (the live entries it drops from), got {count!r}")
        kept |= prune_lowest(drop_scores, members, int((~members).sum()) + int(count))
    grown = int(n) + (0 if n_negative is None else int(n_negative))
    candidates = np.flatnonzero(~kept)  # the just dropped included, as in rigl
    order = np.argsort(-grow_scores.reshape(-1)[candidates], kind="stable")
    new = kept.copy()
    new[candidates[order[:grown]]] = True
    return new.reshape(keep.shape)


# -- the masked weights: the mask-target protocol (prune.targets) -----------------------------


def _retrace(model: Any, retrace: bool) -> None:
    if retrace and getattr(model, "train_function", None) is not None:
        model.make_train_function(force=True)


def _check_seed(seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    return int(seed)


def _rng(seed: int, step: int, key: str) -> np.random.Generator:
    return np.random.default_rng([seed & 0xFFFFFFFF, int(step), zlib.crc32(key.encode())])


def sparse_init(
    model: Any,
    sparsity: float,
    distribution: str = "uniform",
    seed: int = 0,
    optimizer: Any = None,
) -> dict[str, int]:
    """Install a random mask on every masked weight: static sparse training's mask at step 0.

    Each weight of ``n`` entries gets exactly ``round(sparsity * n)`` zeros
    (``"uniform"``), or its Erdős–Rényi-Kernel share of ``round(sparsity * N)``
    zeros over all ``N`` masked entries (``"erk"``, :func:`prune.distributions.erk_zeros`).
    Positions are uniformly random, from ``(seed, weight key)``. Entries that
    become live start at +0.0 with zero optimizer slots. The layers' pruning
    schedules are removed (``pruning_schedule=None``, saved so with the model):
    the mask is now static, so train without :class:`prune.UpdatePruningStep`
    for static sparse training, or with :class:`DynamicSparsity` for SET or RigL.

    References: Mocanu et al. 2018 (random sparse initialisation of SET);
    Evci et al. 2020 (ERK, and "Static" as the baseline of RigL).

    Args:
        model: A built model with masked layers (:func:`prune.prune_low_magnitude`)
            or ``SparseDense`` layers.
        sparsity: Fraction of zeros, in [0, 1).
        distribution: A registered distribution with exact zeros per weight
            (:func:`prune.distributions.distributions` with ``with_zeros=True``):
            ``"layer"`` (also spelled ``"uniform"``) or ``"erk"``.
        seed: Seed of the positions.
        optimizer: Its slots are zeroed where the mask changes; default
            ``model.optimizer``. Slots an optimizer builds later start at its
            initial value (Adagrad: 0.1) for pruned entries too; their update
            is still exactly zero, since their gradient is.

    Returns:
        Zeros per weight key.

    Raises:
        ValueError: bad arguments, unbuilt layers or a structured pattern;
            raised before anything changes.
    """
    if isinstance(sparsity, bool) or not isinstance(sparsity, (int, float, np.floating)) or not 0.0 <= sparsity < 1.0:
        raise ValueError(f"sparsity must be a number in [0, 1), got {sparsity!r}")
    dist = _dist.get_distribution(distribution, "distribution")
    if dist.zeros is None:
        raise ValueError(
            f"distribution {distribution!r} splits zeros by scores, not at random; "
            f"use one of {_dist.distributions(with_zeros=True)}"
        )
    seed = _check_seed(seed)
    targets = require_targets(model, "sparse_init")
    shapes = {t.key: t.shape for t in targets}  # dense shapes (SparseDense stores values flat)
    zeros = dist.zeros(shapes, sparsity)
    plans = []
    for t in targets:
        scores = get_criterion("random")(ScoreContext(weight=np.zeros(shapes[t.key]), seed=seed, key=t.key))
        new = prune_lowest(scores.reshape(-1), np.ones(scores.size, bool), zeros[t.key]).reshape(shapes[t.key])
        plans.append((t, new))
    optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
    retrace = False
    for t, new in plans:
        retrace |= t.install(new, optimizer)
    for layer in {id(t.layer): t.layer for t in targets}.values():
        layer.pruning_schedule = None  # the mask is static now: no schedule may change it
    _retrace(model, retrace)
    return zeros


# -- the callback -------------------------------------------------------------------------


class DynamicSparsity(keras.callbacks.Callback):
    """Dynamic sparse training (SET or RigL) of the masked and ``SparseDense`` layers, in ``fit`` or a custom loop.

    Start from a sparse mask (:func:`sparse_init`, or any masks), then::

        model.fit(x, y, callbacks=[prune.DynamicSparsity("rigl", update_every=100,
                                                          end_step=3000, gradient_data=(xb, yb))])

    In a custom loop, drive it as :class:`prune.UpdatePruningStep`:
    ``set_model``, ``on_train_begin``, then ``on_train_batch_begin`` before
    each training step. Do not combine it with ``UpdatePruningStep``, whose
    schedule would change the sparsity.

    At a step ``t > 0`` with ``t % update_every == 0`` and (if ``end_step`` is
    set) ``t < end_step``, every masked weight drops ``floor(live * f(t))``
    live entries of smallest magnitude and grows as many (see
    :func:`drop_and_grow`), so each weight keeps its number of live entries.
    Grown entries start at +0.0 with zero optimizer slots; pruned entries stay
    +0.0 between updates under every optimizer (the masked layers' invariant).

    References: Mocanu et al., Nature Communications 2018 (SET); Evci et al.,
    ICML 2020 (RigL), whose google-research/rigl code this follows.

    Args:
        method: ``"set"`` (random growth) or ``"rigl"`` (growth by
            ``|dense gradient|`` on ``gradient_data``).
        update_every: ΔT, steps between updates (positive integer).
        drop_fraction: Fraction of the live entries dropped at an update, in (0, 1].
        end_step: No update from this step on; required by the cosine decay.
        decay: ``"constant"`` or ``"cosine"`` (:func:`cosine_drop_fraction`);
            default ``"constant"`` for SET, ``"cosine"`` for RigL, as in the papers.
        seed: Seed of SET's random growth.
        gradient_data: ``(x, y)``, or a callable returning one, for RigL's
            gradient at each update (a batch; rigl uses the current batch: pass
            a callable that returns the batch about to be trained).
        drop: ``"magnitude"`` (default, rigl's: the smallest ``|w|`` over both
            signs) or ``"per_sign"`` (Mocanu et al.'s SET: the same fraction of
            the positive and of the negative entries, :func:`sign_drop_counts`).
        loss: ``loss(y_true, y_pred)`` for that gradient; default the compiled loss.
        optimizer: Optimizer whose slots to reset; default ``model.optimizer``.

    Attributes:
        history: One dict per weight and update: ``step``, ``key``,
            ``fraction``, ``live``, ``n`` (entries dropped by magnitude and
            grown), ``dropped`` and ``grown`` (entries whose mask changed;
            fewer than ``n`` when some dropped entries grew back at once).

    Raises:
        ValueError: a bad argument, naming it and its value, at construction;
            a structured pattern or no masked or ``SparseDense`` layer at
            ``on_train_begin``.
    """

    def __init__(
        self,
        method: str = "set",
        update_every: int = 100,
        drop_fraction: float = 0.3,
        end_step: int | None = None,
        decay: str | None = None,
        seed: int = 0,
        gradient_data: Any = None,
        loss: Callable[[Any, Any], Any] | None = None,
        optimizer: Any = None,
        drop: str = "magnitude",
    ) -> None:
        if method not in METHODS:
            raise ValueError(f"method must be one of {list(METHODS)}, got {method!r}")
        if isinstance(update_every, bool) or not isinstance(update_every, (int, np.integer)) or update_every < 1:
            raise ValueError(f"update_every must be a positive integer, got {update_every!r}")
        if (
            isinstance(drop_fraction, bool)
            or not isinstance(drop_fraction, (int, float, np.floating))
            or not 0.0 < drop_fraction <= 1.0
        ):
            raise ValueError(f"drop_fraction must be a number in (0, 1], got {drop_fraction!r}")
        if end_step is not None and (
            isinstance(end_step, bool) or not isinstance(end_step, (int, np.integer)) or end_step < 1
        ):
            raise ValueError(f"end_step must be a positive integer or None, got {end_step!r}")
        decay = ("cosine" if method == "rigl" else "constant") if decay is None else decay
        if decay not in DECAYS:
            raise ValueError(f"decay must be one of {list(DECAYS)}, got {decay!r}")
        if decay == "cosine" and end_step is None:
            raise ValueError("decay='cosine' needs end_step (the step where the drop fraction reaches 0), got end_step=None")
        if drop not in DROPS:
            raise ValueError(f"drop must be one of {list(DROPS)}, got {drop!r}")
        if method == "rigl" and gradient_data is None:
            raise ValueError("method='rigl' grows by the dense gradient: pass gradient_data=(x, y) or a callable returning one")
        super().__init__()
        self.method = method
        self.update_every = int(update_every)
        self.drop_fraction = float(drop_fraction)
        self.end_step = None if end_step is None else int(end_step)
        self.decay = decay
        self.drop = drop
        self.seed = _check_seed(seed)
        self._gradient_data = gradient_data
        self._loss = loss
        self._optimizer = optimizer
        self._step = 0
        self._started = False
        self.history: list[dict[str, Any]] = []

    def fraction_at(self, step: int) -> float:
        """The drop fraction an update at ``step`` uses."""
        if self.decay == "cosine":
            return cosine_drop_fraction(step, self.drop_fraction, self.end_step)  # type: ignore[arg-type]
        return self.drop_fraction

    def should_update(self, step: int) -> bool:
        """Whether the masks move before training step ``step``."""
        return step > 0 and step % self.update_every == 0 and (self.end_step is None or step < self.end_step)

    def update(self, step: int) -> list[dict[str, Any]]:
        """Move every masked weight's mask once, at ``step`` (whether or not it is an update step).

        Every check and every score runs before anything is written.

        Returns:
            The entries added to :attr:`history`.
        """
        targets = require_targets(self.model, "DynamicSparsity")
        fraction = self.fraction_at(step)
        reads = []
        for t in targets:
            w, keep = t.weight, t.keep
            if not np.all(np.isfinite(w)):
                raise ValueError(f"weight {t.key!r} has NaN or infinite entries; no mask was changed")
            reads.append((t, w, keep))
        grads: Mapping[str, np.ndarray] = {}
        if self.method == "rigl":
            x, y = batch_of(self._gradient_data, "method 'rigl'")
            grads = dense_gradients(self.model, x, y, loss=self._loss)
        plans = []
        for t, w, keep in reads:
            if self.method == "rigl":
                grow = np.abs(np.asarray(grads[t.key], np.float64))
                if not np.all(np.isfinite(grow)):
                    raise ValueError(f"the gradient of {t.key!r} has NaN or infinite entries; no mask was changed")
            else:
                grow = _rng(self.seed, step, t.key).random(w.shape)
            if self.drop == "per_sign":
                n_pos, n_neg = sign_drop_counts(w, keep, fraction)
                n = n_pos + n_neg
                plans.append((t, drop_and_grow(w, keep, n_pos, grow, n_negative=n_neg), keep, n))
            else:
                n = num_drop(int(keep.sum()), fraction)
                plans.append((t, drop_and_grow(w, keep, n, grow), keep, n))
        records = []
        optimizer = self._optimizer if self._optimizer is not None else getattr(self.model, "optimizer", None)
        retrace = False
        for t, new, old, n in plans:
            retrace |= t.install(new, optimizer)
            records.append(
                {
                    "step": int(step),
                    "key": t.key,
                    "fraction": fraction,
                    "live": int(new.sum()),
                    "n": n,
                    "dropped": int((old & ~new).sum()),
                    "grown": int((new & ~old).sum()),
                }
            )
        _retrace(self.model, retrace)
        self.history.extend(records)
        return records

    def on_train_begin(self, logs: dict | None = None) -> None:
        targets = require_targets(self.model, "DynamicSparsity")
        self._step = int(targets[0].layer.pruning_step.numpy())
        self._started = True
        self._driven = list({id(t.layer): t.layer for t in targets}.values())
        attach(self._driven)  # this callback drives the masks: training without UpdatePruningStep is intended

    def on_train_end(self, logs: dict | None = None) -> None:
        detach(getattr(self, "_driven", []))

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        # Work only here, never in on_train_batch_end (see prune.UpdatePruningStep).
        if not self._started:
            self.on_train_begin()
        if self.should_update(self._step):
            self.update(self._step)
        self._step += 1
