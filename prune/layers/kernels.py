"""Sparse-times-dense matrix products with hand-written gradients.

Everything here computes ``y = x @ W`` for a dense batch ``x`` of shape
``[batch, n_in]`` and a sparse weight ``W`` of shape ``[n_in, n_out]`` given as
COO ``indices`` (``[nnz, 2]``, row-major sorted) and ``values`` (``[nnz]``),
and returns gradients with respect to ``x`` and ``values`` (never a dense
``[n_in, n_out]`` gradient).

Forward and input-gradient kernels (``matmul=``):

* ``"coo"``: ``tf.sparse.sparse_dense_matmul`` (TF's COO kernel, one thread).
  ``x @ W`` is computed as ``(W^T @ x^T)^T`` with ``W^T`` given by the same
  values and the index columns swapped (the COO kernel does not need sorted
  indices, so no permutation is needed); ``dx = (W @ dy^T)^T`` uses ``W``
  directly.
* ``"csr"``: ``tf.raw_ops.SparseTensorToCSRSparseMatrix`` then
  ``tf.raw_ops.SparseMatrixMatMul``. With ``TF_ENABLE_ONEDNN_SPMM=1``, which
  ``import prune`` sets, TensorFlow runs that op through oneDNN's CSR
  kernel in graphs as well as eagerly; otherwise graphs get Eigen's
  row-parallel kernel, 2.1x slower here (1024x1024, 90% sparse, batch 256:
  1.28 ms against 0.61 ms, dense ``matmul`` 1.76 ms). CSR needs row-sorted
  indices, so the forward product ``(W^T @ x^T)^T`` needs ``W^T`` in row-major
  order: a permutation ``transpose_perm`` of the entries and the swapped,
  sorted ``transpose_indices``. :func:`transpose_structure` computes them once
  on the host when the sparsity structure changes (``SparseDense`` keeps them
  in variables); without them they are computed in the graph with an argsort.
  ``dx = (W @ dy^T)^T`` uses the natural row-major ``W``. The oneDNN kernel
  takes no transpose flags (TensorFlow falls back to Eigen when one is set),
  and even on Eigen explicit transposes of the dense operand were measured
  faster on this machine than the
  ``transpose_b``/``transpose_output``/``adjoint_a`` flags of
  ``SparseMatrixMatMul`` (e.g. batch 1, 90% sparse: 0.28 ms vs 1.5 ms; with
  ``adjoint_a`` on ``CSR(W)`` the op transposes the matrix internally, about
  1 ms more at 100k entries).
* ``"dense"``: materialise ``W`` with ``SparseToDense`` (the fastest of
  ``scatter_nd``, ``unsorted_segment_sum`` and ``SparseToDense`` here, 2.8 ms
  for 1M entries) and call the dense ``matmul``; best at low sparsity. When
  every entry is stored (0% sparsity), row-major ``values`` already is ``W``:
  a reshape replaces the scatter, and the values gradient's gather.
* ``"native"``: the compiled ops of :mod:`prune.native` (float32): one op
  for the forward product, one for the input gradient, one for the values
  gradient, all reading ``values`` as stored and an int32 ``structure``
  vector (CSR of ``W`` and ``W^T`` plus the permutation between them) that
  ``SparseDense`` rebuilds only when its sparsity pattern changes. No
  per-call format conversion, reorder or transpose happens outside the op.
  When the library is unavailable (``PRUNE_NATIVE=0``, no compiler, failed
  build; :func:`prune.native.load` warns once) or the dtype is not float32,
  ``"native"`` behaves as ``"auto"`` over TensorFlow's kernels.
* ``"auto"``: picks a kernel *at run time* from the cost model in
  :func:`estimate_ms` (batch and ``nnz`` may be unknown when the graph is
  traced: a ``SparseDense`` shrinks its values in place), via
  ``tf.switch_case``: between ``"native"`` and ``"dense"`` when the native
  library is loaded, else among ``"dense"``, ``"coo"`` and ``"csr"``. The
  backward pass chooses its kernels the same way.

Gradient with respect to ``values`` (``dW[i, j] = sum_b x[b, i] dy[b, j]`` at
the stored ``(i, j)`` only). TF's own COO gradient materialises an
``[nnz, batch]`` product; here one of two rules applies:

* ``"dense"`` rule, at moderate density: ``gather_nd(x^T @ dy, indices)``.
  One ``[n_in, n_out]`` temporary, but the product runs in the multithreaded
  BLAS at ~0.015 ns per multiply-add, ~100x cheaper per term than a gather.
* ``"native"`` rule (with the native library): the ``PruneSddmm`` op, the
  same sampled product in one multithreaded, vectorised pass.
* ``"sampled"`` rule, at very high sparsity (or batch 1): gather the needed
  rows of ``x^T`` and ``dy^T`` and reduce over the batch (a sampled
  dense-dense product, SDDMM; Nisa et al., "Sampled Dense Matrix
  Multiplication for High-Performance Machine Learning", HiPC 2018), in chunks of at most ``_SAMPLED_CHUNK_ELEMENTS``
  products, so the ``[nnz, batch]`` intermediate is never whole. Its cost is
  ``~nnz * batch`` gathered terms plus a per-entry row-gather overhead, which
  beats the dense rule only when the density is below roughly 1.5% at batch
  256 and 7% at batch 1 (measured: at batch 1, 95% sparse, 0.92 ms vs 0.99 ms;
  at batch 256, 99% sparse, 3.5 ms vs 3.6 ms).

:func:`values_grad_rule` evaluates the same cost model to choose.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

__all__ = [
    "MATMULS",
    "KERNELS",
    "NATIVE_KERNELS",
    "native_library",
    "check_matmul",
    "check_structure",
    "is_real_dtype",
    "transpose_structure",
    "estimate_ms",
    "choose_matmul",
    "values_grad_rule",
    "sparse_matmul",
    "sampled_values_grad",
]

KERNELS = ("dense", "coo", "csr")
"""TensorFlow-op kernels, in the order of ``"auto"``'s ``tf.switch_case`` branches without the native library."""

