"""The figure command: byte-identical redraws, committed figures up to date, bad input, shared styles.

A synthetic sweep (every column of :data:`experiments.store.RUN_COLUMNS`, the
long curves table and a layer-benchmark table with the benchmark's columns) is
written into ``tmp_path`` so these tests run before any real sweep exists; the
committed figures under ``results/<sweep>/figures`` are checked against a
fresh draw whenever they exist.
"""

from __future__ import annotations

import hashlib
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from experiments import figures
from experiments.plots.paper import (
    plot_accuracy_curves,
    plot_accuracy_vs_sparsity,
    plot_latency_vs_sparsity,
    plot_step_time_vs_sparsity,
)
from experiments.plots.style import IMPLEMENTATION_ORDER, OKABE_ITO, aggregate, crossover, pareto_front, style_for
from experiments.store import CURVE_COLUMNS, RUN_COLUMNS

REPO = Path(__file__).resolve().parents[2]
IMPLS = ["dense", "masked", "sparse_tensor", "tfmot"]
SPARSITIES = [0.0, 0.5, 0.8, 0.9, 0.95, 0.98]
SEEDS = [0, 1, 2]
EPOCHS = 6


def _runs_and_curves() -> tuple[pd.DataFrame, pd.DataFrame]:
    """A realistic, seeded sweep: dense once per seed, sparse implementations at every sparsity."""
    rng = np.random.default_rng(1234)
    rows, curves = [], []
    n = 0
    for seed in SEEDS:
        for impl in IMPLS:
            for s in [0.0] if impl == "dense" else SPARSITIES:
                n += 1
                run_id = f"{impl}-{n:04d}"
                density = 1.0 - s
                acc = 0.965 - 0.25 * s**14 + rng.normal(0, 0.002)
                step = {"dense": 2.0, "masked": 2.3, "sparse_tensor": 0.4 + 3.0 * density, "tfmot": 2.6}[impl]
                lat1 = {"dense": 0.20, "masked": 0.24, "sparse_tensor": 0.05 + 0.4 * density, "tfmot": 0.26}[impl]
                lat256 = {"dense": 1.5, "masked": 1.8, "sparse_tensor": 0.2 + 4.0 * density, "tfmot": 1.9}[impl]
                row = {c: "" for c in RUN_COLUMNS}
                row.update(
                    run_id=run_id, config_hash=f"{n:016x}", sweep="synthetic", implementation=impl,
                    matmul="auto" if impl == "sparse_tensor" else "", dataset="mnist5k", model="lenet300",
                    target_sparsity="" if impl == "dense" else s,
                    schedule="none" if impl == "dense" else "polynomial",
                    schedule_begin="" if impl == "dense" else 0, schedule_end="" if impl == "dense" else 4,
                    schedule_unit="" if impl == "dense" else "epochs", schedule_frequency="" if impl == "dense" else 10,
                    seed=seed, optimizer="adam", learning_rate=0.001, epochs=EPOCHS, batch_size=64,
                    status="ok", test_accuracy=round(acc, 4), test_loss=0.2, train_accuracy=0.99, train_loss=0.05,
                    sparsity=s, nnz=int(266200 * density), size=266200, dense_flops=532400.0,
                    nonzero_flops=532400.0 * density, step_time_ms=step * (1 + rng.normal(0, 0.03)), timed_steps=400,
                    latency_b1_ms=lat1 * (1 + rng.normal(0, 0.03)), latency_b256_ms=lat256 * (1 + rng.normal(0, 0.03)),
                    peak_rss_mb=900.0, git_commit="0" * 40, git_dirty=False, hostname="host", pid=1,
                )
                rows.append(row)
                for e in range(1, EPOCHS + 1):
                    for metric, value in (("test_accuracy", acc - 0.1 / e), ("train_accuracy", 0.99 - 0.1 / e),
                                          ("test_loss", 0.2 + 0.1 / e), ("train_loss", 0.05 + 0.1 / e)):
                        curves.append(dict(run_id=run_id, epoch=e, metric=metric, value=round(value, 5)))
    failed = {c: "" for c in RUN_COLUMNS}
    failed.update(run_id="tfmot-fail", sweep="synthetic", implementation="tfmot", matmul="", dataset="mnist5k",
                  model="lenet300", target_sparsity=0.5, seed=0, status="failed", error="RuntimeError: boom")
    rows.append(failed)
    return pd.DataFrame(rows, columns=RUN_COLUMNS), pd.DataFrame(curves, columns=CURVE_COLUMNS)


