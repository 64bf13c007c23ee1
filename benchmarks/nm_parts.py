"""Per part of an N:M layer (issue 36): the native forward, input-gradient and values-gradient ops against dense.

For each shape (``--shapes``, default 512x2048 and 2048x512, a transformer feed-forward pair's two layers) and
batch (``--batches``, default 1, 256 and 4096 rows), with seeded random weights pruned to a random 2:4 structure
(2 of every 4 consecutive inputs of each output kept) and, beside it, a random 90%-sparse one, the three native
ops (``PruneSpmm``, ``PruneSpmm`` with ``transpose``, ``PruneSddmm``) on the structure ``prune.native.structure``
builds (2:4 gets its N:M section, 90% does not) are timed against the dense products they replace:
``tf.matmul(x, W)``, ``tf.matmul(dy, W, transpose_b=True)`` and ``tf.matmul(x, dy, transpose_a=True)`` (the
dense values gradient before its gather). Each is a tf.function on resident tensors; every op's output is
checked against float64 NumPy first (rtol/atol 1e-3 relative to the largest output). All points are timed in
ONE run, in interleaved rounds (:func:`protocol.interleaved`); the table gives medians over ``--rounds`` rounds
with min-max and "x dense" (dense's median over the op's).

Under ``benchmarks/protocol.py``: a busy machine is refused (exit 3) unless ``--allow-loaded``; TensorFlow's
threads fixed (``--threads``, inter-op 1); the header states CPU, flags, native vector path, load and threads, and
the dense GEMM calibration.

    .venv/bin/python benchmarks/nm_parts.py                   # results/benchmarks/nm_parts.{md,csv}
    .venv/bin/python benchmarks/nm_parts.py --shapes 64x96 --batches 1 5 --rounds 1 --min-ms 1 --allow-loaded --out /tmp/np
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import protocol  # noqa: E402

OUT = ROOT / "results" / "benchmarks" / "nm_parts"
PARTS = ("forward", "input grad", "values grad")
COLUMNS = ["shape", "rows", "structure", "part", "nm_section", "ms", "ms_min", "ms_max", "dense_ms", "x_dense", "max_rel_err"]


def _shape(text: str) -> tuple[int, int]:
    try:
        n_in, n_out = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shapes takes N_INxN_OUT, e.g. 512x2048, got {text!r}") from None
    if n_in < 4 or n_out < 1:
        raise argparse.ArgumentTypeError(f"--shapes needs n_in >= 4 and n_out >= 1, got {text!r}")
    return n_in, n_out


def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"--batches and --rounds take positive integers, got {text!r}")
    return v


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", type=_shape, nargs="+", default=[(512, 2048), (2048, 512)])
    p.add_argument("--batches", type=_positive, nargs="+", default=[1, 256, 4096])
    p.add_argument("--rounds", type=_positive, default=7)
    p.add_argument("--min-ms", type=float, default=20.0)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--out", type=Path, default=OUT)
    protocol.add_arguments(p)
    return p.parse_args(argv)


def _structures(rng: np.random.Generator, n_in: int, n_out: int) -> dict[str, np.ndarray]:
    groups = -(-n_in // 4)
    order = np.argsort(rng.random((groups, 4, n_out)), axis=1)
    keep = np.zeros((groups, 4, n_out), bool)
    np.put_along_axis(keep, order[:, :2], True, axis=1)
    nm = keep.reshape(groups * 4, n_out)[:n_in]
    flat = np.zeros(n_in * n_out, bool)
    flat[rng.permutation(n_in * n_out)[: n_in * n_out // 10]] = True
    return {"2:4": nm, "90%": flat.reshape(n_in, n_out)}


def measure(args: argparse.Namespace) -> list[dict]:
    import tensorflow as tf

    from prune import native

    lib = native.load()
    if lib is None:
        raise SystemExit(f"the native ops did not load: {native.status().reason}")
    rng = np.random.default_rng(0)
    points, fns = [], {}
    for n_in, n_out in args.shapes:
        w = rng.standard_normal((n_in, n_out)).astype(np.float32)
        for rows in args.batches:
            x = rng.standard_normal((rows, n_in)).astype(np.float32)
            dy = rng.standard_normal((rows, n_out)).astype(np.float32)
            xt, dyt, wt = tf.constant(x), tf.constant(dy), tf.constant(w)
            dense = {"forward": tf.function(lambda xt=xt, wt=wt: tf.matmul(xt, wt)),
                     "input grad": tf.function(lambda dyt=dyt, wt=wt: tf.matmul(dyt, wt, transpose_b=True)),
                     "values grad": tf.function(lambda xt=xt, dyt=dyt: tf.matmul(xt, dyt, transpose_a=True))}
            for part, f in dense.items():
                fns[(f"{n_in}x{n_out}", rows, "dense", part)] = f
            for name, mask in _structures(rng, n_in, n_out).items():
                idx = np.argwhere(mask).astype(np.int64)
                vals = tf.constant(w[mask])
                st = tf.constant(native.structure(idx, n_in, n_out))
                nm = native.has_nm_section(int(st.shape[0]), len(idx), n_in, n_out)
                ops = {"forward": tf.function(lambda xt=xt, v=vals, s=st: lib.prune_spmm(xt, v, s, n_in=n_in, n_out=n_out)),
                       "input grad": tf.function(lambda d=dyt, v=vals, s=st: lib.prune_spmm(d, v, s, n_in=n_in, n_out=n_out,
                                                                                           transpose=True)),
                       "values grad": tf.function(lambda xt=xt, d=dyt, v=vals, s=st: lib.prune_sddmm(xt, d, v, s, n_in=n_in,
                                                                                                      n_out=n_out))}
                wm = np.where(mask, w, 0).astype(np.float64)
                expected = {"forward": x.astype(np.float64) @ wm, "input grad": dy.astype(np.float64) @ wm.T,
                            "values grad": (x.astype(np.float64).T @ dy.astype(np.float64))[mask]}
                for part, f in ops.items():
                    got = np.asarray(f().numpy(), np.float64)
                    err = float(np.max(np.abs(got - expected[part])) / max(np.max(np.abs(expected[part])), 1e-30))
                    if err > 1e-3:
                        raise SystemExit(f"{n_in}x{n_out} rows {rows} {name} {part}: relative error {err:.2e} > 1e-3")
                    key = (f"{n_in}x{n_out}", rows, name, part)
                    fns[key] = f
                    points.append({"shape": key[0], "rows": rows, "structure": name, "part": part, "nm_section": nm,
                                   "max_rel_err": err})
    times = protocol.interleaved({" ".join(map(str, k)): f for k, f in fns.items()}, args.rounds, args.min_ms)
    for p in points:
        s = times[f"{p['shape']} {p['rows']} {p['structure']} {p['part']}"]
        d = times[f"{p['shape']} {p['rows']} dense {p['part']}"]
        p.update(ms=s.median, ms_min=s.low, ms_max=s.high, dense_ms=d.median, x_dense=d.median / s.median)
    return points


def markdown(rows: list[dict]) -> str:
    lines = ["| shape | rows | structure | part | N:M section | ms, median (min-max) | dense ms | x dense |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['shape']} | {r['rows']} | {r['structure']} | {r['part']} | {'yes' if r['nm_section'] else 'no'} | "
                     f"{r['ms']:.3f} ({r['ms_min']:.3f}-{r['ms_max']:.3f}) | {r['dense_ms']:.3f} | {r['x_dense']:.2f}x |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    load = protocol.start_or_refuse(args)
    if load is None:
        return protocol.REFUSED
    threads = protocol.fix_tf_threads(args.threads or None)
    import pandas as pd
    import tensorflow as tf

    gemm = protocol.dense_gemm_gflops()
    mach = protocol.machine()
    rows = measure(args)
    load.stop()
    head = protocol.header(
        "Per part of an N:M layer: the native ops against dense (issue 36)", mach, load, gemm,
        f"TensorFlow {tf.__version__}: intra_op={threads[0]}, inter_op={threads[1]}",
        ([] if not load.loaded else ["NOT A RESULT: the machine was loaded."]) + [
            f"Seeded random weights; 2:4: 2 of every 4 consecutive inputs of each output kept (N:M section); 90%: a "
            f"random tenth kept. A call: the op (or tf.matmul) in a tf.function on resident tensors, checked against "
            f"float64 NumPy first. {args.rounds} interleaved round(s), calls per point >= {args.min_ms:g} ms; median "
            "per call (min-max over rounds); 'x dense' = the dense product's median over the op's (the values "
            "gradient's dense product is x^T dy, before its gather at the stored entries)."])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).reindex(columns=COLUMNS).to_csv(args.out.with_name(args.out.name + ".csv"), index=False)
    report = head + "\n" + markdown(rows)
    args.out.with_name(args.out.name + ".md").write_text(report)
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
