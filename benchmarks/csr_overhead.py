"""Where SparseDense's forward time goes (CSR and native kernels), per operation, inside a compiled graph.

Under ``benchmarks/protocol.py``: the table starts with the CPU and its flags, TensorFlow's threads (fixed
before anything runs), the load before and during the run (a busy machine is refused, exit code 3, unless
``--allow-loaded``; then the header says LOADED) and TensorFlow's dense GEMM in GFLOPS measured in the same run.

Every time is one operation's time per application inside one ``tf.function``
(:func:`protocol.per_application`): K applications to K distinct inputs, net of a floor graph that reads the
same inputs and applies nothing, K grown from 8 (x4) up to ``--k-max`` until the time stands clear of the
floor's spread; medians of ``--rounds`` interleaved rounds, with min-max. A time that never stands clear is
written ``< floor``, never as a (possibly negative) number. For an ``--n`` x ``--n`` weight at batch
``--batch`` (default 1024x1024, batch 256), at each of ``--sparsities``:

* ``dense``: ``tf.matmul(x, W)``;
* ``csr kernel``: ``SparseMatrixMatMul`` alone, on a CSR matrix of ``W^T`` built once, outside the graph,
  times a ready ``x^T`` (the kernel's own speed; oneDNN's when ``TF_ENABLE_ONEDNN_SPMM=1``, which
  ``import prune`` sets);
* ``to CSR``: ``SparseTensorToCSRSparseMatrix`` of the stored entries (the graph sums its nnz, a scalar,
  while the floor sums the ``nnz`` input values: the figure is short by that one sum, a few percent);
* ``gather``: reordering ``values`` into the row-major order of ``W^T``;
* ``transpose``: one ``[batch, n]`` transpose (the CSR layer needs two);
* ``layer``: a whole ``SparseDense(matmul="csr")`` call (the above plus the bias);
* ``native op``: the native forward op ``PruneSpmm`` alone (values gathered into ``W^T`` order inside
  it, then the tiled product);
* ``native dx op``: the same op with ``transpose=True`` on a ``[batch, n]`` input, which walks ``W`` as
  stored and gathers nothing;
* ``native layer``: a whole ``SparseDense(matmul="native")`` call (the op, the reshapes and the bias).

Below them, ratios of medians (dense's time over the operation's), and the value gather inside the native
op as ``native op - native dx op`` under the rule for parts below.

Then, for the native forward op alone at each of ``--points`` (``--breakdown-only`` runs just this part),
its per-part times from the op's benchmark-only ``profile`` attribute (see ``sparse_ops.cc``). Each
profile level is timed on its own with :func:`protocol.per_application`; a part is the difference of two
levels:

* ``fixed``: the op with ``profile=1`` (checks of the structure and the output allocation; no work),
  itself net of the floor;
* ``value gather``: ``profile=2`` minus ``profile=1`` (gathering the values into ``W^T`` order, done only
  on the path with more batch tiles than threads, e.g. batch 256 on 2 threads with AVX-512);
* ``transposes``: ``profile=3`` minus ``profile=2`` (or minus ``profile=1`` when nothing is gathered):
  transposing the input tiles and writing the output tiles back, without the multiply-adds (the tiled
  paths, batch of at least one machine vector: 8 rows with AVX2, 16 with AVX-512);
* ``multiply-adds``: the whole op minus ``profile=3`` (tiled) or minus ``profile=1`` (smaller batches:
  the scatter has no separate parts);
* per multiply-add: that time over ``nnz * batch``, against dense's time over ``n * n * batch``.

**When a part is resolved.** A part (the difference ``upper - lower`` of two levels) is reported only when
both levels are resolved against the floor and their intervals over the rounds do not overlap: the upper
level's fastest round is slower than the lower level's slowest round (``upper.low > lower.high``). Then
the part is ``upper.median - lower.median``, with the range ``(upper.low - lower.high)`` to
``(upper.high - lower.low)``, which is positive. Otherwise the part is written ``< floor``: it is not told
apart from the noise, and no negative or in-noise difference is printed. The same rule gives the value
gather inside the op in the first table; a ratio is given only when both of its times are resolved.

Which path the op takes (so which levels apply) is decided inside the op; this script mirrors its rule
(``sparse_ops.cc``: batch below one vector -> scatter; else tiles of ``TileVectors(n, batch)`` vectors,
and more tiles than TensorFlow's intra-op threads -> values gathered first) from the native library's
vector width, the L2 size (``getconf LEVEL2_CACHE_SIZE``) and the threads, and prints the path it assumed.
The weights are uniformly random, so the block kernels never run.

Writes ``--out`` (CSV: every level, operation and part with median, min, max and K) and the report beside
it (``.md``), also printed.

    .venv/bin/python benchmarks/csr_overhead.py                       # both parts, 1024^2 and two 4096^2 points
    .venv/bin/python benchmarks/csr_overhead.py --breakdown-only --points 4096:256:0.9,256:0.99
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import protocol  # noqa: E402

N, BATCH = 1024, 256
SPARSITIES = "0.9,0.99"
# batch:sparsity at --n, or n:batch:sparsity
POINTS = ",".join(f"{b}:{s}" for b in (1, 32, 256) for s in (0.8, 0.9, 0.99)) + ",4096:256:0.9,4096:1:0.9"
OPERATIONS = ("dense", "csr kernel", "to CSR", "gather", "transpose", "layer", "native op", "native dx op",
              "native layer")


@dataclass(frozen=True)
class Part:
    """A resolved difference of two levels (ms): median and range, or unresolved (``ms`` None)."""

    ms: float | None
    low: float | None = None
    high: float | None = None

    def text(self, digits: int = 3) -> str:
        if self.ms is None:
            return "< floor"
        return f"{self.ms:.{digits}f} ({self.low:.{digits}f}-{self.high:.{digits}f})"


def part_of(level: protocol.PerApplication) -> Part:
    """A level net of the floor, as a part (``fixed``)."""
    return Part(level.ms, level.low, level.high) if level.resolved and level.ms is not None else Part(None)


def difference(upper: protocol.PerApplication, lower: protocol.PerApplication) -> Part:
    """``upper - lower`` when both are resolved and their min-max intervals do not overlap, else unresolved."""
    if not (upper.resolved and lower.resolved) or upper.ms is None or lower.ms is None:
        return Part(None)
    if not upper.low > lower.high:
        return Part(None)
    return Part(upper.ms - lower.ms, upper.low - lower.high, upper.high - lower.low)


def ratio(a: protocol.PerApplication, b: protocol.PerApplication) -> str:
    """``a / b`` of medians as ``"2.25x"``, or ``"-"`` when either is unresolved."""
    if a.ms is None or b.ms is None:
        return "-"
    return f"{a.ms / b.ms:.2f}x"


def _lanes() -> int:
    from prune import native

    m = re.search(r"\((\d+) lanes\)", native.status().vector or "")
    return int(m.group(1)) if m else 8


def _half_l2() -> int:
    try:
        l2 = int(subprocess.run(["getconf", "LEVEL2_CACHE_SIZE"], capture_output=True, text=True).stdout.strip())
    except (OSError, ValueError):
        l2 = 0
    return l2 // 2 if l2 > 0 else 256 << 10


def forward_path(n_in: int, batch: int, lanes: int, threads: int, half_l2: int) -> str:
    """The native forward op's path on a non-blocked structure, as ``sparse_ops.cc`` picks it:
    ``"scatter"``, ``"tiled"`` (values read through tperm) or ``"tiled, gathered"``."""
    if batch < lanes:
        return "scatter"
    nv = 4
    while nv > 1 and (n_in * nv * lanes * 4 > half_l2 or (nv // 2) * lanes >= batch):
        nv //= 2
    tiles = -(-batch // (nv * lanes))
    return "tiled" if tiles <= threads else "tiled, gathered"


def _row(section, n, batch, sparsity, nnz, name, got) -> dict:
    nan = float("nan")
    if isinstance(got, protocol.PerApplication):
        ms, lo, hi, k = got.ms, got.low, got.high, got.k
    else:
        ms, lo, hi, k = got.ms, got.low, got.high, None
    return dict(section=section, n=n, batch=batch, sparsity=sparsity, nnz=nnz, name=name,
                ms=nan if ms is None else ms, ms_min=nan if lo is None else lo, ms_max=nan if hi is None else hi,
                k=k, resolved=ms is not None)


def operations(lib, n: int, batch: int, sparsities: list[float], timing: dict, rows: list) -> list[str]:
    """The per-operation table (markdown lines); appends CSV rows."""
    import tensorflow as tf
    from tensorflow.python.ops.linalg.sparse import sparse_csr_matrix_ops as csr_ops

    from prune.layers.sparse import SparseDense

    rng = np.random.default_rng(0)
    xs = [tf.constant(rng.normal(size=(batch, n)).astype("float32")) for _ in range(8)]
    xts = [tf.transpose(x) for x in xs]
    shape = tf.constant([n, n], tf.int64)
    columns, cells = [], {name: [] for name in OPERATIONS}
    derived = {k: [] for k in ("dense / csr kernel", "dense / layer", "dense / native op", "dense / native layer",
                               "value gather inside the native op (native op - native dx op)")}
    for sparsity in sparsities:
        mask = rng.random((n, n)) >= sparsity
        w = (rng.normal(size=(n, n)) * mask / np.sqrt(n * (1 - sparsity))).astype("float32")
        layer = SparseDense.from_dense(w, mask, matmul="csr")
        t_idx, perm = layer.transpose_indices.value, layer.transpose_perm.value
        vals = [tf.constant(rng.normal(size=layer.nnz).astype("float32")) for _ in range(8)]
        dense_w = tf.constant(w)

        def to_csr(v):
            return tf.raw_ops.SparseTensorToCSRSparseMatrix(indices=t_idx, values=v, dense_shape=shape)

        csr = to_csr(tf.gather(layer.values.value, perm))  # built once, captured by the graphs
        # A captured variant loses its shape; SparseMatrixMatMul's shape function needs it (as TF's
        # CSRSparseMatrix sets it in eager mode).
        csr._handle_data = csr_ops._create_handle_data_proto(tf.TensorShape([n, n]).as_proto(),
                                                             tf.float32.as_datatype_enum)
        ops = {
            "dense": (lambda x: tf.matmul(x, dense_w), xs),
            "csr kernel": (lambda xt: tf.raw_ops.SparseMatrixMatMul(a=csr, b=xt), xts),
            "to CSR": (lambda v: tf.raw_ops.SparseMatrixNNZ(sparse_matrix=to_csr(v)), vals),
            "gather": (lambda v: tf.gather(v, perm), vals),
            "transpose": (lambda x: tf.transpose(x), xs),
            "layer": (layer, xs),
        }
        if lib is not None:
            nat = SparseDense.from_dense(w, mask, matmul="native")
            st, v = nat.native_structure.value, nat.values.value
            ops["native op"] = (lambda x: lib.prune_spmm(x, v, st, n_in=n, n_out=n), xs)
            ops["native dx op"] = (lambda x: lib.prune_spmm(x, v, st, n_in=n, n_out=n, transpose=True), xs)
            ops["native layer"] = (nat, xs)
        got = {name: protocol.per_application(fn, pool, **timing) for name, (fn, pool) in ops.items()}
        for name, g in got.items():
            rows.append(_row("operation", n, batch, sparsity, layer.nnz, name, g))
        columns.append(f"{sparsity:.0%} sparse (nnz {layer.nnz})")
        for name in OPERATIONS:
            cells[name].append(got[name].text() + f", K={got[name].k}" if name in got and got[name].resolved
                               else (got[name].text() if name in got else "not measured (no native kernels)"))
        derived["dense / csr kernel"].append(ratio(got["dense"], got["csr kernel"]))
        derived["dense / layer"].append(ratio(got["dense"], got["layer"]))
        gather = Part(None)
        if lib is not None:
            derived["dense / native op"].append(ratio(got["dense"], got["native op"]))
            derived["dense / native layer"].append(ratio(got["dense"], got["native layer"]))
            gather = difference(got["native op"], got["native dx op"])
            rows.append(_row("difference", n, batch, sparsity, layer.nnz, "value gather in op", gather))
            derived["value gather inside the native op (native op - native dx op)"].append(gather.text())
        else:
            for k in ("dense / native op", "dense / native layer",
                      "value gather inside the native op (native op - native dx op)"):
                derived[k].append("-")
        print(f"sparsity {sparsity:.2f} (nnz {layer.nnz}): " + " | ".join(f"{k} {g.text()}" for k, g in got.items())
              + f" | value gather in op {gather.text()}", flush=True)
    lines = [f"## Per operation, {n}x{n} weight, batch {batch}", "",
             "Milliseconds per application in a graph, net of the floor: median (min-max over the rounds), and K, "
             "the applications per graph call. `< floor`: not resolved at the largest K tried.", "",
             "| operation | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    lines += [f"| {name} | " + " | ".join(c) + " |" for name, c in cells.items()]
    lines += [f"| {name} | " + " | ".join(c) + " |" for name, c in derived.items()]
    return lines + [""]


def breakdown(lib, points: list[tuple[int, int, float]], timing: dict, threads: int, rows: list) -> list[str]:
    """The native forward op by part at each ``(n, batch, sparsity)`` (markdown lines); appends CSV rows."""
    import tensorflow as tf

    from prune.layers.sparse import SparseDense

    rng = np.random.default_rng(1)
    lanes, half_l2 = _lanes(), _half_l2()
    lines = ["## The native forward op by part", "",
             f"Milliseconds per application in a graph, net of the floor: median (min-max). Path as `sparse_ops.cc` "
             f"picks it for {lanes} lanes, {threads} threads and an L2 of {2 * half_l2 // 1024} KB (scatter: batch "
             "below one vector; tiled: values read through the permutation; tiled, gathered: more batch tiles than "
             "threads, values gathered first). A part is a difference of two profile levels, given only when the "
             "levels' min-max intervals do not overlap, else `< floor`; `-`: not on this path.", "",
             "| n | batch | sparsity | nnz | path | dense | op | x dense | fixed | value gather | transposes | "
             "multiply-adds | ns per multiply-add, native | dense |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    xs_of: dict = {}
    for n, batch, sparsity in points:
        if (n, batch) not in xs_of:
            xs_of[(n, batch)] = [tf.constant(rng.normal(size=(batch, n)).astype("float32")) for _ in range(8)]
        xs = xs_of[(n, batch)]
        mask = rng.random((n, n)) >= sparsity
        w = (rng.normal(size=(n, n)) * mask).astype("float32")
        nat = SparseDense.from_dense(w, mask, matmul="native")
        st, v, nnz = nat.native_structure.value, nat.values.value, nat.nnz
        dense_w = tf.constant(w)
        path = forward_path(n, batch, lanes, threads, half_l2)

        def op(profile, n=n, st=st, v=v):
            return lambda x: lib.prune_spmm(x, v, st, n_in=n, n_out=n, profile=profile)

        levels = {"dense": lambda x: tf.matmul(x, dense_w), "op": op(0), "profile 1": op(1)}
        if path == "tiled, gathered":
            levels["profile 2"] = op(2)
        if path != "scatter":
            levels["profile 3"] = op(3)
        got = {name: protocol.per_application(fn, xs, **timing) for name, fn in levels.items()}
        parts = {"fixed": part_of(got["profile 1"])}
        if path == "scatter":
            parts["multiply-adds"] = difference(got["op"], got["profile 1"])
        else:
            before = got["profile 1"]
            if path == "tiled, gathered":
                parts["value gather"] = difference(got["profile 2"], got["profile 1"])
                before = got["profile 2"]
            parts["transposes"] = difference(got["profile 3"], before)
            parts["multiply-adds"] = difference(got["op"], got["profile 3"])
        mads = parts["multiply-adds"]
        per_mad = (Part(mads.ms * 1e6 / (nnz * batch), mads.low * 1e6 / (nnz * batch), mads.high * 1e6 / (nnz * batch))
                   if mads.ms is not None else Part(None))
        d = got["dense"]
        per_dense = (Part(d.ms * 1e6 / (n * n * batch), d.low * 1e6 / (n * n * batch), d.high * 1e6 / (n * n * batch))
                     if d.ms is not None else Part(None))
        for name, g in got.items():
            rows.append(_row("level", n, batch, sparsity, nnz, name, g))
        for name, p in parts.items():
            rows.append(_row("part", n, batch, sparsity, nnz, name, p))
        rows.append(_row("per multiply-add (ns)", n, batch, sparsity, nnz, "native", per_mad))
        rows.append(_row("per multiply-add (ns)", n, batch, sparsity, nnz, "dense", per_dense))
        cell = {k: parts[k].text() if k in parts else "-"
                for k in ("fixed", "value gather", "transposes", "multiply-adds")}
        lines.append(f"| {n} | {batch} | {sparsity:.0%} | {nnz} | {path} | {d.text()} | {got['op'].text()} | "
                     f"{ratio(d, got['op'])} | {cell['fixed']} | {cell['value gather']} | {cell['transposes']} | "
                     f"{cell['multiply-adds']} | {per_mad.text(4)} | {per_dense.text(4)} |")
        print(f"n {n} batch {batch:3d} sparsity {sparsity:.2f} (nnz {nnz}, {path}): dense {d.text()} | op "
              f"{got['op'].text()} = " + " + ".join(f"{k} {p.text()}" for k, p in parts.items())
              + f" | ns per multiply-add: native {per_mad.text(4)}, dense {per_dense.text(4)}", flush=True)
    return lines + [""]


def parse_points(text: str, n: int) -> list[tuple[int, int, float]]:
    """``batch:sparsity`` (at ``n``) or ``n:batch:sparsity`` pairs, comma-separated."""
    out = []
    for p in (p for p in text.split(",") if p):
        f = p.split(":")
        if len(f) == 2:
            out.append((n, int(f[0]), float(f[1])))
        elif len(f) == 3:
            out.append((int(f[0]), int(f[1]), float(f[2])))
        else:
            raise ValueError(p)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--breakdown-only", action="store_true", help="only the native op's per-part breakdown")
    parser.add_argument("--n", type=int, default=N, help="the weight is n x n (the operations, and 2-part points)")
    parser.add_argument("--batch", type=int, default=BATCH, help="the operations' batch")
    parser.add_argument("--sparsities", default=SPARSITIES, help="the operations' sparsities")
    parser.add_argument("--points", default=POINTS,
                        help="breakdown points: batch:sparsity (at --n) or n:batch:sparsity, comma-separated")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--min-ms", type=float, default=20.0, help="each measurement repeats calls for this long")
    parser.add_argument("--k-max", type=int, default=256, help="most applications per graph call")
    parser.add_argument("--threads", type=int, default=0,
                        help="TensorFlow's intra-op threads (default: the usable cores)")
    parser.add_argument("--out", default=str(ROOT / "results" / "benchmarks" / "csr_overhead.csv"),
                        help="the CSV; the report goes beside it as .md")
    protocol.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.n < 1 or args.batch < 1:
        parser.error(f"--n and --batch must be at least 1, got {args.n} and {args.batch}")
    try:
        points = parse_points(args.points, args.n)
        sparsities = [float(s) for s in args.sparsities.split(",") if s]
    except ValueError:
        parser.error(f"--points takes batch:sparsity or n:batch:sparsity, --sparsities numbers; got "
                     f"{args.points!r}, {args.sparsities!r}")
    bad = [p for p in points if p[0] < 1 or p[1] < 1 or not 0.0 <= p[2] < 1.0]
    bad += [s for s in sparsities if not 0.0 <= s < 1.0]
    if bad:
        parser.error(f"n and batch must be >= 1 and sparsity in [0, 1), got {bad}")

    load = protocol.start_or_refuse(args)  # before TensorFlow loads: a busy machine is refused at once
    if load is None:
        return protocol.REFUSED

    import tensorflow as tf

    intra, inter = protocol.fix_tf_threads(args.threads or None)
    import prune  # noqa: F401  (sets TF_ENABLE_ONEDNN_SPMM before any graph is built)
    from peers import write_results
    from prune import native

    tf.get_logger().setLevel("ERROR")  # a tf.function per K and operation is intended, not a retracing problem
    gemm = protocol.dense_gemm_gflops()
    mach = protocol.machine()
    lib = native.load()
    timing = dict(rounds=args.rounds, min_ms=args.min_ms, k_max=args.k_max)
    rows: list = []
    body: list[str] = []
    if not args.breakdown_only:
        body += operations(lib, args.n, args.batch, sparsities, timing, rows)
    if lib is not None:
        body += breakdown(lib, points, timing, intra, rows)
    else:
        body += ["## The native forward op by part", "", f"Not measured: {native.status().reason}.", ""]
    load.stop()
    header = protocol.header(
        "Where SparseDense's forward time goes", mach, load, gemm,
        f"TensorFlow {tf.__version__}: intra_op={intra}, inter_op={inter}; "
        f"TF_ENABLE_ONEDNN_SPMM={os.environ.get('TF_ENABLE_ONEDNN_SPMM')}",
        [f"Per application in a graph, net of the floor (K from 8 up to {args.k_max}); medians of {args.rounds} "
         f"interleaved rounds, each >= {args.min_ms:g} ms of calls; min-max in brackets."],
    )
    write_results(pd.DataFrame(rows), Path(args.out), "\n".join([header, *body]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