def _layer_speed() -> pd.DataFrame:
    """A small table with the columns benchmarks/layer_speed.py writes, shaped like a real CPU's.

    Sparse kernels cost a fixed part plus a part per nonzero, so they beat
    dense only past ~85 % sparsity and never reach the ideal; COO's cost grows
    with the batch faster than dense's.
    """
    rows = []
    for mode in ("forward", "train_step"):
        for batch in (1, 256):
            for s in (0.0, 0.5, 0.8, 0.9, 0.99):
                d = 1.0 - s
                csr = 0.08 + 6.0 * d
                for impl, ms in (("dense", 1.0), ("masked", 1.2), ("coo", 0.1 + 8.0 * d), ("csr", csr),
                                 ("densify", 1.1), ("auto", min(csr, 1.1))):
                    ms *= 1.0 if batch == 1 else 20.0 * (4.0 if impl == "coo" else 1.0)
                    rows.append(dict(n_in=784, n_out=300, batch=batch, sparsity=s, nnz=int(235200 * d), impl=impl, mode=mode,
                                     median_ms=ms, min_ms=ms * 0.9, reps=5, auto_choice="csr", grad_rule="dense"))
    return pd.DataFrame(rows)


def write_synthetic(root: Path, sweep: str = "synthetic", bench: bool = True) -> Path:
    """Write a synthetic sweep (and optionally the layer benchmark) under ``root``; return ``root``."""
    runs, curves = _runs_and_curves()
    (root / sweep).mkdir(parents=True, exist_ok=True)
    runs.to_csv(root / sweep / "runs.csv", index=False, lineterminator="\n")
    curves.to_csv(root / sweep / "curves.csv", index=False, lineterminator="\n")
    if bench:
        (root / "benchmarks").mkdir(parents=True, exist_ok=True)
        _layer_speed().to_csv(root / "benchmarks" / "layer_speed.csv", index=False, lineterminator="\n")
    return root


