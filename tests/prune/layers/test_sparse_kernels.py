"""Sparse matmul kernels: forward and gradients agree with the dense product; bad input is rejected."""

import os

import numpy as np
import pytest
import tensorflow as tf

from prune.layers import kernels

SPARSITIES = [0.0, 0.5, 0.9, 0.999]
KERNEL_CHOICES = list(kernels.MATMULS)
RULES = ["auto", "dense", "sampled"]


def _problem(sparsity, batch, n_in=41, n_out=29, seed=0):
    rng = np.random.default_rng(seed)
    mask = rng.random((n_in, n_out)) >= sparsity
    w = (rng.standard_normal((n_in, n_out)) * mask).astype(np.float32)
    x = rng.standard_normal((batch, n_in)).astype(np.float32)
    dy = rng.standard_normal((batch, n_out)).astype(np.float32)
    return mask, w, x, dy


def _sparse_run(x, w, mask, dy, matmul, rule, compiled):
    idx = np.argwhere(mask).astype(np.int64)
    values = tf.constant(w[mask])

    def run(x, values):
        with tf.GradientTape() as tape:
            tape.watch([x, values])
            y = kernels.sparse_matmul(x, values, idx, w.shape, matmul=matmul, values_grad=rule)
        return (y, *tape.gradient(y, [x, values], output_gradients=tf.constant(dy)))

    fn = tf.function(run) if compiled else run
    return [t.numpy() for t in fn(tf.constant(x), values)]


