"""Every batch size through every native op and path, against a float64 dense reference; and a seeded fuzz test.

Issue 31: batch 8 exactly crashed 16-lane (AVX-512) builds, while the suite's batches (1, 3, 7, 9, ...) never met it.
So this file runs every batch from 1 to 64 and 127-129, 255-257 through the forward, the input gradient and the
values gradient, on the general kernels (scatter, row dots, tiles reading through tperm, tiles after the value
gather), on the block kernels of every tile width, and on the profiles that select other paths (batch 1's row
gather, the general kernels on a blocked structure). The batch thresholds move with the vector width
(``kLanes``: 4, 8 or 16 floats), so ``tests/prune/native/test_native_portability.py`` runs this file again in builds of the
other widths, and ``make test-native-asan`` runs it under AddressSanitizer and UBSan.

Tolerance: ``|got - want| <= 1e-5 * (|x| @ |W|) + 1e-30`` per element, the float32 rounding bound of any
summation order scaled well past its ``n * eps``, so a wrong entry, a missing row or a write into the wrong row
fails and a different (but valid) summation order does not.
"""

import os
import zlib

import numpy as np
import pytest
import tensorflow as tf

from prune import native
from prune.layers import kernels
from prune.layers.sparse import SparseDense

FORCED_OFF = os.environ.get("PRUNE_NATIVE", "1").strip() == "0"
pytestmark = pytest.mark.skipif(FORCED_OFF, reason="PRUNE_NATIVE=0 forces the fallback")

BATCHES = [*range(1, 65), 127, 128, 129, 255, 256, 257]


