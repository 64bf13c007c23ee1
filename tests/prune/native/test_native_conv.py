"""The native convolution ops (PruneConv2d, PruneCol2im and the registered gradient) against float64 references.

PruneConv2d forms each tile's patches in its tile buffer (PatchTile) instead of transposing rows of x, so its
edges are the tile edges (positions not a multiple of the tile width, a tile that spans images), the image edges
(padding, strides, dilation) and the channel counts around the 8-wide register transpose (1, 3, 8, 9, 17). This
file walks position counts from 1 to past four vectors of every lane width (``test_native_portability.py`` runs
it again in the 4-, 8- and 16-lane builds, ``make test-native-asan`` under the sanitizers), the panel kernel,
one tile split over output rows, and corrupt structures.

Tolerance: ``1e-5 * (|patches| @ |W|)`` per element, the float32 bound of any summation order (as
``test_native_batches.py``), so a wrong tap, channel or position fails and another summation order does not.
"""

import itertools
import os

import numpy as np
import pytest
import tensorflow as tf

from prune import native
from prune.layers import sparse_conv  # noqa: F401 - registers PruneConv2d's gradient

FORCED_OFF = os.environ.get("PRUNE_NATIVE", "1").strip() == "0"
pytestmark = pytest.mark.skipif(FORCED_OFF, reason="PRUNE_NATIVE=0 forces the fallback")


def _lib():
    lib = native.load()
    assert lib is not None, native.status().reason
    return lib


def _case(rng, k, c, o, density, panels=None):
    mask = rng.random((k, k, c, o)) < density
    w = np.where(mask, rng.standard_normal(mask.shape), 0.0).astype(np.float32)
    flat = mask.reshape(-1, o)
    idx = np.argwhere(flat)
    return w, w.reshape(-1, o)[flat], native.structure(idx, k * k * c, o, panels=panels)


def _patches64(x, k, s, d, padding):
    return tf.image.extract_patches(
        tf.constant(x, tf.float64), [1, k, k, 1], [1, s, s, 1], [1, d, d, 1], padding
    ).numpy()


def _conv(lib, x, values, structure, w, s, d, padding):
    k, _, c, o = w.shape
    return lib.prune_conv2d(x, values, structure, n_in=k * k * c, n_out=o, kernel_size=[k, k], strides=[s, s],
                            dilations=[d, d], padding=padding)


def _check(what, got, want, bound):
    got = np.asarray(got)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, want {want.shape}"
    bad = np.argwhere(~(np.abs(got.astype(np.float64) - want) <= bound))
    assert len(bad) == 0, f"{what}: {len(bad)} wrong entries, the first at {tuple(bad[0])}"


# (batch, height, width): 1 to 130 output positions at stride 1 "SAME" (tiles of 4, 8 or 16 lanes, 1 to 4
# vectors), tiles that span images, a 1 x 1 image
SIZES = [(1, 1, 1), (1, 3, 5), (2, 3, 3), (1, 4, 4), (3, 3, 3), (1, 5, 7), (2, 4, 4), (1, 7, 7), (5, 3, 3), (1, 8, 8),
         (1, 9, 9), (2, 7, 7), (1, 11, 11), (3, 8, 8), (2, 9, 9), (1, 13, 10)]
GEOMETRIES = [(1, 1, 1, "VALID"), (3, 1, 1, "SAME"), (3, 1, 1, "VALID"), (3, 2, 1, "SAME"), (3, 1, 2, "SAME"),
              (5, 1, 1, "SAME"), (5, 2, 1, "VALID")]


