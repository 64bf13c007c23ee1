"""The paper sweep's figures: accuracy, step time, latency and FLOPs against sparsity, and training curves."""

from __future__ import annotations

from typing import Sequence

import matplotlib
import matplotlib.ticker
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from experiments.plots.style import (
    ACC_LABEL,
    PCT,
    aggregate,
    crossover,
    dense_band,
    density_from_position,
    density_position,
    line_with_band,
    log_y,
    new_figure,
    ordered,
    pareto_front,
    single_pair,
    sparse_labels,
    sparsity_axis,
    style_for,
    use_style,
)

__all__ = [
    "plot_accuracy_vs_sparsity",
    "plot_step_time_vs_sparsity",
    "plot_latency_vs_sparsity",
    "plot_accuracy_vs_flops",
    "plot_accuracy_curves",
]

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
    single_pair(runs)
    with use_style():
        fig, ax = new_figure(2.4, ax)
        agg = aggregate(runs, "test_accuracy")
        dense = agg[agg["label"] == "dense"]
        if not dense.empty:
            dense_band(ax, dense["mean"].iloc[0] * PCT, dense["std"].iloc[0] * PCT, "dense (mean ± std)")
        for lab in sparse_labels(agg):
            g = agg[agg["label"] == lab]
            line_with_band(ax, g["target"].to_numpy(), g["mean"].to_numpy() * PCT, g["std"].to_numpy() * PCT, lab)
        if diverged is not None and not diverged.empty:
            cells = diverged.groupby(["label", "target"], sort=True).size().reset_index(name="n")
            for lab, g in cells.groupby("label", sort=True):
                style = style_for(lab)
                ax.plot(g["target"], np.zeros(len(g)), transform=ax.get_xaxis_transform(), linestyle="none",
                        marker="x", color=style.get("color"), clip_on=False,
                        label=f"{lab}: diverged ({int(g['n'].sum())})")
        sparsity_axis(ax, agg["target"])
        ax.set_ylabel(ACC_LABEL)
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
    single_pair(runs)
    dense = pd.to_numeric(runs.loc[runs["label"] == "dense", "step_time_ms"], errors="coerce").dropna()
    if dense.empty:
        raise ValueError("runs: no finished dense run with a step_time_ms; the relative step time needs one")
    rel = runs.assign(relative=pd.to_numeric(runs["step_time_ms"], errors="coerce") / dense.mean())
    with use_style():
        fig, ax = new_figure(2.4, ax)
        agg = aggregate(rel, "relative")
        d = agg[agg["label"] == "dense"]
        dense_band(ax, 1.0, float(d["std"].iloc[0]) if not d.empty else 0.0, "dense (= 1)")
        targets = np.array(sorted(agg["target"].unique()))
        grid = density_from_position(np.linspace(density_position(targets[0]), density_position(targets[-1]), 50))
        ax.plot(grid, 1.0 - grid, color="0.45", linestyle=":", linewidth=1.0, label="ideal (1/density speed-up)", zorder=2)
        for lab in sparse_labels(agg):
            g = agg[agg["label"] == lab]
            line_with_band(ax, g["target"].to_numpy(), g["mean"].to_numpy(), g["std"].to_numpy(), lab)
        sparsity_axis(ax, targets)
        log_y(ax)
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
    single_pair(runs)
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
            dense_band(ax, dmean, dstd, "dense ± std")
            targets = np.array(sorted(agg["target"].unique()))
            grid = density_from_position(np.linspace(density_position(targets[0]), density_position(targets[-1]), 50))
            ax.plot(grid, dmean * (1.0 - grid), color="0.45", linestyle=":", linewidth=1.0, label="ideal ∝ density")
            for lab in sparse_labels(agg):
                g = agg[agg["label"] == lab]
                x, m = g["target"].to_numpy(), g["mean"].to_numpy()
                line_with_band(ax, x, m, g["std"].to_numpy(), lab)
                s = crossover(x, m, dmean) if len(x) > 1 else None
                if s is not None:
                    col = style_for(lab)["color"]
                    ax.axvline(s, color=col, linestyle=":", linewidth=0.8, zorder=1)
                    ax.plot([s], [dmean], linestyle="none", marker="x", markersize=6, markeredgewidth=1.4, color=col, zorder=4)
            log_y(ax)
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
    single_pair(runs)
    acc = aggregate(runs, "test_accuracy")
    flops = aggregate(runs, "nonzero_flops").rename(columns={"mean": "flops"})[["label", "target", "flops"]]
    pts = acc.merge(flops, on=["label", "target"], how="inner")
    with use_style():
        fig, ax = new_figure(2.4, ax)
        front = pts.iloc[pareto_front(pts["flops"], pts["mean"])]
        ax.step(front["flops"], front["mean"] * PCT, where="post", color="0.55", linewidth=1.0, label="Pareto front", zorder=1)
        for lab in ordered(pts["label"]):
            g = pts[pts["label"] == lab]
            st = style_for(lab)
            ax.errorbar(
                g["flops"], g["mean"] * PCT, yerr=g["std"] * PCT, linestyle="none", marker=st["marker"],
                color=st["color"], markerfacecolor="none" if lab != "dense" else st["color"], label=lab, zorder=3,
            )
        ax.set_xscale("log")
        ax.set_xlabel("Nonzero FLOPs per example (forward)")
        ax.set_ylabel(ACC_LABEL)
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
    single_pair(runs)
    chosen = runs[(np.isclose(runs["target"], sparsity)) & (runs["label"] != "dense")]
    if chosen.empty:
        have = sorted(runs.loc[runs["label"] != "dense", "target"].unique().tolist())
        raise ValueError(f"sparsity: no finished sparse run at target sparsity {sparsity!r}; the sweep has {have}")
    shown = pd.concat([runs[runs["label"] == "dense"], chosen])
    acc = curves[curves["metric"] == "test_accuracy"].merge(shown[["run_id", "label"]], on="run_id", how="inner")
    agg = aggregate(acc, "value", by=("label", "epoch"))
    with use_style():
        fig, ax = new_figure(2.4, ax)
        for lab in ordered(agg["label"]):
            g = agg[agg["label"] == lab]
            kw = {"linestyle": "--", "markersize": 3} if lab == "dense" else {"markersize": 3}
            line_with_band(ax, g["epoch"].to_numpy(), g["mean"].to_numpy() * PCT, g["std"].to_numpy() * PCT, lab, **kw)
        if {"schedule_unit", "schedule_end"} <= set(chosen.columns):
            units = chosen["schedule_unit"].astype(str).unique()
            ends = pd.to_numeric(chosen["schedule_end"], errors="coerce").dropna().unique()
            if len(units) == 1 and units[0] == "epochs" and len(ends) == 1:
                ax.axvline(float(ends[0]), color="0.45", linestyle=":", linewidth=0.9)
                ax.annotate("pruning ends", (float(ends[0]), 0.02), xycoords=("data", "axes fraction"),
                            xytext=(-2, 0), textcoords="offset points", ha="right", va="bottom", fontsize=6.5, color="0.3")
        ax.set_xlabel("Epoch")
        ax.set_ylabel(ACC_LABEL)
        ax.set_title(f"Target sparsity {sparsity * PCT:g} %")
        ax.legend(loc="lower right")
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    return fig