NATIVE_KERNELS = ("dense", "native")
"""``"auto"``'s branches when the native library is loaded."""

MATMULS = ("auto",) + KERNELS + ("native",)
"""Valid values of the ``matmul`` argument."""

_SAMPLED_CHUNK_ELEMENTS = 1 << 21  # 2M products (8 MB per float32 operand) per chunk

# Cost model, in nanoseconds. _COST is a non-negative least-squares fit (on
# relative error) of forward medians measured by
# `benchmarks/layer_speed.py --fit` on the 2-core reference machine (TF
# intra-op threads = 2, oneDNN's CSR kernel (TF_ENABLE_ONEDNN_SPMM=1), sizes
# 1024x1024 and 784x300 at sparsity 0-99%, 4096x4096 at 90-99%, batch
# 1/32/256); "fixed" includes the tf.function call overhead. Only the ranking
# of the kernels matters. Each kernel's time is
#     fixed + per_nnz * nnz + per_term * nnz * batch + per_cell * n_in * n_out + per_mac * n_in * n_out * batch
# "per_cell" is the cost of touching the dense [n_in, n_out] matrix once
# (materialising it; reading it in a batch-1 matvec), "per_mac" the BLAS cost
# of one multiply-add. CSR pays a format conversion per call (per_nnz) but
# multiplies on every core; COO converts nothing but runs on one thread.
_COST = {
    #           fixed      per_nnz per_term per_cell per_mac
    "dense": (409_100.0, 2.294, 0.005552, 0.6601, 0.008486),
    "coo": (534_100.0, 4.427, 1.665, 0.03273, 0.00215),
    "csr": (634_400.0, 11.21, 0.05796, 0.0163, 0.0004),
    "native": (400_000.0, 1.5, 0.028, 0.0, 0.0),
    # the native ops on a blocked structure (block kernels, prune/native/block_ops.h): about half the
    # general kernels' cost per term (forward 0.46-0.55x at 1024x1024, 1x16 tiles, batch 256, 80-90%,
    # AVX-512; results/benchmarks/block_speed.csv)
    "native_block": (400_000.0, 1.5, 0.014, 0.0, 0.0),
    # the native ops on a structure with an N:M section (prune/native/nm_ops.h; 2:4 and 4:8 at 512x2048 and
    # 2048x512, 2 threads, interleaved medians taken under load): forward 1.1-1.2x dense's time at 4-64 rows
    # (the N:M kernel), 0.75-0.8x from 256 rows (the panel kernel); input gradient 0.75-0.87x dense at 256 rows
    "native_nm": (400_000.0, 1.5, 0.011, 0.0, 0.0),
}
# Values gradient: dense rule = one BLAS product + gather_nd; sampled rule = two
# gathers and a multiply-reduce per (entry, batch) term.
_GRAD_COST = {
    #             fixed   per_nnz per_term per_cell per_mac
    "dense": (20_000.0, 4.0, 0.0, 1.0, 0.0167),
    "sampled": (50_000.0, 18.0, 1.2, 0.0, 0.0),
    "native": (20_000.0, 0.5, 0.05, 0.0, 0.0),
    "native_block": (20_000.0, 0.5, 0.03, 0.0, 0.0),  # training step 0.6x the general kernels' there
    # N:M values gradient (nm_ops.h): 0.5-0.6x the general kernel's time, 0.85-1.0x dense x^T dy at 256 rows
    "native_nm": (20_000.0, 0.5, 0.028, 0.0, 0.0),
}


