"""Block kernels of the native library: exact against a dense reference, safe against a corrupt block
section, picked for blocked structures, and the masked <-> sparse trajectory holds with them."""

import numpy as np
import pytest
import tensorflow as tf
import keras

import prune
from prune import native
from prune.layers.masked import MaskedDense
from prune.layers.sparse import SparseDense
from prune.core.patterns import Block

needs_native = pytest.mark.skipif(native.load() is None, reason="native library unavailable (PRUNE_NATIVE=0 or no build)")


def _blocked_mask(rng, n_in, n_out, r, c, keep):
    nr, nc = -(-n_in // r), -(-n_out // c)
    return np.repeat(np.repeat(rng.random((nr, nc)) < keep, r, 0), c, 1)[:n_in, :n_out]


def _base_len(nnz, n_in, n_out):
    return 3 * nnz + n_in + n_out + 2


def test_structure_finds_the_widest_tiling_and_refuses_a_wrong_one():
    idx = np.argwhere(np.kron(np.eye(3, dtype=bool), np.ones((1, 16), bool)))  # 3 x 48, one 1x16 tile per row
    assert native.block_width(idx, 48) == 16
    st = native.structure(idx, 3, 48)
    assert len(st) > _base_len(48, 3, 48) and st[_base_len(48, 3, 48) + 1] == 16
    assert len(native.structure(idx, 3, 48, block=0)) == _base_len(48, 3, 48)  # block=0: general kernels only
    assert native.block_width(idx[1:], 48) == 0  # a tile missing one entry: not blocked
    assert native.block_width(np.array([[0, 0], [0, 1], [0, 2], [0, 3]]), 3) == 0  # narrower than every width
    with pytest.raises(ValueError, match="1 x 32 tiles"):
        native.structure(idx, 3, 48, block=32)


# (n_in, n_out, block, batch): odd shapes, edge tiles (C not dividing n_out), every width, batch 1 and
# batches on both sides of a vector and of the micro-kernels' row counts.
CASES = [
    (37, 45, (1, 8), 1), (37, 45, (1, 8), 5), (37, 45, (2, 4), 19), (64, 70, (1, 16), 33), (50, 100, (3, 32), 2),
    (129, 67, (4, 4), 40), (16, 16, (1, 16), 17), (300, 200, (1, 16), 300), (21, 40, (1, 32), 1),
]


@needs_native
@pytest.mark.parametrize("n_in,n_out,block,batch", CASES)
@pytest.mark.parametrize("graph", [False, True])
def test_block_ops_match_the_dense_reference(n_in, n_out, block, batch, graph):
    rng = np.random.default_rng(n_in * batch)
    mask = _blocked_mask(rng, n_in, n_out, *block, 0.35)
    mask[n_in // 2] = False  # an empty block row
    idx = np.argwhere(mask)
    st = native.structure(idx, n_in, n_out)
    assert len(st) > _base_len(len(idx), n_in, n_out)  # the block section is there: the block kernels run
    vals = rng.standard_normal(len(idx)).astype(np.float32)
    w = np.zeros((n_in, n_out), np.float32)
    w[mask] = vals
    x = rng.standard_normal((batch, n_in)).astype(np.float32)
    dy = rng.standard_normal((batch, n_out)).astype(np.float32)
    lib = native.load()

    def ops(x, dy, vals):
        return (lib.prune_spmm(x, vals, st, n_in=n_in, n_out=n_out),
                lib.prune_spmm(dy, vals, st, n_in=n_in, n_out=n_out, transpose=True),
                lib.prune_sddmm(x, dy, vals, st, n_in=n_in, n_out=n_out))

    got = (tf.function(ops) if graph else ops)(x, dy, vals)
    for a, ref in zip(got, (x @ w, dy @ w.T, (x.T @ dy)[mask])):
        np.testing.assert_allclose(a.numpy(), ref, rtol=1e-5, atol=1e-5 * max(1.0, np.abs(ref).max()))


@needs_native
def test_block_ops_reject_a_corrupt_block_section():
    lib = native.load()
    idx = np.argwhere(np.ones((4, 16), bool))
    good = native.structure(idx, 4, 16)
    base = _base_len(64, 4, 16)
    # block section: magic, C, nb, brp (5), bcols (4), boff (4), tcp (2), trows (4), toff (4)
    for where, value in ((base + 3 + 5, 9), (base + 3 + 5 + 4, 60), (base + 3 + 5 + 8 + 2, 4), (base + 3 + 5 + 8 + 2 + 4, 61)):
        bad = good.copy()
        bad[where] = value  # a column block, position or row out of range
        v = np.ones(64, np.float32)
        refused = []
        # Each path checks what it reads (block-CSR or block-CSC) where it reads it: every call either
        # refuses or never touched the bad entry; the paths that read it refuse.
        for batch in (1, 20):  # the row-at-a-time and the micro-kernel paths
            x, dy = np.ones((batch, 4), np.float32), np.ones((batch, 16), np.float32)
            for call in (lambda: lib.prune_spmm(x, v, bad, n_in=4, n_out=16),
                         lambda: lib.prune_spmm(dy, v, bad, n_in=4, n_out=16, transpose=True),
                         lambda: lib.prune_sddmm(x, dy, v, bad, n_in=4, n_out=16)):
                try:
                    call()
                    refused.append(False)
                except tf.errors.InvalidArgumentError as err:
                    assert "out-of-range" in str(err)
                    refused.append(True)
        assert sum(refused) >= 2, (where, refused)
    bad = good.copy()
    bad[base + 1] = 12  # not a tile width
    with pytest.raises(tf.errors.InvalidArgumentError, match="malformed block section"):
        lib.prune_spmm(np.ones((1, 4), np.float32), np.ones(64, np.float32), bad, n_in=4, n_out=16)


@needs_native
def test_sparse_dense_with_a_block_pattern_keeps_a_blocked_structure_under_its_schedule():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((20, 32)).astype(np.float32)
    layer = SparseDense.from_dense(w, np.ones_like(w), pattern=Block((2, 16)),
                                   pruning_schedule=prune.OneShot(0.5, 0), matmul="auto")
    model = keras.Sequential([keras.Input((20,)), layer])
    model.compile("sgd", "mse")
    x = rng.standard_normal((40, 20)).astype(np.float32)
    model.fit(x, np.zeros((40, 32), np.float32), epochs=1, batch_size=20, verbose=0,
              callbacks=[prune.UpdatePruningStep()])
    assert layer.nnz == 320 and native.block_width(layer.indices.numpy(), 32) == 16
    assert layer.native_structure.shape[0] > _base_len(320, 20, 32)
    np.testing.assert_allclose(model(x).numpy(), x @ layer.to_dense() + layer.bias.numpy(), rtol=1e-5, atol=1e-5)


def test_trajectory_matches_masked_dense_with_block_kernels():
    """A Block((2, 8)) schedule: the sparse layer runs the block kernels, the loss curves agree within 1e-4."""
    rng = np.random.default_rng(0)
    w1, w2 = rng.standard_normal((10, 24)).astype(np.float32) * 0.4, rng.standard_normal((24, 3)).astype(np.float32) * 0.3
    x = rng.standard_normal((160, 10)).astype(np.float32)
    y = np.tanh(x @ rng.standard_normal((10, 3)).astype(np.float32))
    schedule = prune.PolynomialDecay(0.2, 0.8, begin_step=0, end_step=60, frequency=10)
    kw = dict(activation="tanh", pruning_schedule=schedule, pattern=Block((2, 8)))

    masked1 = MaskedDense(24, **kw)
    masked1.build((None, 10))
    masked1.kernel.assign(w1)
    masked2 = MaskedDense(3)
    masked2.build((None, 24))
    masked2.kernel.assign(w2)
    sparse1 = SparseDense.from_dense(w1, np.ones_like(w1), matmul="native", **kw)
    sparse2 = SparseDense.from_dense(w2, np.ones_like(w2), matmul="native")
    models = []
    for a, b in ((masked1, masked2), (sparse1, sparse2)):
        model = keras.Sequential([keras.Input((10,)), a, b])
        model.compile(keras.optimizers.Adam(0.01), "mse")
        ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(32).repeat()
        hist = model.fit(ds, epochs=60, steps_per_epoch=1, verbose=0, callbacks=[prune.UpdatePruningStep()], shuffle=False)
        models.append(np.array(hist.history["loss"]))
    np.testing.assert_allclose(models[1], models[0], rtol=1e-4)
    mask = masked1.get_masks()["kernel"]
    np.testing.assert_array_equal(sparse1.get_mask(), mask)
    if native.load() is not None:
        assert native.block_width(sparse1.indices.numpy(), 24) == 8  # the block kernels ran


@needs_native
def test_convert_of_a_block_masked_model_runs_the_block_kernels():
    rng = np.random.default_rng(2)
    layer = MaskedDense(32, pattern=Block((4, 8)))
    layer.build((None, 12))
    mask = _blocked_mask(rng, 12, 32, 4, 8, 0.5)
    layer.set_mask("kernel", mask)
    model = keras.Sequential([keras.Input((12,)), layer])
    sparse = prune.convert(model, to="sparse")
    converted = [lyr for lyr in sparse.layers if isinstance(lyr, SparseDense)][0]
    assert native.block_width(converted.indices.numpy(), 32) == 8
    assert converted.native_structure.shape[0] > _base_len(int(mask.sum()), 12, 32)
    x = rng.standard_normal((5, 12)).astype(np.float32)
    np.testing.assert_allclose(sparse(x).numpy(), model(x).numpy(), rtol=1e-5, atol=1e-5)
