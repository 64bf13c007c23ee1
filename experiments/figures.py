"""Regenerate a sweep's figures and main table from its committed tables, byte for byte.

::

    python -m experiments figures CONFIG.toml|SWEEP [--out DIR] [--results results] [--curve-sparsity S]

Reads only ``<results-root>/SWEEP/runs.csv`` and ``curves.csv``, plus
``<results-root>/benchmarks/layer_speed.csv`` where it exists, and writes into
``DIR`` (default ``<results-root>/SWEEP/figures``), as PNG and PDF:

1. ``accuracy_vs_sparsity``: accuracy vs sparsity, mean ± std over seeds, dense band.
2. ``step_time_vs_sparsity``: training step time relative to dense, ideal 1/density.
3. ``latency_vs_sparsity``: inference latency at batch 1 and 256, ideal, crossovers.
4. ``accuracy_vs_flops``: accuracy vs nonzero FLOPs with the Pareto front.
5. ``accuracy_curves``: test accuracy per epoch at one sparsity (``--curve-sparsity``).
6. ``layer_speedup_<n_in>x<n_out>_<mode>``: the layer benchmark's speed-up per
   kernel and batch size (only when the benchmark table exists).
7. ``accuracy_vs_latency``: test accuracy against measured latency of the deployed
   models (only when ``<results-root>/SWEEP/latency.csv`` exists, written by
   ``benchmarks/deployed_latency.py``).

and ``main_table.tex``: accuracy ± std and speed by implementation × sparsity
(pandas ``to_latex``). A sweep with several (dataset, model) pairs gets one set
per pair, suffixed ``_<dataset>_<model>``.

A sweep whose sparse runs differ in pattern, criterion or distribution (the
runner's pruning axes, e.g. ``experiments/configs/patterns.toml``) gets one
figure instead, ``accuracy_by_pattern``: accuracy by pattern and criterion at
each sparsity, with the dense band. The figures above have one line per
implementation and would mix those runs.

A sweep whose sparse runs differ in method (e.g. ``experiments/configs/methods.toml``)
gets the method figures instead, reading also each IMP run's ``levels.csv`` and
each SET/RigL run's ``mask_updates.csv`` under ``runs/<run_id>/``:

* ``accuracy_by_method``: accuracy vs sparsity per method, mean ± std over seeds,
  dense as the reference line; IMP's points are its ticket levels at the
  sweep's sparsities (one IMP run per seed, whose ``stops`` land on them);
* ``imp_levels``: IMP accuracy vs fraction of weights remaining per level (log x),
  the ticket against its controls (same mask reinitialised, random mask);
* ``mask_changes``: SET and RigL, the fraction of live weights whose mask changed
  at each update, vs step.

Byte-identical output: every figure is drawn with the project style file
(``experiments/paper.mplstyle``: fonts shipped with matplotlib, fixed sizes and
dpi, ``svg.hashsalt``), from rows sorted into one fixed order, into figures
created without pyplot; files are saved with pinned metadata (PNG: no
``Software``; PDF: no ``CreationDate``/``ModDate``, fixed ``Producer`` and
``Creator``), so nothing depends on the clock, the host or the matplotlib
build string. All inputs are read and every file is rendered in memory before
the first one is written, so bad input writes nothing. Exit status: 0 on
success, 2 for bad input.
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import pandas as pd

from experiments.library_names import DST_METHODS

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "FIGURE_NAMES",
    "PDF_METADATA",
    "PNG_METADATA",
    "load_sweep",
    "load_sweep_with_diverged",
    "load_layer_speed",
    "read_tables",
    "main_table",
    "method_tables",
    "render",
    "draw_figures",
    "main",
]

FIGURE_NAMES = ["accuracy_vs_sparsity", "step_time_vs_sparsity", "latency_vs_sparsity", "accuracy_vs_flops", "accuracy_curves"]
PNG_METADATA: dict[str, str | None] = {"Software": None}
PDF_METADATA: dict[str, str | None] = {
    "CreationDate": None,
    "ModDate": None,
    "Producer": "prune experiments.figures",
    "Creator": "prune experiments.figures",
}
_RUN_NUMERIC = [
    "target_sparsity", "seed", "test_accuracy", "sparsity", "nonzero_flops", "dense_flops",
    "step_time_ms", "latency_b1_ms", "latency_b256_ms", "schedule_end",
]


def load_sweep(
    sweep: str, results_root: str | Path = "results", notes: list[str] | None = None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Read a sweep's ``runs.csv`` and ``curves.csv``; see :func:`load_sweep_with_diverged`.

    Returns:
        ``(runs, curves)``: the finished runs with a test accuracy and their curves.
    """
    runs, curves, _ = load_sweep_with_diverged(sweep, results_root, notes)
    return runs, curves