@pytest.mark.parametrize("k,s,d,padding", GEOMETRIES)
@pytest.mark.parametrize("c", [1, 3, 8, 9, 17])
def test_every_batch_and_image_size_of_the_conv_op_matches_the_float64_reference(k, s, d, padding, c):
    lib = _lib()
    rng = np.random.default_rng(k * 100 + c)
    w, values, structure = _case(rng, k, c, 11, 0.35)
    for b, h, wd in SIZES:
        x = rng.standard_normal((b, h, wd, c)).astype(np.float32)
        if padding == "VALID" and min(h, wd) < (k - 1) * d + 1:  # TF refuses it; the op gives no positions
            assert _conv(lib, x, values, structure, w, s, d, padding).shape[1:3].num_elements() == 0
            continue
        patches = _patches64(x, k, s, d, padding)
        w2 = w.reshape(-1, w.shape[-1]).astype(np.float64)
        want = patches @ w2
        got = _conv(lib, x, values, structure, w, s, d, padding)
        _check(f"forward {k}x{k}/s{s}/d{d}/{padding} C={c} x {x.shape}", got, want, 1e-5 * (np.abs(patches) @ np.abs(w2)) + 1e-30)


@pytest.mark.parametrize("k,s,d,padding", GEOMETRIES)
def test_every_batch_of_the_registered_gradient_matches_the_float64_tape(k, s, d, padding):
    lib = _lib()
    rng = np.random.default_rng(k * 7 + s)
    c, o = 9, 13
    w, values, structure = _case(rng, k, c, o, 0.4)
    for b, h, wd in SIZES[::3]:
        if padding == "VALID" and min(h, wd) < (k - 1) * d + 1:
            continue
        x = rng.standard_normal((b, h, wd, c)).astype(np.float32)
        xt, vt = tf.constant(x), tf.constant(values)
        with tf.GradientTape() as tape:
            tape.watch([xt, vt])
            y = _conv(lib, xt, vt, structure, w, s, d, padding)
            weights = tf.constant(rng.standard_normal(y.shape).astype(np.float32))
            loss = tf.reduce_sum(y * weights)
        gx, gv = tape.gradient(loss, [xt, vt])
        x64, k64 = tf.constant(x, tf.float64), tf.Variable(w.astype(np.float64))
        with tf.GradientTape() as tape:
            tape.watch(x64)
            loss64 = tf.reduce_sum(tf.nn.convolution(x64, k64, [s, s], padding, dilations=[d, d]) * tf.cast(weights, tf.float64))
        gx64, gk64 = tape.gradient(loss64, [x64, k64])
        # bounds: the same products, in absolute value
        with tf.GradientTape() as tape:
            tape.watch(x64)
            abs_loss = tf.reduce_sum(tf.nn.convolution(x64, tf.abs(k64), [s, s], padding, dilations=[d, d]) *
                                     tf.abs(tf.cast(weights, tf.float64)))
        bound_x = 1e-5 * tape.gradient(abs_loss, x64).numpy() + 1e-30
        patches = np.abs(_patches64(x, k, s, d, padding)).reshape(-1, k * k * c)
        bound_w = 1e-5 * (patches.T @ np.abs(weights.numpy().reshape(-1, o))) + 1e-30
        mask = (w != 0).reshape(-1, o)
        _check(f"dx {k}/{s}/{d}/{padding} {x.shape}", gx, gx64.numpy(), bound_x)
        _check(f"dv {k}/{s}/{d}/{padding} {x.shape}", gv, gk64.numpy().reshape(-1, o)[mask], bound_w[mask])


def test_col2im_is_the_transpose_of_extract_patches():
    lib = _lib()
    rng = np.random.default_rng(0)
    for (k, s, d, padding), c in itertools.product(GEOMETRIES, (1, 5)):
        x = rng.standard_normal((2, 9, 7, c)).astype(np.float32)
        xt = tf.constant(x, tf.float64)
        with tf.GradientTape() as tape:
            tape.watch(xt)
            patches = tf.image.extract_patches(xt, [1, k, k, 1], [1, s, s, 1], [1, d, d, 1], padding)
        dp = rng.standard_normal(patches.shape).astype(np.float32)
        want = tape.gradient(patches, xt, output_gradients=tf.constant(dp, tf.float64)).numpy()
        got = lib.prune_col2im(dp, x, kernel_size=[k, k], strides=[s, s], dilations=[d, d], padding=padding)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5, err_msg=f"{k} {s} {d} {padding} {c}")