def _hashes(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


EXPECTED = sorted(
    [f"{name}.{fmt}" for name in figures.FIGURE_NAMES for fmt in ("png", "pdf")]
    + [f"layer_speedup_784x300_{mode}.{fmt}" for mode in ("forward", "train_step") for fmt in ("png", "pdf")]
    + ["main_table.tex"]
)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic(tmp_path_factory.mktemp("results"))


@pytest.fixture(scope="module")
def drawn(synthetic: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("figs_a")
    assert figures.main(["synthetic", "--results-root", str(synthetic), "--out", str(out)]) == 0
    return out


def test_two_draws_are_byte_identical_across_processes(synthetic: Path, drawn: Path, tmp_path: Path) -> None:
    out_b = tmp_path / "figs_b"
    # another hash seed, default backend and build date: none of them may reach the files
    env = dict(os.environ, PYTHONHASHSEED="12345", MPLBACKEND="pdf", SOURCE_DATE_EPOCH="86400")
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.figures", "synthetic", "--results-root", str(synthetic), "--out", str(out_b)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    a, b = _hashes(drawn), _hashes(out_b)
    assert sorted(a) == EXPECTED
    assert a == b, [name for name in a if a[name] != b.get(name)]


def test_files_carry_no_clock_or_build_metadata(drawn: Path) -> None:
    for path in sorted(drawn.glob("*.pdf")):
        data = path.read_bytes()
        assert b"/CreationDate" not in data and b"/ModDate" not in data, path.name
        assert b"/Producer (prune experiments.figures)" in data, path.name
    for path in sorted(drawn.glob("*.png")):
        data = path.read_bytes()
        assert b"Software" not in data and b"Matplotlib version" not in data, path.name


def test_png_figures_are_one_paper_column_wide(drawn: Path) -> None:
    for path in sorted(drawn.glob("*.png")):
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
        width, height = struct.unpack(">II", data[16:24])
        assert width == round(3.3 * 300), (path.name, width)  # 3.3 in at savefig.dpi 300
        assert 0.3 * width < height < 1.6 * width, (path.name, width, height)


def test_latex_table_has_every_implementation_and_sparsity(drawn: Path) -> None:
    tex = (drawn / "main_table.tex").read_text()
    assert tex.startswith("\\begin{table}") and "\\toprule" in tex and "\\label{tab:main}" in tex
    body = [line for line in tex.splitlines() if "\\pm" in line and line.endswith("\\\\")]
    assert len(body) == 1 + 3 * len(SPARSITIES)  # dense once, three sparse implementations at every sparsity
    assert sum(line.startswith("sparse\\_tensor &") for line in body) == len(SPARSITIES)


def test_main_table_numbers_match_the_runs(synthetic: Path) -> None:
    runs, _ = figures.load_sweep("synthetic", synthetic)
    table = figures.main_table(runs)
    raw = pd.read_csv(synthetic / "synthetic" / "runs.csv")
    sel = raw[(raw["implementation"] == "masked") & (raw["target_sparsity"] == 0.9)]["test_accuracy"]
    row = table[(table["implementation"] == "masked") & (table["sparsity_pct"] == 90.0)].iloc[0]
    assert row["accuracy_pct_mean"] == pytest.approx(100 * sel.mean())
    assert row["accuracy_pct_std"] == pytest.approx(100 * sel.std(ddof=1))
    assert row["seeds"] == 3
    dense = table[table["implementation"] == "dense"].iloc[0]
    assert dense["step_rel_mean"] == pytest.approx(1.0)
    assert "tfmot-fail" not in set(runs["run_id"])  # failed runs are left out


RASTER_RMS_TOL = 0.05
"""Largest root-mean-square difference (0-255 levels, matplotlib's ``compare_images``) between a committed
PNG and a fresh draw. numpy's vectorised math differs in the last bits between CPUs (AVX2, AVX-512), and a
log axis turns that into a different pixel: measured 3-16 pixels changed by one level, RMS 0.002-0.005, for
the paper figures drawn on AVX2 and redrawn on AVX-512. A stale figure (a moved marker, a changed label)
measures RMS 1 or more. Vector outputs (PDF, LaTeX) and every other file must be byte-identical."""


def _stale_figures(committed: Path, drawn: Path) -> list[str]:
    """Files of ``committed`` that a fresh draw in ``drawn`` does not reproduce (PNGs within the tolerance)."""
    from matplotlib.testing.compare import compare_images

    old, new = _hashes(committed), _hashes(drawn)
    assert sorted(old) == sorted(new), f"committed {sorted(old)} vs drawn {sorted(new)}"
    stale = []
    for name in sorted(old):
        if old[name] == new[name]:
            continue
        if name.endswith(".png"):
            failure = compare_images(str(committed / name), str(drawn / name), tol=RASTER_RMS_TOL)
            if failure is None:
                continue
        stale.append(name)
    return stale


def _figure_pins() -> dict[str, str]:
    """The versions that drew the committed figures, from constraints/figures.txt (``{"matplotlib": "3.11.2", ...}``)."""
    pins = {}
    for line in (REPO / "constraints" / "figures.txt").read_text().splitlines():
        spec = line.split("#")[0].split(";")[0].strip()
        if "==" in spec:
            name, version = spec.split("==")
            pins[name.strip().lower()] = version.strip()
    return pins


def _committed_figure_folders() -> dict[str, Path]:
    from importlib.metadata import version

    off = {name: (pin, version(name)) for name, pin in _figure_pins().items() if version(name) != pin}
    if off:
        pytest.skip(f"the committed figures were drawn with {_figure_pins()} (constraints/figures.txt); installed: "
                    + ", ".join(f"{n} {v}" for n, (_, v) in off.items()))
    results = REPO / "results"
    committed = {
        d.parent.name: d for d in sorted(results.glob("*/figures")) if d.is_dir() and any(p.is_file() for p in d.iterdir())
    }
    if not committed:
        pytest.skip("no committed figures yet under results/*/figures (run `make figures` after a sweep and commit them)")
    return committed


def test_committed_figures_equal_a_fresh_draw(tmp_path: Path) -> None:
    """Every figure file committed under results/<sweep>/figures is what the command draws now."""
    for sweep, folder in _committed_figure_folders().items():
        out = tmp_path / sweep
        assert figures.main([sweep, "--results-root", str(REPO / "results"), "--out", str(out)]) == 0
        stale = _stale_figures(folder, out)
        assert not stale, f"{sweep}: committed figures differ from a fresh draw: {stale}; run `make figures`"


def test_the_comparison_fails_on_a_stale_figure(tmp_path: Path) -> None:
    """The raster tolerance lets CPU rounding through (16 pixels one level off), not a changed figure (a 6x6 mark)."""
    from PIL import Image

    folder = _committed_figure_folders().get("paper")
    if folder is None:
        pytest.skip("no committed paper figures")
    image = np.asarray(Image.open(folder / "latency_vs_sparsity.png").convert("RGB")).copy()
    (tmp_path / "committed").mkdir()
    Image.fromarray(image).save(tmp_path / "committed" / "f.png")
    for case, (rows, cols, change) in {"rounding": (slice(100, 116), 200, 1), "stale": (slice(100, 106), slice(200, 206), 200)}.items():
        edited = image.astype(int)
        edited[rows, cols] = np.abs(edited[rows, cols] - change)
        (tmp_path / case).mkdir()
        Image.fromarray(edited.astype(np.uint8)).save(tmp_path / case / "f.png")
        assert _stale_figures(tmp_path / "committed", tmp_path / case) == ([] if case == "rounding" else ["f.png"]), case


def _lowered_dispatch() -> str:
    """NPY_DISABLE_CPU_FEATURES that turns off every SIMD target numpy dispatches to on this CPU ('' if none)."""
    from numpy._core import _multiarray_umath as umath

    return " ".join(f for f in umath.__cpu_dispatch__ if umath.__cpu_features__.get(f))


@pytest.mark.slow
def test_committed_figures_reproduce_with_numpy_simd_lowered(tmp_path: Path) -> None:
    """Another CPU, simulated: a child draws with numpy's SIMD dispatch lowered to its baseline; still no stale figure."""
    committed = _committed_figure_folders()
    lowered = _lowered_dispatch()
    if not lowered:
        pytest.skip("numpy dispatches to no SIMD target on this CPU: nothing to lower")
    env = dict(os.environ, NPY_DISABLE_CPU_FEATURES=lowered, PYTHONPATH=str(REPO))
    probe = "from numpy._core import _multiarray_umath as u; print(' '.join(f for f in u.__cpu_dispatch__ if u.__cpu_features__[f]))"
    still = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True).stdout
    assert still.strip() == "", f"numpy still dispatches to {still!r} with NPY_DISABLE_CPU_FEATURES={lowered!r}"
    for sweep, folder in committed.items():
        out = tmp_path / sweep
        cmd = [sys.executable, "-m", "experiments", "figures", sweep, "--results-root", str(REPO / "results"), "--out", str(out)]
        proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        stale = _stale_figures(folder, out)
        assert not stale, f"{sweep} with NPY_DISABLE_CPU_FEATURES={lowered!r}: {stale}"


def test_unknown_sweep_is_a_value_error_and_writes_nothing(synthetic: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=r"sweep 'nope'.*synthetic"):
        figures.draw_figures("nope", out, synthetic)
    assert not out.exists()
    assert figures.main(["nope", "--results-root", str(synthetic), "--out", str(out)]) == 2
    assert not out.exists()


def test_missing_tables_are_value_errors_and_write_nothing(tmp_path: Path) -> None:
    root = write_synthetic(tmp_path / "results", bench=False)
    out = tmp_path / "out"
    (root / "synthetic" / "curves.csv").unlink()
    with pytest.raises(ValueError, match=r"curves\.csv missing"):
        figures.draw_figures("synthetic", out, root)
    (root / "synthetic" / "runs.csv").unlink()
    with pytest.raises(ValueError, match=r"sweep 'synthetic': runs\.csv missing"):
        figures.draw_figures("synthetic", out, root)
    with pytest.raises(ValueError, match=r"results_root .*not a directory"):
        figures.draw_figures("synthetic", out, tmp_path / "absent")
    with pytest.raises(ValueError, match=r"sweep must be the name of a folder"):
        figures.draw_figures("../results", out, root)
    assert not out.exists()


def test_bad_curve_sparsity_and_out_file_write_nothing(synthetic: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=r"--curve-sparsity 0\.33 .*\[0\.0, 0\.5, 0\.8, 0\.9, 0\.95, 0\.98\]"):
        figures.draw_figures("synthetic", out, synthetic, curve_sparsity=0.33)
    assert not out.exists()
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    with pytest.raises(ValueError, match=r"out .*a_file.* not a directory"):
        figures.draw_figures("synthetic", a_file, synthetic)
    assert a_file.read_text() == "x"


def _line_styles(fig) -> dict[str, tuple[str, str]]:
    out = {}
    for ax in fig.axes:
        for line in ax.get_lines():
            if not line.get_label().startswith("_"):
                out[line.get_label()] = (line.get_color(), line.get_marker())
    return out


def test_each_implementation_keeps_its_colour_and_marker_in_every_figure(synthetic: Path) -> None:
    runs, curves = figures.load_sweep("synthetic", synthetic)
    figs = [
        plot_accuracy_vs_sparsity(runs),
        plot_step_time_vs_sparsity(runs),
        plot_latency_vs_sparsity(runs),
        plot_accuracy_curves(runs, curves, 0.9),
    ]
    seen: dict[str, set[tuple[str, str]]] = {}
    for fig in figs:
        for label, style in _line_styles(fig).items():
            seen.setdefault(label, set()).add(style)
    for impl in ("masked", "sparse_tensor", "tfmot"):
        assert len(seen[impl]) == 1, (impl, seen[impl])
        (color, marker), = seen[impl]
        assert color.upper() == style_for(impl)["color"] and marker == style_for(impl)["marker"]
    colours = [style_for(i)["color"] for i in IMPLEMENTATION_ORDER]
    assert len(set(colours)) == len(colours)
    assert set(colours) <= set(OKABE_ITO.values())
    assert style_for("csr") == style_for("sparse_tensor-csr")  # kernels share the runs' styles
    assert style_for("made-up") == style_for("made-up")


def test_crossover_and_pareto_front() -> None:
    s = [0.0, 0.5, 0.9, 0.99]
    # above the reference until 0.5, below from 0.9: the crossing lies between them
    x = crossover(s, [2.0, 1.5, 0.5, 0.2], 1.0)
    assert x is not None and 0.5 < x < 0.9
    assert crossover(s, [0.5, 0.4, 0.3, 0.2], 1.0) == 0.0  # never slower
    assert crossover(s, [2.0, 2.0, 2.0, 2.0], 1.0) is None  # never faster
    # slower again after dipping below: the crossover is the last crossing
    late = crossover(s, [2.0, 0.5, 2.0, 0.5], 1.0)
    assert late is not None and 0.9 < late < 0.99
    with pytest.raises(ValueError, match="strictly increasing"):
        crossover([0.5, 0.5], [1.0, 1.0], 1.0)
    front = pareto_front([1.0, 2.0, 3.0, 4.0], [0.9, 0.8, 0.95, 0.95])
    assert front.tolist() == [0, 2]


def test_synthetic_latency_crossover_is_marked(synthetic: Path) -> None:
    runs, _ = figures.load_sweep("synthetic", synthetic)
    fig = plot_latency_vs_sparsity(runs)
    vlines = [ln for ln in fig.axes[0].get_lines() if ln.get_linestyle() == ":" and ln.get_label().startswith("_")]
    xs = sorted({float(ln.get_xdata()[0]) for ln in vlines})
    agg = aggregate(runs, "latency_b1_ms")
    st = agg[agg["label"] == "sparse_tensor"]
    dense = float(agg.loc[agg["label"] == "dense", "mean"].iloc[0])
    expected = crossover(st["target"], st["mean"], dense)
    assert expected is not None and 0.5 < expected < 0.9
    assert xs == [pytest.approx(expected)]


def test_figures_takes_the_sweep_file_and_results_flag_as_run_does(tmp_path: Path) -> None:
    """``figures CONFIG.toml --results DIR`` (run's and status's way to name a sweep) draws what ``figures NAME`` does."""
    by_file, by_name = tmp_path / "file", tmp_path / "name"
    config = REPO / "experiments" / "configs" / "patterns.toml"
    assert figures.main([str(config), "--results", str(REPO / "results"), "--out", str(by_file)]) == 0
    assert figures.main(["patterns", "--results-root", str(REPO / "results"), "--out", str(by_name)]) == 0
    assert _hashes(by_file) == _hashes(by_name) and _hashes(by_file)
    bad = tmp_path / "bad.toml"
    bad.write_text("name = 3\n")
    assert figures.main([str(bad), "--out", str(tmp_path / "bad")]) == 2 and not (tmp_path / "bad").exists()


def test_accuracy_vs_latency_draws_a_row_of_panels_per_runtime_in_the_table():
    """One panel per batch for the TF graph, and a second row for LiteRT when the table has its column."""
    from experiments.plots.tradeoff import accuracy_vs_latency

    rows = [dict(family=f, batch=b, latency_ms=0.5 * b ** 0.5, litert_ms=0.01 * b * (w // 100), accuracy=a, accuracy_low=a - 0.01,
                 accuracy_high=a + 0.01, weights=w)
            for f, a, w in (("dense", 0.88, 1000), ("unstructured", 0.89, 100)) for b in (1, 256)]
    table = pd.DataFrame(rows)
    both = accuracy_vs_latency(table)
    assert [ax.get_title() for ax in both.axes] == ["TF graph, batch 1", "TF graph, batch 256", "LiteRT, batch 1",
                                                    "LiteRT, batch 256"]
    drawn = [list(c.lines[0].get_xdata()) for c in both.axes[3].containers]  # unstructured, then dense (FAMILY_STYLES' order)
    assert drawn == [[2.56], [25.6]]  # batch 256, LiteRT's column
    tf_only = accuracy_vs_latency(table.drop(columns="litert_ms"))
    assert [ax.get_title() for ax in tf_only.axes] == ["TF graph, batch 1", "TF graph, batch 256"]
    with pytest.raises(ValueError, match=r"lacks columns \['latency_ms'\]"):
        accuracy_vs_latency(table.drop(columns="latency_ms"))
    with pytest.raises(ValueError, match=r"no timed latency to draw \(rows: 4;"):
        accuracy_vs_latency(table.assign(latency_ms=float("nan"), litert_ms=float("nan")))
