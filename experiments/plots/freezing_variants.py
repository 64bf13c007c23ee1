"""The partial-freezing experiment's figure."""

from __future__ import annotations

import matplotlib
import matplotlib.patches
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from experiments.plots.style import ACC_LABEL, OKABE_ITO, PCT, new_figure, use_style

__all__ = ["plot_partial_freezing"]

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
        fig, ax = new_figure(0.3 * len(r) + 0.8, ax)
        y = np.arange(len(r))[::-1]
        ax.barh(y, r["test_accuracy"] * PCT, color=[OKABE_ITO["blue"] if f else OKABE_ITO["orange"] for f in fixed],
                hatch=["" if f else "///" for f in fixed], edgecolor="white", linewidth=0.5)
        ax.set_yticks(y, r["name"])
        lo = float(r["test_accuracy"].min() * PCT)
        ax.set_xlim(max(0.0, lo - 10.0), min(100.0, float(r["test_accuracy"].max() * PCT) + 4.0))
        ax.set_xlabel(ACC_LABEL)
        ax.grid(axis="y", visible=False)
        ax.legend(
            handles=[matplotlib.patches.Patch(color=OKABE_ITO["blue"], label="pretrained rows bitwise fixed"),
                     matplotlib.patches.Patch(facecolor=OKABE_ITO["orange"], hatch="///", edgecolor="white", label="pretrained rows drift")],
            loc="lower left", bbox_to_anchor=(0.0, 1.01), borderaxespad=0.0, ncols=1,
        )
        for yi, acc in zip(y, r["test_accuracy"] * PCT):
            ax.annotate(f"{acc:.1f}", (acc, yi), xytext=(2, 0), textcoords="offset points", va="center", fontsize=6.5)
    return fig
