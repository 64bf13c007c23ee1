"""The end-of-sweep summary: accuracy and speed by implementation x sparsity, mean +- std over seeds."""

from __future__ import annotations

import numpy as np
import pandas as pd

__all__ = ["summarize", "overhead", "format_summary", "kernel_note"]

_METRICS = {
    "test_accuracy": "accuracy",
    "sparsity": "achieved sparsity",
    "step_time_ms": "step ms",
    "latency_b1_ms": "latency b1 ms",
    "latency_b256_ms": "latency b256 ms",
}

_AXES = {"pattern": "unstructured", "criterion": "magnitude", "distribution": "layer", "method": "gmp"}
_KEYS = ["dataset", "model", "schedule", "implementation", "method", "pattern", "criterion", "distribution", "target_sparsity"]


def _label(df: pd.DataFrame) -> pd.Series:
    matmul = df["matmul"].fillna("").astype(str)
    return df["implementation"].where(matmul.isin(["", "auto"]), df["implementation"] + "-" + matmul)


def summarize(runs: pd.DataFrame) -> pd.DataFrame:
    """Numeric summary of the finished runs of ``runs.csv``.

    Means and standard deviations are over the ``ok`` runs only. A run with
    status ``diverged`` (its loss became NaN or infinite) is counted in the
    ``diverged`` column of its cell and nowhere else; a cell whose every seed
    diverged has a row with NaN metrics and ``seeds == 0``. Failed runs are
    left out entirely (they are listed by ``status``).

    Returns:
        One row per (dataset, model, schedule, implementation, method, pattern,
        criterion, distribution, target_sparsity) with
        ``<metric>_mean``, ``<metric>_std`` for each metric, ``seeds`` (the ok
        runs whose accuracy is averaged) and ``diverged``.
    """
    runs = runs.copy()
    for metric in _METRICS:  # a diverged row may lack measurements; keep the columns numeric
        runs[metric] = pd.to_numeric(runs[metric], errors="coerce") if metric in runs.columns else np.nan
    done = runs[runs["status"].isin(["ok", "diverged"])].copy()
    if done.empty:
        return pd.DataFrame()
    done["implementation"] = _label(done)
    for col, default in _AXES.items():  # a table from before the axes: the defaults those runs used
        if col not in done.columns:
            done[col] = np.where(done["implementation"] == "dense", "", default)
        done[col] = done[col].fillna("").astype(str)  # empty for dense, which groupby would drop as NaN
    keys = _KEYS
    ok = done[done["status"] == "ok"]
    cells = done.groupby(keys).size().rename("runs")
    agg = ok.groupby(keys)[list(_METRICS)].agg(["mean", "std"])
    agg.columns = [f"{m}_{s}" for m, s in agg.columns]
    agg = agg.reindex(cells.index)
    # the rows whose accuracy was averaged (not the distinct seed values: a row without an accuracy is not averaged)
    agg["seeds"] = ok.groupby(keys)["test_accuracy"].count().reindex(cells.index).fillna(0).astype(int)
    agg["diverged"] = (done["status"] == "diverged").groupby([done[k] for k in keys]).sum().reindex(cells.index).astype(int)
    return agg.reset_index()


def format_summary(summary: pd.DataFrame) -> str:
    """``mean ± std`` text table of :func:`summarize`; a one-seed cell shows ``(n=1)``, not ``± 0``."""
    if summary.empty:
        return "(no finished runs)"
    # the axis columns only where the sweep varies them (a sweep without the axes prints as before)
    shown = [k for k in _KEYS if k in summary.columns and (k not in _AXES or not summary[k].isin(["", _AXES[k]]).all())]
    out = summary[shown].copy()
    for metric, title in _METRICS.items():
        digits = 4 if metric in ("test_accuracy", "sparsity") else 3
        mean, std, seeds = summary[f"{metric}_mean"], summary[f"{metric}_std"], summary["seeds"]
        out[title] = [
            "n/a" if not np.isfinite(m) else f"{m:.{digits}f} (n={int(n)})" if n < 2 or not np.isfinite(s)
            else f"{m:.{digits}f} ± {s:.{digits}f}"
            for m, s, n in zip(mean, std, seeds)
        ]
        if "diverged" in summary:  # a cell where every seed diverged
            out.loc[(summary["seeds"] == 0).to_numpy(), title] = "diverged"
    out["seeds"] = summary["seeds"]
    if "diverged" in summary and summary["diverged"].any():
        out["diverged"] = summary["diverged"]
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.max_rows", 500):
        return out.to_string(index=False)


def overhead(runs: pd.DataFrame) -> pd.DataFrame:
    """Mean per-run overhead by implementation: seconds a run costs beyond fit and evaluate.

    ``startup_seconds`` (process spawn and imports) is charged to the first run
    of each worker process, and the native kernels' first load (their build, on
    a machine's first use) to the first run of each worker that uses them, never
    to ``fit_seconds``; ``overhead_seconds`` adds data loading, model building,
    latency measurement and writing outputs.
    """
    ok = runs[runs["status"] == "ok"].copy()
    if ok.empty:
        return pd.DataFrame()
    ok["implementation"] = _label(ok)
    cols = ["startup_seconds", "overhead_seconds", "fit_seconds", "total_seconds"]
    table = ok.groupby("implementation")[cols].mean()
    table["runs"] = ok.groupby("implementation").size()
    return table


def kernel_note(runs: pd.DataFrame) -> str | None:
    """One line when any run of ``runs`` ran without the native kernels it asked for, else ``None``.

    Such runs timed TensorFlow's kernels (``native_kernel`` starts with
    ``tensorflow (fallback``), so their speed is not comparable with runs on
    the native ones. Tables from before the column say nothing.
    """
    if "native_kernel" not in runs:
        return None
    kernel = runs["native_kernel"].fillna("").astype(str)
    fallback = kernel[kernel.str.startswith("tensorflow (fallback")]
    if fallback.empty:
        return None
    reasons = "; ".join(sorted(set(fallback)))
    return (f"note: {len(fallback)} of {len(runs)} run(s) ran on TensorFlow's kernels, not the native ones: {reasons} "
            "(column native_kernel of runs.csv); their timings are not comparable with native runs")