@pytest.mark.parametrize("sparsity", SPARSITIES)
@pytest.mark.parametrize("matmul", KERNEL_CHOICES)
def test_forward_and_gradients_match_dense(sparsity, matmul):
    for batch, rule, compiled in [(1, "auto", False), (9, "dense", True), (9, "sampled", False)]:
        mask, w, x, dy = _problem(sparsity, batch)
        y, gx, gv = _sparse_run(x, w, mask, dy, matmul, rule, compiled)
        np.testing.assert_allclose(y, x @ w, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(gx, dy @ w.T, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(gv, (x.T @ dy)[mask], rtol=1e-5, atol=1e-5)


def test_tiny_exact():
    # W = [[0, 2], [3, 0]] stored as two entries; x = [[1, 10]].
    x = tf.constant([[1.0, 10.0]])
    values = tf.constant([2.0, 3.0])
    indices = np.array([[0, 1], [1, 0]])
    for matmul in KERNEL_CHOICES:
        with tf.GradientTape() as tape:
            tape.watch(values)
            y = kernels.sparse_matmul(x, values, indices, (2, 2), matmul=matmul)
        np.testing.assert_array_equal(y.numpy(), [[30.0, 2.0]])
        # d(sum y)/d values: entry (0,1) sees x[0]=1, entry (1,0) sees x[1]=10
        np.testing.assert_array_equal(tape.gradient(y, values).numpy(), [1.0, 10.0])


def test_sampled_grad_chunks_agree_with_one_shot():
    mask, w, x, dy = _problem(0.7, 5)
    idx = tf.constant(np.argwhere(mask).astype(np.int64))
    whole = kernels.sampled_values_grad(tf.constant(x), tf.constant(dy), idx, chunk_elements=1 << 20)
    chunked = kernels.sampled_values_grad(tf.constant(x), tf.constant(dy), idx, chunk_elements=7 * 5)
    np.testing.assert_allclose(chunked.numpy(), whole.numpy(), rtol=1e-6)
    np.testing.assert_allclose(whole.numpy(), (x.T @ dy)[mask], rtol=1e-5, atol=1e-5)


def test_empty_matrix():
    x = tf.ones((3, 4))
    for matmul in KERNEL_CHOICES:
        y = kernels.sparse_matmul(x, tf.zeros([0]), np.zeros((0, 2), np.int64), (4, 5), matmul=matmul)
        np.testing.assert_array_equal(y.numpy(), np.zeros((3, 5)))


def test_transpose_structure():
    indices = np.array([[0, 1], [0, 2], [1, 0], [2, 1]])
    perm, t_idx = kernels.transpose_structure(indices, (3, 3))
    np.testing.assert_array_equal(perm, [2, 0, 3, 1])
    np.testing.assert_array_equal(t_idx, [[0, 1], [1, 0], [1, 2], [2, 0]])


def test_check_structure_sorts_unsorted():
    idx, vals = kernels.check_structure([[1, 0], [0, 1], [0, 0]], [3.0, 2.0, 1.0], (2, 2))
    np.testing.assert_array_equal(idx, [[0, 0], [0, 1], [1, 0]])
    np.testing.assert_array_equal(vals, [1.0, 2.0, 3.0])


@pytest.mark.parametrize(
    "indices, values, match",
    [
        ([[0, 0], [2, 1]], [1.0, 2.0], r"indices entry \[2, 1\] is out of range"),
        ([[0, -1]], [1.0], r"indices entry \[0, -1\] is out of range"),
        ([[0, 1], [0, 1]], [1.0, 2.0], r"indices has duplicate entry \[0, 1\]"),
        ([[0, 1], [1, 1]], [1.0], r"indices has 2 entries, values has shape \(1,\)"),
        ([0, 1], [1.0], r"indices must have shape \[nnz, 2\]"),
    ],
)
def test_check_structure_rejects(indices, values, match):
    with pytest.raises(ValueError, match=match):
        kernels.check_structure(indices, values, (2, 2))


def test_unknown_matmul():
    with pytest.raises(ValueError, match=r"matmul must be one of .*'csr'.*got 'blas'"):
        kernels.sparse_matmul(tf.ones((1, 2)), tf.ones([1]), [[0, 0]], (2, 2), matmul="blas")
    with pytest.raises(ValueError, match=r"values_grad must be one of .* got 'x'"):
        kernels.sparse_matmul(tf.ones((1, 2)), tf.ones([1]), [[0, 0]], (2, 2), values_grad="x")


def test_cost_model_choices():
    # the documented regimes: dense at 0% sparsity, a sparse kernel at 99% (batch 256),
    # the dense values-gradient rule at 50% and the sampled one at 99.9%.
    # Without the native library (TensorFlow's kernels) and with it (native or densify).
    assert kernels.choose_matmul(256, 1024, 1024, 1024 * 1024, native=False) == "dense"
    assert kernels.choose_matmul(256, 1024, 1024, 10_486, native=False) in ("coo", "csr")
    assert kernels.values_grad_rule(256, 1024, 1024, 524_288) == "dense"
    assert kernels.values_grad_rule(256, 1024, 1024, 1_049) == "sampled"
    assert kernels.choose_matmul(256, 1024, 1024, 1024 * 1024, native=True) == "dense"
    assert kernels.choose_matmul(256, 1024, 1024, 209_715, native=True) == "native"  # 80% sparse
    assert kernels.choose_matmul(1, 1024, 1024, 209_715, native=True) == "native"
    assert kernels.values_grad_rule(256, 1024, 1024, 104_858, native=True) == "native"


def test_import_prune_enables_onednn_spmm_unless_set(monkeypatch):
    # `import prune` turns on oneDNN's CSR kernel for graphs, but never overrides the user's choice.
    import importlib

    import prune

    monkeypatch.delenv("TF_ENABLE_ONEDNN_SPMM", raising=False)
    importlib.reload(prune)
    assert os.environ["TF_ENABLE_ONEDNN_SPMM"] == "1"
    monkeypatch.setenv("TF_ENABLE_ONEDNN_SPMM", "0")
    importlib.reload(prune)
    assert os.environ["TF_ENABLE_ONEDNN_SPMM"] == "0"


def test_run_time_choice_matches_host_model_with_static_and_dynamic_batch():
    # auto's in-graph choice (folded constants for a static batch, the full formula otherwise)
    # is the kernel choose_matmul names for the same sizes.
    for batch in (1, 32, 256):
        for n_in, n_out in ((1024, 1024), (784, 300), (64, 8)):
            for density in (1.0, 0.5, 0.2, 0.1, 0.05, 0.01, 0.001):
                nnz = int(round(density * n_in * n_out))
                for native, names in ((False, kernels.KERNELS), (True, kernels.NATIVE_KERNELS)):
                    if density == 1.0:  # every entry stored: dense (a reshape) without consulting the model
                        assert kernels.choose_matmul(batch, n_in, n_out, nnz, native=native) == "dense"
                        continue
                    want = names.index(kernels.choose_matmul(batch, n_in, n_out, nnz, native=native))
                    for b in (batch, tf.constant(batch)):
                        got = kernels._argmin_branch(kernels._COST, names, tf.constant(nnz), b, n_in, n_out)
                        assert int(got) == want, (batch, n_in, n_out, nnz, b, native)
