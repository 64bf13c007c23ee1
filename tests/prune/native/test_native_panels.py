"""The panel section of the native structure and the forward kernel that reads it (issue 33).

``prune.native.structure`` appends, for a layer dense enough, W^T's entries ordered by panel of
``PANEL_WIDTH`` inputs, then by output; the forward op's large-batch path (more batch tiles than threads)
then adds each panel's entries while that panel's part of the transposed input tile is in L1. These tests
check the section's exact layout on a tiny weight, that the kernel matches a float64 dense product at
batches around the path's thresholds and on ragged panels, that every corrupt section is refused with
``InvalidArgument`` (never read out of bounds: ``make test-native-asan`` runs this file), and that a
``SparseDense`` layer carries the section and is not mistaken for a blocked one.
"""

import os
import re

import numpy as np
import pytest
import tensorflow as tf

from prune import native
from prune.layers.sparse import SparseDense

FORCED_OFF = os.environ.get("PRUNE_NATIVE", "1").strip() == "0"
needs_native = pytest.mark.skipif(FORCED_OFF, reason="PRUNE_NATIVE=0 forces the fallback")


def _base_len(nnz: int, n_in: int, n_out: int) -> int:
    return 3 * nnz + n_in + n_out + 2


def _panel_batch() -> int:
    """A batch that takes the panel path on this build and machine: more tiles of 4 vectors than threads."""
    lanes = int(re.search(r"\((\d+) lanes\)", native.status().vector).group(1))
    threads = tf.config.threading.get_intra_op_parallelism_threads() or len(os.sched_getaffinity(0))
    return threads * 4 * lanes + 3  # and a ragged last tile


def test_panel_section_of_a_tiny_weight_is_exact():
    # W is 5 x 3 with panels of 2 inputs: panels {0, 1}, {2, 3}, {4}
    mask = np.array([[1, 0, 1], [0, 1, 1], [1, 1, 0], [0, 0, 0], [0, 1, 1]], bool)
    idx = np.argwhere(mask)  # row-major: value k is entry idx[k]
    sec = native.panel_section(idx, 5, 3, width=2)
    assert list(sec[:3]) == [0x6C6E5031, 2, 3]
    starts = sec[3:3 + 3 * 3 + 1]
    # segments (panel, output): (0,0): (0,0) | (0,1): (1,1) | (0,2): (0,2), (1,2) | (1,0): (2,0) | (1,1): (2,1)
    # | (1,2): none | (2,0): none | (2,1): (4,1) | (2,2): (4,2)
    assert list(starts) == [0, 1, 2, 4, 5, 6, 6, 6, 7, 8]
    pcols, pperm = sec[13:21], sec[21:29]
    assert list(pcols) == [0, 1, 0, 1, 2, 2, 4, 4]
    # positions in row-major values: (0,0)=0 (0,2)=1 (1,1)=2 (1,2)=3 (2,0)=4 (2,1)=5 (4,1)=6 (4,2)=7
    assert list(pperm) == [0, 2, 1, 3, 4, 5, 6, 7]
    assert len(sec) == 3 + 10 + 2 * 8


def test_structure_adds_panels_by_the_rule_and_on_request():
    rng = np.random.default_rng(0)
    dense = np.argwhere(rng.random((300, 40)) < 0.3)  # 3 panels, ~90 entries per output: 30 per segment
    sparse = np.argwhere(rng.random((300, 40)) < 0.02)  # ~2 per segment: below PANEL_MIN_SEGMENT
    narrow = np.argwhere(rng.random((100, 40)) < 0.9)  # one panel: nothing to order
    for idx, n_in, want in ((dense, 300, True), (sparse, 300, False), (narrow, 100, False)):
        st = native.structure(idx, n_in, 40)
        has = len(st) > _base_len(len(idx), n_in, 40)
        assert has == want == native.panels_pay(len(idx), n_in, 40)
        assert not native.has_block_section(len(st), len(idx), n_in, 40)
    assert len(native.structure(sparse, 300, 40, panels=True)) > _base_len(len(sparse), 300, 40)
    assert len(native.structure(dense, 300, 40, panels=False)) == _base_len(len(dense), 300, 40)


def test_a_blocked_structure_with_panels_is_still_told_blocked():
    rng = np.random.default_rng(1)
    tiles = rng.random((300, 4)) < 0.6
    mask = np.repeat(tiles, 8, axis=1)  # whole 1 x 8 tiles, 3 panels, dense enough for panels
    idx = np.argwhere(mask)
    st = native.structure(idx, 300, 32)
    assert native.panels_pay(len(idx), 300, 32)
    assert native.has_block_section(len(st), len(idx), 300, 32)
    assert not native.has_block_section(len(native.structure(idx, 300, 32, block=0)), len(idx), 300, 32)


def _product(lib, x, vals, st, n_in, n_out, graph=False):
    def f(x):
        return lib.prune_spmm(x, vals, st, n_in=n_in, n_out=n_out)

    return (tf.function(f) if graph else f)(tf.constant(x)).numpy()