def _blocked_mask(rng: np.random.Generator, n_in: int, n_out: int, c: int, density: float) -> np.ndarray:
    """A mask of whole 1 x c tiles along the output axis (the last tile of a row narrower when c does not divide n_out)."""
    n_cb = -(-n_out // c)
    tiles = rng.random((n_in, n_cb)) < density
    return np.repeat(tiles, c, axis=1)[:, :n_out]


def _structures() -> dict[str, tuple[np.ndarray, int]]:
    """name -> (mask, block width of the native structure: 0 general kernels, else the block section's C)."""
    rng = np.random.default_rng(31)
    out = {
        "general-37x29": (rng.random((37, 29)) < 0.4, 0),
        # 15k entries: the small-batch paths cut it into units shared between threads (32k multiply-adds each
        # from batch 3), the tiled paths split rows over the pool from batch 35 (2^19 multiply-adds)
        "general-300x100": (rng.random((300, 100)) < 0.5, 0),
        "general-empty-rows-cols": (rng.random((40, 33)) < 0.3, 0),
        # 5 panels of 128 inputs, the last ragged (prune.native.structure adds the panel section): the forward
        # op's panel kernel from the batch where tiles of 4 vectors outnumber threads (255-257 here on up to 3
        # threads with 16 lanes; test_native_panels.py picks its batches from the machine's threads)
        "general-panels-517x23": (rng.random((517, 23)) < 0.25, 0),
    }
    out["general-empty-rows-cols"][0][[0, 7, 39]] = False
    out["general-empty-rows-cols"][0][:, [0, 16, 32]] = False
    for c in native.BLOCK_WIDTHS:
        out[f"block-1x{c}"] = (_blocked_mask(rng, 45, 2 * c + 3, c, 0.5), c)
    return out


STRUCTURES = _structures()


def _bound(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return 1e-5 * (np.abs(a) @ np.abs(b)) + 1e-30


def _check(what: str, got: np.ndarray, want: np.ndarray, bound: np.ndarray) -> None:
    assert got.shape == want.shape, f"{what}: shape {got.shape}, want {want.shape}"
    err = np.abs(got.astype(np.float64) - want)
    bad = np.argwhere(~(err <= bound))  # NaN fails too
    assert len(bad) == 0, f"{what}: {len(bad)} wrong entries, the first at {tuple(bad[0])}: {got[tuple(bad[0])]} " \
                          f"against {want[tuple(bad[0])]}"


@pytest.mark.parametrize("name", list(STRUCTURES))
def test_every_batch_matches_the_dense_reference_on_every_op(name):
    lib = native.load()
    assert lib is not None, native.status().reason
    mask, c = STRUCTURES[name]
    n_in, n_out = mask.shape
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    idx = np.argwhere(mask).astype(np.int64)
    w = np.zeros(mask.shape, np.float32)
    w[mask] = rng.standard_normal(len(idx)).astype(np.float32)
    values = w[mask]
    structure = native.structure(idx, n_in, n_out, block=c)
    w64 = w.astype(np.float64)
    profiles = [0] + ([4] if c else [])  # 4: the general kernels on a blocked structure
    for batch in BATCHES:
        x = rng.standard_normal((batch, n_in)).astype(np.float32)
        dy = rng.standard_normal((batch, n_out)).astype(np.float32)
        x64, dy64 = x.astype(np.float64), dy.astype(np.float64)
        for profile in profiles:
            at = f"{name}, batch {batch}, profile {profile}"
            y = lib.prune_spmm(x, values, structure, n_in=n_in, n_out=n_out, profile=profile).numpy()
            _check(f"forward, {at}", y, x64 @ w64, _bound(x, w))
            dx = lib.prune_spmm(dy, values, structure, n_in=n_in, n_out=n_out, transpose=True, profile=profile).numpy()
            _check(f"input gradient, {at}", dx, dy64 @ w64.T, _bound(dy, w.T))
        dv = lib.prune_sddmm(x, dy, values, structure, n_in=n_in, n_out=n_out).numpy()
        _check(f"values gradient, {name}, batch {batch}", dv, (x64.T @ dy64)[mask], _bound(x.T, dy)[mask])
        if batch == 1:  # profile 5: batch 1's forward as a row gather over W^T through tperm
            y = lib.prune_spmm(x, values, structure, n_in=n_in, n_out=n_out, profile=5).numpy()
            _check(f"forward row gather, {name}", y, x64 @ w64, _bound(x, w))


def test_every_batch_through_a_layer_in_a_graph_with_gradients():
    """One traced function with an unknown batch (``[None, n_in]``), run at every batch: forward and both gradients."""
    mask, _ = STRUCTURES["general-300x100"]
    rng = np.random.default_rng(8)
    w = (rng.standard_normal(mask.shape) * mask).astype(np.float32)
    layer = SparseDense.from_dense(w, mask, matmul="native", use_bias=False)

    @tf.function(input_signature=[tf.TensorSpec([None, mask.shape[0]], tf.float32),
                                  tf.TensorSpec([None, mask.shape[1]], tf.float32)])
    def step(x, dy):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x)
        gx, gv = tape.gradient(y, [x, layer.values], output_gradients=dy)
        return y, gx, gv

    w64 = w.astype(np.float64)
    for batch in BATCHES:
        x = rng.standard_normal((batch, mask.shape[0])).astype(np.float32)
        dy = rng.standard_normal((batch, mask.shape[1])).astype(np.float32)
        y, gx, gv = (t.numpy() for t in step(x, dy))
        _check(f"forward, batch {batch}", y, x.astype(np.float64) @ w64, _bound(x, w))
        _check(f"input gradient, batch {batch}", gx, dy.astype(np.float64) @ w64.T, _bound(dy, w.T))
        _check(f"values gradient, batch {batch}", gv, (x.T.astype(np.float64) @ dy)[mask], _bound(x.T, dy)[mask])
    assert len(step._list_all_concrete_functions()) == 1  # one trace served every batch


@pytest.mark.parametrize("block", [0, 8], ids=["general", "block-1x8"])
def test_fit_at_batch_8_and_predict_with_a_remainder_of_8_match_tensorflow_kernels(block):
    """``fit(batch_size=8)`` and a ``predict`` whose last batch has 8 rows, native against TensorFlow's kernels."""
    import keras

    rng = np.random.default_rng(block)
    n_in, n_out = 48, 32
    mask = _blocked_mask(rng, n_in, n_out, 8, 0.4) if block else rng.random((n_in, n_out)) < 0.4
    w = (rng.standard_normal((n_in, n_out)) * mask).astype(np.float32)
    x = rng.standard_normal((40, n_in)).astype(np.float32)
    t = rng.standard_normal((40, n_out)).astype(np.float32)
    trained = {}
    for matmul in ("native", "coo"):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((n_in,)), SparseDense.from_dense(w, mask, matmul=matmul)])
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
        model.fit(x, t, batch_size=8, epochs=2, shuffle=False, verbose=0)
        layer = model.layers[0]
        # 40 rows at 16: batches of 16, 16 and a remainder of 8
        trained[matmul] = (layer.values.numpy(), layer.bias.numpy(), model.predict(x, batch_size=16, verbose=0))
    (v_native, b_native, p_native), (v_coo, b_coo, p_coo) = trained["native"], trained["coo"]
    assert not np.allclose(v_native, w[mask])  # it trained
    np.testing.assert_allclose(v_native, v_coo, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(b_native, b_coo, rtol=1e-4, atol=1e-5)
    w_final = np.zeros_like(w)
    w_final[mask] = v_native
    _check("predict", p_native, x.astype(np.float64) @ w_final + b_native, _bound(x, w_final) + 1e-6 * np.abs(b_native))


def _corrupt(rng: np.random.Generator, structure: np.ndarray) -> tuple[np.ndarray, str]:
    bad = structure.copy()
    pos = int(rng.integers(len(bad)))
    choice = int(rng.integers(4))
    value = [-1, 2**31 - 1, int(bad[pos]) + int(rng.integers(1, 50)), int(rng.integers(-(2**31), 2**31 - 1))][choice]
    bad[pos] = value
    return bad, f"structure[{pos}] = {value} (was {structure[pos]})"


def test_fuzz_every_op_with_random_shapes_batches_blocks_and_corrupt_structures():
    """Seeded: random shapes, batches, sparsities and block structures agree with the reference; a structure with one
    entry corrupted gives InvalidArgument or an output, never a crash (under ``make test-native-asan``, never a
    sanitizer report either)."""
    lib = native.load()
    rng = np.random.default_rng(2026_12_02)
    rejected = 0
    for case in range(120):
        n_in, n_out = int(rng.integers(1, 70)), int(rng.integers(1, 70))
        batch = int(rng.choice([0, 1, 2, 7, 8, 9, 15, 16, 17, 31, 32, 33, 64, int(rng.integers(1, 300))]))
        c = int(rng.choice([0, *native.BLOCK_WIDTHS])) if n_out >= 4 else 0
        density = float(rng.choice([0.0, 0.05, 0.3, 0.7, 1.0]))
        mask = _blocked_mask(rng, n_in, n_out, c, density) if c else rng.random((n_in, n_out)) < density
        idx = np.argwhere(mask).astype(np.int64)
        block = c if c and native.block_width(idx, n_out) >= 1 and native._is_blocked(idx, n_out, c) else 0
        w = np.zeros((n_in, n_out), np.float32)
        w[mask] = rng.standard_normal(len(idx)).astype(np.float32)
        structure = native.structure(idx, n_in, n_out, block=block)
        x = rng.standard_normal((batch, n_in)).astype(np.float32)
        dy = rng.standard_normal((batch, n_out)).astype(np.float32)
        at = f"case {case}: {n_in}x{n_out}, batch {batch}, block {block}, nnz {len(idx)}"
        y = lib.prune_spmm(x, w[mask], structure, n_in=n_in, n_out=n_out).numpy()
        _check(f"forward, {at}", y, x.astype(np.float64) @ w, _bound(x, w))
        dx = lib.prune_spmm(dy, w[mask], structure, n_in=n_in, n_out=n_out, transpose=True).numpy()
        _check(f"input gradient, {at}", dx, dy.astype(np.float64) @ w.T, _bound(dy, w.T))
        dv = lib.prune_sddmm(x, dy, w[mask], structure, n_in=n_in, n_out=n_out).numpy()
        _check(f"values gradient, {at}", dv, (x.T.astype(np.float64) @ dy)[mask], _bound(x.T, dy)[mask])
        if len(structure) == 0:
            continue
        for _ in range(3):
            bad, how = _corrupt(rng, structure)
            calls = (
                lambda: lib.prune_spmm(x, w[mask], bad, n_in=n_in, n_out=n_out),
                lambda: lib.prune_spmm(dy, w[mask], bad, n_in=n_in, n_out=n_out, transpose=True),
                lambda: lib.prune_sddmm(x, dy, w[mask], bad, n_in=n_in, n_out=n_out),
            )
            for call in calls:
                try:
                    call().numpy()
                except tf.errors.InvalidArgumentError as err:
                    rejected += 1
                    assert "structure" in str(err), (at, how, str(err))
    assert rejected > 100  # the corruptions were seen, not all absorbed
