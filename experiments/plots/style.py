"""What every figure shares: the style file, one colour and marker per implementation, the runs table
helpers (:func:`tidy_runs`, :func:`aggregate`, :func:`crossover`, :func:`pareto_front`) and the sparsity axis.

Sparsity axes use :func:`sparsity_axis`: positions are ``log10(1 / density)``,
labels are the sparsity in percent, so 90 %, 95 % and 98 % do not crowd into
the right edge and the ideal ``1 / density`` speed-up is a straight line.
"""

from __future__ import annotations

import contextlib
import zlib
from pathlib import Path
from typing import Iterator, Sequence

import matplotlib
import matplotlib.style
import matplotlib.ticker
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

__all__ = [
    "STYLE_PATH",
    "OKABE_ITO",
    "IMPLEMENTATION_ORDER",
    "KERNEL_ORDER",
    "KERNEL_DISPLAY",
    "PCT",
    "ACC_LABEL",
    "SPARSITY_LABEL",
    "use_style",
    "style_for",
    "order_key",
    "ordered",
    "implementation_label",
    "tidy_runs",
    "aggregate",
    "density_position",
    "density_from_position",
    "crossover",
    "pareto_front",
    "sparsity_axis",
    "log_y",
    "new_figure",
    "single_pair",
    "dense_band",
    "line_with_band",
    "sparse_labels",
]


STYLE_PATH = Path(__file__).parent.parent / "paper.mplstyle"

OKABE_ITO = {
    "black": "#000000",
    "orange": "#E69F00",
    "sky_blue": "#56B4E9",
    "bluish_green": "#009E73",
    "yellow": "#F0E442",
    "blue": "#0072B2",
    "vermillion": "#D55E00",
    "reddish_purple": "#CC79A7",
}

# One colour and marker per implementation label (``implementation`` or
# ``sparse_tensor-<matmul>``). Layer-benchmark kernels map onto the same
# entries (coo -> sparse_tensor-coo, auto -> sparse_tensor, ...).
_STYLES: dict[str, tuple[str, str]] = {
    "dense": (OKABE_ITO["black"], "s"),
    "masked": (OKABE_ITO["blue"], "o"),
    "sparse_tensor": (OKABE_ITO["vermillion"], "^"),
    "sparse_tensor-coo": (OKABE_ITO["orange"], "v"),
    "sparse_tensor-csr": (OKABE_ITO["reddish_purple"], "D"),
    "sparse_tensor-dense": (OKABE_ITO["sky_blue"], "X"),
    "tfmot": (OKABE_ITO["bluish_green"], "P"),
}
_ALIASES = {
    "auto": "sparse_tensor",
    "sparse_tensor-auto": "sparse_tensor",
    "coo": "sparse_tensor-coo",
    "csr": "sparse_tensor-csr",
    "densify": "sparse_tensor-dense",
}
KERNEL_DISPLAY = {
    "auto": "auto",
    "coo": "coo",
    "csr": "csr",
    "densify": "densify",
}
_FALLBACK = [(OKABE_ITO["yellow"], "*"), (OKABE_ITO["sky_blue"], "h"), (OKABE_ITO["orange"], "p"), (OKABE_ITO["blue"], "d")]

IMPLEMENTATION_ORDER = list(_STYLES)
KERNEL_ORDER = ["dense", "masked", "auto", "coo", "csr", "densify"]

PCT = 100.0
ACC_LABEL = "Test accuracy (%)"
SPARSITY_LABEL = "Sparsity (% of weights zero)"


@contextlib.contextmanager
def use_style() -> Iterator[None]:
    """Apply the project style file (and nothing else) inside a ``with`` block."""
    with matplotlib.style.context(STYLE_PATH, after_reset=True):
        yield


def style_for(name: str) -> dict[str, str]:
    """Colour and marker of an implementation or layer-benchmark kernel.

    Args:
        name: ``dense``, ``masked``, ``sparse_tensor``, ``sparse_tensor-coo``,
            ``tfmot``, or a kernel of the layer benchmark (``coo``, ``csr``,
            ``densify``, ``auto``). An unknown name gets a fixed fallback
            derived from the name itself, so it is stable across figures.

    Returns:
        ``{"color": ..., "marker": ...}``, ready to pass to ``Axes.plot``.
    """
    key = _ALIASES.get(name, name)
    if key in _STYLES:
        color, marker = _STYLES[key]
    else:
        color, marker = _FALLBACK[zlib.crc32(name.encode()) % len(_FALLBACK)]
    return {"color": color, "marker": marker}


def order_key(label: str) -> tuple[int, str]:
    return (IMPLEMENTATION_ORDER.index(label) if label in IMPLEMENTATION_ORDER else len(IMPLEMENTATION_ORDER), label)


