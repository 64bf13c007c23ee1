"""The methods sweep's figures: GMP, one-shot, SNIP, static, SET, RigL and IMP (its levels and controls)."""

from __future__ import annotations

import matplotlib
import matplotlib.ticker
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter

from experiments.library_names import imp as imp_library
from experiments.plots.style import (
    ACC_LABEL,
    OKABE_ITO,
    PCT,
    aggregate,
    dense_band,
    new_figure,
    single_pair,
    sparsity_axis,
    style_for,
    use_style,
)

__all__ = [
    "METHOD_ORDER",
    "IMP_VARIANTS",
    "varies_method",
    "imp_ticket_points",
    "plot_accuracy_by_method",
    "plot_imp_levels",
    "plot_mask_changes",
]

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
IMP_VARIANTS = list(imp_library.VARIANTS)
"""IMP's variants in row order (:data:`prune.training.imp.VARIANTS`)."""
_VARIANT_STYLES = {
    "ticket": (OKABE_ITO["bluish_green"], "P", "-"),
    "reinit": (OKABE_ITO["reddish_purple"], "x", "--"),
    "random": ("#7f7f7f", "s", ":"),
}
_VARIANT_LABELS = {"ticket": "IMP ticket (rewound)", "reinit": "same mask, reinitialised", "random": "random mask, same init"}


def _method_rank(name: str) -> tuple[int, str]:
    return (METHOD_ORDER.index(name) if name in METHOD_ORDER else len(METHOD_ORDER), name)


def varies_method(runs: pd.DataFrame) -> bool:
    """Whether ``runs`` get the method figures: their sparse runs differ in method (a sweep over the method
    axis), or use one method other than ``gmp`` (an IMP-only sweep: its figures are its levels)."""
    if "method" not in runs.columns:
        return False
    methods = runs.loc[runs["implementation"].astype(str) != "dense", "method"].astype(str)
    return methods.nunique() > 1 or bool((methods != "gmp").any())


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
    single_pair(runs)
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
        fig, ax = new_figure(2.5, ax)
        dense = aggregate(runs[runs["label"] == "dense"], "test_accuracy")
        if not dense.empty:
            dense_band(ax, dense["mean"].iloc[0] * PCT, dense["std"].iloc[0] * PCT, "dense")
        for method in sorted(set(agg["method"]), key=_method_rank):
            a = agg[agg["method"] == method].sort_values("target")
            color, marker = _METHOD_STYLES.get(method, (style_for(method)["color"], style_for(method)["marker"]))
            x, mean, std = a["target"].to_numpy(), a["mean"].to_numpy() * PCT, a["std"].to_numpy() * PCT
            ax.fill_between(x, mean - std, mean + std, color=color, alpha=0.15, linewidth=0, zorder=2)
            ax.plot(x, mean, color=color, marker=marker, label=method.replace("_", "-"), zorder=3, markersize=3.5)
        sparsity_axis(ax, sorted(set(agg["target"])))
        ax.set_ylabel(ACC_LABEL)
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
        fig, ax = new_figure(2.5, ax)
        for variant in [v for v in IMP_VARIANTS if v in set(agg["variant"])]:
            a = agg[(agg["variant"] == variant) & agg["level"].isin(x_of.index)].sort_values("level")
            if variant != "ticket":  # the controls start where the ticket does: level 0 is the dense training
                a = pd.concat([agg[(agg["variant"] == "ticket") & (agg["level"] == 0)], a])
            fallback = style_for(variant)  # a variant added to prune.training.imp later: a stable colour of its own
            color, marker, ls = _VARIANT_STYLES.get(variant, (fallback["color"], fallback["marker"], "-."))
            x = x_of.loc[a["level"]].to_numpy() * PCT
            mean, std = a["mean"].to_numpy() * PCT, a["std"].to_numpy() * PCT
            ax.fill_between(x, mean - std, mean + std, color=color, alpha=0.15, linewidth=0, zorder=2)
            label = _VARIANT_LABELS.get(variant, variant)
            ax.plot(x, mean, color=color, marker=marker, linestyle=ls, label=label, zorder=3, markersize=3.5)
        ax.set_xscale("log")
        ax.invert_xaxis()
        lo = float(np.nanmin(x_of.to_numpy())) * PCT
        ax.xaxis.set_major_locator(FixedLocator([t for t in (100, 50, 20, 10, 5, 2, 1, 0.5) if t >= lo * 0.999]))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel("Weights remaining (%)")
        ax.set_ylabel(ACC_LABEL)
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
                    ax.plot(a["step"], a["mean"] * PCT, color=color, alpha=float(shade), marker=marker,
                            markersize=2, linewidth=0.9, label=f"{t * PCT:g} %")
            ax.set_ylabel(f"{method.upper() if method == 'set' else 'RigL' if method == 'rigl' else method}\nchanged (%)")
            top = float(agg.loc[agg["method"] == method, "mean"].max()) * PCT
            ax.set_ylim(0.0, max(top * 1.25, 1.0))
            ax.legend(loc="upper right", fontsize=5.5, ncols=min(4, len(targets)), title="sparsity", title_fontsize=5.5)
        axs[-1].set_xlabel("Training step")
    return fig
