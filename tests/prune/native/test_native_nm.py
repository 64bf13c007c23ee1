"""N:M kernels of the native library (issue 36): the N:M section is built for N:M structures and only for them,
the ops are exact against a float64 dense reference, a corrupt N:M section gives InvalidArgument, and a
SparseDense pruned with prune.NByM runs them."""

import numpy as np
import pytest
import tensorflow as tf
import keras

import prune
from prune import native
from prune.layers.sparse import SparseDense

needs_native = pytest.mark.skipif(native.load() is None, reason="native library unavailable (PRUNE_NATIVE=0 or no build)")

SHAPES = [(2, 4), (1, 4), (4, 8)]  # (kept n, group m): prune.NByM(2, 4), NByM(3, 4), NByM(4, 8)


def _nm_mask(rng, n_in, n_out, n, m, short=0.0):
    """Exactly n of every m inputs per output (all of a partial last group's, if fewer); a fraction ``short`` of the
    (group, output) pairs keep one fewer."""
    mask = np.zeros((n_in, n_out), bool)
    for g in range(-(-n_in // m)):
        rows = np.arange(g * m, min(n_in, g * m + m))
        scores = rng.random((len(rows), n_out))
        keep = np.argsort(scores, axis=0)[: min(n, len(rows))]
        drop = rng.random(n_out) < short
        for j in range(n_out):
            mask[rows[keep[: len(keep) - int(drop[j]), j]], j] = True
    return mask


def _base_len(nnz, n_in, n_out):
    return 3 * nnz + n_in + n_out + 2


@pytest.mark.parametrize("n,m", SHAPES + [(2, 8), (1, 8)])
def test_structure_adds_an_nm_section_to_nm_structures(n, m):
    rng = np.random.default_rng(n * m)
    idx = np.argwhere(_nm_mask(rng, 53, 70, n, m))
    assert native.nm_shape(idx, 53, 70) == (n, m)
    st = native.structure(idx, 53, 70)
    base = _base_len(len(idx), 53, 70)
    assert st[base] == 0x4D4E3A31 and tuple(st[base + 1: base + 3]) == (n, m) and st[base + 3] == -(-53 // m)
    assert native.has_nm_section(len(st), len(idx), 53, 70)
    assert not native.has_block_section(len(st), len(idx), 53, 70)
    assert len(native.structure(idx, 53, 70, nm=False)) == base
    # a few groups one short: still N:M (90% of the slots filled)
    idx = np.argwhere(_nm_mask(rng, 53, 70, n, m, short=0.05))
    assert native.has_nm_section(len(native.structure(idx, 53, 70)), len(idx), 53, 70)


def test_structure_keeps_unstructured_and_sparse_layers_off_the_nm_kernels():
    rng = np.random.default_rng(0)
    mask = rng.random((256, 300)) < 0.1  # 90% sparse: at most 4 of 8 almost everywhere, but 20% of 4:8's slots
    idx = np.argwhere(mask)
    st = native.structure(idx, 256, 300)
    assert native.nm_shape(idx, 256, 300) is None and not native.has_nm_section(len(st), len(idx), 256, 300)
    # 2:4 with half its groups one short: 75% of the slots filled, below NM_MIN_FILL
    idx = np.argwhere(_nm_mask(rng, 64, 64, 2, 4, short=0.5))
    assert native.nm_shape(idx, 64, 64) is None
    assert native.nm_shape(idx, 64, 64, min_fill=0.0) == (2, 4)
    assert native.has_nm_section(len(native.structure(idx, 64, 64, nm=True)), len(idx), 64, 64) is False  # fill
    # a dense enough N:M layer keeps its panel section beside the N:M section
    idx = np.argwhere(_nm_mask(rng, 300, 40, 2, 4))
    st = native.structure(idx, 300, 40)
    assert native.panels_pay(len(idx), 300, 40) and native.has_nm_section(len(st), len(idx), 300, 40)
    with pytest.raises(ValueError, match="not N:M"):
        native.structure(np.argwhere(np.ones((8, 3), bool)), 8, 3, nm=True)


# (n_in, n_out): odd shapes (partial last groups, outputs not a multiple of the 64-output blocks), one block row
CASES = [(37, 53), (515, 129), (64, 200), (9, 3)]


@needs_native
@pytest.mark.parametrize("n,m", SHAPES)
@pytest.mark.parametrize("n_in,n_out", CASES)
def test_nm_ops_match_the_dense_reference(n, m, n_in, n_out):
    rng = np.random.default_rng(n_in * n + m)
    mask = _nm_mask(rng, n_in, n_out, n, m, short=0.03)
    idx = np.argwhere(mask)
    st = native.structure(idx, n_in, n_out, nm=True)  # also where a small partial last group leaves < 90% filled
    assert st[_base_len(len(idx), n_in, n_out)] == 0x4D4E3A31
    if n_in > 64:
        assert native.has_nm_section(len(native.structure(idx, n_in, n_out)), len(idx), n_in, n_out)
    vals = rng.standard_normal(len(idx)).astype(np.float32)
    w = np.zeros((n_in, n_out))
    w[mask] = vals
    lib = native.load()
    for batch in (1, 2, 3, 5, 16, 17, 64, 257):
        x = rng.standard_normal((batch, n_in)).astype(np.float32)
        dy = rng.standard_normal((batch, n_out)).astype(np.float32)
        got = (lib.prune_spmm(x, vals, st, n_in=n_in, n_out=n_out),
               lib.prune_spmm(dy, vals, st, n_in=n_in, n_out=n_out, transpose=True),
               lib.prune_sddmm(x, dy, vals, st, n_in=n_in, n_out=n_out))
        refs = (x.astype(np.float64) @ w, dy.astype(np.float64) @ w.T, (x.T.astype(np.float64) @ dy)[mask])
        for a, ref in zip(got, refs):
            np.testing.assert_allclose(a.numpy(), ref, rtol=1e-5, atol=1e-5 * max(1.0, np.abs(ref).max()),
                                       err_msg=f"batch {batch}")
        general = (lib.prune_spmm(x, vals, st, n_in=n_in, n_out=n_out, profile=7),  # the general kernels
                   lib.prune_sddmm(x, dy, vals, st, n_in=n_in, n_out=n_out, profile=7))
        for a, b, ref in zip((got[0], got[2]), general, (refs[0], refs[2])):
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-5 * max(1.0, np.abs(ref).max()))


@needs_native
def test_nm_ops_match_the_dense_reference_in_a_graph():
    rng = np.random.default_rng(3)
    mask = _nm_mask(rng, 40, 70, 2, 4)
    idx = np.argwhere(mask)
    st = native.structure(idx, 40, 70)
    vals = rng.standard_normal(len(idx)).astype(np.float32)
    w = np.zeros((40, 70), np.float32)
    w[mask] = vals
    lib = native.load()
    fn = tf.function(lambda x: lib.prune_spmm(x, vals, st, n_in=40, n_out=70))
    for batch in (1, 6, 33):
        x = rng.standard_normal((batch, 40)).astype(np.float32)
        np.testing.assert_allclose(fn(x).numpy(), x @ w, rtol=1e-5, atol=1e-5)


@needs_native
def test_nm_ops_reject_a_corrupt_nm_section():
    lib = native.load()
    rng = np.random.default_rng(0)
    n_in, n_out = 10, 5  # 3 groups of 4, the last of 2 inputs
    idx = np.argwhere(_nm_mask(rng, n_in, n_out, 2, 4))
    nnz = len(idx)
    good = native.structure(idx, n_in, n_out)
    o = _base_len(nnz, n_in, n_out)
    slots = native.NM_WIDTH * 3 * 2  # one block of 64 outputs, 3 groups, 2 slots
    codes_at, slots_at = o + 4, o + 4 + slots // 4
    x, vals = np.ones((3, n_in), np.float32), np.ones(nnz, np.float32)

    for batch in (1, 2, 3, 20):
        lib.prune_spmm(np.ones((batch, n_in), np.float32), vals, good, n_in=n_in, n_out=n_out).numpy()

    def corrupt(at, value, *, byte=None):
        bad = good.copy()
        if byte is None:
            bad[at] = value
        else:
            b = bad[at:at + 1].view(np.uint8)
            b[byte] = value
        return bad

    cases = [
        (corrupt(slots_at, nnz), "out-of-range code or slot"),  # a slot past the values
        (corrupt(slots_at + 7, -2), "out-of-range code or slot"),  # below -1
        (corrupt(slots_at + 5, 2**31 - 1), "out-of-range code or slot"),
        (corrupt(codes_at, 4, byte=1), "out-of-range code or slot"),  # a code >= m
        (corrupt(codes_at, 255, byte=0), "out-of-range code or slot"),
        # the last group has 2 inputs: code 2 or 3 would read past n_in
        (corrupt(codes_at + 2 * 2 * native.NM_WIDTH // 4, 3, byte=0), "out-of-range code or slot"),
        (corrupt(o + 1, 3), "unsupported shape"),
        (corrupt(o + 2, 6), "unsupported shape"),
        (corrupt(o + 3, 4), "groups"),
        (good[:-1], "cut short"),
        (corrupt(o, 12345), "malformed section"),
    ]
    dy = np.ones((3, n_out), np.float32)
    for bad, message in cases:
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            lib.prune_spmm(x, vals, bad, n_in=n_in, n_out=n_out).numpy()
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):  # the values gradient's N:M kernel
            lib.prune_sddmm(x, dy, vals, bad, n_in=n_in, n_out=n_out).numpy()


def _nm_layer(rng, n_in, n_out, matmul="native"):
    w = rng.standard_normal((n_in, n_out)).astype(np.float32)
    layer = SparseDense.from_dense(w, np.ones_like(w), pattern=prune.NByM(2, 4), pruning_schedule=prune.OneShot(0.5, 0),
                                   matmul=matmul)
    model = keras.Sequential([keras.Input((n_in,)), layer])
    prune.update_masks(model, 0)
    return model, layer


@needs_native
def test_sparse_dense_pruned_with_nbym_runs_the_nm_kernels():
    rng = np.random.default_rng(5)
    model, layer = _nm_layer(rng, 38, 50)
    assert layer.nnz == 50 * (9 * 2 + 2)  # 9 whole groups of 4 and a last group of 2, both of whose inputs stay
    assert native.nm_shape(layer.indices.numpy(), 38, 50) == (2, 4)
    assert native.has_nm_section(layer.native_structure.shape[0], layer.nnz, 38, 50)
    w = layer.to_dense()
    assert (np.count_nonzero(w[:36].reshape(9, 4, 50), axis=1) == 2).all()
    for batch in (1, 3, 16, 64, 257):
        x = rng.standard_normal((batch, 38)).astype(np.float32)
        with tf.GradientTape(persistent=True) as tape:
            xt = tf.constant(x)
            tape.watch(xt)
            y = layer(xt)
            loss = tf.reduce_sum(y * y)
        dx, dv = tape.gradient(loss, [xt, layer.values])
        ref = x.astype(np.float64) @ w + layer.bias.numpy()
        np.testing.assert_allclose(y.numpy(), ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
        dy = 2 * ref
        np.testing.assert_allclose(dx.numpy(), dy @ w.T, rtol=1e-5, atol=1e-5 * np.abs(dy @ w.T).max())
        rows, cols = layer.indices.numpy().T
        dw = x.T.astype(np.float64) @ dy
        np.testing.assert_allclose(dv.numpy(), dw[rows, cols], rtol=1e-5, atol=1e-5 * np.abs(dw).max())


@needs_native
def test_auto_prices_the_nm_kernels():
    from prune.layers import kernels

    # 2:4 at 512 x 2048 and 256 rows: priced below both the general kernels and dense
    nnz, n_in, n_out = 512 * 1024, 512, 2048
    cost = {k: kernels._COST[k] for k in ("dense", "native", "native_nm")}
    est = {k: sum(c * t for c, t in zip(v, kernels._terms(nnz, 256, n_in, n_out))) for k, v in cost.items()}
    assert est["native_nm"] < min(est["dense"], est["native"])
    model, layer = _nm_layer(np.random.default_rng(0), 64, 64, matmul="auto")
    x = np.ones((8, 64), np.float32)
    np.testing.assert_allclose(model(x).numpy(), x @ layer.to_dense() + layer.bias.numpy(), rtol=1e-5, atol=1e-4)
