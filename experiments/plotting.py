"""Drawing functions shared by ``python -m experiments figures`` and the notebooks.

Each ``plot_*`` function draws one figure from a results table and returns the
:class:`matplotlib.figure.Figure` (created without pyplot, so nothing global is
touched). Every figure is drawn inside :func:`use_style` (the project style
file ``experiments/paper.mplstyle``: one paper column, ~3.3 in wide), and every
implementation keeps the same colour and marker everywhere
(:func:`style_for`, Okabe-Ito palette, colour-blind safe).

The table helpers (:func:`tidy_runs`, :func:`aggregate`, :func:`crossover`,
:func:`pareto_front`, :func:`layer_speedups`) are the same numbers the figures
show, so a notebook can check a claim against exactly what is drawn.

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
import matplotlib.patches
import matplotlib.style
import matplotlib.ticker
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

__all__ = [
    "STYLE_PATH",
    "OKABE_ITO",
    "IMPLEMENTATION_ORDER",
    "use_style",
    "style_for",
    "implementation_label",
    "tidy_runs",
    "aggregate",
    "crossover",
    "pareto_front",
    "layer_speedups",
    "sparsity_axis",
    "plot_accuracy_vs_sparsity",
    "plot_step_time_vs_sparsity",
    "plot_latency_vs_sparsity",
    "plot_accuracy_vs_flops",
    "plot_accuracy_curves",
    "plot_layer_speedup",
    "plot_partial_freezing",
    "varies_pruning_axes",
    "plot_accuracy_by_pattern",
    "varies_method",
    "imp_ticket_points",
    "plot_accuracy_by_method",
    "plot_imp_levels",
    "plot_mask_changes",
]

STYLE_PATH = Path(__file__).with_name("paper.mplstyle")

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
_DISPLAY = {
    "auto": "auto",
    "coo": "coo",
    "csr": "csr",
    "densify": "densify",
}
_FALLBACK = [(OKABE_ITO["yellow"], "*"), (OKABE_ITO["sky_blue"], "h"), (OKABE_ITO["orange"], "p"), (OKABE_ITO["blue"], "d")]

IMPLEMENTATION_ORDER = list(_STYLES)
_KERNEL_ORDER = ["dense", "masked", "auto", "coo", "csr", "densify"]

_PCT = 100.0
_ACC_LABEL = "Test accuracy (%)"
_SPARSITY_LABEL = "Sparsity (% of weights zero)"


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


def _order_key(label: str) -> tuple[int, str]:
    return (IMPLEMENTATION_ORDER.index(label) if label in IMPLEMENTATION_ORDER else len(IMPLEMENTATION_ORDER), label)


def _ordered(labels: Sequence[str] | pd.Series) -> list[str]:
    return sorted(set(labels), key=_order_key)


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
    ok["_order"] = [_order_key(v)[0] for v in ok["label"]]
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
        out["_order"] = [_order_key(v)[0] for v in out["label"]]
        out = out.sort_values(["_order", *by], kind="mergesort").drop(columns="_order")
    return out.reset_index(drop=True)


def _u(s: np.ndarray | float) -> np.ndarray:
    """Axis position of a sparsity: log10(1 / density)."""
    return -np.log10(np.clip(1.0 - np.asarray(s, dtype=float), 1e-6, None))


def _u_inv(u: np.ndarray | float) -> np.ndarray:
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
    u0, u1 = _u(s[last]), _u(s[last + 1])
    g0, g1 = gap[last], gap[last + 1]
    u = u0 + (u1 - u0) * g0 / (g0 - g1)
    return float(_u_inv(u))


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


def layer_speedups(bench: pd.DataFrame) -> pd.DataFrame:
    """Speed-up of every kernel over dense in the layer benchmark.

    Args:
        bench: ``results/benchmarks/layer_speed.csv`` (columns ``n_in``,
            ``n_out``, ``batch``, ``sparsity``, ``impl``, ``mode``,
            ``median_ms``, ...).

    Returns:
        One row per (``n_in``, ``n_out``, ``mode``, ``batch``, ``sparsity``,
        ``impl``) other than dense, with ``median_ms``, ``dense_ms``,
        ``speedup`` (dense / kernel), ``ideal`` (1 / density) and
        ``fraction_of_ideal``; sorted.

    Raises:
        ValueError: a needed column is missing, or there are no dense rows.
    """
    needed = ["n_in", "n_out", "batch", "sparsity", "impl", "mode", "median_ms"]
    missing = [c for c in needed if c not in bench.columns]
    if missing:
        raise ValueError(f"bench: layer benchmark table lacks columns {missing}")
    keys = ["n_in", "n_out", "mode", "batch", "sparsity"]
    data = bench[[*keys, "impl", "median_ms"]].copy()
    dense = data[data["impl"] == "dense"].groupby(keys, sort=True)["median_ms"].median().rename("dense_ms")
    if dense.empty:
        raise ValueError("bench: the layer benchmark table has no impl == 'dense' rows to compare against")
    other = data[data["impl"] != "dense"].groupby([*keys, "impl"], sort=True)["median_ms"].median().reset_index()
    out = other.merge(dense.reset_index(), on=keys, how="inner")
    out["speedup"] = out["dense_ms"] / out["median_ms"]
    out["ideal"] = 1.0 / np.clip(1.0 - out["sparsity"].astype(float), 1e-9, None)
    out["fraction_of_ideal"] = out["speedup"] / out["ideal"]
    out["_k"] = [_KERNEL_ORDER.index(k) if k in _KERNEL_ORDER else len(_KERNEL_ORDER) for k in out["impl"]]
    out = out.sort_values(["n_in", "n_out", "mode", "batch", "_k", "impl", "sparsity"], kind="mergesort")
    return out.drop(columns="_k").reset_index(drop=True)


def sparsity_axis(ax: Axes, sparsities: Sequence[float]) -> None:
    """Put sparsity on the x axis: ``log10(1/density)`` spacing, percent labels at ``sparsities``."""
    ticks = sorted({round(float(s), 6) for s in sparsities})
    if len(ticks) > 8:  # keep labels readable at column width
        ticks = [t for t in (0.0, 0.5, 0.8, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999) if ticks[0] <= t <= ticks[-1]]
    ax.set_xscale("function", functions=(_u, _u_inv))
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda s, _pos: f"{s * _PCT:g}"))
    lo, hi = _u(ticks[0]), _u(ticks[-1])
    pad = 0.04 * (hi - lo if hi > lo else 1.0)
    ax.set_xlim(float(_u_inv(lo - pad)), float(_u_inv(hi + pad)))
    ax.set_xlabel(_SPARSITY_LABEL)


def _log_y(ax: Axes) -> None:
    """Log y axis with plain-number tick labels (0.5, 1, 2 rather than 10^0)."""
    ax.set_yscale("log")
    plain = FuncFormatter(lambda v, _pos: f"{v:g}")
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())


def _new_figure(height: float, ax: Axes | None) -> tuple[Figure, Axes]:
    if ax is not None:
        return ax.figure, ax
    fig = Figure(figsize=(3.3, height))
    return fig, fig.add_subplot()


def _single_pair(runs: pd.DataFrame) -> None:
    if {"dataset", "model"} <= set(runs.columns):
        pairs = runs[["dataset", "model"]].drop_duplicates()
        if len(pairs) > 1:
            raise ValueError(
                f"runs: holds {len(pairs)} (dataset, model) pairs {sorted(map(tuple, pairs.values.tolist()))}; "
                "draw one at a time"
            )


def _dense_band(ax: Axes, mean: float, std: float, label: str) -> None:
    st = style_for("dense")
    ax.axhspan(mean - std, mean + std, color=st["color"], alpha=0.12, linewidth=0, zorder=1)
    ax.axhline(mean, color=st["color"], linestyle="--", linewidth=0.9, label=label, zorder=2)


def _line_with_band(ax: Axes, x: np.ndarray, mean: np.ndarray, std: np.ndarray, label: str, **kw: object) -> None:
    st = style_for(label)
    ax.fill_between(x, mean - std, mean + std, color=st["color"], alpha=0.18, linewidth=0, zorder=2)
    ax.plot(x, mean, color=st["color"], marker=st["marker"], label=label, zorder=3, **kw)


def _sparse_labels(agg: pd.DataFrame) -> list[str]:
    return [lab for lab in _ordered(agg["label"]) if lab != "dense"]


def plot_accuracy_vs_sparsity(runs: pd.DataFrame, ax: Axes | None = None, diverged: pd.DataFrame | None = None) -> Figure:
    """Figure 1: test accuracy vs target sparsity, one line per implementation.

    Lines are the mean over seeds with a ±1 std band; dense is a horizontal
    line with its ±1 std band. Runs that diverged (loss NaN or infinite) are
    not in the means; each (implementation, sparsity) with one is marked by an
    ``x`` on the bottom edge, in the implementation's colour.

    Args:
        runs: Output of :func:`tidy_runs` for one (dataset, model).
        ax: Draw into this axes instead of a new figure.
        diverged: Diverged runs of the same (dataset, model), with ``label``
            and ``target`` as :func:`tidy_runs` gives them (optional).
    """
    _single_pair(runs)
    with use_style():
        fig, ax = _new_figure(2.4, ax)
        agg = aggregate(runs, "test_accuracy")
        dense = agg[agg["label"] == "dense"]
        if not dense.empty:
            _dense_band(ax, dense["mean"].iloc[0] * _PCT, dense["std"].iloc[0] * _PCT, "dense (mean ± std)")
        for lab in _sparse_labels(agg):
            g = agg[agg["label"] == lab]
            _line_with_band(ax, g["target"].to_numpy(), g["mean"].to_numpy() * _PCT, g["std"].to_numpy() * _PCT, lab)
        if diverged is not None and not diverged.empty:
            cells = diverged.groupby(["label", "target"], sort=True).size().reset_index(name="n")
            for lab, g in cells.groupby("label", sort=True):
                style = style_for(lab)
                ax.plot(g["target"], np.zeros(len(g)), transform=ax.get_xaxis_transform(), linestyle="none",
                        marker="x", color=style.get("color"), clip_on=False,
                        label=f"{lab}: diverged ({int(g['n'].sum())})")
        sparsity_axis(ax, agg["target"])
        ax.set_ylabel(_ACC_LABEL)
        ax.legend(loc="lower left")
    return fig


def plot_step_time_vs_sparsity(runs: pd.DataFrame, ax: Axes | None = None) -> Figure:
    """Figure 2: training step time relative to dense vs sparsity, with the ideal.

    Each run's median step time is divided by the mean dense step time (same
    dataset and model); lines are the mean over seeds with a ±1 std band. The
    ideal is a step whose time shrinks with the nonzeros: ``density``, i.e. a
    ``1 / density`` speed-up.

    Args:
        runs: Output of :func:`tidy_runs` for one (dataset, model).
        ax: Draw into this axes instead of a new figure.

    Raises:
        ValueError: there is no dense run to compare against.
    """
    _single_pair(runs)
    dense = pd.to_numeric(runs.loc[runs["label"] == "dense", "step_time_ms"], errors="coerce").dropna()
    if dense.empty:
        raise ValueError("runs: no finished dense run with a step_time_ms; the relative step time needs one")
    rel = runs.assign(relative=pd.to_numeric(runs["step_time_ms"], errors="coerce") / dense.mean())
    with use_style():
        fig, ax = _new_figure(2.4, ax)
        agg = aggregate(rel, "relative")
        d = agg[agg["label"] == "dense"]
        _dense_band(ax, 1.0, float(d["std"].iloc[0]) if not d.empty else 0.0, "dense (= 1)")
        targets = np.array(sorted(agg["target"].unique()))
        grid = _u_inv(np.linspace(_u(targets[0]), _u(targets[-1]), 50))
        ax.plot(grid, 1.0 - grid, color="0.45", linestyle=":", linewidth=1.0, label="ideal (1/density speed-up)", zorder=2)
        for lab in _sparse_labels(agg):
            g = agg[agg["label"] == lab]
            _line_with_band(ax, g["target"].to_numpy(), g["mean"].to_numpy(), g["std"].to_numpy(), lab)
        sparsity_axis(ax, targets)
        _log_y(ax)
        ax.set_ylabel("Training step time / dense (×)")
        ax.legend(loc="lower left", ncols=2)
    return fig


def plot_latency_vs_sparsity(runs: pd.DataFrame, batches: Sequence[int] = (1, 256)) -> Figure:
    """Figure 3: inference latency vs sparsity at batch 1 and batch 256.

    One panel per batch size (column ``latency_b<batch>_ms``). Dense is a
    horizontal band, the ideal is dense latency × density, and where an
    implementation becomes faster than dense (:func:`crossover`) a dotted
    vertical line and an ``x`` on the dense line mark the crossover.

    Args:
        runs: Output of :func:`tidy_runs` for one (dataset, model).
        batches: Batch sizes, one panel each.

    Raises:
        ValueError: a latency column is missing, or no dense run has it.
    """
    _single_pair(runs)
    for b in batches:
        col = f"latency_b{b}_ms"
        if col not in runs.columns:
            raise ValueError(f"batches: no column {col!r} for batch {b}")
    with use_style():
        fig = Figure(figsize=(3.3, 1.55 * len(batches) + 0.5))
        axes = fig.subplots(len(batches), 1, sharex=True, squeeze=False)[:, 0]
        for i, (ax, b) in enumerate(zip(axes, batches)):
            agg = aggregate(runs, f"latency_b{b}_ms")
            d = agg[agg["label"] == "dense"]
            if d.empty:
                raise ValueError(f"runs: no finished dense run with latency_b{b}_ms")
            dmean, dstd = float(d["mean"].iloc[0]), float(d["std"].iloc[0])
            _dense_band(ax, dmean, dstd, "dense ± std")
            targets = np.array(sorted(agg["target"].unique()))
            grid = _u_inv(np.linspace(_u(targets[0]), _u(targets[-1]), 50))
            ax.plot(grid, dmean * (1.0 - grid), color="0.45", linestyle=":", linewidth=1.0, label="ideal ∝ density")
            for lab in _sparse_labels(agg):
                g = agg[agg["label"] == lab]
                x, m = g["target"].to_numpy(), g["mean"].to_numpy()
                _line_with_band(ax, x, m, g["std"].to_numpy(), lab)
                s = crossover(x, m, dmean) if len(x) > 1 else None
                if s is not None:
                    col = style_for(lab)["color"]
                    ax.axvline(s, color=col, linestyle=":", linewidth=0.8, zorder=1)
                    ax.plot([s], [dmean], linestyle="none", marker="x", markersize=6, markeredgewidth=1.4, color=col, zorder=4)
            _log_y(ax)
            ax.set_ylabel(f"Latency, batch {b} (ms)")
            sparsity_axis(ax, targets)
            if i < len(batches) - 1:
                ax.set_xlabel("")
        handles, labels = axes[0].get_legend_handles_labels()
        handles.append(Line2D([], [], linestyle="none", marker="x", color="0.2", markersize=6, markeredgewidth=1.4))
        labels.append("crossover")
        fig.legend(handles, labels, loc="outside upper center", ncols=3)
    return fig


def plot_accuracy_vs_flops(runs: pd.DataFrame, ax: Axes | None = None) -> Figure:
    """Figure 4: test accuracy vs nonzero FLOPs per example, with the Pareto front.

    One marker per implementation and target sparsity (mean over seeds, ±1
    std error bar); the grey step line joins the points no other point beats
    on both FLOPs and accuracy (:func:`pareto_front`).

    Args:
        runs: Output of :func:`tidy_runs` for one (dataset, model).
        ax: Draw into this axes instead of a new figure.
    """
    _single_pair(runs)
    acc = aggregate(runs, "test_accuracy")
    flops = aggregate(runs, "nonzero_flops").rename(columns={"mean": "flops"})[["label", "target", "flops"]]
    pts = acc.merge(flops, on=["label", "target"], how="inner")
    with use_style():
        fig, ax = _new_figure(2.4, ax)
        front = pts.iloc[pareto_front(pts["flops"], pts["mean"])]
        ax.step(front["flops"], front["mean"] * _PCT, where="post", color="0.55", linewidth=1.0, label="Pareto front", zorder=1)
        for lab in _ordered(pts["label"]):
            g = pts[pts["label"] == lab]
            st = style_for(lab)
            ax.errorbar(
                g["flops"], g["mean"] * _PCT, yerr=g["std"] * _PCT, linestyle="none", marker=st["marker"],
                color=st["color"], markerfacecolor="none" if lab != "dense" else st["color"], label=lab, zorder=3,
            )
        ax.set_xscale("log")
        ax.set_xlabel("Nonzero FLOPs per example (forward)")
        ax.set_ylabel(_ACC_LABEL)
        ax.legend(loc="lower right")
    return fig


def plot_accuracy_curves(runs: pd.DataFrame, curves: pd.DataFrame, sparsity: float, ax: Axes | None = None) -> Figure:
    """Figure 5: test accuracy over epochs per implementation at one target sparsity.

    Mean over seeds with a ±1 std band; dense (dashed) for reference; a
    dotted vertical line where the pruning schedule ends (when it is given
    in epochs and the same for every run shown).

    Args:
        runs: Output of :func:`tidy_runs` for one (dataset, model).
        curves: ``results/<sweep>/curves.csv`` (``run_id, epoch, metric, value``).
        sparsity: The target sparsity to show; must be one of the sweep's.

    Raises:
        ValueError: no sparse run has target ``sparsity``.
    """
    _single_pair(runs)
    chosen = runs[(np.isclose(runs["target"], sparsity)) & (runs["label"] != "dense")]
    if chosen.empty:
        have = sorted(runs.loc[runs["label"] != "dense", "target"].unique().tolist())
        raise ValueError(f"sparsity: no finished sparse run at target sparsity {sparsity!r}; the sweep has {have}")
    shown = pd.concat([runs[runs["label"] == "dense"], chosen])
    acc = curves[curves["metric"] == "test_accuracy"].merge(shown[["run_id", "label"]], on="run_id", how="inner")
    agg = aggregate(acc, "value", by=("label", "epoch"))
    with use_style():
        fig, ax = _new_figure(2.4, ax)
        for lab in _ordered(agg["label"]):
            g = agg[agg["label"] == lab]
            kw = {"linestyle": "--", "markersize": 3} if lab == "dense" else {"markersize": 3}
            _line_with_band(ax, g["epoch"].to_numpy(), g["mean"].to_numpy() * _PCT, g["std"].to_numpy() * _PCT, lab, **kw)
        if {"schedule_unit", "schedule_end"} <= set(chosen.columns):
            units = chosen["schedule_unit"].astype(str).unique()
            ends = pd.to_numeric(chosen["schedule_end"], errors="coerce").dropna().unique()
            if len(units) == 1 and units[0] == "epochs" and len(ends) == 1:
                ax.axvline(float(ends[0]), color="0.45", linestyle=":", linewidth=0.9)
                ax.annotate("pruning ends", (float(ends[0]), 0.02), xycoords=("data", "axes fraction"),
                            xytext=(-2, 0), textcoords="offset points", ha="right", va="bottom", fontsize=6.5, color="0.3")
        ax.set_xlabel("Epoch")
        ax.set_ylabel(_ACC_LABEL)
        ax.set_title(f"Target sparsity {sparsity * _PCT:g} %")
        ax.legend(loc="lower right")
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    return fig


def plot_layer_speedup(speedups: pd.DataFrame, n_in: int, n_out: int, mode: str) -> Figure:
    """Figure 6: one layer's speed-up over dense vs sparsity, per kernel, one panel per batch size.

    Args:
        speedups: Output of :func:`layer_speedups`.
        n_in: Layer input size to show.
        n_out: Layer output size to show.
        mode: ``forward`` or ``train_step`` (one call), or ``forward_graph``
            or ``train_step_graph`` (one more application inside a graph).

    Raises:
        ValueError: no rows for (``n_in``, ``n_out``, ``mode``).
    """
    sel = speedups[(speedups["n_in"] == n_in) & (speedups["n_out"] == n_out) & (speedups["mode"] == mode)]
    if sel.empty:
        have = sorted(set(map(tuple, speedups[["n_in", "n_out", "mode"]].values.tolist())))
        raise ValueError(f"n_in, n_out, mode: no layer benchmark rows for {(n_in, n_out, mode)}; the table has {have}")
    batches = sorted(sel["batch"].unique())
    kernels = sorted(sel["impl"].unique(), key=lambda k: (_KERNEL_ORDER.index(k) if k in _KERNEL_ORDER else 99, k))
    with use_style():
        fig = Figure(figsize=(3.3, 2.2))
        axes = fig.subplots(1, len(batches), sharey=True, squeeze=False)[0]
        for ax, b in zip(axes, batches):
            g = sel[sel["batch"] == b]
            targets = np.array(sorted(g["sparsity"].unique()))
            grid = _u_inv(np.linspace(_u(targets[0]), _u(targets[-1]), 50))
            ax.plot(grid, 1.0 / (1.0 - grid), color="0.45", linestyle=":", linewidth=1.0, label="ideal (1 / density)")
            ax.axhline(1.0, color=style_for("dense")["color"], linestyle="--", linewidth=0.9, label="dense (= 1)")
            for k in kernels:
                kg = g[g["impl"] == k]
                st = style_for(k)
                ax.plot(kg["sparsity"], kg["speedup"], color=st["color"], marker=st["marker"], markersize=3, linewidth=1.0,
                        label=_DISPLAY.get(k, k))
            sparsity_axis(ax, [t for t in targets if t in (0.0, 0.9, 0.99)] or [targets[0], targets[-1]])
            ax.set_xlabel("")
            ax.set_title(f"batch {b}")
            _log_y(ax)
        axes[0].set_ylabel("Speed-up over dense (×)")
        what = {
            "forward": "forward pass",
            "train_step": "training step",
            "forward_graph": "forward pass inside a graph",
            "train_step_graph": "training step inside a graph",
        }.get(mode, mode)
        fig.supxlabel(f"{_SPARSITY_LABEL}\nlayer {n_in}×{n_out}, {what}", fontsize=8)
        handles, labels = axes[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside upper center", ncols=4)
    return fig


def plot_partial_freezing(results: pd.DataFrame, ax: Axes | None = None) -> Figure:
    """Test accuracy of each partial-freezing variant (``results/partial_freezing/results.csv``).

    Bars are hatched where the pretrained embedding rows did not stay
    bitwise fixed.

    Args:
        results: The experiment's table (``variant``, ``method``,
            ``optimizer``, ``test_accuracy``, ``pretrained_rows_bitwise_fixed``).
        ax: Draw into this axes instead of a new figure.
    """
    needed = ["variant", "method", "optimizer", "test_accuracy", "pretrained_rows_bitwise_fixed"]
    missing = [c for c in needed if c not in results.columns]
    if missing:
        raise ValueError(f"results: missing columns {missing}")
    r = results.fillna({"method": ""}).copy()
    r["name"] = [
        v if not m else f"{v}: {m}" + (f" + {o}" if o != "adam" else "")
        for v, m, o in zip(r["variant"], r["method"].astype(str), r["optimizer"].astype(str))
    ]
    fixed = r["pretrained_rows_bitwise_fixed"].astype(str).str.lower() == "true"
    with use_style():
        fig, ax = _new_figure(0.3 * len(r) + 0.8, ax)
        y = np.arange(len(r))[::-1]
        ax.barh(y, r["test_accuracy"] * _PCT, color=[OKABE_ITO["blue"] if f else OKABE_ITO["orange"] for f in fixed],
                hatch=["" if f else "///" for f in fixed], edgecolor="white", linewidth=0.5)
        ax.set_yticks(y, r["name"])
        lo = float(r["test_accuracy"].min() * _PCT)
        ax.set_xlim(max(0.0, lo - 10.0), min(100.0, float(r["test_accuracy"].max() * _PCT) + 4.0))
        ax.set_xlabel(_ACC_LABEL)
        ax.grid(axis="y", visible=False)
        ax.legend(
            handles=[matplotlib.patches.Patch(color=OKABE_ITO["blue"], label="pretrained rows bitwise fixed"),
                     matplotlib.patches.Patch(facecolor=OKABE_ITO["orange"], hatch="///", edgecolor="white", label="pretrained rows drift")],
            loc="lower left", bbox_to_anchor=(0.0, 1.01), borderaxespad=0.0, ncols=1,
        )
        for yi, acc in zip(y, r["test_accuracy"] * _PCT):
            ax.annotate(f"{acc:.1f}", (acc, yi), xytext=(2, 0), textcoords="offset points", va="center", fontsize=6.5)
    return fig


# -- the pattern x criterion figure of a sweep over the pruning axes -------------

AXIS_DEFAULTS = {"pattern": "unstructured", "criterion": "magnitude", "distribution": "layer"}
CRITERION_ORDER = ["magnitude", "snip", "taylor", "movement", "random"]
_CRITERION_STYLES = {
    "magnitude": (OKABE_ITO["blue"], "o"),
    "snip": (OKABE_ITO["vermillion"], "^"),
    "taylor": (OKABE_ITO["orange"], "v"),
    "movement": (OKABE_ITO["reddish_purple"], "D"),
    "random": ("#7f7f7f", "s"),
}


def _pattern_rank(label: str) -> tuple[int, str]:
    if label == "unstructured":
        return (0, label)
    if ":" in label:
        return (1, label)
    return (2 if label.startswith("block") else 3, label)


def varies_pruning_axes(runs: pd.DataFrame) -> bool:
    """Whether the sparse runs of ``runs`` differ in pattern, criterion or distribution."""
    if not set(AXIS_DEFAULTS) <= set(runs.columns):
        return False
    sparse = runs[runs["implementation"].astype(str) != "dense"]
    return len(sparse[list(AXIS_DEFAULTS)].drop_duplicates()) > 1


def plot_accuracy_by_pattern(runs: pd.DataFrame, ax: Axes | None = None) -> Figure:
    """Test accuracy by sparsity pattern and pruning criterion, mean ± std over seeds.

    One column per (target sparsity, pattern) (and distribution and
    implementation, when the sweep has more than one), one point with a ±1
    std bar per criterion, side by side in a fixed colour and marker; dense is
    the dashed line with its ±1 std band. Points, not bars: the accuracy axis
    does not start at zero. Each
    group is labelled with its pattern and target sparsity (an N:M pattern's
    is m/n).

    Args:
        runs: Output of :func:`tidy_runs` for one (dataset, model), with the
            ``pattern``, ``criterion`` and ``distribution`` columns.

    Raises:
        ValueError: a column is missing or there is no sparse run.
    """
    _single_pair(runs)
    missing = [c for c in AXIS_DEFAULTS if c not in runs.columns]
    if missing:
        raise ValueError(f"runs: missing columns {missing}")
    sparse = runs[runs["label"] != "dense"].copy()
    if sparse.empty:
        raise ValueError("runs: no sparse run to compare")
    keys = ["target", "pattern", "distribution", "label"]
    agg = aggregate(sparse, "test_accuracy", by=[*keys, "criterion"])
    groups = sorted(
        agg[keys].drop_duplicates().itertuples(index=False, name=None),
        key=lambda g: (g[0], _pattern_rank(g[1]), g[2], _order_key(g[3])),
    )
    crits = sorted(set(agg["criterion"]), key=lambda c: (CRITERION_ORDER.index(c) if c in CRITERION_ORDER else 99, c))
    many_dist = agg["distribution"].nunique() > 1
    many_impl = agg["label"].nunique() > 1
    width = 0.8 / len(crits)
    with use_style():
        fig, ax = _new_figure(2.5, ax)
        dense = aggregate(runs[runs["label"] == "dense"], "test_accuracy")
        if not dense.empty:
            _dense_band(ax, dense["mean"].iloc[0] * _PCT, dense["std"].iloc[0] * _PCT, "dense (mean ± std)")
        for j, crit in enumerate(crits):
            x, mean, std = [], [], []
            for i, g in enumerate(groups):
                row = agg[(agg[keys] == pd.Series(g, index=keys)).all(axis=1) & (agg["criterion"] == crit)]
                if not row.empty:
                    x.append(i - 0.4 + (j + 0.5) * width)
                    mean.append(row["mean"].iloc[0] * _PCT)
                    std.append(row["std"].iloc[0] * _PCT)
            color, marker = _CRITERION_STYLES.get(crit, (style_for(crit)["color"], style_for(crit)["marker"]))
            ax.errorbar(x, mean, yerr=std, color=color, marker=marker, linestyle="none", label=crit, zorder=3,
                        elinewidth=0.8, capthick=0.8, markersize=4)
        for i in range(1, len(groups)):
            ax.axvline(i - 0.5, color="0.85", linewidth=0.5, zorder=1)
        labels = []
        for target, pattern, dist, lab in groups:
            text = f"{pattern.replace('block', 'block ')}\n{target * _PCT:g} %"
            if many_dist:
                text += f"\n{dist}"
            if many_impl:
                text += f"\n{lab}"
            labels.append(text)
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels(labels, fontsize=6)
        ax.grid(axis="x", visible=False)
        ax.set_xlim(-0.5, len(groups) - 0.5)
        low = float(np.nanmin(agg["mean"] - agg["std"])) * _PCT
        top = max(float(np.nanmax(agg["mean"] + agg["std"])) * _PCT,
                  (dense["mean"].iloc[0] + dense["std"].iloc[0]) * _PCT if not dense.empty else 0.0)
        pad = max(0.5, 0.08 * (top - low))
        ax.set_ylim(max(0.0, low - pad), min(100.0, top + 2.5 * pad))
        ax.set_ylabel(_ACC_LABEL)
        ax.legend(loc="upper right", ncols=len(crits) + (0 if dense.empty else 1), fontsize=5.5, handlelength=1.2,
                  columnspacing=0.8)
    return fig


# -- the methods sweep: GMP, static, SET, RigL, IMP --------------------------------

METHOD_ORDER = ["gmp", "one_shot", "snip", "static", "set", "rigl", "imp"]
_METHOD_STYLES = {
    "gmp": (OKABE_ITO["blue"], "o"),
    "one_shot": (OKABE_ITO["sky_blue"], "v"),
    "snip": (OKABE_ITO["yellow"], "<"),
    "static": ("#7f7f7f", "s"),
    "set": (OKABE_ITO["orange"], "D"),
    "rigl": (OKABE_ITO["vermillion"], "^"),
    "imp": (OKABE_ITO["bluish_green"], "P"),
}
IMP_VARIANTS = ["ticket", "reinit", "random"]
_VARIANT_STYLES = {
    "ticket": (OKABE_ITO["bluish_green"], "P", "-"),
    "reinit": (OKABE_ITO["reddish_purple"], "x", "--"),
    "random": ("#7f7f7f", "s", ":"),
}
_VARIANT_LABELS = {"ticket": "IMP ticket (rewound)", "reinit": "same mask, reinitialised", "random": "random mask, same init"}


def _method_rank(name: str) -> tuple[int, str]:
    return (METHOD_ORDER.index(name) if name in METHOD_ORDER else len(METHOD_ORDER), name)


def varies_method(runs: pd.DataFrame) -> bool:
    """Whether the sparse runs of ``runs`` differ in method (a sweep over the method axis)."""
    if "method" not in runs.columns:
        return False
    return runs.loc[runs["implementation"].astype(str) != "dense", "method"].nunique() > 1


def imp_ticket_points(runs: pd.DataFrame, levels: pd.DataFrame, tolerance: float = 0.005) -> pd.DataFrame:
    """IMP's accuracy at the sweep's other sparsities, from its ticket levels.

    For every IMP run and every target sparsity of the sweep's other sparse
    runs up to the IMP run's own, the ticket level whose measured sparsity is
    closest (within ``tolerance``; the ``stops`` of the method make levels land
    there) gives one point.

    Args:
        runs: :func:`tidy_runs` output with ``method``.
        levels: The IMP runs' ``levels.csv`` rows, with a ``run_id`` column.
        tolerance: Largest accepted ``|measured - target|``.

    Returns:
        Columns ``run_id, seed, target, test_accuracy, level``.

    Raises:
        ValueError: a target sparsity has no ticket level within ``tolerance``
            (a stop is missing), or ``levels`` lacks a column.
    """
    missing = [c for c in ("run_id", "level", "variant", "sparsity", "test_accuracy") if c not in levels.columns]
    if missing:
        raise ValueError(f"levels: missing columns {missing}")
    others = runs[(runs["label"] != "dense") & (runs["method"] != "imp")]
    targets = sorted(set(others["target"]))
    rows = []
    for r in runs[runs["method"] == "imp"].itertuples():
        ticket = levels[(levels["run_id"] == r.run_id) & (levels["variant"] == "ticket")]
        for t in [t for t in targets if t <= r.target + 1e-9] or [r.target]:
            if ticket.empty:
                raise ValueError(f"levels: IMP run {r.run_id} has no ticket rows")
            i = (ticket["sparsity"] - t).abs().idxmin()
            if abs(ticket.loc[i, "sparsity"] - t) > tolerance:
                raise ValueError(
                    f"levels: IMP run {r.run_id} has no ticket level at sparsity {t:g} (closest "
                    f"{ticket.loc[i, 'sparsity']:.4f}); give the method stops = [...] at the sweep's sparsities"
                )
            rows.append(dict(run_id=r.run_id, seed=r.seed, target=t, test_accuracy=ticket.loc[i, "test_accuracy"],
                             level=int(ticket.loc[i, "level"])))
    return pd.DataFrame(rows, columns=["run_id", "seed", "target", "test_accuracy", "level"])


def plot_accuracy_by_method(runs: pd.DataFrame, levels: pd.DataFrame | None = None, ax: Axes | None = None) -> Figure:
    """Test accuracy vs sparsity, one line per method, mean ± std over seeds; dense as the reference line.

    IMP's points are its ticket levels at the sweep's sparsities
    (:func:`imp_ticket_points`), so one IMP run per seed gives every sparsity.

    Args:
        runs: :func:`tidy_runs` output for one (dataset, model), with ``method``.
        levels: The IMP runs' ``levels.csv`` rows (``run_id`` column); needed if there is an IMP run.

    Raises:
        ValueError: no sparse run, or IMP runs without levels.
    """
    _single_pair(runs)
    sparse = runs[runs["label"] != "dense"]
    if sparse.empty:
        raise ValueError("runs: no sparse run to compare")
    points = sparse[sparse["method"] != "imp"][["method", "target", "seed", "test_accuracy"]]
    if (sparse["method"] == "imp").any():
        if levels is None:
            raise ValueError("runs: IMP runs need their levels.csv rows (levels=...)")
        imp = imp_ticket_points(runs, levels).assign(method="imp")
        points = pd.concat([points, imp[["method", "target", "seed", "test_accuracy"]]], ignore_index=True)
    agg = aggregate(points, "test_accuracy", by=["method", "target"])
    with use_style():
        fig, ax = _new_figure(2.5, ax)
        dense = aggregate(runs[runs["label"] == "dense"], "test_accuracy")
        if not dense.empty:
            _dense_band(ax, dense["mean"].iloc[0] * _PCT, dense["std"].iloc[0] * _PCT, "dense")
        for method in sorted(set(agg["method"]), key=_method_rank):
            a = agg[agg["method"] == method].sort_values("target")
            color, marker = _METHOD_STYLES.get(method, (style_for(method)["color"], style_for(method)["marker"]))
            x, mean, std = a["target"].to_numpy(), a["mean"].to_numpy() * _PCT, a["std"].to_numpy() * _PCT
            ax.fill_between(x, mean - std, mean + std, color=color, alpha=0.15, linewidth=0, zorder=2)
            ax.plot(x, mean, color=color, marker=marker, label=method.replace("_", "-"), zorder=3, markersize=3.5)
        sparsity_axis(ax, sorted(set(agg["target"])))
        ax.set_ylabel(_ACC_LABEL)
        ax.legend(loc="lower left", ncols=2, fontsize=6)
    return fig


def plot_imp_levels(levels: pd.DataFrame, ax: Axes | None = None) -> Figure:
    """IMP: test accuracy vs fraction of weights remaining (log), per level; ticket vs its two controls.

    Mean ± std over the IMP runs (seeds) of each (level, variant); x is the
    mean measured fraction remaining of the level's ticket.

    Args:
        levels: ``levels.csv`` rows of one (dataset, model), with ``run_id``.

    Raises:
        ValueError: no ticket rows, or a column is missing.
    """
    missing = [c for c in ("run_id", "level", "variant", "remaining", "test_accuracy") if c not in levels.columns]
    if missing:
        raise ValueError(f"levels: missing columns {missing}")
    if not (levels["variant"] == "ticket").any():
        raise ValueError("levels: no ticket rows")
    ok = levels[levels["status"].astype(str) == "ok"] if "status" in levels.columns else levels
    x_of = ok[ok["variant"] == "ticket"].groupby("level")["remaining"].mean()
    agg = aggregate(ok, "test_accuracy", by=["variant", "level"])
    with use_style():
        fig, ax = _new_figure(2.5, ax)
        for variant in [v for v in IMP_VARIANTS if v in set(agg["variant"])]:
            a = agg[(agg["variant"] == variant) & agg["level"].isin(x_of.index)].sort_values("level")
            if variant != "ticket":  # the controls start where the ticket does: level 0 is the dense training
                a = pd.concat([agg[(agg["variant"] == "ticket") & (agg["level"] == 0)], a])
            color, marker, ls = _VARIANT_STYLES[variant]
            x = x_of.loc[a["level"]].to_numpy() * _PCT
            mean, std = a["mean"].to_numpy() * _PCT, a["std"].to_numpy() * _PCT
            ax.fill_between(x, mean - std, mean + std, color=color, alpha=0.15, linewidth=0, zorder=2)
            ax.plot(x, mean, color=color, marker=marker, linestyle=ls, label=_VARIANT_LABELS[variant], zorder=3,
                    markersize=3.5)
        ax.set_xscale("log")
        ax.invert_xaxis()
        lo = float(np.nanmin(x_of.to_numpy())) * _PCT
        ax.xaxis.set_major_locator(FixedLocator([t for t in (100, 50, 20, 10, 5, 2, 1, 0.5) if t >= lo * 0.999]))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel("Weights remaining (%)")
        ax.set_ylabel(_ACC_LABEL)
        ax.legend(loc="lower left", fontsize=6)
    return fig


def plot_mask_changes(updates: pd.DataFrame) -> Figure:
    """SET and RigL: fraction of the live weights whose mask changed at each update, vs step.

    Per run and update, ``sum(dropped) / sum(live)`` over the weights; mean
    over seeds; one panel per method, one line per target sparsity.

    Args:
        updates: ``mask_updates.csv`` rows with ``method``, ``target``, ``run_id``.

    Raises:
        ValueError: no rows, or a column is missing.
    """
    missing = [c for c in ("run_id", "method", "target", "step", "live", "dropped") if c not in updates.columns]
    if missing:
        raise ValueError(f"updates: missing columns {missing}")
    if updates.empty:
        raise ValueError("updates: no mask update to draw")
    per_run = updates.groupby(["method", "target", "run_id", "step"], sort=True)[["dropped", "live"]].sum().reset_index()
    per_run["changed"] = per_run["dropped"] / per_run["live"]
    agg = aggregate(per_run, "changed", by=["method", "target", "step"])
    methods = sorted(set(agg["method"]), key=_method_rank)
    targets = sorted(set(agg["target"]))
    shades = np.linspace(0.4, 1.0, len(targets)) if len(targets) > 1 else np.ones(1)
    with use_style():
        fig = Figure(figsize=(3.3, 1.2 + 1.1 * len(methods)))
        axs = fig.subplots(len(methods), 1, sharex=True, squeeze=False)[:, 0]
        for ax, method in zip(axs, methods):
            color, marker = _METHOD_STYLES.get(method, (style_for(method)["color"], style_for(method)["marker"]))
            for shade, t in zip(shades, targets):
                a = agg[(agg["method"] == method) & (agg["target"] == t)]
                if not a.empty:
                    ax.plot(a["step"], a["mean"] * _PCT, color=color, alpha=float(shade), marker=marker,
                            markersize=2, linewidth=0.9, label=f"{t * _PCT:g} %")
            ax.set_ylabel(f"{method.upper() if method == 'set' else 'RigL' if method == 'rigl' else method}\nchanged (%)")
            top = float(agg.loc[agg["method"] == method, "mean"].max()) * _PCT
            ax.set_ylim(0.0, max(top * 1.25, 1.0))
            ax.legend(loc="upper right", fontsize=5.5, ncols=min(4, len(targets)), title="sparsity", title_fontsize=5.5)
        axs[-1].set_xlabel("Training step")
    return fig
