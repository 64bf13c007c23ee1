"""Sparsity distributions: how one target sparsity is spread over several weights.

A registry of :class:`Distribution` values, one per name, which the layers'
``scope``, :func:`prune.sparse_init`'s ``distribution`` and
:func:`prune.training.lottery.magnitude_masks`'s ``scope`` all look up
(:func:`get_distribution`). Each selects keep-masks from scores and, where the
split does not depend on the scores, gives exact zeros per weight
(``params -> {key: number of zeros}``, exact in total, in the spirit of
jaxpruner's ``sparsity_distribution_fn``):

* ``"layer"``: every weight at the target sparsity, each
  rounded on its own (:func:`uniform_zeros`).
* ``"global"``: one threshold over all scores; the split follows the scores
  (:func:`prune.core.masks.global_masks`), so there is no per-weight count.
* ``"erk"``: Erdős–Rényi-Kernel (:func:`erk_sparsities`, :func:`erk_zeros`).

A new distribution is one :func:`register_distribution` call. Nothing here
imports TensorFlow.

To keep the first layer dense under ERK, leave it unpruned: as in rigl, a
weight outside the group is simply not counted (rigl's ``custom_sparsity_map``
of ``{first_layer: 0.0}`` excludes it from the ERK equation the same way).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from prune.core.patterns import num_zeros

__all__ = [
    "Distribution",
    "register_distribution",
    "get_distribution",
    "distributions",
    "uniform_zeros",
    "erk_sparsities",
    "erk_zeros",
    "configured_target",
]


def _check_sparsity(sparsity: float) -> float:
    if not (0.0 <= float(sparsity) < 1.0):
        raise ValueError(f"sparsity must be in [0, 1), got {sparsity!r}")
    return float(sparsity)


def configured_target(sparsity: float) -> float:
    """The sparsity a user configured, from the float32 a schedule hands the engine.

    Schedules compute in float32 (bit-compatible with tfmot), so
    ``ConstantSparsity(0.9)`` gives 0.8999999762. Per-layer floors of such a
    value drift from a formula evaluated at 0.9 (ERK kept 4 entries more than
    rigl's and put one of them in a layer it declares dense). The shortest
    decimal that rounds to the same float32 is the configured value whenever
    the schedule is at one (0.9 here), and the float32's own value otherwise.
    """
    return float(repr(np.float32(sparsity)).removeprefix("np.float32(").removesuffix(")"))


def uniform_zeros(shapes: Mapping[str, tuple[int, ...]], sparsity: float) -> dict[str, int]:
    """``round(sparsity * n)`` zeros for each weight of ``n`` entries (:func:`prune.core.patterns.num_zeros`)."""
    s = _check_sparsity(sparsity)
    return {k: num_zeros(s, int(np.prod(shape, dtype=np.int64))) for k, shape in shapes.items()}


def erk_sparsities(
    shapes: Mapping[str, tuple[int, ...]],
    sparsity: float,
    power_scale: float = 1.0,
) -> dict[str, float]:
    """Erdős–Rényi-Kernel sparsity per weight at an overall ``sparsity``.

    A weight of shape ``(d_1, ..., d_k)`` gets density ``eps * (sum d_i / prod
    d_i) ** power_scale``, with ``eps`` chosen so that the weights together keep
    ``(1 - sparsity)`` of their entries; a weight whose density would exceed 1
    is made dense and ``eps`` is solved again over the others. This is rigl's
    ``get_sparsities_erdos_renyi`` with ``include_kernel=True`` and no custom
    sparsities, including its use of ``floor(sparsity * n)`` zeros per weight in
    the equation for ``eps``.

    Reference: Evci, Gale, Menick, Castro and Elsen, "Rigging the Lottery:
    Making All Tickets Winners", ICML 2020 (google-research/rigl,
    ``rigl/sparse_utils.py``).

    Args:
        shapes: Weight shapes by key.
        sparsity: Overall target, in [0, 1).
        power_scale: Exponent of the ratio (rigl's ``erk_power_scale``; < 1 is softer).

    Returns:
        Sparsity per key, in [0, 1).
    """
    s = _check_sparsity(sparsity)
    dense: set[str] = set()
    while True:
        divisor, rhs, raw = 0.0, 0.0, {}
        for key, shape in shapes.items():
            n = int(np.prod(shape, dtype=np.int64))
            n_zeros = int(np.floor(s * n))
            if key in dense:
                rhs -= n_zeros
            else:
                rhs += n - n_zeros
                raw[key] = (float(np.sum(shape)) / n) ** power_scale
                divisor += raw[key] * n
        if not raw:
            return {k: 0.0 for k in shapes}
        eps = rhs / divisor
        max_prob = max(raw.values())
        if max_prob * eps > 1:
            dense.update(k for k, p in raw.items() if p == max_prob)
            continue
        return {k: 0.0 if k in dense else 1.0 - eps * raw[k] for k in shapes}


def erk_zeros(shapes: Mapping[str, tuple[int, ...]], sparsity: float, power_scale: float = 1.0) -> dict[str, int]:
    """Integer zeros per weight from :func:`erk_sparsities`, exactly ``round(sparsity * N)`` in total.

    Each weight first gets ``floor(s_l * n_l)`` zeros; the remaining zeros go,
    one each, to the weights with the largest fractional parts (ties to the
    earlier key), never filling a weight completely and never into a weight
    that ERK makes dense (``s_l = 0``), so each weight is within one entry of
    ``s_l * n_l``.
    """
    s = _check_sparsity(sparsity)
    sizes = {k: int(np.prod(shape, dtype=np.int64)) for k, shape in shapes.items()}
    total = num_zeros(s, sum(sizes.values()))
    sp = erk_sparsities(shapes, s, power_scale)
    exact = {k: sp[k] * sizes[k] for k in shapes}
    zeros = {k: min(int(np.floor(exact[k])), sizes[k] - 1) for k in shapes}
    short = total - sum(zeros.values())
    keys = list(shapes)
    order = [i for i in sorted(range(len(keys)), key=lambda i: (-(exact[keys[i]] - zeros[keys[i]]), i)) if sp[keys[i]] > 0]
    while short != 0:
        moved = False
        for i in order:
            k = keys[i]
            if short > 0 and zeros[k] < sizes[k] - 1:
                zeros[k] += 1
                short -= 1
                moved = True
            elif short < 0 and zeros[k] > 0:
                zeros[k] -= 1
                short += 1
                moved = True
            if short == 0:
                break
        if not moved:
            raise ValueError(
                f"cannot place {total} zeros in weights of sizes {sizes} without emptying one or filling a dense one"
            )
    return zeros


# -- the registry ------------------------------------------------------------------------------------

Select = Callable[[dict[str, np.ndarray], float, dict[str, np.ndarray], Any], dict[str, np.ndarray]]


@dataclass(frozen=True)
class Distribution:
    """One way to spread a sparsity over weights.

    Attributes:
        name: Its one spelling (``scope=name``).
        grouped: Whether the weights that use it are pruned together, as one
            group per model (``global``, ``erk``), rather than each on its own.
        select: ``select(scores, sparsity, previous, pattern) -> keep`` by
            weight key; masks only shrink (``previous`` entries that are pruned
            stay pruned), as :mod:`prune.core.masks` rules.
        zeros: ``zeros(shapes, sparsity) -> {key: zeros}``, exact per weight,
            for random masks (:func:`prune.sparse_init`); ``None`` where the
            split follows the scores.
        structured: Whether patterns whose units fix each group's sparsity
            (N:M) may be used with it (only a per-weight one can).
        configured: The engine hands it the configured target
            (:func:`configured_target`), not the schedule's float32: ERK's
            per-layer floors are sensitive to the last bits. The others keep
            the float32, bit-compatible with tfmot's rounding.
    """

    name: str
    grouped: bool
    select: Select
    zeros: Callable[[Mapping[str, tuple[int, ...]], float], dict[str, int]] | None = None
    structured: bool = False
    configured: bool = False


_DISTRIBUTIONS: dict[str, Distribution] = {}
_ALIASES: dict[str, str] = {}


def register_distribution(distribution: Distribution, aliases: tuple[str, ...] = ()) -> None:
    """Register ``distribution`` under its name (and old spellings in ``aliases``).

    Raises:
        ValueError: not a :class:`Distribution`, or a name or alias already taken by another one.
    """
    if not isinstance(distribution, Distribution):
        raise ValueError(f"distribution must be a prune.core.distributions.Distribution, got {distribution!r}")
    for name in (distribution.name, *aliases):
        if not isinstance(name, str) or not name:
            raise ValueError(f"distribution names must be non-empty strings, got {name!r}")
        taken = _ALIASES.get(name, name if name in _DISTRIBUTIONS else None)
        if taken is not None and taken != distribution.name:
            raise ValueError(f"distribution name {name!r} is taken by {taken!r}")
    _DISTRIBUTIONS[distribution.name] = distribution
    _ALIASES.update({a: distribution.name for a in aliases})


def distributions(with_zeros: bool = False) -> list[str]:
    """Names of the registered distributions (with ``with_zeros``, those that give exact zeros per weight)."""
    return [n for n, d in _DISTRIBUTIONS.items() if not with_zeros or d.zeros is not None]


def get_distribution(name: str, what: str = "scope") -> Distribution:
    """The distribution ``name`` (or an old spelling of it); an unknown name lists the valid ones.

    Args:
        name: A registered name or alias.
        what: The argument's name, for the message.
    """
    key = _ALIASES.get(name, name) if isinstance(name, str) else name
    if key not in _DISTRIBUTIONS:
        aliases = ", ".join(f"{a!r} for {n!r}" for a, n in _ALIASES.items())
        raise ValueError(f"unknown {what} {name!r}; valid: {list(_DISTRIBUTIONS)}" + (f" (aliases: {aliases})" if aliases else ""))
    return _DISTRIBUTIONS[key]


def _each(scores: dict[str, np.ndarray], sparsity: float, previous: dict[str, np.ndarray], pattern: Any) -> dict[str, np.ndarray]:
    return {k: pattern.select(scores[k], sparsity, previous[k]) for k in scores}


def _global(scores: dict[str, np.ndarray], sparsity: float, previous: dict[str, np.ndarray], pattern: Any) -> dict[str, np.ndarray]:
    from prune.core import masks

    return masks.global_masks(scores, sparsity, previous, pattern)


def _erk(scores: dict[str, np.ndarray], sparsity: float, previous: dict[str, np.ndarray], pattern: Any) -> dict[str, np.ndarray]:
    from prune.core import masks
    from prune.core.patterns import Unstructured

    if not pattern.has_units:
        raise ValueError(f"pattern {pattern!r} fixes each group's sparsity and cannot be used with scope='erk'")
    shapes = {k: tuple(v.shape) for k, v in scores.items()}
    if isinstance(pattern, Unstructured):
        zeros = erk_zeros(shapes, sparsity)  # exact in total
        return {k: masks.topk_mask(scores[k], zeros[k] / scores[k].size, previous[k]) for k in scores}
    per = erk_sparsities(shapes, sparsity)
    return {k: pattern.select(scores[k], per[k], previous[k]) for k in scores}


register_distribution(Distribution("layer", grouped=False, select=_each, zeros=uniform_zeros, structured=True))
register_distribution(Distribution("global", grouped=True, select=_global))
register_distribution(Distribution("erk", grouped=True, select=_erk, zeros=erk_zeros, configured=True))