XLA_MATMULS = ("auto", "dense")
"""Kernels a graph compiled by XLA can run: there ``"auto"`` runs ``"dense"`` (COO and CSR take variant or
int64 sparse ops XLA has no kernel for, and the native ops have no XLA kernel)."""


def check_xla(matmul: str, where: str) -> None:
    """Refuse a kernel XLA cannot compile, when the graph being traced is for XLA.

    Raises:
        ValueError: naming ``where`` (the layer) and the kernel, and the way out.
    """
    from prune._internals import in_xla_context

    if matmul not in XLA_MATMULS and in_xla_context():
        raise ValueError(
            f"{where} uses matmul={matmul!r}, which XLA cannot compile (jit_compile=True): use matmul='dense' "
            f"(or 'auto', which runs 'dense' under XLA), or compile with jit_compile=False"
        )


def check_matmul(matmul: Any) -> str:
    """Validate a ``matmul`` argument.

    Raises:
        ValueError: naming the value and listing the valid ones.
    """
    if not isinstance(matmul, str) or matmul not in MATMULS:
        raise ValueError(f"matmul must be one of {list(MATMULS)}, got {matmul!r}")
    return matmul


def is_real_dtype(dtype: Any) -> bool:
    """Whether arrays of ``dtype`` hold real numbers a weight can take: bool, integer, float.

    Includes the ``ml_dtypes`` floats NumPy files under "void" (``bfloat16``,
    the ``float8`` kinds), which Keras loads bfloat16 weights as.
    """
    dtype = np.dtype(dtype)
    return dtype.kind in "biuf" or (dtype.kind == "V" and dtype.name.startswith(("bfloat", "float", "int", "uint")))


def check_structure(
    indices: Any,
    values: Any,
    dense_shape: tuple[int, int],
    name: str = "indices",
    require_sorted: bool = False,
    values_name: str = "values",
) -> tuple[np.ndarray, np.ndarray]:
    """Validate COO ``indices``/``values`` on the host; sort them row-major, or require them sorted.

    Two uses, one rule set: user input (:meth:`prune.layers.SparseDense.from_sparse`)
    is sorted here (``require_sorted=False``); stored state (``set_weights``,
    loading a file) must already be row-major sorted and unique
    (``require_sorted=True``), since the layer only ever stores it so and
    entries in another order mean the state did not come from a layer.

    Args:
        indices: Integer array ``[nnz, 2]``.
        values: Real ``[nnz]`` array, in the order of ``indices``.
        dense_shape: ``(n_in, n_out)``.
        name: Name of the indices argument, used in error messages.
        require_sorted: Reject, rather than sort, entries that are not in
            strictly increasing row-major order (so also duplicates).
        values_name: Name of the values argument, used in error messages.

    Returns:
        ``(indices, values)`` as int64 / original dtype, sorted row-major (a
        stable sort: unsorted input is sorted, not rejected, unless
        ``require_sorted``).

    Raises:
        ValueError: wrong shapes or dtypes, length mismatch, out-of-range or
            duplicate indices, and with ``require_sorted`` unsorted ones; the
            message names the argument and the first offending entry (its
            position and value).
    """
    n_in, n_out = (int(d) for d in dense_shape)
    idx = np.asarray(indices)
    vals = np.asarray(values)
    if idx.size == 0:
        idx = idx.reshape(0, 2)
    if idx.ndim != 2 or idx.shape[1] != 2:
        raise ValueError(f"{name} must have shape [nnz, 2], got shape {tuple(idx.shape)}")
    if not np.issubdtype(idx.dtype, np.integer):
        raise ValueError(f"{name} must be integers, got dtype {idx.dtype}")
    if vals.ndim != 1 or vals.shape[0] != idx.shape[0]:
        raise ValueError(
            f"{values_name} must have shape [nnz] matching {name}: {name} has {idx.shape[0]} entries, "
            f"{values_name} has shape {tuple(vals.shape)}"
        )
    if not is_real_dtype(vals.dtype):
        raise ValueError(f"{values_name} must be real numbers, got dtype {vals.dtype}")
    # On the given dtype, before the cast: an unsigned index past int64's range must not wrap into range.
    bad = (idx[:, 0] < 0) | (idx[:, 0] >= n_in) | (idx[:, 1] < 0) | (idx[:, 1] >= n_out)
    if bad.any():
        k = int(np.argmax(bad))
        raise ValueError(
            f"{name} entry {idx[k].tolist()} is out of range for dense_shape {(n_in, n_out)}, at position {k}"
        )
    idx = idx.astype(np.int64)
    linear = idx[:, 0] * n_out + idx[:, 1]
    if require_sorted:
        step = np.flatnonzero(linear[1:] <= linear[:-1])
        if step.size:
            k = int(step[0]) + 1
            first, prev = idx[k].tolist(), idx[k - 1].tolist()
            if linear[k] == linear[k - 1]:
                raise ValueError(f"{name} has duplicate entry {first} (positions {k - 1} and {k})")
            raise ValueError(
                f"{name} entry {first} (position {k}) follows {prev} (position {k - 1}), which is later in "
                f"row-major order: the entries must be row-major sorted and unique (stored entries are not re-sorted)"
            )
        return idx, vals
    order = np.argsort(linear, kind="stable")
    linear = linear[order]
    dup = np.flatnonzero(linear[1:] == linear[:-1])
    if dup.size:
        a, b = sorted(int(p) for p in order[dup[0] : dup[0] + 2])
        raise ValueError(f"{name} has duplicate entry {idx[a].tolist()} (positions {a} and {b})")
    return idx[order], vals[order]


