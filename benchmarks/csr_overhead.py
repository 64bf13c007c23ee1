"""Where SparseDense's forward time goes: the bare CSR kernel vs the layer call.

Times, side by side in one process (median of 40 calls, 1024x1024 weight,
batch 256): a dense ``tf.matmul``; ``SparseMatrixMatMul`` on a CSR matrix built
once, with ``x`` already transposed (the kernel's own speed); and a
``SparseDense(matmul="csr")`` call, which rebuilds the CSR matrix from COO,
reorders the values and transposes input and output on every call.

    python benchmarks/csr_overhead.py
"""

from __future__ import annotations

import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

INTRA, INTER, N, BATCH = 2, 1, 1024, 256


def _median_ms(fn, calls: int = 40) -> float:
    fn()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn().numpy()
        times.append(time.perf_counter() - start)
    return float(np.median(times) * 1e3)


def main() -> None:
    tf.config.threading.set_intra_op_parallelism_threads(INTRA)
    tf.config.threading.set_inter_op_parallelism_threads(INTER)
    from prune.layers.sparse import SparseDense

    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(BATCH, N)).astype("float32"))
    x_t = tf.transpose(x)
    print(f"TensorFlow {tf.__version__}, intra_op={INTRA}, inter_op={INTER}; {N}x{N} weight, batch {BATCH}")
    for sparsity in (0.9, 0.99):
        mask = rng.random((N, N)) >= sparsity
        w = (rng.normal(size=(N, N)) * mask).astype("float32")
        w_t = w.T.copy()
        idx = np.argwhere(w_t != 0).astype("int64")
        csr = tf.raw_ops.SparseTensorToCSRSparseMatrix(
            indices=idx, values=w_t[idx[:, 0], idx[:, 1]], dense_shape=np.array([N, N], np.int64)
        )
        dense_w = tf.constant(w)
        layer = SparseDense.from_dense(w, mask, matmul="csr")
        call = tf.function(lambda: layer(x))
        dense = _median_ms(lambda: tf.matmul(x, dense_w))
        bare = _median_ms(lambda: tf.raw_ops.SparseMatrixMatMul(a=csr, b=x_t))
        full = _median_ms(call)
        print(
            f"sparsity {sparsity:.2f}: dense {dense:.2f} ms | bare CSR kernel {bare:.2f} ms ({dense / bare:.2f}x) | "
            f"SparseDense(csr) call {full:.2f} ms ({dense / full:.2f}x)"
        )


if __name__ == "__main__":
    main()