def _sweep_folder(sweep: str, results_root: str | Path) -> Path:
    if not isinstance(sweep, str) or not sweep or "/" in sweep or sweep in (".", ".."):
        raise ValueError(f"sweep must be the name of a folder under the results root, got {sweep!r}")
    root = Path(results_root)
    if not root.is_dir():
        raise ValueError(f"results_root {str(root)!r} is not a directory")
    folder = root / sweep
    if not folder.is_dir():
        have = sorted(p.name for p in root.iterdir() if (p / "runs.csv").is_file())
        raise ValueError(f"sweep {sweep!r}: no folder {str(folder)!r}; sweeps with a runs.csv under {str(root)!r}: {have}")
    for name in ("runs.csv", "curves.csv"):
        if not (folder / name).is_file():
            raise ValueError(f"sweep {sweep!r}: {name} missing ({str(folder / name)!r} is not a file)")
    return folder


def read_tables(folder: Path, notes: list[str] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A sweep folder's ``runs.csv`` and ``curves.csv`` through the runner's checked reader, as pandas reads them.

    The rows are those ``status`` and ``run`` see (:meth:`experiments.store.Store.read`):
    each cell checked against :data:`experiments.tables.RUN_SCHEMA`, duplicates
    dropped, anything that differs from a run's ``result.json`` restored from
    it, and so are columns of :data:`experiments.tables.FIGURE_RUN_COLUMNS`
    that runs.csv lacks (one line per repair appended to ``notes``, if given).

    Raises:
        ValueError: naming the file, line and column of what nothing restores
            (a column runs.csv lacks: the file, the column and a row without a
            ``result.json``).
    """
    from experiments.store import CURVE_COLUMNS, Store, _csv_text

    store = Store(folder, hand_made=True)
    store.read()
    if store.lost:
        raise ValueError(f"{store.lost[0]}: the figures would leave that run out")
    if notes is not None:
        notes.extend(store.restored + store.warnings + store.repairs)
    text = _csv_text(store.rows.values(), store.header, header=True)
    if not store.rows and not (folder / "runs.csv").stat().st_size:
        raise ValueError(f"{folder / 'runs.csv'}: empty file (0 bytes), and no runs/*/result.json to rebuild it from")
    runs = pd.read_csv(
        io.StringIO(text),
        dtype={"run_id": str, "matmul": str, "status": str, "implementation": str}
        | {c: str for c in ("pattern", "criterion", "distribution", "method")},
    )
    curves = pd.read_csv(io.StringIO(_csv_text(store.curves, CURVE_COLUMNS, header=True)), dtype={"run_id": str, "metric": str})
    return runs, curves


def load_sweep_with_diverged(
    sweep: str, results_root: str | Path = "results", notes: list[str] | None = None
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Read a sweep's ``runs.csv`` and ``curves.csv``, checked and repaired by :func:`read_tables`.

    Args:
        sweep: Name of the folder under ``results_root`` (e.g. ``"paper"``).
        results_root: The results root.
        notes: If given, one line is appended per repair made in memory (a cell
            or row restored from a run's ``result.json``, a duplicate dropped).

    Returns:
        ``(runs, curves, diverged)``: the finished runs with a test accuracy, tidied by
        :func:`experiments.plots.style.tidy_runs`, and the curves of those runs
        sorted by run, metric and epoch, and the runs with status
        ``diverged`` (same columns), which are kept out of every mean.
        Optional columns a table lacks (``step_time_ms``, latencies, FLOPs;
        ``dataset``/``model``, then ``"unknown"``) are added empty; the
        figures that need them are skipped.

    Raises:
        ValueError: the sweep folder, ``runs.csv`` or ``curves.csv`` is
            missing, not text or damaged where nothing restores it (naming the
            file, line and column), a table lacks columns, or no run finished.
    """
    from experiments.plots.style import tidy_runs

    folder = _sweep_folder(sweep, results_root)
    runs_path = folder / "runs.csv"
    runs, curves = read_tables(folder, notes)
    for col in _RUN_NUMERIC:
        if col in runs.columns:
            runs[col] = pd.to_numeric(runs[col], errors="coerce")
        elif col not in ("target_sparsity", "seed", "test_accuracy"):  # optional: its figure is skipped
            runs[col] = float("nan")
    from experiments.plots.pruning_axes import AXIS_DEFAULTS

    for col, default in AXIS_DEFAULTS.items():  # a table from before the pruning axes: the defaults it ran with
        if col not in runs.columns:
            runs[col] = default
        runs[col] = runs[col].fillna(default).astype(str)
        runs.loc[runs["implementation"] == "dense", col] = ""
    if "method" not in runs.columns:  # a table from before the method axis: every sparse run was gmp
        runs["method"] = "gmp"
    runs["method"] = runs["method"].fillna("gmp").astype(str)
    runs.loc[runs["implementation"] == "dense", "method"] = ""
    for col in ("dataset", "model"):  # an older or hand-made table: one unnamed pair
        if col not in runs.columns:
            runs[col] = "unknown"
        runs[col] = runs[col].fillna("unknown").astype(str)
    try:
        everything = tidy_runs(runs.assign(status=runs["status"].where(runs["status"] != "diverged", "ok")))
    except ValueError as e:
        raise ValueError(f"sweep {sweep!r}: {runs_path}: {e}") from None
    diverged_ids = set(runs.loc[runs["status"] == "diverged", "run_id"])
    diverged = everything[everything["run_id"].isin(diverged_ids)].reset_index(drop=True)
    ok = everything[~everything["run_id"].isin(diverged_ids)]
    ok = ok[ok["test_accuracy"].notna()].reset_index(drop=True)
    if ok.empty:
        raise ValueError(
            f"sweep {sweep!r}: {runs_path} has no run with status 'ok' and a test_accuracy ({len(runs)} rows)"
        )
    curves = curves[curves["run_id"].isin(set(ok["run_id"]))]
    curves = curves.sort_values(["run_id", "metric", "epoch"], kind="mergesort").reset_index(drop=True)
    return ok, curves, diverged


def load_layer_speed(results_root: str | Path = "results") -> pd.DataFrame | None:
    """``<results_root>/benchmarks/layer_speed.csv`` sorted into a fixed order, or ``None`` if absent."""
    path = Path(results_root) / "benchmarks" / "layer_speed.csv"
    if not path.is_file():
        return None
    bench = pd.read_csv(path)
    keys = [c for c in ("n_in", "n_out", "mode", "batch", "sparsity", "impl") if c in bench.columns]
    return bench.sort_values(keys, kind="mergesort").reset_index(drop=True) if keys else bench


def _pm(mean: float, std: float, digits: int, n: int = 2) -> str:
    """``$mean \\pm std$``, or ``$mean$ (n=1)`` for one seed: a spread of one value is no spread."""
    if pd.isna(mean):
        return "--"
    if n < 2 or pd.isna(std):
        return f"${mean:.{digits}f}$ (n={int(n)})"
    return f"${mean:.{digits}f} \\pm {std:.{digits}f}$"


def main_table(runs: pd.DataFrame, diverged: pd.DataFrame | None = None) -> pd.DataFrame:
    """The main result: accuracy ± std and speed by implementation × target sparsity.

    Args:
        runs: Output of :func:`load_sweep` (one dataset and model).
        diverged: The diverged runs of that pair (from :func:`load_sweep_with_diverged`);
            when any, a ``diverged`` count column is added (cells where every
            seed diverged get a row with NaN metrics).

    Returns:
        Numeric columns ``implementation``, ``sparsity_pct``,
        ``accuracy_pct_mean``/``_std``, ``step_rel_mean``/``_std`` (training
        step time / mean dense), ``latency_b1_ms_mean``/``_std``,
        ``latency_b256_ms_mean``/``_std`` and ``seeds``; dense first.
    """
    from experiments.plots.style import aggregate

    acc = aggregate(runs, "test_accuracy")
    table = acc[["label", "target"]].copy()
    table["accuracy_pct_mean"] = acc["mean"] * 100.0
    table["accuracy_pct_std"] = acc["std"] * 100.0
    table["seeds"] = acc["n"].astype(int)
    dense_step = pd.to_numeric(runs.loc[runs["label"] == "dense", "step_time_ms"], errors="coerce").mean()
    rel = runs.assign(step_rel=pd.to_numeric(runs["step_time_ms"], errors="coerce") / dense_step)
    for value, name in (("step_rel", "step_rel"), ("latency_b1_ms", "latency_b1_ms"), ("latency_b256_ms", "latency_b256_ms")):
        agg = aggregate(rel, value)[["label", "target", "mean", "std"]]
        agg = agg.rename(columns={"mean": f"{name}_mean", "std": f"{name}_std"})
        table = table.merge(agg, on=["label", "target"], how="left")
    if diverged is not None and not diverged.empty:
        counts = diverged.groupby(["label", "target"]).size().rename("diverged").reset_index()
        table = table.merge(counts, on=["label", "target"], how="outer")
        table["diverged"] = table["diverged"].fillna(0).astype(int)
        table["seeds"] = table["seeds"].fillna(0).astype(int)
        from experiments.plots.style import order_key

        table["_order"] = [order_key(v)[0] for v in table["label"]]
        table = table.sort_values(["_order", "label", "target"], kind="mergesort").drop(columns="_order")
    table.insert(1, "sparsity_pct", table.pop("target") * 100.0)
    return table.rename(columns={"label": "implementation"}).reset_index(drop=True)


def _latex(table: pd.DataFrame, caption: str) -> str:
    """``main_table`` as a booktabs LaTeX table (pandas ``to_latex``); a one-seed cell shows ``(n=1)``, not ``\\pm 0``."""
    seeds = table["seeds"].fillna(0).astype(int).tolist()
    shown = pd.DataFrame(
        {
            "Implementation": [v.replace("_", r"\_") for v in table["implementation"]],
            "Sparsity (\\%)": [f"{v:g}" for v in table["sparsity_pct"]],
            "Accuracy (\\%)": [_pm(m, s, 2, n) for m, s, n in zip(table["accuracy_pct_mean"], table["accuracy_pct_std"], seeds)],
            "Step time (\\(\\times\\) dense)": [
                _pm(m, s, 2, n) for m, s, n in zip(table["step_rel_mean"], table["step_rel_std"], seeds)
            ],
            "Latency b1 (ms)": [_pm(m, s, 3, n) for m, s, n in zip(table["latency_b1_ms_mean"], table["latency_b1_ms_std"], seeds)],
            "Latency b256 (ms)": [
                _pm(m, s, 2, n) for m, s, n in zip(table["latency_b256_ms_mean"], table["latency_b256_ms_std"], seeds)
            ],
        }
    )
    fmt = "llrrrr"
    if "diverged" in table:
        shown["Diverged"] = [str(int(v)) for v in table["diverged"]]
        fmt += "r"
    return shown.to_latex(index=False, escape=False, column_format=fmt, caption=caption, label="tab:main", position="t")


def render(fig: Figure, fmt: str) -> bytes:
    """The bytes of ``fig`` saved as ``fmt`` (``png`` or ``pdf``) with pinned metadata, in the project style."""
    from experiments.plots.style import use_style

    if fmt not in ("png", "pdf"):
        raise ValueError(f"fmt must be 'png' or 'pdf', got {fmt!r}")
    buf = io.BytesIO()
    with use_style():
        fig.savefig(buf, format=fmt, metadata=PNG_METADATA if fmt == "png" else PDF_METADATA)
    return buf.getvalue()


def _choose_curve_sparsity(runs: pd.DataFrame, wanted: float | None) -> float:
    targets = sorted(runs.loc[runs["label"] != "dense", "target"].unique().tolist())
    if not targets:
        raise ValueError("runs: no finished sparse run to draw accuracy curves for")
    if wanted is None:
        return 0.9 if any(abs(t - 0.9) < 1e-9 for t in targets) else max(targets)
    for t in targets:
        if abs(t - wanted) < 1e-9:
            return t
    raise ValueError(f"--curve-sparsity {wanted!r} is not a target sparsity of the sweep; choose one of {targets}")


def _fully_connected(runs: pd.DataFrame) -> bool:
    """Whether every model of the sweep is Dense layers only (no stem, no builder): the layer-speed benchmark's figures, of
    Dense layers, go with those sweeps and not with a convnet's."""
    from experiments import axes

    names = {str(m).split("-")[0] for m in runs["model"].unique()}
    return all(n in axes.MODELS and not axes.MODELS.get(n).stem and not axes.MODELS.get(n).builder for n in names)


def draw_figures(
    sweep: str,
    out: str | Path | None = None,
    results_root: str | Path = "results",
    curve_sparsity: float | None = None,
    skipped: list[str] | None = None,
    notes: list[str] | None = None,
) -> list[Path]:
    """Draw every figure and the main table of ``sweep`` into ``out``.

    Args:
        sweep: Folder name under ``results_root``.
        out: Output folder (created); default ``<results_root>/<sweep>/figures``.
        results_root: The results root.
        curve_sparsity: Target sparsity of the accuracy-curve figure; default
            0.9 if the sweep has it, else its highest.
        skipped: If given, one line is appended per figure that the tables
            cannot support (e.g. no dense ``step_time_ms``, no value in
            ``nonzero_flops``, a damaged ``levels.csv``), naming what is
            missing; that figure is then left out instead of failing the whole draw.
        notes: If given, one line is appended per repair of the tables made in
            memory (see :func:`load_sweep_with_diverged`).

    Returns:
        The written files, sorted.

    Raises:
        ValueError: bad input (see :func:`load_sweep`; ``out`` is a file;
            ``curve_sparsity`` not in the sweep); nothing is written then.
    """
    from experiments.plots.layer_speed import layer_speedups, plot_layer_speedup
    from experiments.plots.methods import varies_method
    from experiments.plots.paper import (
        plot_accuracy_curves,
        plot_accuracy_vs_flops,
        plot_accuracy_vs_sparsity,
        plot_latency_vs_sparsity,
        plot_step_time_vs_sparsity,
    )
    from experiments.plots.pruning_axes import plot_accuracy_by_pattern, varies_pruning_axes
    from experiments.plots.tradeoff import accuracy_vs_latency

    runs, curves, diverged_all = load_sweep_with_diverged(sweep, results_root, notes)
    out_dir = Path(out) if out is not None else Path(results_root) / sweep / "figures"
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"out {str(out_dir)!r} exists and is not a directory")
    bench = load_layer_speed(results_root)

    files: dict[str, bytes] = {}

    def add(name: str, draw: Callable[[], Figure], needs: tuple[str, ...] = ()) -> None:
        try:
            for col in needs:  # a column the figure plots, absent from the table or empty for every run drawn
                if col not in sub or not sub[col].notna().any():
                    raise ValueError(f"runs.csv has no value in column {col!r} for these runs (missing or empty)")
            fig = draw()
        except ValueError as e:
            if skipped is None:
                raise
            skipped.append(f"{name}: {e}")
            return
        for fmt in ("png", "pdf"):
            files[f"{name}.{fmt}"] = render(fig, fmt)

    pairs = runs[["dataset", "model"]].drop_duplicates().sort_values(["dataset", "model"]).values.tolist()
    methods_sweep = varies_method(runs)
    axes_sweep = varies_pruning_axes(runs) and not methods_sweep
    for dataset, model in pairs:
        sub = runs[(runs["dataset"] == dataset) & (runs["model"] == model)].reset_index(drop=True)
        sfx = f"_{dataset}_{model}" if len(pairs) > 1 else ""
        if methods_sweep:
            _add_method_figures(add, sub, Path(results_root) / sweep / "runs", sfx, notes)
            continue
        if axes_sweep:
            add(f"accuracy_by_pattern{sfx}", lambda: plot_accuracy_by_pattern(sub))
            continue
        s = _choose_curve_sparsity(sub, curve_sparsity)
        div = None
        if not diverged_all.empty:
            div = diverged_all[(diverged_all["dataset"] == dataset) & (diverged_all["model"] == model)]
        add(f"accuracy_vs_sparsity{sfx}", lambda: plot_accuracy_vs_sparsity(sub, diverged=div))
        add(f"step_time_vs_sparsity{sfx}", lambda: plot_step_time_vs_sparsity(sub))
        add(f"latency_vs_sparsity{sfx}", lambda: plot_latency_vs_sparsity(sub), ("latency_b1_ms", "latency_b256_ms"))
        add(f"accuracy_vs_flops{sfx}", lambda: plot_accuracy_vs_flops(sub), ("nonzero_flops",))
        add(f"accuracy_curves{sfx}", lambda: plot_accuracy_curves(sub, curves, s))
        caption = (
            f"{model} on {dataset} (sweep {sweep}): test accuracy and speed, mean $\\pm$ std over seeds. "
            "Step time is the median training step relative to the mean dense step."
        ).replace("_", r"\_")
        files[f"main_table{sfx}.tex"] = _latex(main_table(sub, div), caption).encode()
    if bench is not None and not axes_sweep and not methods_sweep and _fully_connected(runs):
        speed = layer_speedups(bench)
        for n_in, n_out, mode in speed[["n_in", "n_out", "mode"]].drop_duplicates().values.tolist():
            add(
                f"layer_speedup_{n_in}x{n_out}_{mode}",
                lambda n_in=n_in, n_out=n_out, mode=mode: plot_layer_speedup(speed, n_in, n_out, mode),
            )

    latency = Path(results_root) / sweep / "latency.csv"
    if latency.is_file():  # benchmarks/deployed_latency.py's table: accuracy against measured latency
        add("accuracy_vs_latency", lambda: accuracy_vs_latency(pd.read_csv(latency)))

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name in sorted(files):
        path = out_dir / name
        tmp = path.with_name(f".{name}.tmp")
        tmp.write_bytes(files[name])
        tmp.replace(path)
        written.append(path)
    return written


