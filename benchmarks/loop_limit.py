"""The limit of prune's general kernels' inner loop on this CPU, beside the op, for issue 33's targets.

Issue 33 asks, for each speed target the kernels miss, for the hardware limit. This script measures it instead of
assuming it:

* ``peak``: the CPU's FMA throughput, register-only (12 independent vectors, no loads): multiply-adds per ns
  per core. Dense GEMM reaches near this; so does the block kernels' register-tiled loop at best.
* ``panel``: the entry loop that the forward op's panel path runs (``AddEntries<4, false>`` from
  ``prune/native/sparse_ops.cc``, copied from the source at each run, so the loop timed is the op's), on one
  panel's 128 x 64 tile in L1 with sorted random columns, segments of the lengths a 1024 x 1024 (and 4096 x 4096)
  layer has at each sparsity: the rate of the multiply-adds with nothing else to pay (no transposes, no value
  gather, no dispatch, no TensorFlow).
* ``l2``: the same loop over a 1024-column tile (256 KB, in L2), as the plain tiled path runs it.

From these and the dense GEMM measured in the same run it writes, per target, the time the multiply-adds alone
would take at the rate of the loop the op runs for that layer (the panel loop where the layer's panel segments hold
at least ``prune.native.PANEL_MIN_SEGMENT`` entries, else the plain tiled loop on an L2 tile), and so the best
"x dense" that loop allows. ``docs/kernels.md`` sets these beside what the op and the layer reach in the committed
tables. Under ``benchmarks/protocol.py``.

    .venv/bin/python benchmarks/loop_limit.py            # writes results/benchmarks/loop_limit.{csv,md}
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import protocol  # noqa: E402

SOURCE = Path(__file__).with_name("loop_limit.cc")
from prune.native import PANEL_MIN_SEGMENT, PANEL_WIDTH, panels_pay  # noqa: E402  (the op's own panel rule)

PANEL_OUT_BYTES = 256 << 10  # sparse_ops.cc's kPanelOutBytes: the output accumulators one pass over the panels keeps
TILE_LANES = 64  # the harness's tile: AddEntries<4, false> at 16 lanes (AVX-512); fewer lanes make it narrower
TARGETS = (
    # (name, n_in, n_out, batch, sparsity, target x dense)
    ("1024x1024, batch 256, 90%", 1024, 1024, 256, 0.90, 3.0),
    ("1024x1024, batch 256, 99%", 1024, 1024, 256, 0.99, 8.0),
    ("4096x4096, batch 256, 90%", 4096, 4096, 256, 0.90, 4.0),
)
"""Issue 33's unstructured targets at batch 256."""
BLOCK_TARGETS = ((0.8, 3.0), (0.9, 5.0))
"""Issue 33's 1x16 / 2x16 block targets at batch 256, (sparsity, x dense): the block kernels reuse each loaded
input across a tile's outputs in registers, as dense GEMM does, so the FMA peak bounds them."""


def kernel_include(source: str) -> str:
    """``vec``, ``kLanes``, ``kPrefetchAhead`` and ``AddEntries`` cut from ``sparse_ops.cc``'s text.

    Raises:
        ValueError: a piece is not found where this expects it (the source changed shape: update the markers).
    """
    pieces = []
    for name, pattern in (
        ("vector width", r"#if defined\(PRUNE_VEC_BYTES\)\n.*?typedef float vec __attribute__\(\(vector_size\(kVecBytes\)\)\);\n"),
        ("kPrefetchAhead", r"constexpr int64_t kPrefetchAhead = \d+;\n"),
        ("AddEntries", r"template <int NV, bool kPerm>\ninline void AddEntries\(.*?\n}\n"),
    ):
        m = re.search(pattern, source, flags=re.S)
        if m is None:
            raise ValueError(f"prune/native/sparse_ops.cc: {name} not found (pattern {pattern!r})")
        pieces.append(m.group(0))
    return "#include <cstdint>\n#include <algorithm>\n" + "\n".join(pieces)