def transpose_structure(indices: np.ndarray, dense_shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Entries of ``W^T`` in row-major order.

    Args:
        indices: Row-major sorted ``[nnz, 2]`` indices of ``W`` (``[n_in, n_out]``).
        dense_shape: ``(n_in, n_out)``.

    Returns:
        ``(perm, transpose_indices)``: ``values[perm]`` are the values of
        ``W^T`` (``[n_out, n_in]``) in row-major order, at ``transpose_indices``.
    """
    idx = np.asarray(indices, dtype=np.int64).reshape(-1, 2)
    n_in = int(dense_shape[0])
    perm = np.argsort(idx[:, 1] * n_in + idx[:, 0], kind="stable").astype(np.int64)
    return perm, idx[perm][:, ::-1].copy()


def _terms(nnz: Any, batch: Any, n_in: int, n_out: int) -> tuple[Any, ...]:
    cells = float(n_in) * float(n_out)
    return 1.0, nnz, nnz * batch, cells, cells * batch


def estimate_ms(kernel: str, batch: int, n_in: int, n_out: int, nnz: int) -> float:
    """Modelled forward time (ms) of ``kernel`` on this machine class.

    The model is linear in five terms (see ``_COST``): a fixed overhead, work
    per stored entry (format conversion), per stored entry and batch row
    (sparse kernels), per dense cell (materialising ``W``) and per dense
    multiply-add (BLAS). The constants are medians fitted by
    ``benchmarks/layer_speed.py``; refit them on other hardware.
    """
    coeffs = _COST[kernel] if kernel in _COST else _GRAD_COST[kernel.removeprefix("grad_")]
    terms = _terms(float(nnz), float(batch), n_in, n_out)
    return float(sum(c * t for c, t in zip(coeffs, terms))) * 1e-6


def native_library() -> Any | None:
    """The native op library (:func:`prune.native.load`), or ``None`` when falling back."""
    from prune import native

    return native.load()


def choose_matmul(batch: int, n_in: int, n_out: int, nnz: int, native: bool | None = None) -> str:
    """The kernel ``"auto"`` runs for these sizes (host-side version of the run-time choice).

    Args:
        native: Whether the native library is in use; ``None`` asks :mod:`prune.native`.
    """
    if native is None:
        native = native_library() is not None
    names = NATIVE_KERNELS if native else KERNELS
    if nnz == n_in * n_out:  # every entry stored: "dense" reshapes the values (see _dispatch)
        return "dense"
    return min(names, key=lambda k: estimate_ms(k, batch, n_in, n_out, nnz))


def values_grad_rule(batch: int, n_in: int, n_out: int, nnz: int, native: bool = False) -> str:
    """``"dense"``, ``"sampled"`` or ``"native"``: which values-gradient rule applies (see module docstring)."""
    names = ("dense", "native") if native else ("dense", "sampled")
    return min(names, key=lambda k: estimate_ms("grad_" + k, batch, n_in, n_out, nnz))


def _argmin_branch(table: dict[str, tuple[float, ...]], names: tuple[str, ...], nnz: Any, batch: Any, n_in: int, n_out: int) -> Any:
    """Index into ``names`` of the cheapest modelled option, as an int32 scalar tensor.

    Each cost is ``(A + B * batch) + nnz * (C + D * batch)`` with per-option
    constant vectors, so the run-time choice is a handful of vector ops; with
    a static ``batch`` (the usual case inside a traced model) the brackets are
    folded on the host. The whole dispatch (this choice plus the switch)
    costs about 0.04 ms per call in a graph: ``SparseDense(matmul="auto")``
    0.20 ms against 0.16 ms for the COO kernel it chose (1024x1024, 99%
    sparse, batch 1).
    """
    cells = float(n_in) * float(n_out)
    coef = np.array([table[n] for n in names], np.float64)  # fixed, per_nnz, per_term, per_cell, per_mac
    a, b, c, d = coef[:, 0] + coef[:, 3] * cells, coef[:, 4] * cells, coef[:, 1], coef[:, 2]
    n = tf.cast(nnz, tf.float64)
    if isinstance(batch, (int, np.integer)):
        costs = tf.constant(a + b * batch) + n * tf.constant(c + d * batch)
    else:
        bt = tf.cast(batch, tf.float64)
        costs = tf.constant(a) + tf.constant(b) * bt + n * (tf.constant(c) + tf.constant(d) * bt)
    return tf.cast(tf.argmin(costs), tf.int32)


# -- kernels -----------------------------------------------------------------
def _dense_w(values: tf.Tensor, indices: tf.Tensor, n_in: int, n_out: int) -> tf.Tensor:
    return tf.sparse.to_dense(tf.SparseTensor(indices, values, [n_in, n_out]), validate_indices=False)


def _full_w(values: tf.Tensor, n_in: int, n_out: int) -> tf.Tensor:
    # Every entry stored (a SparseDense at 0% sparsity, e.g. before a schedule starts): unique,
    # in-range, row-major sorted indices make ``values`` W itself, so a reshape replaces a
    # 1M-entry scatter (1.9 ms for 1024x1024 here).
    return tf.reshape(values, [n_in, n_out])


def _coo_xw(x: tf.Tensor, values: tf.Tensor, indices: tf.Tensor, n_in: int, n_out: int) -> tf.Tensor:
    w_t = tf.SparseTensor(tf.reverse(indices, axis=[1]), values, [n_out, n_in])  # COO needs no order
    return tf.transpose(tf.sparse.sparse_dense_matmul(w_t, x, adjoint_b=True))


def _coo_dyWt(dy: tf.Tensor, values: tf.Tensor, indices: tf.Tensor, n_in: int, n_out: int) -> tf.Tensor:
    w = tf.SparseTensor(indices, values, [n_in, n_out])
    return tf.transpose(tf.sparse.sparse_dense_matmul(w, dy, adjoint_b=True))


def _csr_times(a_indices: tf.Tensor, a_values: tf.Tensor, shape: tuple[int, int], b: tf.Tensor) -> tf.Tensor:
    """``(A @ b^T)^T`` for ``A`` given by row-major sorted COO, via CSR."""
    csr = tf.raw_ops.SparseTensorToCSRSparseMatrix(
        indices=a_indices, values=a_values, dense_shape=tf.constant(shape, tf.int64)
    )
    out = tf.raw_ops.SparseMatrixMatMul(a=csr, b=tf.transpose(b))
    out = tf.ensure_shape(out, [shape[0], None])  # the variant input hides the static shape
    return tf.transpose(out)


def _forward(kernel: str, x: tf.Tensor, values: tf.Tensor, indices: tf.Tensor, t_perm: tf.Tensor, t_indices: tf.Tensor, n_in: int, n_out: int) -> tf.Tensor:
    if kernel == "dense":
        return tf.matmul(x, _dense_w(values, indices, n_in, n_out))
    if kernel == "dense_full":
        return tf.matmul(x, _full_w(values, n_in, n_out))
    if kernel == "coo":
        return _coo_xw(x, values, indices, n_in, n_out)
    if t_perm is None:
        t_perm = tf.argsort(indices[:, 1] * n_in + indices[:, 0], stable=True)
        t_indices = tf.reverse(tf.gather(indices, t_perm), axis=[1])
    return _csr_times(t_indices, tf.gather(values, t_perm), (n_out, n_in), x)


def _input_grad(kernel: str, dy: tf.Tensor, values: tf.Tensor, indices: tf.Tensor, n_in: int, n_out: int) -> tf.Tensor:
    if kernel == "dense":
        return tf.matmul(dy, _dense_w(values, indices, n_in, n_out), transpose_b=True)
    if kernel == "dense_full":
        return tf.matmul(dy, _full_w(values, n_in, n_out), transpose_b=True)
    if kernel == "coo":
        return _coo_dyWt(dy, values, indices, n_in, n_out)
    return _csr_times(indices, values, (n_in, n_out), dy)


def _dense_values_grad(x: tf.Tensor, dy: tf.Tensor, indices: tf.Tensor, full: bool) -> tf.Tensor:
    dw = tf.matmul(x, dy, transpose_a=True)
    if full:  # every entry stored in row-major order: the gather is a reshape
        return tf.reshape(dw, tf.shape(indices)[:1])
    return tf.gather_nd(dw, indices)


def sampled_values_grad(x: tf.Tensor, dy: tf.Tensor, indices: tf.Tensor, chunk_elements: int = _SAMPLED_CHUNK_ELEMENTS) -> tf.Tensor:
    """``sum_b x[b, i_k] * dy[b, j_k]`` for every stored entry ``k`` (SDDMM).

    Works in chunks of ``max(1, chunk_elements // batch)`` entries, so at most
    ``chunk_elements`` products exist at once, never the whole ``[nnz, batch]``.

    Args:
        x: ``[batch, n_in]`` layer input.
        dy: ``[batch, n_out]`` upstream gradient.
        indices: ``[nnz, 2]`` int64 entries.
        chunk_elements: Upper bound on the size of the temporary products.
    """
    x_t = tf.transpose(x)
    dy_t = tf.transpose(dy)

    def block(rows: tf.Tensor, cols: tf.Tensor) -> tf.Tensor:
        return tf.reduce_sum(tf.gather(x_t, rows) * tf.gather(dy_t, cols), axis=1)

    batch = tf.maximum(tf.shape(x, out_type=tf.int64)[0], 1)
    nnz = tf.shape(indices, out_type=tf.int64)[0]
    chunk = tf.maximum(tf.constant(chunk_elements, tf.int64) // batch, 1)

    def chunked() -> tf.Tensor:
        n_chunks = (nnz + chunk - 1) // chunk
        pad = n_chunks * chunk - nnz
        padded = tf.pad(indices, [[0, pad], [0, 0]])  # padding points at entry (0, 0): harmless, cut below
        rows = tf.reshape(padded[:, 0], [n_chunks, chunk])
        cols = tf.reshape(padded[:, 1], [n_chunks, chunk])
        out = tf.map_fn(lambda rc: block(rc[0], rc[1]), (rows, cols), fn_output_signature=x.dtype, parallel_iterations=1)
        return tf.reshape(out, [-1])[:nnz]

    # One block when it fits (no loop overhead), else a sequential loop over chunks.
    return tf.cond(nnz <= chunk, lambda: block(indices[:, 0], indices[:, 1]), chunked)


def _values_grad(rule: str, x: tf.Tensor, dy: tf.Tensor, indices: tf.Tensor) -> tf.Tensor:
    if rule in ("dense", "dense_full"):
        return _dense_values_grad(x, dy, indices, full=rule == "dense_full")
    return sampled_values_grad(x, dy, indices)


def _dispatch(
    choice: str, table: dict, names: tuple[str, ...], make: Any, nnz: Any, static_nnz: int | None, batch: Any,
    n_in: int, n_out: int,
) -> tf.Tensor:
    """``make(name)`` for the chosen option (``choice``, or the cost model's when ``"auto"``).

    The ``"dense"`` option becomes ``"dense_full"`` when every entry is
    stored. That test is decided at trace time when ``static_nnz`` is known,
    else at run time, and it is folded into the one ``tf.switch_case`` rather
    than nested in its branch: with a ``tf.cond`` inside the dense branch,
    ``SparseDense(matmul="auto")`` took 0.33 ms more per call in a graph
    (1024x1024 at 99% sparsity, batch 1, where the COO product it ran takes
    0.07 ms), presumably because TensorFlow then runs the switch as a
    function call instead of lowering it.

    ``nnz`` must be the length of ``indices``, never of ``values``: after a
    ``SparseDense`` compaction, Grappler's shape inference can still believe
    the pre-compaction length of ``values`` (it meets the optimizer's slots in
    the update) and constant-folds a predicate on it to the stale answer, so
    ``"dense_full"`` ran on a shorter vector. ``indices`` has no slots.
    ``test_compact_shrinks_values_indices_and_slots_and_training_continues``
    fails when this is violated.
    """
    cells = n_in * n_out
    if static_nnz is not None:
        rename = {"dense": "dense_full"} if static_nnz == cells else {}
        if choice == "auto" and static_nnz == cells:  # every entry stored: W is the values, no sparse kernel wins
            return make("dense_full")
        if choice != "auto":
            return make(rename.get(choice, choice))
        index = _argmin_branch(table, names, nnz, batch, n_in, n_out)
        return tf.switch_case(index, [lambda n=n: make(rename.get(n, n)) for n in names])
    full = tf.equal(tf.cast(nnz, tf.int64), cells)
    if choice == "dense":
        return tf.cond(full, lambda: make("dense_full"), lambda: make("dense"))
    if choice != "auto":
        return make(choice)
    index = _argmin_branch(table, names, nnz, batch, n_in, n_out)
    index = tf.where(full, len(names), index)  # every entry stored: the reshape and one BLAS product
    return tf.switch_case(index, [lambda n=n: make(n) for n in names] + [lambda: make("dense_full")])


def _native_forward(lib: Any, x: tf.Tensor, values: tf.Tensor, structure: tf.Tensor, n_in: int, n_out: int) -> tf.Tensor:
    return lib.prune_spmm(x, values, structure, n_in=n_in, n_out=n_out)


def _native_input_grad(lib: Any, dy: tf.Tensor, values: tf.Tensor, structure: tf.Tensor, n_in: int, n_out: int) -> tf.Tensor:
    return lib.prune_spmm(dy, values, structure, n_in=n_in, n_out=n_out, transpose=True)


def _native_values_grad(lib: Any, x: tf.Tensor, dy: tf.Tensor, values: tf.Tensor, structure: tf.Tensor, n_in: int, n_out: int) -> tf.Tensor:
    return lib.prune_sddmm(x, dy, values, structure, n_in=n_in, n_out=n_out)


def sparse_matmul(
    x: Any,
    values: Any,
    indices: Any,
    dense_shape: tuple[int, int],
    matmul: str = "auto",
    transpose_perm: Any = None,
    transpose_indices: Any = None,
    values_grad: str = "auto",
    structure: Any = None,
    blocked: bool = False,
    nm: bool = False,
) -> tf.Tensor:
    """``x @ W`` with ``W = SparseTensor(indices, values, dense_shape)``, differentiable in ``x`` and ``values``.

    Args:
        x: ``[batch, n_in]`` float tensor.
        values: ``[nnz]`` tensor (e.g. a variable's value), in the order of ``indices``.
        indices: ``[nnz, 2]`` int64, row-major sorted, unique, in range (see
            :func:`check_structure`; not re-checked here, inside the graph).
        dense_shape: Static ``(n_in, n_out)``.
        matmul: ``"auto"``, ``"coo"``, ``"csr"``, ``"dense"`` or ``"native"`` (module docstring).
        transpose_perm: Optional ``[nnz]`` from :func:`transpose_structure`;
            computed in the graph when omitted (only the CSR forward uses it).
        transpose_indices: Optional ``[nnz, 2]`` from :func:`transpose_structure`.
        values_grad: ``"auto"``, ``"dense"`` or ``"sampled"``: the rule for the
            values gradient (module docstring); with the native kernels
            ``"sampled"`` is the native sampled product.
        structure: Optional int32 vector from :func:`prune.native.structure`
            for these indices; computed in the graph when omitted and the
            native kernels run.
        blocked: Whether ``structure`` has a block section (the native ops then run
            their block kernels); ``"auto"``'s cost model prices ``"native"`` accordingly.
        nm: Whether ``structure`` has an N:M section (:func:`prune.native.has_nm_section`; the native
            forward then runs its N:M kernel); ``"auto"`` prices ``"native"`` as ``"native_nm"``.

    Returns:
        ``[batch, n_out]`` tensor.

    Raises:
        ValueError: unknown ``matmul`` or ``values_grad``.
    """
    check_matmul(matmul)
    if values_grad not in ("auto", "dense", "sampled"):
        raise ValueError(f"values_grad must be one of ['auto', 'dense', 'sampled'], got {values_grad!r}")
    check_xla(matmul, "sparse_matmul")
    from prune._internals import in_xla_context

    if in_xla_context():  # shapes are static there: scatter to dense, no switch over kernels or over nnz
        return _xla_dense_matmul(tf.convert_to_tensor(x), values, indices, (int(dense_shape[0]), int(dense_shape[1])))
    n_in, n_out = int(dense_shape[0]), int(dense_shape[1])
    x = tf.convert_to_tensor(x)
    values = tf.convert_to_tensor(values, dtype=x.dtype)
    indices = tf.cast(tf.convert_to_tensor(indices), tf.int64)
    if transpose_perm is not None and transpose_indices is not None:
        transpose_perm = tf.convert_to_tensor(transpose_perm)
        transpose_indices = tf.cast(tf.convert_to_tensor(transpose_indices), tf.int64)
    else:  # computed inside the CSR branch only, so other kernels do not pay for the argsort
        transpose_perm = transpose_indices = None
    lib = native_library() if matmul in ("auto", "native") and x.dtype == tf.float32 else None
    if lib is not None:
        from prune import native

        structure = native.structure_tf(indices, n_in, n_out) if structure is None else tf.convert_to_tensor(structure)
        names, grad_names = NATIVE_KERNELS, ("dense", "native")
        grad_rule = {"sampled": "native"}.get(values_grad, values_grad)
    else:
        matmul = "auto" if matmul == "native" else matmul
        names, grad_names, grad_rule = KERNELS, ("dense", "sampled"), values_grad

    def forward(k: str, x: tf.Tensor, values: tf.Tensor) -> tf.Tensor:
        if k == "native":
            return _native_forward(lib, x, values, structure, n_in, n_out)
        return _forward(k, x, values, indices, transpose_perm, transpose_indices, n_in, n_out)

    def input_grad(k: str, dy: tf.Tensor, values: tf.Tensor) -> tf.Tensor:
        if k == "native":
            return _native_input_grad(lib, dy, values, structure, n_in, n_out)
        return _input_grad(k, dy, values, indices, n_in, n_out)

    def values_grad_of(r: str, x: tf.Tensor, dy: tf.Tensor, values: tf.Tensor) -> tf.Tensor:
        if r == "native":
            return _native_values_grad(lib, x, dy, values, structure, n_in, n_out)
        return _values_grad(r, x, dy, indices)

    cost, grad_cost = _COST, _GRAD_COST
    if lib is not None and blocked:
        cost = {**_COST, "native": _COST["native_block"]}
        grad_cost = {**_GRAD_COST, "native": _GRAD_COST["native_block"]}
    elif lib is not None and nm:
        cost = {**_COST, "native": _COST["native_nm"]}
        grad_cost = {**_GRAD_COST, "native": _GRAD_COST["native_nm"]}

    @tf.custom_gradient
    def _op(x: tf.Tensor, values: tf.Tensor) -> Any:
        batch = x.shape[0] if x.shape[0] is not None else tf.shape(x)[0]
        nnz, static_nnz = tf.shape(indices)[0], indices.shape[0]  # not values': see _dispatch
        y = _dispatch(matmul, cost, names, lambda k: forward(k, x, values), nnz, static_nnz, batch, n_in, n_out)
        y = tf.ensure_shape(y, [x.shape[0], n_out])

        def grad(dy: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            dx = _dispatch(
                matmul, cost, names, lambda k: input_grad(k, dy, values), nnz, static_nnz, batch, n_in, n_out
            )
            dv = _dispatch(
                grad_rule,
                {n: grad_cost[n] for n in grad_names},
                grad_names,
                lambda r: values_grad_of(r, x, dy, values),
                nnz, static_nnz, batch, n_in, n_out,
            )
            return tf.ensure_shape(dx, x.shape), tf.ensure_shape(dv, values.shape)

        return y, grad

    return _op(x, values)


def _xla_dense_matmul(x: tf.Tensor, values: Any, indices: Any, dense_shape: tuple[int, int]) -> tf.Tensor:
    """``x @ W`` with W scattered to dense, differentiable in ``x`` and ``values``, for graphs compiled by XLA.

    XLA compiles every branch of a ``tf.cond``/``tf.switch_case`` with static
    shapes, so the dense kernel's "every entry stored" branch (a reshape of
    ``values``) cannot sit beside the scatter when entries are missing; the
    scatter alone is right either way. The gradients are automatic: the
    values gradient is ``x^T dy`` gathered at the indices.
    """
    values = tf.convert_to_tensor(values, dtype=x.dtype)
    w = tf.scatter_nd(tf.cast(indices, tf.int64), values, dense_shape)
    return tf.matmul(x, w)