def _run_tables(runs_dir: Path, run_ids: list[str], name: str, notes: list[str] | None = None) -> pd.DataFrame:
    """The ``name`` tables (``levels.csv``, ``mask_updates.csv``) of these runs, checked, with a ``run_id`` column.

    ``levels.csv`` is checked against and restored from the run's
    ``levels/NN/level.json`` (:func:`experiments.tables.read_levels`; repairs
    go to ``notes``); ``mask_updates.csv`` must be intact.
    """
    from experiments import tables

    frames = []
    for run_id in run_ids:
        if name == "levels.csv":
            text, found, _ = tables.read_levels(runs_dir / run_id)
            if notes is not None:
                notes.extend(found)
        else:
            text = tables.read_mask_updates(runs_dir / run_id / name)
        frames.append(pd.read_csv(io.StringIO(text)).assign(run_id=run_id))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def method_tables(
    runs: pd.DataFrame, runs_dir: str | Path, notes: list[str] | None = None
) -> tuple[pd.DataFrame | None, pd.DataFrame | None]:
    """The per-run tables of a sweep over the method axis, checked (see :func:`_run_tables`).

    Args:
        runs: The sweep's runs (:func:`load_sweep`), with ``method`` and ``target``.
        runs_dir: Its ``runs/`` folder.
        notes: If given, one line is appended per repair (a ``levels.csv`` rebuilt from its level folders).

    Returns:
        ``(levels, updates)``: every IMP run's ``levels.csv`` rows and every
        SET/RigL run's ``mask_updates.csv`` rows (with ``method`` and
        ``target``), each with a ``run_id`` column; None where the sweep has
        no such run.

    Raises:
        ValueError: a run of those methods lacks its table, or the table is
            damaged where nothing restores it (naming the file, line and column).
    """
    runs_dir = Path(runs_dir)
    imp_ids = runs.loc[runs["method"] == "imp", "run_id"].tolist()
    levels = _run_tables(runs_dir, imp_ids, "levels.csv", notes) if imp_ids else None
    dst = runs[runs["method"].isin(list(DST_METHODS))]
    updates = None
    if not dst.empty:
        updates = _run_tables(runs_dir, dst["run_id"].tolist(), "mask_updates.csv")
        updates = updates.merge(dst[["run_id", "method", "target"]], on="run_id")
    return levels, updates