def ordered(labels: Sequence[str] | pd.Series) -> list[str]:
    return sorted(set(labels), key=order_key)


def implementation_label(runs: pd.DataFrame) -> pd.Series:
    """``implementation``, or ``sparse_tensor-<matmul>`` when a matmul other than ``auto`` was chosen."""
    matmul = runs["matmul"].fillna("").astype(str)
    impl = runs["implementation"].astype(str)
    return impl.where(matmul.isin(["", "auto"]), impl + "-" + matmul)


def tidy_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """The finished runs of ``runs.csv``, labelled and sorted.

    Keeps ``status == "ok"`` rows, adds ``label`` (see
    :func:`implementation_label`) and ``target`` (``target_sparsity`` as a
    float, 0 for dense runs that leave it empty), and sorts by implementation
    order, target sparsity, seed and run id, so every figure sees its rows in
    one fixed order.

    Args:
        runs: ``results/<sweep>/runs.csv`` as read by pandas.

    Raises:
        ValueError: ``runs`` lacks a column the figures need.
    """
    needed = ["run_id", "implementation", "matmul", "target_sparsity", "seed", "status", "test_accuracy"]
    missing = [c for c in needed if c not in runs.columns]
    if missing:
        raise ValueError(f"runs: missing columns {missing}")
    ok = runs[runs["status"].astype(str) == "ok"].copy()
    ok["label"] = implementation_label(ok)
    ok["target"] = pd.to_numeric(ok["target_sparsity"], errors="coerce").fillna(0.0).astype(float)
    ok.loc[ok["implementation"] == "dense", "target"] = 0.0
    ok["_order"] = [order_key(v)[0] for v in ok["label"]]
    ok = ok.sort_values(["_order", "label", "target", "seed", "run_id"], kind="mergesort")
    return ok.drop(columns="_order").reset_index(drop=True)


def aggregate(runs: pd.DataFrame, value: str, by: Sequence[str] = ("label", "target")) -> pd.DataFrame:
    """Mean and standard deviation of ``value`` over seeds, per group.

    Args:
        runs: Output of :func:`tidy_runs` (or any frame with ``by`` and ``value``).
        value: Column to summarise (e.g. ``test_accuracy``).
        by: Grouping columns.

    Returns:
        Columns ``*by``, ``mean``, ``std`` (0 for a single seed) and ``n``,
        sorted by implementation order then the remaining keys. Rows where
        ``value`` is missing are left out.

    Raises:
        ValueError: ``value`` or a ``by`` column is not in ``runs``.
    """
    by = list(by)
    for col in [value, *by]:
        if col not in runs.columns:
            raise ValueError(f"aggregate: column {col!r} not in the table (value={value!r}, by={by})")
    data = runs[[*by, value]].copy()
    data[value] = pd.to_numeric(data[value], errors="coerce")
    data = data.dropna(subset=[value])
    if data.empty:
        return pd.DataFrame(columns=[*by, "mean", "std", "n"])
    grouped = data.groupby(by, sort=True)[value]
    out = grouped.agg(["mean", "std", "count"]).reset_index().rename(columns={"count": "n"})
    out["std"] = out["std"].fillna(0.0)
    if "label" in by:
        out["_order"] = [order_key(v)[0] for v in out["label"]]
        out = out.sort_values(["_order", *by], kind="mergesort").drop(columns="_order")
    return out.reset_index(drop=True)


def density_position(s: np.ndarray | float) -> np.ndarray:
    """Axis position of a sparsity: log10(1 / density)."""
    return -np.log10(np.clip(1.0 - np.asarray(s, dtype=float), 1e-6, None))


def density_from_position(u: np.ndarray | float) -> np.ndarray:
    return 1.0 - np.power(10.0, -np.asarray(u, dtype=float))


