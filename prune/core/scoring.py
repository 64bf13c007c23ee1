"""Pruning criteria (scores): one registered function from a :class:`ScoreContext` to scores.

A criterion sees a context, not just the weight: the weight, its gradient
(when the criterion declares that it needs one), the optimizer's slots for it
(likewise), the step, the seed and the weight's key (``"layer/weight"``).
Higher scores are kept. A new criterion is one function and one
:func:`register_criterion` line::

    prune.register_criterion("grad_norm", lambda ctx: np.abs(ctx.gradient), needs=("gradient",))

**Where gradients come from.** The engine does not guess them. A criterion
that needs gradients gets the gradient of the loss on a batch the user names:
pass ``gradients=prune.compute_gradients(model, x, y)`` to
:func:`prune.update_masks`, or ``gradient_data=(x, y)`` to
:class:`prune.UpdatePruningStep`, which computes them on that batch (forward
pass in inference mode, the model's compiled loss unless ``loss`` is given)
each time a schedule fires. A criterion asked to score without them raises a
``ValueError`` naming the criterion and the weight, before any mask changes.
Gradient-based scores are thus *one-batch* estimates at the update step;
SNIP and Taylor are defined that way (Taylor averages over batches: pass a
larger batch), and movement pruning's accumulated score is approximated by its
latest term.

Scores are float arrays of the weight's (dense) shape; NaN or infinite scores
are refused by the engine with the weight's name.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

__all__ = [
    "ScoreContext",
    "Criterion",
    "register_criterion",
    "get_criterion",
    "criteria",
    "magnitude",
    "random",
    "snip",
    "taylor",
    "movement",
    "gradient",
    "NEEDS",
]

NEEDS = ("gradient", "slots")


@dataclass(frozen=True)
class ScoreContext:
    """What a criterion may look at, for one weight.

    Attributes:
        weight: The weight's current values (dense view; pruned entries are 0).
        gradient: Gradient of the loss w.r.t. the weight, same shape, or ``None``.
        slots: Optimizer state for the weight (dense views), by slot variable
            name, e.g. ``{"adam/dense_kernel_momentum": ...}``; empty unless asked for.
        step: The training step of the update.
        seed: The layer's seed.
        key: ``"layer/weight"``, unique in the model.
    """

    weight: np.ndarray
    gradient: np.ndarray | None = None
    slots: Mapping[str, np.ndarray] = field(default_factory=dict)
    step: int = 0
    seed: int = 0
    key: str = ""


@dataclass(frozen=True)
class Criterion:
    """A registered score function and what it needs from the engine."""

    name: str
    fn: Callable[[ScoreContext], np.ndarray]
    needs: tuple[str, ...] = ()

    def __call__(self, ctx: ScoreContext) -> np.ndarray:
        if "gradient" in self.needs and ctx.gradient is None:
            raise ValueError(
                f"criterion {self.name!r} needs the gradient of {ctx.key!r}; pass gradients="
                "prune.compute_gradients(model, x, y) to prune.update_masks, or gradient_data=(x, y) "
                "to prune.UpdatePruningStep"
            )
        scores = np.asarray(self.fn(ctx), dtype=np.float64)
        if scores.shape != np.shape(ctx.weight):
            raise ValueError(
                f"criterion {self.name!r} returned scores of shape {scores.shape} for {ctx.key!r} of shape {np.shape(ctx.weight)}"
            )
        return scores


def magnitude(ctx: ScoreContext) -> np.ndarray:
    """``|w|``.

    Reference: Han et al., "Learning both Weights and Connections for Efficient
    Neural Networks", NeurIPS 2015.
    """
    return np.abs(np.asarray(ctx.weight, np.float64))


def random(ctx: ScoreContext) -> np.ndarray:
    """Seeded uniform scores, fixed per ``(seed, key)``.

    The same weight gets the same scores at every update, so a gradual random
    schedule prunes a growing prefix of one random order, and results
    reproduce from the seed alone.
    """
    rng = np.random.default_rng([int(ctx.seed) & 0xFFFFFFFF, zlib.crc32(ctx.key.encode())])
    return rng.random(np.shape(ctx.weight))


def snip(ctx: ScoreContext) -> np.ndarray:
    """Connection sensitivity ``|w * g|``.

    Reference: Lee, Ajanthan and Torr, "SNIP: Single-shot Network Pruning based
    on Connection Sensitivity", ICLR 2019 (the saliency before normalisation,
    which does not change the ranking within a weight nor across weights).
    """
    return np.abs(np.asarray(ctx.weight, np.float64) * np.asarray(ctx.gradient, np.float64))


def taylor(ctx: ScoreContext) -> np.ndarray:
    """First-order Taylor importance ``(g * w)^2`` per parameter.

    Reference: Molchanov, Mallya, Tyree, Frosio and Kautz, "Importance
    Estimation for Neural Network Pruning", CVPR 2019, eq. (4) for a single
    parameter; grouped per filter by :class:`prune.core.patterns.Channel`, which sums
    the scores of a unit.
    """
    return (np.asarray(ctx.gradient, np.float64) * np.asarray(ctx.weight, np.float64)) ** 2


def movement(ctx: ScoreContext) -> np.ndarray:
    """Movement score ``-w * g``: weights moving away from zero are kept.

    Reference: Sanh, Wolf and Rush, "Movement Pruning: Adaptive Sparsity by
    Fine-Tuning", NeurIPS 2020, where ``S = -sum_t (dL/dW)_t * W_t`` is
    accumulated over training; here the sum is its term at the update step.
    """
    return -(np.asarray(ctx.weight, np.float64) * np.asarray(ctx.gradient, np.float64))


def gradient(ctx: ScoreContext) -> np.ndarray:
    """``|g|``: where the loss moves most. RigL's grow score, with the dense gradient (pruned entries included).

    Reference: Evci, Gale, Menick, Castro and Elsen, "Rigging the Lottery: Making All Tickets Winners", ICML 2020.
    """
    return np.abs(np.asarray(ctx.gradient, np.float64))


_CRITERIA: dict[str, Criterion] = {
    "magnitude": Criterion("magnitude", magnitude),
    "random": Criterion("random", random),
    "snip": Criterion("snip", snip, ("gradient",)),
    "taylor": Criterion("taylor", taylor, ("gradient",)),
    "movement": Criterion("movement", movement, ("gradient",)),
    "gradient": Criterion("gradient", gradient, ("gradient",)),
}


def register_criterion(name: str, fn: Callable[[ScoreContext], np.ndarray], needs: tuple[str, ...] = ()) -> None:
    """Register ``fn(ctx) -> scores`` under ``name`` (higher scores are kept).

    Args:
        name: Non-empty name, used as ``criterion=name``.
        fn: Takes a :class:`ScoreContext`, returns scores of the weight's shape.
        needs: Any of ``"gradient"``, ``"slots"``: what the engine must put in the context.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"criterion name must be a non-empty string, got {name!r}")
    if not callable(fn):
        raise ValueError(f"fn must be callable, got {fn!r}")
    bad = [n for n in needs if n not in NEEDS]
    if isinstance(needs, str) or bad:
        raise ValueError(f"needs must be a tuple of {list(NEEDS)}, got {needs!r}")
    _CRITERIA[name] = Criterion(name, fn, tuple(needs))


def criteria(needs: str | None = None) -> list[str]:
    """Names of the registered criteria; with ``needs`` (``"gradient"``, ``"slots"``), those that need it."""
    return sorted(name for name, c in _CRITERIA.items() if needs is None or needs in c.needs)


def get_criterion(name: str) -> Criterion:
    """Look up a criterion; an unknown name lists the valid ones."""
    if name not in _CRITERIA:
        raise ValueError(f"unknown criterion {name!r}; valid criteria: {criteria()}")
    return _CRITERIA[name]
