"""The pattern x criterion figure of a sweep over the pruning axes."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from experiments.plots.style import (
    ACC_LABEL,
    OKABE_ITO,
    PCT,
    aggregate,
    dense_band,
    new_figure,
    order_key,
    single_pair,
    style_for,
    use_style,
)

__all__ = ["AXIS_DEFAULTS", "CRITERION_ORDER", "varies_pruning_axes", "plot_accuracy_by_pattern"]

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
    single_pair(runs)
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
        key=lambda g: (g[0], _pattern_rank(g[1]), g[2], order_key(g[3])),
    )
    crits = sorted(set(agg["criterion"]), key=lambda c: (CRITERION_ORDER.index(c) if c in CRITERION_ORDER else 99, c))
    many_dist = agg["distribution"].nunique() > 1
    many_impl = agg["label"].nunique() > 1
    width = 0.8 / len(crits)
    with use_style():
        fig, ax = new_figure(2.5, ax)
        dense = aggregate(runs[runs["label"] == "dense"], "test_accuracy")
        if not dense.empty:
            dense_band(ax, dense["mean"].iloc[0] * PCT, dense["std"].iloc[0] * PCT, "dense (mean ± std)")
        for j, crit in enumerate(crits):
            x, mean, std = [], [], []
            for i, g in enumerate(groups):
                row = agg[(agg[keys] == pd.Series(g, index=keys)).all(axis=1) & (agg["criterion"] == crit)]
                if not row.empty:
                    x.append(i - 0.4 + (j + 0.5) * width)
                    mean.append(row["mean"].iloc[0] * PCT)
                    std.append(row["std"].iloc[0] * PCT)
            color, marker = _CRITERION_STYLES.get(crit, (style_for(crit)["color"], style_for(crit)["marker"]))
            ax.errorbar(x, mean, yerr=std, color=color, marker=marker, linestyle="none", label=crit, zorder=3,
                        elinewidth=0.8, capthick=0.8, markersize=4)
        for i in range(1, len(groups)):
            ax.axvline(i - 0.5, color="0.85", linewidth=0.5, zorder=1)
        labels = []
        for target, pattern, dist, lab in groups:
            text = f"{pattern.replace('block', 'block ')}\n{target * PCT:g} %"
            if many_dist:
                text += f"\n{dist}"
            if many_impl:
                text += f"\n{lab}"
            labels.append(text)
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels(labels, fontsize=6)
        ax.grid(axis="x", visible=False)
        ax.set_xlim(-0.5, len(groups) - 0.5)
        low = float(np.nanmin(agg["mean"] - agg["std"])) * PCT
        top = max(float(np.nanmax(agg["mean"] + agg["std"])) * PCT,
                  (dense["mean"].iloc[0] + dense["std"].iloc[0]) * PCT if not dense.empty else 0.0)
        pad = max(0.5, 0.08 * (top - low))
        ax.set_ylim(max(0.0, low - pad), min(100.0, top + 2.5 * pad))
        ax.set_ylabel(ACC_LABEL)
        ax.legend(loc="upper right", ncols=len(crits) + (0 if dense.empty else 1), fontsize=5.5, handlelength=1.2,
                  columnspacing=0.8)
    return fig
