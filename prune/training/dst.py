"""Sparse training on Keras models: a fixed sparse mask from step 0, or one that moves (SET, RigL, MEST, GraNet).

The algorithms are :mod:`prune.algorithms` (NumPy only: one base class, one registry, one file each); this
module runs them on the masked layers (:func:`prune.prunable_layers`) and on
:class:`prune.layers.SparseDense`. The first three:

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
   (:func:`prune.core.patterns.prune_lowest`: ties drop the lower flat index first);
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

The masks here grow. The rule "masks only shrink" (:mod:`prune.core.masks`) is a
rule of schedules: :func:`prune.update_masks` never revives an entry. Sparse
training revives entries on purpose, through this module only.

Masks are read and installed through the mask-target protocol
(:mod:`prune.core.targets`), so every prunable layer kind takes part: a
``SparseDense`` layer moves its stored structure (new entries at +0.0 with zero
slots), and its dense gradient (RigL) is computed at update steps only
(:func:`prune.training.gradients.dense_gradients`). Only the ``Unstructured()`` pattern
takes part; a structured one is refused with the layer's name.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import keras
import numpy as np

from prune.core import distributions as _dist
from prune.algorithms import SparseTraining, Update, algorithms, get_algorithm
from prune.core.driving import attach, detach
from prune.training.gradients import batch_of, dense_gradients
from prune.core.patterns import prune_lowest
from prune.core.scoring import ScoreContext, get_criterion
from prune.core.targets import require_targets

__all__ = ["METHODS", "DynamicSparsity", "sparse_init"]


def __getattr__(name: str) -> Any:
    if name == "METHODS":  # read from the registry each time: an algorithm registered later is a method too
        return tuple(algorithms("sparse_training", moving=True))
    raise AttributeError(f"module 'prune.training.dst' has no attribute {name!r}")


# -- the masked weights: the mask-target protocol (prune.core.targets) -----------------------------


def _retrace(model: Any, retrace: bool) -> None:
    if retrace and getattr(model, "train_function", None) is not None:
        model.make_train_function(force=True)


def _check_seed(seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    return int(seed)


def sparse_init(
    model: Any,
    sparsity: float,
    distribution: str = "layer",
    seed: int = 0,
    optimizer: Any = None,
) -> dict[str, int]:
    """Install a random mask on every masked weight: static sparse training's mask at step 0.

    Each weight of ``n`` entries gets exactly ``round(sparsity * n)`` zeros
    (``"layer"``), or its Erdős–Rényi-Kernel share of ``round(sparsity * N)``
    zeros over all ``N`` masked entries (``"erk"``, :func:`prune.core.distributions.erk_zeros`).
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
            (:func:`prune.core.distributions.distributions` with ``with_zeros=True``):
            ``"layer"`` or ``"erk"``.
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
    """Dynamic sparse training (SET, RigL, MEST, GraNet, ...) of the masked and ``SparseDense`` layers.

    Runs any registered algorithm that moves masks (:mod:`prune.algorithms`), in ``fit`` or a custom loop.
    Start from a sparse mask (:func:`sparse_init`, or any masks), then::

        model.fit(x, y, callbacks=[prune.DynamicSparsity("rigl", update_every=100,
                                                          end_step=3000, gradient_data=(xb, yb))])

    In a custom loop, drive it as :class:`prune.UpdatePruningStep`:
    ``set_model``, ``on_train_begin``, then ``on_train_batch_begin`` before
    each training step. Do not combine it with ``UpdatePruningStep``, whose
    schedule would change the sparsity (GraNet's schedule is its own).

    At a step ``t > 0`` with ``t % update_every == 0`` and (if ``end_step`` is
    set) ``t < end_step``, every masked weight drops ``floor(live * f(t))``
    live entries of smallest magnitude and grows as many (SET and RigL; see
    :func:`prune.algorithms.drop_and_grow`), so each weight keeps its number of live entries.
    Grown entries start at +0.0 with zero optimizer slots; pruned entries stay
    +0.0 between updates under every optimizer (the masked layers' invariant).

    References: Mocanu et al., Nature Communications 2018 (SET); Evci et al.,
    ICML 2020 (RigL), whose google-research/rigl code this follows; the others in their modules.

    Args:
        method: A registered algorithm that moves masks (:func:`prune.algorithms.algorithms`): ``"set"``
            (random growth), ``"rigl"`` (growth by ``|dense gradient|`` on ``gradient_data``), ``"mest"``,
            ``"granet"``; or an algorithm instance (then the arguments below must stay at their defaults).
        update_every: ΔT, steps between updates (positive integer).
        drop_fraction: Fraction of the live entries dropped at an update, in (0, 1]; default the algorithm's.
        end_step: No update from this step on; required by the cosine decay.
        decay: ``"constant"`` or ``"cosine"`` (:func:`prune.algorithms.cosine_drop_fraction`);
            default the algorithm's (``"constant"`` for SET, ``"cosine"`` for RigL, as in the papers).
        seed: Seed of SET's random growth.
        gradient_data: ``(x, y)``, or a callable returning one, for the gradient of the algorithms that need
            one (RigL, MEST, GraNet), at each update (a batch; rigl uses the current batch: pass
            a callable that returns the batch about to be trained).
        drop: ``"magnitude"`` (default, rigl's: the smallest ``|w|`` over both
            signs) or ``"per_sign"`` (Mocanu et al.'s SET: the same fraction of
            the positive and of the negative entries, :func:`prune.algorithms.sign_drop_counts`).
        loss: ``loss(y_true, y_pred)`` for that gradient; default the compiled loss.
        optimizer: Optimizer whose slots to reset; default ``model.optimizer``.
        **params: The algorithm's own parameters (MEST's ``lam``; GraNet's ``final_sparsity``, ...).

    Attributes:
        algorithm: The :class:`prune.algorithms.SparseTraining` that plans each update.
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
        method: str | SparseTraining = "set",
        update_every: int = 100,
        drop_fraction: float | None = None,
        end_step: int | None = None,
        decay: str | None = None,
        seed: int = 0,
        gradient_data: Any = None,
        loss: Callable[[Any, Any], Any] | None = None,
        optimizer: Any = None,
        drop: str = "magnitude",
        **params: Any,
    ) -> None:
        if isinstance(method, SparseTraining):
            algorithm = method
        else:
            if not isinstance(method, str) or method not in algorithms("sparse_training", moving=True):
                raise ValueError(f"method must be one of {algorithms('sparse_training', moving=True)}, got {method!r}")
            base = dict(update_every=update_every, end_step=end_step, decay=decay, seed=seed, drop=drop)
            if drop_fraction is not None:
                base["drop_fraction"] = drop_fraction
            algorithm = get_algorithm(method, kind="sparse_training")(**base, **params)
        if not algorithm.moves:
            raise ValueError(f"method must be one of {algorithms('sparse_training', moving=True)}, got {algorithm.name!r}, "
                             "which never moves a mask")
        if algorithm.needs_gradient and gradient_data is None:
            what = "grows by the dense gradient" if algorithm.name == "rigl" else "scores with the gradient"
            raise ValueError(f"method={algorithm.name!r} {what}: pass gradient_data=(x, y) or a callable returning one")
        super().__init__()
        self.algorithm = algorithm
        self._gradient_data = gradient_data
        self._loss = loss
        self._optimizer = optimizer
        self._step = 0
        self._started = False
        self.history: list[dict[str, Any]] = []

    # The algorithm's settings, read through (one home: the algorithm).
    method = property(lambda self: self.algorithm.name, doc="The algorithm's registered name.")
    update_every = property(lambda self: self.algorithm.update_every, doc="Steps between updates.")
    drop_fraction = property(lambda self: self.algorithm.drop_fraction, doc="The drop fraction at step 0.")
    end_step = property(lambda self: self.algorithm.end_step, doc="No update from this step on (None: no end).")
    decay = property(lambda self: self.algorithm.decay, doc="``constant`` or ``cosine``.")
    drop = property(lambda self: self.algorithm.drop, doc="``magnitude`` or ``per_sign``.")
    seed = property(lambda self: self.algorithm.seed, doc="Seed of the random scores.")

    def fraction_at(self, step: int) -> float:
        """The drop fraction an update at ``step`` uses."""
        return self.algorithm.fraction_at(step)

    def should_update(self, step: int) -> bool:
        """Whether the masks move before training step ``step``."""
        return self.algorithm.should_update(step)

    def update(self, step: int) -> list[dict[str, Any]]:
        """Move every masked weight's mask once, at ``step`` (whether or not it is an update step).

        Every check and every score runs before anything is written.

        Returns:
            The entries added to :attr:`history`.
        """
        targets = require_targets(self.model, "DynamicSparsity")
        fraction = self.fraction_at(step)
        reads = [(t, t.weight, t.keep) for t in targets]  # checked by the algorithm's plan, before anything is written
        grads: Mapping[str, np.ndarray] = {}
        if self.algorithm.needs_gradient:
            x, y = batch_of(self._gradient_data, f"method {self.algorithm.name!r}")
            grads = dense_gradients(self.model, x, y, loss=self._loss)
        updates = [Update(t.key, w, keep, None if t.key not in grads else np.asarray(grads[t.key], np.float64),
                          self.algorithm.rng(step, t.key), layer=t.layer.name) for t, w, keep in reads]
        plans = self.algorithm.plan(updates, step)
        records = []
        optimizer = self._optimizer if self._optimizer is not None else getattr(self.model, "optimizer", None)
        retrace = False
        for (t, _, old), (new, n) in zip(reads, plans):
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
