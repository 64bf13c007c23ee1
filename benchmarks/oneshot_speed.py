"""What ``prune.oneshot`` costs in time and memory on one large layer: magnitude, Wanda and SparseGPT.

The case of issue 35's target: a trained ``Dense(d, d)`` (``d = 1024``) applied to sequences, and ``--seqs``
calibration sequences of ``--tokens`` tokens each (128 x 64 = 8192 tokens of ``d`` features, 32 MB as float32),
passed to ``prune.oneshot(model, data, ...)`` with its default ``batch_size`` (32 sequences per calibration
batch). Methods: magnitude (no data), Wanda and SparseGPT at 50% unstructured, and SparseGPT at 2:4.

Each run is **a fresh Python process** (``--child``), so that no run inherits another's allocator pools or
traced graphs, and one run's peak cannot hide under another's. In it, the model and the data are built and
the model is applied once (a trained model has run before; TensorFlow's first call sets up its kernels), and
then:

    total s       wall time of the ``prune.oneshot`` call: cloning, calibration, pruning, installing masks
    solve s       the method's own arithmetic on the statistics (``OneShotPruning.plan``), within ``total``
    extra MB      the process's peak resident memory during the call (``VmHWM``, reset just before it through
                  ``/proc/self/clear_refs``) less its resident memory just before it: what the call adds, to
                  the model and the data the user already holds, at its highest
    numpy MB      the peak of the Python heap's allocations during the call (``tracemalloc``: NumPy's arrays,
                  not TensorFlow's tensors), a second view of the same peak

Runs of the methods are interleaved (``--rounds`` rounds, a fresh random order each round), medians with min
and max.

Under ``benchmarks/protocol.py``: a busy machine is refused (exit 3) unless ``--allow-loaded``; TensorFlow's
threads are fixed in every child (intra-op = ``--threads``, default the usable cores; inter-op = 1) and stated;
TensorFlow's dense GEMM in GFLOPS is measured in the parent, in the same run, and a dense forward pass over the
calibration data is timed in every child as that run's own yardstick. Writes ``--out`` (CSV) and a Markdown
table beside it.

    .venv/bin/python benchmarks/oneshot_speed.py
    .venv/bin/python benchmarks/oneshot_speed.py --d 512 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import protocol  # noqa: E402

CASES = {  # name: (method, sparsity, N:M or None)
    "magnitude 50%": ("magnitude", 0.5, None),
    "wanda 50%": ("wanda", 0.5, None),
    "sparsegpt 50%": ("sparsegpt", 0.5, None),
    "sparsegpt 2:4": ("sparsegpt", None, (2, 4)),
}
TARGET_S, TARGET_MB = 5.0, 64.0
"""Issue 35's target for SparseGPT at d = 1024 with 128 x 64 tokens, set before the first run."""


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak() -> bool:
    """Reset ``VmHWM`` to the current resident size (Linux >= 4.0: ``echo 5 > /proc/self/clear_refs``)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def child(args: argparse.Namespace) -> dict:
    """One run of one case in this (fresh) process; returns its readings."""
    import tracemalloc

    import keras
    import tensorflow as tf

    import prune
    from prune.algorithms.oneshot import OneShotPruning

    protocol.fix_tf_threads(args.threads or None)
    method, sparsity, nm = CASES[args.child]
    rng = np.random.default_rng(0)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((args.tokens, args.d)), keras.layers.Dense(args.d, name="fc")])
    # A "trained" layer and inputs with unequal feature scales, so Wanda and SparseGPT differ from magnitude.
    model.layers[0].kernel.assign(rng.standard_normal((args.d, args.d)).astype("float32") / np.sqrt(args.d))
    scale = np.exp(rng.normal(0.0, 0.5, size=args.d)).astype("float32")
    data = rng.standard_normal((args.seqs, args.tokens, args.d)).astype("float32") * scale
    model(data[:32])  # a trained model has run: TensorFlow's kernels are set up
    forward = []
    for _ in range(3):
        t0 = time.perf_counter()
        for i in range(0, args.seqs, 32):
            model(data[i:i + 32])
        forward.append(time.perf_counter() - t0)

    solve = [0.0]
    plan = OneShotPruning.plan

    def timed_plan(self, updates):
        t0 = time.perf_counter()
        try:
            return plan(self, updates)
        finally:
            solve[0] += time.perf_counter() - t0

    OneShotPruning.plan = timed_plan  # no one-shot method overrides plan (prune_weight is theirs)
    assert not any("plan" in sub.__dict__ for sub in OneShotPruning.__subclasses__())
    kwargs = dict(sparsity=sparsity, method=method, verbose=False)
    if nm is not None:
        kwargs["pattern"] = prune.NByM(*nm)
    calib = None if method == "magnitude" else data
    rss0 = _status_kb("VmRSS")
    resettable = _reset_peak()
    tracemalloc.start()
    t0 = time.perf_counter()
    pruned = prune.oneshot(model, calib, **kwargs)
    total = time.perf_counter() - t0
    _, numpy_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    hwm = _status_kb("VmHWM")
    kernel = pruned.layers[0].kernel.numpy()
    return dict(case=args.child, total_s=total, solve_s=solve[0], extra_mb=(hwm - rss0) / 1024 if resettable else float("nan"),
                numpy_mb=numpy_peak / 2**20, rss_before_mb=rss0 / 1024, forward_s=float(np.median(forward)),
                zeros=float(np.mean(kernel == 0.0)), tf=tf.__version__, keras=keras.__version__)


def run_child(case: str, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", case, "--d", str(args.d), "--seqs", str(args.seqs),
           "--tokens", str(args.tokens), "--threads", str(args.threads)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"case {case!r} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def markdown(df, header: str, args: argparse.Namespace) -> str:
    lines = [header, "",
             f"Seconds and MB, median of {args.rounds} fresh-process runs (min-max). `dense fwd s`: the same run's "
             f"dense forward pass over all {args.seqs} x {args.tokens} calibration tokens (the yardstick of that "
             f"run). Target (issue 35, set before the run): SparseGPT under {TARGET_S:.0f} s and under "
             f"{TARGET_MB:.0f} MB extra.", "",
             "| case | total s | solve s | extra MB | numpy MB | dense fwd s | zeros |", "|---|---|---|---|---|---|---|"]
    for _, r in df.iterrows():
        cells = [f"{r[c]:.2f} ({r[c + '_min']:.2f}-{r[c + '_max']:.2f})" for c in ("total_s", "solve_s")]
        cells += [f"{r[c]:.0f} ({r[c + '_min']:.0f}-{r[c + '_max']:.0f})" for c in ("extra_mb", "numpy_mb")]
        cells += [f"{r['forward_s']:.3f}", f"{r['zeros']:.3f}"]
        lines.append(f"| {r['case']} | " + " | ".join(cells) + " |")
    gpt = df[df["case"].str.startswith("sparsegpt")]
    if gpt.empty:
        return "\n".join(lines) + "\n"
    worst_s, worst_mb = float(gpt["total_s_max"].max()), float(gpt["extra_mb_max"].max())
    met = worst_s < TARGET_S and worst_mb < TARGET_MB
    lines += ["", f"Target {'met' if met else 'MISSED'}: the slowest SparseGPT run took {worst_s:.2f} s (target "
              f"{TARGET_S:.0f} s) and the largest added {worst_mb:.0f} MB (target {TARGET_MB:.0f} MB)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--d", type=int, default=1024, help="the Dense layer's input and output width")
    p.add_argument("--seqs", type=int, default=128, help="calibration sequences")
    p.add_argument("--tokens", type=int, default=64, help="tokens per sequence")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=0, help="TensorFlow's intra-op threads (default: the usable cores)")
    p.add_argument("--cases", default="", help=f"comma-separated subset of {', '.join(CASES)} (default: all)")
    p.add_argument("--child", choices=sorted(CASES), help=argparse.SUPPRESS)
    p.add_argument("--out", default=str(ROOT / "results" / "benchmarks" / "oneshot_speed.csv"))
    protocol.add_arguments(p)
    args = p.parse_args(argv)
    for name in ("d", "seqs", "tokens", "rounds"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.threads < 0:
        p.error(f"--threads must be >= 0, got {args.threads}")
    cases = [c.strip() for c in args.cases.split(",") if c.strip()] or list(CASES)
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        p.error(f"--cases: {', '.join(map(repr, unknown))} not among {', '.join(map(repr, CASES))}")
    if args.child:
        print(json.dumps(child(args)), flush=True)
        return 0

    load = protocol.start_or_refuse(args)  # children are waited for: their CPU counts as this run's, not load
    if load is None:
        return protocol.REFUSED
    import pandas as pd
    import tensorflow as tf
    import keras

    from peers import write_results

    intra, inter = protocol.fix_tf_threads(args.threads or None)
    gemm = protocol.dense_gemm_gflops()
    mach = protocol.machine()
    rng = np.random.default_rng(0)
    order = list(cases)
    got: dict[str, list[dict]] = {c: [] for c in cases}
    for r in range(args.rounds):
        rng.shuffle(order)
        for case in order:
            got[case].append(run_child(case, args))
            print(f"round {r + 1}/{args.rounds} {case}: {got[case][-1]['total_s']:.2f} s, "
                  f"{got[case][-1]['extra_mb']:.0f} MB", flush=True)
    load.stop()
    rows = []
    for case in cases:
        runs = got[case]
        row = dict(case=case)
        for col in ("total_s", "solve_s", "extra_mb", "numpy_mb"):
            s = protocol.Samples(tuple(x[col] for x in runs))
            row.update({col: s.median, f"{col}_min": s.low, f"{col}_max": s.high})
        row["forward_s"] = float(np.median([x["forward_s"] for x in runs]))
        row["zeros"] = runs[0]["zeros"]
        rows.append(row)
    df = pd.DataFrame(rows).assign(d=args.d, seqs=args.seqs, tokens=args.tokens, rounds=args.rounds,
                                   intra_threads=intra, inter_threads=inter)
    header = protocol.header(
        f"What prune.oneshot costs on one {args.d}x{args.d} Dense layer", mach, load, gemm,
        f"TensorFlow {tf.__version__} (Keras {keras.__version__}): intra_op={intra}, inter_op={inter}, in every child",
        [f"Dense({args.d}) on {args.seqs} calibration sequences x {args.tokens} tokens (float32, random, feature "
         f"scales log-normal), `prune.oneshot`'s default batch_size 32; one fresh process per run; "
         f"{args.rounds} interleaved rounds."],
    )
    write_results(df, Path(args.out), markdown(df, header, args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
