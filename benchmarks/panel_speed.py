"""What the input-axis panels buy the native forward op: the same op with and without them, paired in one run.

Under ``benchmarks/protocol.py`` (CPU and flags, fixed threads, the load before and during the run, a busy
machine refused with exit code 3 unless ``--allow-loaded``, TensorFlow's dense GEMM in GFLOPS in the same run).

The forward op ``PruneSpmm`` reads the structure's panel section (``prune.native.structure``) on its path with
more batch tiles than threads; its benchmark-only ``profile=6`` ignores the section, which is the kernel the op
ran before panels. Both forms, and the floor graph, are timed in every round in a fresh random order
(:func:`protocol.interleaved`), each a ``tf.function`` of K applications to K distinct inputs, so that the two
forms meet the same state of the machine: a virtual machine's cores vary in speed from one second to the next
(the header says UNSTEADY when the calibration saw it), and a ratio of two forms timed minutes apart would carry
that drift. Per form, the time per application net of the floor is reported only when it stands clear of the
floor's spread (:func:`protocol.resolve`); the ratio ``without / with`` is taken per round and reported as its
median with min-max, only where both forms resolve.

    .venv/bin/python benchmarks/panel_speed.py                       # 1024^2 and 4096^2 at batch 256, 80-95%
    .venv/bin/python benchmarks/panel_speed.py --points 1024:128:0.9 --rounds 9
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
import protocol  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
POINTS = "1024:256:0.8,1024:256:0.9,1024:256:0.95,4096:256:0.8,4096:256:0.9"


def parse_points(text: str) -> list[tuple[int, int, float]]:
    """``"n:batch:sparsity,..."`` to a list of points; a ``ValueError`` names the bad one."""
    out = []
    for item in text.split(","):
        parts = item.strip().split(":")
        try:
            n, batch, sparsity = int(parts[0]), int(parts[1]), float(parts[2])
        except (ValueError, IndexError):
            raise ValueError(f"--points: {item!r} is not n:batch:sparsity (e.g. 1024:256:0.9)") from None
        if n < 1 or batch < 1 or not 0.0 <= sparsity < 1.0 or len(parts) != 3:
            raise ValueError(f"--points: {item!r} needs n >= 1, batch >= 1 and 0 <= sparsity < 1")
        out.append((n, batch, sparsity))
    return out


def markdown(df: pd.DataFrame, header: str) -> str:
    lines = [header, "",
             "Milliseconds per application in a graph, net of the floor: median (min-max over the rounds); `< floor`: "
             "not resolved. `without / with`: the op's time without the panel section over its time with it, per "
             "round (median, min-max); above 1 the panels are faster. `segment`: mean stored entries per (panel, "
             "output) segment; `panels`: whether prune.native.structure adds the section by default (panels_pay; "
             "this script always adds it); K: applications per graph call.", "",
             "| n | batch | sparsity | nnz | segment | panels | K | with panels | without (profile 6) | without / with |",
             "|---|---|---|---|---|---|---|---|---|---|"]

    def cell(ms, lo, hi):
        return "< floor" if np.isnan(ms) else f"{ms:.3f} ({lo:.3f}-{hi:.3f})"

    for r in df.itertuples():
        ratio = "-" if np.isnan(r.ratio) else f"{r.ratio:.2f} ({r.ratio_min:.2f}-{r.ratio_max:.2f})"
        lines.append(f"| {r.n} | {r.batch} | {r.sparsity:.0%} | {r.nnz} | {r.segment:.1f} | {'yes' if r.panels else 'no'} | {r.k} | "
                     f"{cell(r.with_ms, r.with_min, r.with_max)} | {cell(r.without_ms, r.without_min, r.without_max)} | "
                     f"{ratio} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--points", default=POINTS, help="n:batch:sparsity, comma-separated (an n x n weight)")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--min-ms", type=float, default=30.0, help="each measurement repeats calls for this long")
    p.add_argument("--k", type=int, default=8, help="applications per graph call to start from")
    p.add_argument("--k-max", type=int, default=128, help="most applications per graph call")
    p.add_argument("--threads", type=int, default=0, help="TensorFlow's intra-op threads (default: the usable cores)")
    p.add_argument("--out", default=str(ROOT / "results/benchmarks/panel_speed.csv"),
                   help="the CSV; the report goes beside it as .md")
    protocol.add_arguments(p)
    args = p.parse_args(argv)
    try:
        points = parse_points(args.points)
    except ValueError as e:
        p.error(str(e))
    if args.rounds < 1 or args.k < 1:
        p.error(f"--rounds and --k must be positive, got {args.rounds} and {args.k}")

    load = protocol.start_or_refuse(args)  # before TensorFlow loads: a busy machine is refused at once
    if load is None:
        return protocol.REFUSED

    import tensorflow as tf

    intra, inter = protocol.fix_tf_threads(args.threads or None)
    from peers import write_results
    from prune import native

    tf.get_logger().setLevel("ERROR")
    lib = native.load()
    if lib is None:
        print(f"panel_speed: the native kernels are not available ({native.status().reason})", file=sys.stderr)
        return 2
    gemm = protocol.dense_gemm_gflops()
    mach = protocol.machine()
    rng = np.random.default_rng(0)
    rows = []
    nan = float("nan")
    for n, batch, sparsity in points:
        mask = rng.random((n, n)) >= sparsity
        idx = np.argwhere(mask)
        vals = tf.constant(rng.standard_normal(len(idx)).astype(np.float32))
        st = tf.constant(native.structure(idx, n, n, panels=True))
        pool = [tf.constant(rng.standard_normal((batch, n)).astype(np.float32)) for _ in range(4)]

        k = args.k
        while True:  # K grows (x4, up to --k-max) until both forms stand clear of the floor
            def inputs(pool=pool, k=k):
                return [pool[i % len(pool)] + tf.constant(float(i)) for i in range(k)]

            graphs = {}
            for name, profile in (("with", 0), ("without", 6)):
                graphs[name] = tf.function(lambda profile=profile, st=st, vals=vals, n=n, inputs=inputs: tf.add_n(
                    [tf.reduce_sum(lib.prune_spmm(x, vals, st, n_in=n, n_out=n, profile=profile)) for x in inputs()]))
            graphs["floor"] = tf.function(lambda inputs=inputs: tf.add_n([tf.reduce_sum(x) for x in inputs()]))
            for g in graphs.values():
                g().numpy()  # trace
            got = protocol.interleaved({name: (lambda g=g: g().numpy()) for name, g in graphs.items()}, args.rounds,
                                       args.min_ms, seed=n + batch + k)
            res = {name: protocol.resolve(got[name].values, got["floor"].values, k) for name in ("with", "without")}
            if all(r.resolved for r in res.values()) or k * 4 > args.k_max:
                break
            k *= 4
        ratios = [(b - f) / (a - f) for a, b, f in zip(got["with"].values, got["without"].values, got["floor"].values)]
        both = res["with"].resolved and res["without"].resolved
        row = dict(n=n, batch=batch, sparsity=sparsity, nnz=len(idx),
                   segment=len(idx) / (n * -(-n // native.PANEL_WIDTH)),
                   panels=native.panels_pay(len(idx), n, n), k=k, rounds=args.rounds, threads=intra)
        for k, r in res.items():
            row[f"{k}_ms"] = nan if r.ms is None else r.ms
            row[f"{k}_min"] = nan if r.low is None else r.low
            row[f"{k}_max"] = nan if r.high is None else r.high
        row.update(ratio=statistics.median(ratios) if both else nan, ratio_min=min(ratios) if both else nan,
                   ratio_max=max(ratios) if both else nan)
        rows.append(row)
        print(f"n {n} batch {batch} sparsity {sparsity:.2f}: with {res['with'].text()} without {res['without'].text()}"
              f" ratio {row['ratio']:.2f}", flush=True)
    load.stop()
    header = protocol.header(
        "What the input-axis panels buy the native forward op", mach, load, gemm,
        f"TensorFlow {tf.__version__}: intra_op={intra}, inter_op={inter}",
        [f"Weights n x n, uniformly random; the op alone (no layer); K from {args.k} (x4) up to {args.k_max} "
         "applications per graph call, until both forms stand clear of the floor; "
         f"{args.rounds} rounds, each >= {args.min_ms:g} ms of calls, the two forms and the floor in a fresh order "
         f"every round; panels of {native.PANEL_WIDTH} inputs."],
    )
    write_results(pd.DataFrame(rows), Path(args.out), markdown(pd.DataFrame(rows), header))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