def test_panel_kernel_and_a_split_single_tile_match_the_reference():
    lib = _lib()
    rng = np.random.default_rng(1)
    # 3 x 3 x 32 = 288 inputs, dense enough for a panel section; 8 x 16 x 16 positions: more tiles than threads
    w, values, structure = _case(rng, 3, 32, 40, 0.5)
    assert native.panels_pay(len(values), 288, 40)
    # batch 1 at 7 x 7: one tile; 576 x 256 at 50% is 73k entries x 49 positions, past the serial threshold, so
    # the tile is formed once (in parallel, by column ranges that cut across taps) and its output rows split
    w1, values1, structure1 = _case(rng, 3, 64, 256, 0.5)
    for (w_, v_, st_), shape in (((w, values, structure), (8, 16, 16, 32)), ((w1, values1, structure1), (1, 7, 7, 64))):
        x = rng.standard_normal(shape).astype(np.float32)
        patches = _patches64(x, 3, 1, 1, "SAME")
        w2 = w_.reshape(-1, w_.shape[-1]).astype(np.float64)
        _check(f"x {shape}", _conv(lib, x, v_, st_, w_, 1, 1, "SAME"), patches @ w2, 1e-5 * (np.abs(patches) @ np.abs(w2)) + 1e-30)


def test_the_conv_ops_reject_a_corrupt_structure_and_bad_shapes():
    lib = _lib()
    rng = np.random.default_rng(2)
    w, values, good = _case(rng, 3, 2, 3, 0.6, panels=False)
    n_in, nnz = 18, len(values)
    x = rng.standard_normal((2, 5, 5, 2)).astype(np.float32)
    _conv(lib, x, values, good, w, 1, 1, "SAME")
    t0 = n_in + 1 + nnz  # W^T's row pointers start here (after rp and cols)
    for where, value in ((t0 + 3 + 1, n_in), (t0 + 3 + 1, -1), (len(good) - 1, nnz)):  # a W^T column, a perm entry
        bad = good.copy()
        bad[where] = value
        with pytest.raises(tf.errors.InvalidArgumentError, match="out-of-range"):
            _conv(lib, x, values, bad, w, 1, 1, "SAME")
    bad = good.copy()
    bad[t0 + 1] = nnz + 5  # W^T's row pointers no longer rise to nnz
    with pytest.raises(tf.errors.InvalidArgumentError, match="row pointers"):
        _conv(lib, x, values, bad, w, 1, 1, "SAME")
    with pytest.raises(tf.errors.InvalidArgumentError, match="structure must have"):
        _conv(lib, x, values, good[:-1], w, 1, 1, "SAME")
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"x must be \[batch, height, width, 2\]"):
        _conv(lib, x[..., :1], values, good, w, 1, 1, "SAME")
    # a panel section with a column beyond n_in
    wp, vp, sp = _case(rng, 3, 32, 40, 0.5)
    xp = rng.standard_normal((8, 16, 16, 32)).astype(np.float32)
    bad = sp.copy()
    bad[-2 * len(vp) + 7] = 288  # pcols, after the panel starts
    with pytest.raises(tf.errors.InvalidArgumentError, match="out-of-range"):
        _conv(lib, xp, vp, bad, wp, 1, 1, "SAME")
    with pytest.raises(tf.errors.InvalidArgumentError, match="dp must be"):
        lib.prune_col2im(np.zeros((2, 5, 5, 17), np.float32), x, kernel_size=[3, 3], strides=[1, 1], dilations=[1, 1],
                         padding="SAME")
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="kernel_size, strides and dilations"):
        lib.prune_conv2d(x, values, good, n_in=n_in, n_out=3, kernel_size=[3, 0], strides=[1, 1], dilations=[1, 1],
                         padding="SAME")
