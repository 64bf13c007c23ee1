"""Where SparseDense's forward time goes (CSR and native kernels), per operation, inside a compiled graph.

Each quantity is the cost of one more application inside one ``tf.function``:
``(T_K - T_1) / (K - 1)`` for a function doing the operation on ``K``
distinct inputs against one doing it once (medians over interleaved calls),
so the fixed cost of calling a function (~0.4 ms here) is not in it. For a
1024x1024 weight at batch 256:

* ``dense``: ``tf.matmul(x, W)``;
* ``csr kernel``: ``SparseMatrixMatMul`` alone, on a CSR matrix of ``W^T``
  built once in the graph, times a ready ``x^T`` (the kernel's own speed;
  oneDNN's when ``TF_ENABLE_ONEDNN_SPMM=1``, which ``import prune`` sets);
* ``to CSR``: ``SparseTensorToCSRSparseMatrix`` of the stored entries;
* ``gather``: reordering ``values`` into the row-major order of ``W^T``;
* ``transpose``: one ``[batch, n]`` transpose (the layer needs two);
* ``layer``: a whole ``SparseDense(matmul="csr")`` call (the above plus the bias);
* ``native op``: the native forward op ``PruneSpmm`` alone (values gathered
  into ``W^T`` order inside it, then the tiled product);
* ``native dx op``: the same op with ``transpose=True`` on a ``[batch, n]``
  input, which walks ``W`` as stored and gathers nothing: the forward op's
  cost minus its value gather, plus noise;
* ``native layer``: a whole ``SparseDense(matmul="native")`` call (the op, the
  reshapes and the bias).

Then, for the native forward op alone at batch 1, 32 and 256 and sparsity
80/90/99% (``--breakdown-only`` runs just this part), its per-part times
from the op's benchmark-only ``profile`` attribute (see ``sparse_ops.cc``):

* ``fixed``: the op with ``profile=1`` (checks of the structure and the
  output allocation; no work);
* ``value gather``: ``profile=2`` minus ``fixed`` (gathering the values into
  ``W^T`` order, done only with more batch tiles than threads, i.e. batch 256);
* ``transposes``: ``profile=3`` minus ``profile=2`` (or minus ``fixed``):
  transposing the input tiles and writing the output tiles back, without the
  multiply-adds (tiled paths, batch >= 8 on AVX2);
* ``multiply-adds``: the whole op minus ``profile=3`` (tiled) or minus
  ``fixed`` (batch below 8: the scatter has no separate parts);
* per multiply-add: that time over ``nnz * batch``, against dense's time over
  ``n_in * n_out * batch``.

    python benchmarks/csr_overhead.py [--breakdown-only]
    python benchmarks/csr_overhead.py --breakdown-only --n 4096 --points 256:0.9   # one size, chosen points
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import prune  # noqa: E402,F401  (sets TF_ENABLE_ONEDNN_SPMM before any graph is built)
from prune import native  # noqa: E402
from prune.layers.sparse import SparseDense  # noqa: E402

INTRA, INTER, N, BATCH, K, CALLS = 2, 1, 1024, 256, 8, 40


def _per_application(ops: dict, calls: int = CALLS) -> dict[str, float]:
    """``{name: ms}`` from ``{name: (one_fn, k_fn)}``, timed interleaved."""
    fns = {(name, i): f for name, pair in ops.items() for i, f in enumerate(pair)}
    for f in fns.values():
        f().numpy()
    times = {key: [] for key in fns}
    for _ in range(calls):
        for key, f in fns.items():
            start = time.perf_counter()
            f().numpy()
            times[key].append(time.perf_counter() - start)
    med = {key: float(np.median(t)) * 1e3 for key, t in times.items()}
    return {name: (med[(name, 1)] - med[(name, 0)]) / (K - 1) for name in ops}


def _pair(apply, inputs):
    """Functions applying ``apply`` to the first input, and to all ``K`` of them."""
    one = tf.function(lambda: tf.reduce_sum(apply(inputs[0])))
    k = tf.function(lambda: tf.add_n([tf.reduce_sum(apply(a)) for a in inputs]))
    return one, k


def main() -> None:
    tf.config.threading.set_intra_op_parallelism_threads(INTRA)
    tf.config.threading.set_inter_op_parallelism_threads(INTER)
    rng = np.random.default_rng(0)
    xs = [tf.constant(rng.normal(size=(BATCH, N)).astype("float32")) for _ in range(K)]
    xts = [tf.transpose(x) for x in xs]
    shape = tf.constant([N, N], tf.int64)
    print(
        f"TensorFlow {tf.__version__}, intra_op={INTRA}, inter_op={INTER}, "
        f"TF_ENABLE_ONEDNN_SPMM={os.environ.get('TF_ENABLE_ONEDNN_SPMM')}; {N}x{N} weight, batch {BATCH}; "
        f"per application inside one graph, K={K}; prune.native: {native.status().reason}; "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    for sparsity in (0.9, 0.99):
        mask = rng.random((N, N)) >= sparsity
        w = (rng.normal(size=(N, N)) * mask / np.sqrt(N * (1 - sparsity))).astype("float32")
        layer = SparseDense.from_dense(w, mask, matmul="csr")
        t_idx, perm = layer.transpose_indices.value, layer.transpose_perm.value
        vals = [tf.constant(rng.normal(size=layer.nnz).astype("float32")) for _ in range(K)]
        dense_w = tf.constant(w)

        def to_csr(v):
            return tf.raw_ops.SparseTensorToCSRSparseMatrix(indices=t_idx, values=v, dense_shape=shape)

        def kernel_k(k):
            def run():
                csr = to_csr(tf.gather(layer.values.value, perm))  # built once per call
                return tf.add_n([tf.reduce_sum(tf.raw_ops.SparseMatrixMatMul(a=csr, b=xt)) for xt in xts[:k]])

            return tf.function(run)

        ops = {
            "dense": _pair(lambda x: tf.matmul(x, dense_w), xs),
            "csr kernel": (kernel_k(1), kernel_k(K)),
            "to CSR": _pair(lambda v: tf.cast(tf.raw_ops.SparseMatrixNNZ(sparse_matrix=to_csr(v)), tf.float32), vals),
            "gather": _pair(lambda v: tf.gather(v, perm), vals),
            "transpose": _pair(lambda x: tf.transpose(x)[:, :1], xs),
            "layer": _pair(layer, xs),
        }
        lib = native.load()
        if lib is not None:
            nat = SparseDense.from_dense(w, mask, matmul="native")
            st, v = nat.native_structure.value, nat.values.value
            ops["native op"] = _pair(lambda x: lib.prune_spmm(x, v, st, n_in=N, n_out=N), xs)
            ops["native dx op"] = _pair(lambda x: lib.prune_spmm(x, v, st, n_in=N, n_out=N, transpose=True), xs)
            ops["native layer"] = _pair(nat, xs)
        ms = _per_application(ops)
        print(f"sparsity {sparsity:.2f} (nnz {layer.nnz}): " + " | ".join(f"{k} {v:.3f} ms" for k, v in ms.items()))
        print(
            f"  dense / csr kernel = {ms['dense'] / ms['csr kernel']:.2f}x; "
            f"dense / layer = {ms['dense'] / ms['layer']:.2f}x"
        )
        if lib is not None:
            print(
                f"  dense / native op = {ms['dense'] / ms['native op']:.2f}x; "
                f"dense / native layer = {ms['dense'] / ms['native layer']:.2f}x; "
                f"value gather inside the op ~ {ms['native op'] - ms['native dx op']:.3f} ms"
            )


BREAKDOWN_POINTS = tuple((b, s) for b in (1, 32, 256) for s in (0.8, 0.9, 0.99))


def breakdown(lib, n: int = N, points: tuple[tuple[int, float], ...] = BREAKDOWN_POINTS) -> None:
    """Per-part times of the native forward op (module docstring), per application inside one graph.

    Args:
        lib: The loaded native library.
        n: The weight is ``n x n``.
        points: ``(batch, sparsity)`` pairs, measured in this order.
    """
    rng = np.random.default_rng(1)
    N = n  # noqa: N806  (the size of this breakdown)
    print(f"native forward op by part, {N}x{N}, per application inside one graph (ms); "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    xs_of = {}
    for batch, sparsity in points:
        if batch not in xs_of:
            xs_of[batch] = [tf.constant(rng.normal(size=(batch, N)).astype("float32")) for _ in range(K)]
        xs = xs_of[batch]
        mask = rng.random((N, N)) >= sparsity
        w = (rng.normal(size=(N, N)) * mask).astype("float32")
        nat = SparseDense.from_dense(w, mask, matmul="native")
        st, v = nat.native_structure.value, nat.values.value
        dense_w = tf.constant(w)

        def op(profile):
            return _pair(lambda x: lib.prune_spmm(x, v, st, n_in=N, n_out=N, profile=profile), xs)

        ops = {"dense": _pair(lambda x: tf.matmul(x, dense_w), xs), "op": op(0), "p1": op(1)}
        tiled = batch >= 8
        if tiled:
            ops["p2"], ops["p3"] = op(2), op(3)
        ms = _per_application(ops)
        parts = {"fixed": ms["p1"]}
        if tiled:
            gathers = batch > 64  # more batch tiles than the 2 threads: the values are gathered first
            parts["value gather"] = ms["p2"] - ms["p1"] if gathers else 0.0
            parts["transposes"] = ms["p3"] - (ms["p2"] if gathers else ms["p1"])
            parts["multiply-adds"] = ms["op"] - ms["p3"]
        else:
            parts["multiply-adds"] = ms["op"] - ms["p1"]
        nnz = nat.nnz
        print(
            f"batch {batch:3d} sparsity {sparsity:.2f} (nnz {nnz}): dense {ms['dense']:.3f} | op {ms['op']:.3f} "
            f"({ms['dense'] / ms['op']:.2f}x dense) = " + " + ".join(f"{k} {t:.3f}" for k, t in parts.items())
            + f" | ns per multiply-add: native {parts['multiply-adds'] * 1e6 / (nnz * batch):.4f}, "
            f"dense {ms['dense'] * 1e6 / (N * N * batch):.4f}",
            flush=True,
        )


def _arguments(argv: list[str]) -> tuple[bool, int, tuple[tuple[int, float], ...]]:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--breakdown-only", action="store_true")
    parser.add_argument("--n", type=int, default=N, help="breakdown: the weight is n x n")
    parser.add_argument("--points", default=None, help="breakdown: batch:sparsity pairs, e.g. 256:0.9,1:0.99")
    args = parser.parse_args(argv)
    if args.n < 1:
        parser.error(f"--n must be at least 1, got {args.n}")
    points = BREAKDOWN_POINTS
    if args.points:
        try:
            points = tuple((int(b), float(s)) for b, s in (p.split(":") for p in args.points.split(",")))
        except ValueError:
            parser.error(f"--points must be batch:sparsity pairs separated by commas, got {args.points!r}")
        bad = [p for p in points if p[0] < 1 or not 0.0 <= p[1] < 1.0]
        if bad:
            parser.error(f"--points: batch must be >= 1 and sparsity in [0, 1), got {bad}")
    return args.breakdown_only, args.n, points


if __name__ == "__main__":
    only, n, points = _arguments(sys.argv[1:])
    if only:
        tf.config.threading.set_intra_op_parallelism_threads(INTRA)
        tf.config.threading.set_inter_op_parallelism_threads(INTER)
    else:
        main()
    if native.load() is not None:
        breakdown(native.load(), n, points)