def _add_method_figures(
    add: Callable[..., None], runs: pd.DataFrame, runs_dir: Path, sfx: str, notes: list[str] | None
) -> None:
    """A sweep over the method axis: accuracy by method; IMP's levels; SET/RigL mask changes."""
    from experiments.plots.methods import plot_accuracy_by_method, plot_imp_levels, plot_mask_changes

    def table(name: str) -> Callable[[], pd.DataFrame | None]:
        """The runs' ``name`` table, or (if damaged) a function raising its error when a figure needs it."""
        only = runs[runs["method"] == "imp"] if name == "levels" else runs[runs["method"] != "imp"]
        try:
            value = method_tables(only, runs_dir, notes)[0 if name == "levels" else 1]
        except ValueError as e:
            error = e

            def fail() -> pd.DataFrame:
                raise error

            return fail
        return lambda: value

    levels, updates = table("levels"), table("updates")
    imp = (runs["method"] == "imp").any()
    add(f"accuracy_by_method{sfx}", lambda: plot_accuracy_by_method(runs, levels() if imp else None))
    if imp:
        add(f"imp_levels{sfx}", lambda: plot_imp_levels(levels()))
    if runs["method"].isin(list(DST_METHODS)).any():
        add(f"mask_changes{sfx}", lambda: plot_mask_changes(updates()))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m experiments figures",
        description="Redraw a sweep's figures (PNG, PDF) and main LaTeX table from its committed tables, byte for byte.",
    )
    p.add_argument(
        "sweep",
        help="the sweep TOML file, as run and status take it (e.g. experiments/configs/paper.toml); "
        "or its name, the folder under the results root (e.g. paper)",
    )
    p.add_argument("--out", help="output folder (default RESULTS/SWEEP/figures)")
    p.add_argument("--results", "--results-root", dest="results_root", default="results",
                   help="results root, as for run and status (default ./results; --results-root is the old spelling)")
    p.add_argument("--curve-sparsity", type=float, help="target sparsity of the accuracy-curve figure (default 0.9 or the highest)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Command line entry point; returns the exit status (0 ok, 2 bad input).

    Args:
        argv: Arguments after ``figures`` (default ``sys.argv[1:]``).
    """
    args = _parser().parse_args(argv)
    if args.sweep.endswith(".toml") or Path(args.sweep).is_file():  # the sweep file: its name names the folder
        from experiments.config import ConfigError, load_sweep

        try:
            args.sweep = load_sweep(args.sweep).name
        except (ConfigError, OSError) as e:
            print(f"error: invalid config {args.sweep}: {e}", file=sys.stderr)
            return 2
    skipped: list[str] = []
    notes: list[str] = []
    try:
        written = draw_figures(args.sweep, args.out, args.results_root, args.curve_sparsity, skipped=skipped, notes=notes)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for line in notes:
        print(f"note: {line} (in memory; `run` rewrites the file)", file=sys.stderr)
    print(f"wrote {len(written)} files to {written[0].parent}")
    for path in written:
        print(f"  {path.name}")
    for line in skipped:
        print(f"skipped {line}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
