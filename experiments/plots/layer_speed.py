"""The layer benchmark's figure: one layer's speed-up over dense, per kernel (:func:`layer_speedups`)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from experiments.plots.style import (
    KERNEL_DISPLAY,
    KERNEL_ORDER,
    SPARSITY_LABEL,
    density_from_position,
    density_position,
    log_y,
    sparsity_axis,
    style_for,
    use_style,
)

__all__ = ["layer_speedups", "plot_layer_speedup"]

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
    out["_k"] = [KERNEL_ORDER.index(k) if k in KERNEL_ORDER else len(KERNEL_ORDER) for k in out["impl"]]
    out = out.sort_values(["n_in", "n_out", "mode", "batch", "_k", "impl", "sparsity"], kind="mergesort")
    return out.drop(columns="_k").reset_index(drop=True)


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
    kernels = sorted(sel["impl"].unique(), key=lambda k: (KERNEL_ORDER.index(k) if k in KERNEL_ORDER else 99, k))
    with use_style():
        fig = Figure(figsize=(3.3, 2.2))
        axes = fig.subplots(1, len(batches), sharey=True, squeeze=False)[0]
        for ax, b in zip(axes, batches):
            g = sel[sel["batch"] == b]
            targets = np.array(sorted(g["sparsity"].unique()))
            grid = density_from_position(np.linspace(density_position(targets[0]), density_position(targets[-1]), 50))
            ax.plot(grid, 1.0 / (1.0 - grid), color="0.45", linestyle=":", linewidth=1.0, label="ideal (1 / density)")
            ax.axhline(1.0, color=style_for("dense")["color"], linestyle="--", linewidth=0.9, label="dense (= 1)")
            for k in kernels:
                kg = g[g["impl"] == k]
                st = style_for(k)
                ax.plot(kg["sparsity"], kg["speedup"], color=st["color"], marker=st["marker"], markersize=3, linewidth=1.0,
                        label=KERNEL_DISPLAY.get(k, k))
            sparsity_axis(ax, [t for t in targets if t in (0.0, 0.9, 0.99)] or [targets[0], targets[-1]])
            ax.set_xlabel("")
            ax.set_title(f"batch {b}")
            log_y(ax)
        axes[0].set_ylabel("Speed-up over dense (×)")
        what = {
            "forward": "forward pass",
            "train_step": "training step",
            "forward_graph": "forward pass inside a graph",
            "train_step_graph": "training step inside a graph",
        }.get(mode, mode)
        fig.supxlabel(f"{SPARSITY_LABEL}\nlayer {n_in}×{n_out}, {what}", fontsize=8)
        handles, labels = axes[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside upper center", ncols=4)
    return fig