@needs_native
# (256, 1100): more outputs than one chunk of accumulators holds on 16-lane builds (1024 rows of 64 floats)
@pytest.mark.parametrize("n_in, n_out, density", [(300, 100, 0.5), (517, 61, 0.2), (1024, 96, 0.1), (256, 1100, 0.1)])
def test_panel_kernel_matches_the_dense_product(n_in, n_out, density):
    lib = native.load()
    assert lib is not None, native.status().reason
    rng = np.random.default_rng(n_in)
    mask = rng.random((n_in, n_out)) < density
    mask[:, 5] = False  # an output with no entry in any panel
    mask[128:256, 7] = False  # an output with no entry in the second panel
    idx = np.argwhere(mask)
    w = np.zeros((n_in, n_out), np.float32)
    w[mask] = rng.standard_normal(int(mask.sum())).astype(np.float32)
    vals = w[mask]
    st = native.structure(idx, n_in, n_out, panels=True)
    plain = native.structure(idx, n_in, n_out, panels=False)
    # batches around the panel path's threshold (more tiles of up to 4 vectors than threads) at every width
    pb = _panel_batch()
    for batch in (1, 33, 65, 127, 129, 200, 257, pb - 4, pb, 2 * pb + 7):
        x = rng.standard_normal((batch, n_in)).astype(np.float32)
        want = x.astype(np.float64) @ w.astype(np.float64)
        bound = 1e-5 * (np.abs(x) @ np.abs(w)) + 1e-30
        for graph in (False, True):
            got = _product(lib, x, vals, st, n_in, n_out, graph)
            assert np.all(np.abs(got - want) <= bound), (batch, graph, np.abs(got - want).max())
        np.testing.assert_allclose(_product(lib, x, vals, plain, n_in, n_out), want, rtol=0, atol=float(bound.max()))
    # the panel kernel ran at batch pb: there the op reads the section, so a bad panel column is refused
    bad = st.copy()
    bad[_base_len(len(idx), n_in, n_out) + 3 + int(st[_base_len(len(idx), n_in, n_out) + 2]) * n_out + 1] = n_in
    with pytest.raises(tf.errors.InvalidArgumentError, match="panel section"):
        _product(lib, np.ones((pb, n_in), np.float32), vals, bad, n_in, n_out)


def _corrupt(st: np.ndarray, nnz: int, n_in: int, n_out: int):
    base = _base_len(nnz, n_in, n_out)
    count = int(st[base + 2])
    starts = base + 3
    pcols = starts + count * n_out + 1
    pperm = pcols + nnz
    yield "bad magic", lambda s: s.__setitem__(base, 7), "malformed section"
    yield "panel count", lambda s: s.__setitem__(base + 2, count + 1), "malformed panel section"
    yield "width 0", lambda s: s.__setitem__(base + 1, 0), "malformed panel section"
    yield "starts do not span", lambda s: s.__setitem__(pcols - 1, nnz - 1), "do not span"
    yield "starts decrease", lambda s: s.__setitem__(starts + 3, -1), "decrease"
    yield "column out of range", lambda s: s.__setitem__(pcols + nnz // 2, n_in), "out-of-range"
    yield "negative column", lambda s: s.__setitem__(pcols + 1, -5), "out-of-range"
    yield "permutation out of range", lambda s: s.__setitem__(pperm + nnz - 1, nnz), "out-of-range"
    yield "cut short", None, "cut short"


@needs_native
def test_a_corrupt_panel_section_is_refused():
    lib = native.load()
    rng = np.random.default_rng(3)
    n_in, n_out = 300, 40
    mask = rng.random((n_in, n_out)) < 0.3
    idx = np.argwhere(mask)
    nnz = len(idx)
    vals = np.ones(nnz, np.float32)
    good = native.structure(idx, n_in, n_out)
    assert len(good) > _base_len(nnz, n_in, n_out)
    x = np.ones((_panel_batch(), n_in), np.float32)
    for what, change, message in _corrupt(good, nnz, n_in, n_out):
        bad = good.copy()
        if change is None:
            bad = bad[:-1]
        else:
            change(bad)
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            lib.prune_spmm(x, vals, bad, n_in=n_in, n_out=n_out).numpy()
    # the section is read on the panel path only: at batch 1 a bad panel column is never touched
    bad = good.copy()
    bad[_base_len(nnz, n_in, n_out) + 3 + int(good[_base_len(nnz, n_in, n_out) + 2]) * n_out + 1] = n_in
    y = lib.prune_spmm(np.ones((1, n_in), np.float32), vals, bad, n_in=n_in, n_out=n_out).numpy()
    np.testing.assert_allclose(y[0], mask.sum(0), rtol=1e-6)


@needs_native
def test_sparse_dense_carries_panels_and_matches_its_dense_kernel():
    rng = np.random.default_rng(4)
    w = rng.standard_normal((384, 64)).astype(np.float32)
    mask = rng.random((384, 64)) < 0.25
    layer = SparseDense.from_dense(w * mask, mask, matmul="native")
    x = rng.standard_normal((300, 384)).astype(np.float32)
    y = layer(x).numpy()
    n = layer.nnz
    assert layer.native_structure.shape[0] > _base_len(n, 384, 64) and not layer._blocked()
    want = x.astype(np.float64) @ (w * mask).astype(np.float64) + layer.bias.numpy()
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-4)
