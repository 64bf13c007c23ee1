"""Mask selection: exact top-k masks, per-layer and global scope, mask validation.

Everything here is NumPy on host arrays, separate from the Keras plumbing, so
it can be tested exactly on tiny inputs. Criteria live in :mod:`prune.core.scoring`,
patterns in :mod:`prune.core.patterns`, distributions across weights in
:mod:`prune.core.distributions`.

Rules, shared by every criterion, pattern and scope:

* A weight of ``n`` entries (units, for a pattern with larger units) at
  sparsity ``s`` gets exactly ``round(s * n)`` zeros (round half to even, as
  ``numpy.round`` and ``tf.math.round`` do; :func:`prune.core.patterns.num_zeros`). With global scope the total over
  all weights is exact.
* Ties break deterministically: among equal scores the entry with the lower
  flat index (lower weight first, under global scope) is pruned first.
* Masks only shrink (kept here for global scope, :func:`global_masks`, and per weight by
  :meth:`prune.core.patterns.Pattern.select`). Entries already pruned are ranked below every live entry,
  so they stay pruned; if the schedule asks for fewer zeros than already exist,
  the mask is left as it is. This is a rule of schedules: dynamic sparse
  training (:mod:`prune.algorithms`, run by :mod:`prune.training.dst`) grows entries on purpose, and
  :func:`prune.training.lottery.rewind` installs any mask (IMP's random-mask control).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from prune.core.patterns import Pattern, Unstructured, num_zeros, prune_lowest

__all__ = [
    "topk_mask",
    "layer_masks",
    "global_masks",
    "validate_mask",
]

def topk_mask(scores: np.ndarray, sparsity: float, previous: np.ndarray | None = None) -> np.ndarray:
    """Binary mask with exactly ``round(sparsity * n)`` zeros at the lowest scores.

    Args:
        scores: Scores of one weight; higher is kept.
        sparsity: Target fraction of zeros, in [0, 1).
        previous: The current mask (bool or 0/1). Its zeros stay zeros.

    Returns:
        A bool array of ``scores``' shape (True = kept).
    """
    return Unstructured().select(scores, sparsity, previous)


def layer_masks(
    scores: Mapping[str, np.ndarray], sparsity: float, previous: Mapping[str, np.ndarray] | None = None
) -> dict[str, np.ndarray]:
    """Per-layer scope: each weight gets its own exact top-k mask."""
    previous = previous or {}
    return {name: topk_mask(s, sparsity, previous.get(name)) for name, s in scores.items()}


def global_masks(
    scores: Mapping[str, np.ndarray],
    sparsity: float,
    previous: Mapping[str, np.ndarray] | None = None,
    pattern: Pattern | None = None,
) -> dict[str, np.ndarray]:
    """Global scope: one threshold over all weights' units, exact in total.

    Scores are compared across weights as they are, so a criterion used
    globally should be comparable across layers (magnitude is the usual one;
    Blalock et al. 2020 compare the two scopes).

    Args:
        scores: Scores by weight key; higher is kept.
        sparsity: Target fraction of pruned units over all weights, in [0, 1).
        previous: Current masks by key; their zeros stay zeros.
        pattern: A pattern with units (default unstructured); ``NByM`` has none.
    """
    pattern = Unstructured() if pattern is None else pattern
    if not pattern.has_units:
        raise ValueError(f"pattern {pattern!r} fixes each group's sparsity and cannot be used with scope='global'")
    previous = previous or {}
    names = list(scores)
    if not names:
        return {}
    shapes, unit_scores, alive = [], [], []
    for n in names:
        s = np.asarray(scores[n], np.float64)
        prev = np.asarray(previous[n]).astype(bool) if n in previous else np.ones(s.shape, bool)
        pattern.check(s.shape, n)
        u, a = pattern.units(s, prev)
        shapes.append(s.shape)
        unit_scores.append(u)
        alive.append(a)
    flat, live = np.concatenate(unit_scores), np.concatenate(alive)
    k = num_zeros(sparsity, flat.size)
    keep = live.copy() if k <= int((~live).sum()) else prune_lowest(flat, live, k)
    out, start = {}, 0
    for n, shape, u in zip(names, shapes, unit_scores):
        prev = np.asarray(previous[n]).astype(bool) if n in previous else np.ones(shape, bool)
        out[n] = pattern.expand(keep[start : start + u.size], shape) & prev
        start += u.size
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