def build(directory: Path) -> Path:
    """The harness, compiled with the native library's optimisation and instruction-set flags."""
    from prune import native

    cxx = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
    if cxx is None:
        raise RuntimeError("no C++ compiler (g++ or c++) on PATH")
    (directory / "kernel.inc").write_text(kernel_include((ROOT / "prune" / "native" / "sparse_ops.cc").read_text()))
    exe = directory / "loop_limit"
    flags = [f for f in native._OPT_FLAGS if f != "-fPIC"] + native.target_flags(cxx) + native.extra_flags()
    cmd = [cxx, *flags, "-std=c++17", "-pthread", "-I", str(directory), str(SOURCE), "-o", str(exe)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"building the harness failed: {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    return exe


def run(exe: Path, mode: str, threads: int, reps: int, *shape: int) -> protocol.Samples:
    """Multiply-adds per ns over all threads, one per round (the harness's warm-up round dropped)."""
    out = subprocess.run([str(exe), mode, str(threads), str(reps), *map(str, shape)], capture_output=True, text=True,
                         check=True, timeout=600).stdout.split("\n")
    rounds = [line.split() for line in out if line.strip()][1:]
    return protocol.Samples(tuple(int(work) / (float(sec) * 1e9) for sec, work in rounds))


def segment(n_in: int, sparsity: float) -> int:
    """Mean entries per (panel, output) segment: a panel's columns times the density."""
    return max(1, round(min(PANEL_WIDTH, n_in) * (1.0 - sparsity)))


def op_loop(n_in: int, sparsity: float, n_out: int | None = None) -> tuple[str, int]:
    """``(loop, entries per segment)`` of the loop the forward op runs at batch 256 for this layer.

    The op runs its panels where :func:`prune.native.panels_pay` says so (the rule that decides whether a
    structure gets a panel section); else the plain tiled loop, whose segment is a whole output row.
    ``n_out`` defaults to ``n_in`` (the targets are square).
    """
    n_out = n_in if n_out is None else n_out
    if panels_pay(round(n_in * n_out * (1.0 - sparsity)), n_in, n_out):
        return "panel", segment(n_in, sparsity)
    return "l2", max(1, round(n_in * (1.0 - sparsity)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=0, help="harness threads and TF's intra-op threads (default: the usable cores)")
    p.add_argument("--out", default=str(ROOT / "results" / "benchmarks" / "loop_limit.csv"))
    protocol.add_arguments(p)
    args = p.parse_args(argv)
    if args.threads < 0:
        p.error(f"--threads must be 0 (the usable cores) or more, got {args.threads}")
    load = protocol.start_or_refuse(args)
    if load is None:
        return protocol.REFUSED
    import pandas as pd

    intra, inter = protocol.fix_tf_threads(args.threads or None)
    threads = intra
    with tempfile.TemporaryDirectory() as d:
        exe = build(Path(d))
        gemm = protocol.dense_gemm_gflops()
        mach = protocol.machine()
        rows = []
        peak = run(exe, "peak", threads, 20_000_000)
        rows.append(dict(loop="peak", n_cols=0, segment=0, rate=peak.median, rate_min=peak.low, rate_max=peak.high))
        for sparsity in (0.8, 0.9, 0.95, 0.99):
            seg = segment(1024, sparsity)
            rows_per = max(64, PANEL_OUT_BYTES // (TILE_LANES * 4))  # the op's chunk of output rows per pass
            got = run(exe, "entries", threads, max(1, 4_000_000 // (seg * rows_per)), PANEL_WIDTH, seg, rows_per)
            rows.append(dict(loop="panel", n_cols=PANEL_WIDTH, segment=seg, rate=got.median, rate_min=got.low,
                             rate_max=got.high))
        for sparsity in (0.9, 0.99):
            seg = round(1024 * (1.0 - sparsity))
            got = run(exe, "entries", threads, max(1, 4_000_000 // (seg * 1024)), 1024, seg, 1024)
            rows.append(dict(loop="l2", n_cols=1024, segment=seg, rate=got.median, rate_min=got.low, rate_max=got.high))
    load.stop()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    dense_rate = gemm.median / 2  # GFLOPS / 2 = multiply-adds per ns, on all the cores
    lines = ["| loop | tile columns | entries per segment | multiply-adds per ns, all threads: median (min-max) | "
             "x dense GEMM's rate |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['loop']} | {r['n_cols'] or '-'} | {r['segment'] or '-'} | {r['rate']:.1f} "
                     f"({r['rate_min']:.1f}-{r['rate_max']:.1f}) | {r['rate'] / dense_rate:.2f} |")
    lines += ["", "| target | loop the op runs | entries per segment | multiply-adds | at that loop's rate, ms | "
              "dense at the calibration's rate, ms | best x dense the loop allows | target |",
              "|---|---|---|---|---|---|---|---|"]
    measured = {(r["loop"], r["segment"]): r["rate"] for r in rows}
    targets = []
    for name, n_in, n_out, batch, sparsity, target in TARGETS:
        macs = n_in * n_out * (1.0 - sparsity) * batch
        loop, seg = op_loop(n_in, sparsity)
        if (loop, seg) not in measured:
            raise RuntimeError(f"target {name!r} needs the {loop} loop at {seg} entries per segment, which this run "
                               f"did not measure (measured: {sorted(measured)})")
        t_loop = macs / measured[(loop, seg)] / 1e6
        t_dense = n_in * n_out * batch / dense_rate / 1e6
        targets.append(dict(target=name, loop=loop, segment=seg, macs=macs, loop_ms=t_loop, dense_ms=t_dense,
                            limit=t_dense / t_loop, wanted=target))
        lines.append(f"| {name} | {loop} | {seg} | {macs / 1e6:.1f} M | {t_loop:.3f} | {t_dense:.3f} | "
                     f"{t_dense / t_loop:.1f}x | {target:g}x |")
    peak_rate = rows[0]["rate"]
    lines += ["", "| block target (1x16, 2x16; batch 256) | FLOP-proportional ideal | at the FMA peak, x dense | target |",
              "|---|---|---|---|"]
    for sparsity, target in BLOCK_TARGETS:
        ideal = 1.0 / (1.0 - sparsity)
        lines.append(f"| {sparsity:.0%} | {ideal:.0f}x | {ideal * peak_rate / dense_rate:.1f}x | {target:g}x |")
    head = protocol.header(
        "The general kernels' inner loop alone, against the FMA peak and dense", mach, load, gemm,
        f"harness: {threads} threads, each on its own data; TensorFlow intra_op={intra}, inter_op={inter} "
        "(the dense calibration only)",
        extra=["peak: 12 independent register FMAs per step, no loads. panel / l2: AddEntries<4, false> cut from "
               f"prune/native/sparse_ops.cc at this run, over segments of sorted random columns of a {TILE_LANES}-lane tile "
               "of 128 (L1) or 1024 (L2) columns; accumulators loaded and stored once per segment, as PanelTile "
               "does. 7 rounds after a warm-up, median (min-max). A multiply-add is one lane of one FMA.",
               "The targets table uses the rate of the loop the op runs for that layer at batch 256: the panel loop "
               f"at the layer's panel segment (128 x density entries) where that holds at least {PANEL_MIN_SEGMENT} "
               "entries, else the plain tiled loop on an L2 tile at a whole output row's entries. It bounds what "
               "the op can reach with every other part (transposes, value gather, dispatch, TensorFlow) at zero; "
               "the harness keeps its entries in cache, so it says nothing of a layer whose entries stream from L3.",
               f"GEMM columns of the CSV: the dense calibration, {gemm.median:.1f} GFLOPS (min {gemm.low:.1f}, "
               f"max {gemm.high:.1f})."])
    out.with_suffix(".md").write_text(head + "\n" + "\n".join(lines) + "\n")
    df = pd.DataFrame(rows).assign(gemm_gflops=gemm.median, gemm_gflops_low=gemm.low, gemm_gflops_high=gemm.high)
    df.to_csv(out, index=False)  # after the table, so that a failure above leaves the committed pair as it was
    pd.DataFrame(targets).to_csv(out.with_name(out.stem + "_targets.csv"), index=False)
    print(head + "\n" + "\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
