"""Sparsity distributions: how one target sparsity is spread over several weights.

``params -> {key: number of zeros}``, exact in total, in the spirit of
jaxpruner's ``sparsity_distribution_fn``. Three are used by the engine, by the
layers' ``scope``:

* ``"layer"`` (uniform): every weight at the target sparsity, each rounded on
  its own (:func:`uniform_zeros`).
* ``"global"``: one threshold over all scores; the split follows the scores
  (:func:`prune.masks.global_masks`), so there is no per-weight count here.
* ``"erk"``: Erdős–Rényi-Kernel (:func:`erk_sparsities`, :func:`erk_zeros`).

To keep the first layer dense under ERK, leave it unpruned: as in rigl, a
weight outside the group is simply not counted (rigl's ``custom_sparsity_map``
of ``{first_layer: 0.0}`` excludes it from the ERK equation the same way).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

__all__ = ["uniform_zeros", "erk_sparsities", "erk_zeros", "configured_target"]


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
    """``round(sparsity * n)`` zeros for each weight of ``n`` entries."""
    s = _check_sparsity(sparsity)
    return {k: int(np.round(s * int(np.prod(shape, dtype=np.int64)))) for k, shape in shapes.items()}


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
    total = int(np.round(s * sum(sizes.values())))
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