def crossover(sparsity: Sequence[float], value: Sequence[float], reference: float | Sequence[float]) -> float | None:
    """Sparsity from which ``value`` stays at or below ``reference``.

    The point where the curve last goes from above the reference to at or
    below it, interpolated linearly in the coordinates the figures draw
    (``log10(1 / density)`` against ``log(value)``), so the mark sits on the
    drawn segment.

    Args:
        sparsity: Increasing sparsities.
        value: A cost at each sparsity (latency, time; lower is better).
        reference: The dense cost: one number, or one per sparsity.

    Returns:
        The crossover sparsity; the first sparsity if ``value`` is never
        above the reference; ``None`` if it is still above at the last one.

    Raises:
        ValueError: lengths differ, sparsities are not increasing, or a cost
            is not positive.
    """
    s = np.asarray(sparsity, dtype=float)
    v = np.asarray(value, dtype=float)
    r = np.broadcast_to(np.asarray(reference, dtype=float), s.shape) if np.ndim(reference) == 0 else np.asarray(reference, dtype=float)
    if not (s.shape == v.shape == r.shape) or s.ndim != 1 or s.size == 0:
        raise ValueError(f"crossover: sparsity, value and reference must be 1-D of one length, got {s.shape}, {v.shape}, {r.shape}")
    if np.any(np.diff(s) <= 0):
        raise ValueError(f"crossover: sparsity must be strictly increasing, got {s.tolist()}")
    if np.any(v <= 0) or np.any(r <= 0):
        raise ValueError("crossover: costs must be positive")
    gap = np.log(v) - np.log(r)  # > 0: slower than the reference
    above = np.flatnonzero(gap > 0)
    if above.size == 0:
        return float(s[0])
    last = int(above[-1])
    if last == s.size - 1:
        return None
    u0, u1 = density_position(s[last]), density_position(s[last + 1])
    g0, g1 = gap[last], gap[last + 1]
    u = u0 + (u1 - u0) * g0 / (g0 - g1)
    return float(density_from_position(u))


def pareto_front(cost: Sequence[float], accuracy: Sequence[float]) -> np.ndarray:
    """Indices of the points no other point beats on both cost (lower) and accuracy (higher).

    Args:
        cost: e.g. nonzero FLOPs per example.
        accuracy: e.g. mean test accuracy.

    Returns:
        Indices into the inputs, sorted by increasing cost.
    """
    c = np.asarray(cost, dtype=float)
    a = np.asarray(accuracy, dtype=float)
    if c.shape != a.shape:
        raise ValueError(f"pareto_front: cost and accuracy differ in shape: {c.shape} vs {a.shape}")
    order = np.lexsort((-a, c))  # by cost, then best accuracy first
    front: list[int] = []
    best = -np.inf
    for i in order:
        if a[i] > best:
            front.append(int(i))
            best = a[i]
    return np.array(front, dtype=int)


def sparsity_axis(ax: Axes, sparsities: Sequence[float]) -> None:
    """Put sparsity on the x axis: ``log10(1/density)`` spacing, percent labels at ``sparsities``."""
    ticks = sorted({round(float(s), 6) for s in sparsities})
    if len(ticks) > 8:  # keep labels readable at column width
        ticks = [t for t in (0.0, 0.5, 0.8, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999) if ticks[0] <= t <= ticks[-1]]
    ax.set_xscale("function", functions=(density_position, density_from_position))
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda s, _pos: f"{s * PCT:g}"))
    lo, hi = density_position(ticks[0]), density_position(ticks[-1])
    pad = 0.04 * (hi - lo if hi > lo else 1.0)
    ax.set_xlim(float(density_from_position(lo - pad)), float(density_from_position(hi + pad)))
    ax.set_xlabel(SPARSITY_LABEL)


def log_y(ax: Axes) -> None:
    """Log y axis with plain-number tick labels (0.5, 1, 2 rather than 10^0)."""
    ax.set_yscale("log")
    plain = FuncFormatter(lambda v, _pos: f"{v:g}")
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())


def new_figure(height: float, ax: Axes | None) -> tuple[Figure, Axes]:
    if ax is not None:
        return ax.figure, ax
    fig = Figure(figsize=(3.3, height))
    return fig, fig.add_subplot()


def single_pair(runs: pd.DataFrame) -> None:
    if {"dataset", "model"} <= set(runs.columns):
        pairs = runs[["dataset", "model"]].drop_duplicates()
        if len(pairs) > 1:
            raise ValueError(
                f"runs: holds {len(pairs)} (dataset, model) pairs {sorted(map(tuple, pairs.values.tolist()))}; "
                "draw one at a time"
            )


def dense_band(ax: Axes, mean: float, std: float, label: str) -> None:
    st = style_for("dense")
    ax.axhspan(mean - std, mean + std, color=st["color"], alpha=0.12, linewidth=0, zorder=1)
    ax.axhline(mean, color=st["color"], linestyle="--", linewidth=0.9, label=label, zorder=2)


def line_with_band(ax: Axes, x: np.ndarray, mean: np.ndarray, std: np.ndarray, label: str, **kw: object) -> None:
    st = style_for(label)
    ax.fill_between(x, mean - std, mean + std, color=st["color"], alpha=0.18, linewidth=0, zorder=2)
    ax.plot(x, mean, color=st["color"], marker=st["marker"], label=label, zorder=3, **kw)


def sparse_labels(agg: pd.DataFrame) -> list[str]:
    return [lab for lab in ordered(agg["label"]) if lab != "dense"]
