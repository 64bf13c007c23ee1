"""Mask selection: score functions, exact top-k masks, per-layer and global scope.

Everything here is NumPy on host arrays, separate from the Keras plumbing, so
it can be tested exactly on tiny inputs.

Rules, shared by every criterion and scope:

* A weight of ``n`` entries at sparsity ``s`` gets exactly ``round(s * n)``
  zeros (round half to even, as ``numpy.round`` and ``tf.math.round`` do).
  With global scope the total over all weights is exact.
* Ties break deterministically: among equal scores the entry with the lower
  flat index (lower weight first, under global scope) is pruned first.
* Masks only shrink. Entries already pruned are ranked below every live entry,
  so they stay pruned; if the schedule asks for fewer zeros than already exist,
  the mask is left as it is.
"""

from __future__ import annotations

import zlib
from typing import Callable, Mapping

import numpy as np

__all__ = [
    "magnitude_scores",
    "random_scores",
    "register_criterion",
    "get_criterion",
    "criteria",
    "SCOPES",
    "check_scope",
    "num_zeros",
    "topk_mask",
    "layer_masks",
    "global_masks",
    "validate_mask",
]

ScoreFn = Callable[[np.ndarray, int, str], np.ndarray]
"""``score(weight, seed, key) -> scores`` of the weight's shape; higher is kept."""

SCOPES = ("layer", "global")


def magnitude_scores(weight: np.ndarray, seed: int = 0, key: str = "") -> np.ndarray:
    """Score = ``|w|``.

    Reference: Han et al., "Learning both Weights and Connections for Efficient
    Neural Networks", NeurIPS 2015.
    """
    return np.abs(np.asarray(weight, dtype=np.float64))


def random_scores(weight: np.ndarray, seed: int = 0, key: str = "") -> np.ndarray:
    """Seeded uniform scores, fixed per ``(seed, key)``.

    The same weight gets the same scores at every update, so a gradual random
    schedule prunes a growing prefix of one random order, and results
    reproduce from the seed alone.
    """
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, zlib.crc32(key.encode())])
    return rng.random(np.shape(weight))


_CRITERIA: dict[str, ScoreFn] = {"magnitude": magnitude_scores, "random": random_scores}


def register_criterion(name: str, fn: ScoreFn) -> None:
    """Register a score function under ``name`` (higher scores are kept)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"criterion name must be a non-empty string, got {name!r}")
    _CRITERIA[name] = fn


def criteria() -> list[str]:
    """Names of the registered criteria."""
    return sorted(_CRITERIA)


def get_criterion(name: str) -> ScoreFn:
    """Look up a criterion; an unknown name lists the valid ones."""
    if name not in _CRITERIA:
        raise ValueError(f"unknown criterion {name!r}; valid criteria: {criteria()}")
    return _CRITERIA[name]


def check_scope(scope: str) -> str:
    """Validate a scope name ('layer' or 'global')."""
    if scope not in SCOPES:
        raise ValueError(f"unknown scope {scope!r}; valid scopes: {list(SCOPES)}")
    return scope


def num_zeros(sparsity: float, n: int) -> int:
    """Exactly how many zeros ``n`` entries get at ``sparsity``: ``round(sparsity * n)``."""
    if not (0.0 <= sparsity < 1.0):
        raise ValueError(f"sparsity must be in [0, 1), got {sparsity!r}")
    return int(np.round(sparsity * n))


def _prune_lowest(flat_scores: np.ndarray, flat_prev: np.ndarray, k: int) -> np.ndarray:
    """Boolean keep-vector with the ``k`` lowest-ranked entries off (``k >= already pruned``)."""
    ranked = np.where(flat_prev, flat_scores, -np.inf)
    # Stable sort: among equal scores, the lower index comes first (is pruned first).
    order = np.argsort(ranked, kind="stable")
    keep = np.ones(flat_scores.shape[0], dtype=bool)
    keep[order[:k]] = False
    return keep


def topk_mask(scores: np.ndarray, sparsity: float, previous: np.ndarray | None = None) -> np.ndarray:
    """Binary mask with exactly ``round(sparsity * n)`` zeros at the lowest scores.

    Args:
        scores: Scores of one weight; higher is kept.
        sparsity: Target fraction of zeros, in [0, 1).
        previous: The current mask (bool or 0/1). Its zeros stay zeros.

    Returns:
        A bool array of ``scores``' shape (True = kept).
    """
    scores = np.asarray(scores)
    prev = np.ones(scores.shape, bool) if previous is None else np.asarray(previous).astype(bool)
    k = num_zeros(sparsity, scores.size)
    if k <= int((~prev).sum()):
        return prev.copy()
    return _prune_lowest(scores.reshape(-1), prev.reshape(-1), k).reshape(scores.shape)


def layer_masks(
    scores: Mapping[str, np.ndarray], sparsity: float, previous: Mapping[str, np.ndarray] | None = None
) -> dict[str, np.ndarray]:
    """Per-layer scope: each weight gets its own exact top-k mask."""
    previous = previous or {}
    return {name: topk_mask(s, sparsity, previous.get(name)) for name, s in scores.items()}


def global_masks(
    scores: Mapping[str, np.ndarray], sparsity: float, previous: Mapping[str, np.ndarray] | None = None
) -> dict[str, np.ndarray]:
    """Global scope: one threshold over all weights, exact in total.

    Scores are compared across weights as they are, so a criterion used
    globally should be comparable across layers (magnitude is the usual one;
    Blalock et al. 2020 compare the two scopes).
    """
    previous = previous or {}
    names = list(scores)
    if not names:
        return {}
    shapes = [np.shape(scores[n]) for n in names]
    flat = np.concatenate([np.asarray(scores[n], np.float64).reshape(-1) for n in names])
    prev = np.concatenate(
        [
            (np.asarray(previous[n]).astype(bool) if n in previous else np.ones(shapes[i], bool)).reshape(-1)
            for i, n in enumerate(names)
        ]
    )
    k = num_zeros(sparsity, flat.size)
    keep = prev.copy() if k <= int((~prev).sum()) else _prune_lowest(flat, prev, k)
    out, start = {}, 0
    for n, shape in zip(names, shapes):
        size = int(np.prod(shape, dtype=np.int64))
        out[n] = keep[start : start + size].reshape(shape)
        start += size
    return out


def validate_mask(mask: np.ndarray, shape: tuple[int, ...], name: str = "mask") -> np.ndarray:
    """Check a user-supplied mask: right shape, only 0 and 1. Returns it as bool.

    Raises:
        ValueError: naming ``name``, the shape or the offending values.
    """
    arr = np.asarray(mask)
    if tuple(arr.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got shape {tuple(arr.shape)}")
    if arr.dtype != bool:
        bad = ~np.isin(arr, (0, 1))
        if bad.any():
            values = np.unique(arr[bad])[:5].tolist()
            raise ValueError(f"{name} must contain only 0 and 1, got values {values}")
    return arr.astype(bool)
