"""Accuracy against measured latency: large-sparse against small-dense (``benchmarks/deployed_latency.py``)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FormatStrFormatter

from experiments.plots.style import ACC_LABEL, OKABE_ITO, PCT, use_style

__all__ = ["FAMILY_STYLES", "RUNTIMES", "accuracy_vs_latency"]

FAMILY_STYLES = {
    "unstructured": (OKABE_ITO["blue"], "o", "-"),
    "block 1x16": (OKABE_ITO["vermillion"], "s", "-"),
    "2:4": (OKABE_ITO["reddish_purple"], "D", "none"),
    "3:4": (OKABE_ITO["reddish_purple"], "d", "none"),
    "channel": (OKABE_ITO["orange"], "v", "-"),
    "small dense": ("#000000", "^", "--"),
    "dense": ("#000000", "*", "none"),
}


RUNTIMES = {"latency_ms": "TF graph", "litert_ms": "LiteRT"}
"""The latency columns drawn, one row of panels each, when the table has them: the deployed model in a
``tf.function``, and the same weights in LiteRT's dense interpreter."""


def accuracy_vs_latency(table: pd.DataFrame) -> Figure:
    """Test accuracy (mean over seeds with its 95% interval) against latency, one panel per batch size and runtime.

    Args:
        table: ``results/fmnist_lenet300/latency.csv`` (columns ``family``, ``batch``,
            ``latency_ms``, ``accuracy``, ``accuracy_low``, ``accuracy_high``, ``weights``;
            with ``litert_ms``, a second row of panels for LiteRT).

    Raises:
        ValueError: a required column is missing, or the table has no rows or no timed latency at all.
    """
    need = {"family", "batch", "latency_ms", "accuracy", "accuracy_low", "accuracy_high", "weights"}
    missing = sorted(need - set(table.columns))
    if missing:
        raise ValueError(f"the latency table lacks columns {missing}")
    batches = sorted(table["batch"].unique())
    runtimes = [c for c in RUNTIMES if c in table.columns and table[c].notna().any()]
    if not batches or not runtimes:
        raise ValueError(f"the latency table has no timed latency to draw (rows: {len(table)}; every one of "
                         f"{[c for c in RUNTIMES if c in table.columns]} is empty)")
    with use_style():
        fig = Figure(figsize=(3.4 * len(batches), 3.0 * len(runtimes)), layout="constrained")
        grid = fig.subplots(len(runtimes), len(batches), squeeze=False)
        for row, column in zip(grid, runtimes):
            for ax, batch in zip(row, batches):
                part = table[table["batch"] == batch]
                for family, (color, marker, line) in FAMILY_STYLES.items():
                    f = part[part["family"] == family].sort_values("weights")
                    if f.empty:
                        continue
                    y = f["accuracy"].to_numpy() * PCT
                    err = np.vstack([y - f["accuracy_low"].to_numpy() * PCT, f["accuracy_high"].to_numpy() * PCT - y])
                    err = np.nan_to_num(err, nan=0.0)
                    ax.errorbar(f[column], y, yerr=err, color=color, marker=marker, linestyle=line,
                                markersize=4, capsize=2, linewidth=1, label=family)
                ax.xaxis.set_major_formatter(FormatStrFormatter("%g"))
                ax.set_xlabel(f"{RUNTIMES[column]} latency at batch {batch} (ms)")
                ax.set_title(f"{RUNTIMES[column]}, batch {batch}")
            row[0].set_ylabel(ACC_LABEL)
        grid[0][-1].legend(fontsize=7, loc="lower right")
    return fig
