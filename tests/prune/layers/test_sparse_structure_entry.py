"""SparseDense state from outside (issue 31): set_weights, loading and from_sparse check the entries where they enter.

``values`` and ``indices`` are validated (integer, in range, row-major sorted
and unique, lengths that agree) before any variable changes, and the derived
arrays (``transpose_perm``, ``transpose_indices``, ``native_structure``) are
always recomputed, never taken from the caller or the file: the CSR and native
kernels read them and trust them.

Batch 8 is avoided: the native library has a known crash there on AVX-512
machines, being fixed separately.
"""

import io
import re
import zipfile

import h5py
import keras
import numpy as np
import pytest
import tensorflow as tf

from prune import native
from prune.layers import kernels
from prune.layers import sparse as sparse_module
from prune.layers.sparse import SparseDense

N_IN, N_OUT = 5, 4
# Row-major sorted and unique; each bad case below edits one entry of a copy.
INDICES = np.array([[0, 1], [1, 0], [1, 3], [2, 2], [4, 0]], np.int64)
VALUES = np.array([1.0, -2.0, 3.0, -4.0, 5.0], np.float32)
BIAS = np.array([0.5, -0.5, 0.25, 0.0], np.float32)
# Another valid state of the same length, so that "unchanged" tells a rejected call from a partial one.
OTHER_INDICES = np.array([[0, 0], [0, 3], [2, 1], [3, 2], [4, 3]], np.int64)
OTHER_VALUES = np.array([10.0, 20.0, 30.0, 40.0, 50.0], np.float32)
MATMULS = ["native", "csr", "coo", "dense", "auto"]
BATCHES = [1, 3, 5, 17]


def _layer(matmul="auto", **kwargs):
    return SparseDense.from_sparse(INDICES, VALUES, (N_IN, N_OUT), matmul=matmul, bias=BIAS, name="sd", **kwargs)


def _named(layer):
    return {v.name: np.array(w) for v, w in zip(layer.weights, layer.get_weights())}


def _assert_same_weights(layer, before):
    after = _named(layer)
    assert list(after) == list(before)
    for name in before:
        np.testing.assert_array_equal(after[name], before[name], err_msg=name)


def _dense(indices, values, shape=(N_IN, N_OUT)):
    w = np.zeros(shape, np.float64)
    w[indices[:, 0], indices[:, 1]] = values
    return w


def _other_state(layer, **changes):
    """get_weights()-ordered arrays of OTHER_* (a different valid state), with ``changes`` by weight name."""
    arrays = _named(layer)
    arrays.update(values=OTHER_VALUES, indices=OTHER_INDICES, bias=BIAS + 1.0, pruning_step=np.int64(7))
    arrays.update(changes)
    return [arrays[v.name] for v in layer.weights]


def _swap(a, i, j):
    a = np.array(a)
    a[[i, j]] = a[[j, i]]
    return a


def _with(a, k, entry):
    a = np.array(a)
    a[k] = entry
    return a


# -- the helper: check_structure(require_sorted=True) ------------------------------------------------------------------


def test_check_structure_require_sorted_rejects_what_the_default_sorts():
    idx, vals = kernels.check_structure(_swap(INDICES, 0, 1), _swap(VALUES, 0, 1), (N_IN, N_OUT))
    np.testing.assert_array_equal(idx, INDICES)
    np.testing.assert_array_equal(vals, VALUES)
    with pytest.raises(ValueError, match=r"^indices entry \[0, 1\] \(position 1\) follows \[1, 0\] \(position 0\)"):
        kernels.check_structure(_swap(INDICES, 0, 1), _swap(VALUES, 0, 1), (N_IN, N_OUT), require_sorted=True)
    idx, vals = kernels.check_structure(INDICES, VALUES, (N_IN, N_OUT), require_sorted=True)
    np.testing.assert_array_equal(idx, INDICES)
    assert idx.dtype == np.int64


@pytest.mark.parametrize(
    "indices, values, match",
    [
        (_with(INDICES, 2, [1, 0]), VALUES, r"^w has duplicate entry \[1, 0\] \(positions 1 and 2\)$"),
        (_with(INDICES, 4, [5, 0]), VALUES, r"^w entry \[5, 0\] is out of range for dense_shape \(5, 4\), at position 4$"),
        (_with(INDICES, 3, [2, -1]), VALUES, r"^w entry \[2, -1\] is out of range for dense_shape \(5, 4\), at position 3"),
        (INDICES.astype(np.float64), VALUES, r"^w must be integers, got dtype float64$"),
        (INDICES, VALUES[:4], r"^v must have shape \[nnz\] matching w: w has 5 entries, v has shape \(4,\)$"),
        (INDICES, VALUES.astype(str), r"^v must be real numbers, got dtype <U"),
        (INDICES.astype(np.uint64) + np.uint64(2**63), VALUES, r"^w entry \[9223372036854775808, "),  # no int64 wrap
    ],
)
def test_check_structure_names_the_first_bad_entry(indices, values, match):
    for require_sorted in (False, True):
        with pytest.raises(ValueError, match=match):
            kernels.check_structure(indices, values, (N_IN, N_OUT), name="w", values_name="v", require_sorted=require_sorted)


# -- set_weights -------------------------------------------------------------------------------------------------------


def test_set_weights_rejects_permuted_entries_and_leaves_the_layer_unchanged():
    layer = _layer("csr")
    before = _named(layer)
    weights = _other_state(layer, values=_swap(OTHER_VALUES, 1, 3), indices=_swap(OTHER_INDICES, 1, 3))
    with pytest.raises(
        ValueError,
        match=r"^set_weights on SparseDense layer 'sd': weights\[2\] \('indices'\) entry \[2, 1\] \(position 2\) "
        r"follows \[3, 2\] \(position 1\), which is later in row-major order",
    ):
        layer.set_weights(weights)
    _assert_same_weights(layer, before)
    x = np.arange(3 * N_IN, dtype=np.float32).reshape(3, N_IN) / 7
    np.testing.assert_allclose(layer(x).numpy(), x @ _dense(INDICES, VALUES) + BIAS, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"indices": _with(OTHER_INDICES, 2, [0, 3])}, r"weights\[2\] \('indices'\) has duplicate entry \[0, 3\] \(positions 1 and 2\)"),
        ({"indices": _with(OTHER_INDICES, 4, [5, 3])}, r"weights\[2\] \('indices'\) entry \[5, 3\] is out of range for dense_shape \(5, 4\), at position 4"),
        ({"indices": _with(OTHER_INDICES, 4, [4, 4])}, r"weights\[2\] \('indices'\) entry \[4, 4\] is out of range for dense_shape \(5, 4\), at position 4"),
        ({"indices": _with(OTHER_INDICES, 0, [-1, 0])}, r"weights\[2\] \('indices'\) entry \[-1, 0\] is out of range for dense_shape \(5, 4\), at position 0"),
        ({"indices": OTHER_INDICES.astype(np.float32)}, r"weights\[2\] \('indices'\) must be integers, got dtype float32"),
        ({"values": OTHER_VALUES[:4]}, r"weights\[0\] \('values'\) has shape \(4,\), expected \(5,\) \(the layer holds 5 entries\)"),
        ({"indices": OTHER_INDICES[:4]}, r"weights\[2\] \('indices'\) has shape \(4, 2\), expected \(5, 2\)"),
        ({"bias": np.zeros(3, np.float32)}, r"weights\[1\] \('bias'\) has shape \(3,\), expected \(4,\)"),
        ({"transpose_perm": np.zeros(6, np.int64)}, r"weights\[3\] \('transpose_perm'\) has shape \(6,\), expected \(5,\)"),
        ({"transpose_indices": np.zeros((5, 3), np.int64)}, r"weights\[4\] \('transpose_indices'\) has shape \(5, 3\), expected \(5, 2\)"),
        ({"native_structure": np.zeros((2, 3), np.int32)}, r"weights\[6\] \('native_structure'\) must be 1-D, got shape \(2, 3\)"),
        ({"values": OTHER_VALUES.astype(str)}, r"weights\[0\] \('values'\) must be real numbers"),
        ({"pruning_step": np.float64(7.5)}, r"weights\[5\] \('pruning_step'\) must be integers, got dtype float64"),
    ],
    ids=["duplicate", "row_out_of_range", "col_out_of_range", "negative", "float_indices", "short_values",
         "short_indices", "bias_shape", "transpose_perm_length", "transpose_indices_shape", "native_structure_rank",
         "string_values", "float_step"],
)
def test_set_weights_rejects_bad_state_before_changing_anything(changes, match):
    layer = _layer("csr")
    before = _named(layer)
    weights = _other_state(layer, **changes)
    with pytest.raises(ValueError, match=r"^set_weights on SparseDense layer 'sd': " + match):
        layer.set_weights(weights)
    _assert_same_weights(layer, before)


def test_set_weights_wrong_number_of_arrays():
    layer = _layer()
    before = _named(layer)
    with pytest.raises(ValueError, match=r"^set_weights on SparseDense layer 'sd': expected 7 arrays \(values, bias, indices"):
        layer.set_weights(_other_state(layer)[:-1])
    _assert_same_weights(layer, before)


def _blocked_entries():
    """Whole 1 x 4 tiles (rows 0, 2, 3 of an 8-wide output), so that native_structure gets a block section."""
    cols = np.arange(4)
    idx = np.concatenate([np.stack([np.full(4, r), cols + off], 1) for r, off in ((0, 0), (2, 4), (3, 0))])
    return idx.astype(np.int64), np.linspace(-3, 3, len(idx)).astype(np.float32)


@pytest.mark.parametrize("garbage", ["stale", "random"])
@pytest.mark.parametrize("structure", ["unstructured", "blocked"])
@pytest.mark.parametrize("matmul", MATMULS)
def test_valid_set_weights_recomputes_garbage_derived_arrays_every_kernel_agrees(matmul, structure, garbage):
    rng = np.random.default_rng(3)
    if structure == "blocked":
        n_out = 8
        new_idx, new_vals = _blocked_entries()
        flat = np.array([0, 2, 5, 7, 9, 12, 14, 17, 20, 23, 30, 38])  # no whole 1 x 4 tile
        layer = SparseDense.from_sparse(np.stack([flat // 8, flat % 8], 1), np.ones(12), (N_IN, n_out), matmul=matmul, name="sd")
        assert not layer._blocked()
    else:
        n_out = N_OUT
        new_idx, new_vals = OTHER_INDICES, OTHER_VALUES
        layer = _layer(matmul)
    bias = np.linspace(-1, 1, n_out).astype(np.float32)
    nnz = len(new_idx)
    given = _named(layer)  # "stale": the derived arrays of the layer's current entries, consistent but not with the new
    if garbage == "random":  # right lengths (native_structure: any), contents out of range
        given["transpose_perm"] = rng.integers(-(10**6), 10**6, nnz)
        given["transpose_indices"] = rng.integers(-(10**6), 10**6, (nnz, 2))
        given["native_structure"] = rng.integers(-(10**6), 10**6, 11).astype(np.int32)
    given.update(values=new_vals, indices=new_idx, bias=bias, pruning_step=np.int64(3))
    layer.set_weights([given[v.name] for v in layer.weights])

    w = _dense(new_idx, new_vals, (N_IN, n_out))
    for batch in BATCHES:
        x = rng.standard_normal((batch, N_IN)).astype(np.float32)
        np.testing.assert_allclose(layer(x).numpy(), x.astype(np.float64) @ w + bias, rtol=1e-5, atol=1e-5)
    # the gradients read the structure too (CSR of W, the native W^T permutation)
    x = tf.constant(rng.standard_normal((3, N_IN)).astype(np.float32))
    g = rng.standard_normal((3, n_out)).astype(np.float32)
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = tf.reduce_sum(layer(x) * g)
    g_vals, g_x = tape.gradient(loss, [layer.values, x])
    full = x.numpy().astype(np.float64).T @ g
    np.testing.assert_allclose(g_vals.numpy(), full[new_idx[:, 0], new_idx[:, 1]], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(g_x.numpy(), g @ w.T, rtol=1e-5, atol=1e-5)

    perm, t_idx = kernels.transpose_structure(new_idx, (N_IN, n_out))
    np.testing.assert_array_equal(layer.indices.numpy(), new_idx)
    np.testing.assert_array_equal(layer.transpose_perm.numpy(), perm)
    np.testing.assert_array_equal(layer.transpose_indices.numpy(), t_idx)
    np.testing.assert_array_equal(layer.native_structure.numpy(), native.structure(new_idx, N_IN, n_out))
    assert layer._blocked() == (structure == "blocked")
    assert int(layer.pruning_step.numpy()) == 3


# -- from_sparse / from_dense --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: SparseDense.from_sparse(_with(INDICES, 2, [1, 0]), VALUES, (N_IN, N_OUT)), r"^indices has duplicate entry \[1, 0\] \(positions 1 and 2\)$"),
        (lambda: SparseDense.from_sparse(_with(INDICES, 1, [5, 0]), VALUES, (N_IN, N_OUT)), r"^indices entry \[5, 0\] is out of range for dense_shape \(5, 4\), at position 1"),
        (lambda: SparseDense.from_sparse(_with(INDICES, 1, [1, -2]), VALUES, (N_IN, N_OUT)), r"^indices entry \[1, -2\] is out of range for dense_shape \(5, 4\), at position 1"),
        (lambda: SparseDense.from_sparse(INDICES, VALUES[:3], (N_IN, N_OUT)), r"^values must have shape \[nnz\] matching indices: indices has 5 entries"),
        (lambda: SparseDense.from_sparse(INDICES, VALUES, (N_IN, N_OUT), bias=np.zeros(5)), r"^bias must have shape \(4,\), got shape \(5,\)$"),
        (lambda: SparseDense.from_sparse(INDICES, VALUES, (N_IN, N_OUT), bias=BIAS, use_bias=False), r"^bias was given but use_bias=False$"),
        (lambda: SparseDense.from_dense(np.full((2, 2), "a"), np.ones((2, 2))), r"^values must be real numbers"),
    ],
    ids=["duplicate", "out_of_range", "negative", "short_values", "bias_shape", "bias_without_use_bias", "string_weights"],
)
def test_construction_rejects_bad_entries(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_from_sparse_still_sorts_unsorted_input():
    order = [4, 2, 0, 3, 1]
    layer = SparseDense.from_sparse(INDICES[order], VALUES[order], (N_IN, N_OUT), bias=BIAS, matmul="csr")
    np.testing.assert_array_equal(layer.indices.numpy(), INDICES)
    np.testing.assert_array_equal(layer.values.numpy(), VALUES)
    x = np.eye(N_IN, dtype=np.float32)
    np.testing.assert_allclose(layer(x).numpy(), _dense(INDICES, VALUES) + BIAS, rtol=1e-6)


# -- loading a .keras / .weights.h5 file --------------------------------------------------------------------------------
# Files in Keras's own format of every variable (keys "0".."6"), as versions before the compact store wrote them:
# the ``old_format`` fixture saves that way. The compact store's own checks are further below.


@pytest.fixture
def old_format(monkeypatch):
    monkeypatch.setattr(SparseDense, "save_own_variables", keras.layers.Layer.save_own_variables)


def _model(matmul="auto"):
    return keras.Sequential([keras.Input((N_IN,)), _layer(matmul)])


def _edit_vars(h5file, edit, keys=tuple(str(i) for i in range(7))):
    """Apply ``edit`` to the layer's stored arrays (by key), rewriting the group; ``keys``: the ones expected."""
    group = h5file["layers/sparse_dense/vars"]
    if keys is not None:
        assert [k for k in group] == list(keys)
    stored = {k: group[k][()] for k in group}
    edit(stored)
    for k in list(group):
        del group[k]
    for k, v in stored.items():
        group[k] = v


def _tampered_keras(tmp_path, edit, matmul="auto", keys=tuple(str(i) for i in range(7))):
    src, dst = tmp_path / "model.keras", tmp_path / "tampered.keras"
    _model(matmul).save(src)
    with zipfile.ZipFile(src) as z:
        members = {n: z.read(n) for n in z.namelist()}
    buf = io.BytesIO(members["model.weights.h5"])
    with h5py.File(buf, "r+") as f:
        _edit_vars(f, edit, keys)
    members["model.weights.h5"] = buf.getvalue()
    with zipfile.ZipFile(dst, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return dst


# stored keys: 0 values, 1 bias, 2 indices, 3 transpose_perm, 4 transpose_indices, 5 pruning_step, 6 native_structure
def _reorder(s):
    s["0"], s["2"] = _swap(s["0"], 2, 3), _swap(s["2"], 2, 3)


def _duplicate(s):
    s["2"] = _with(s["2"], 3, [1, 3])


def _out_of_range(s):
    s["2"] = _with(s["2"], 4, [4, 4])


def _negative(s):
    s["2"] = _with(s["2"], 0, [0, -1])


def _short_transpose(s):
    s["3"] = s["3"][:4]


def _short_values(s):
    s["0"] = s["0"][:4]


LOAD_ERRORS = {
    "reorder": (_reorder, r"weight 'indices' \(stored as '2'\) entry \[1, 3\] \(position 3\) follows \[2, 2\] \(position 2\)"),
    "duplicate": (_duplicate, r"weight 'indices' \(stored as '2'\) has duplicate entry \[1, 3\] \(positions 2 and 3\)"),
    "out_of_range": (_out_of_range, r"weight 'indices' \(stored as '2'\) entry \[4, 4\] is out of range for dense_shape \(5, 4\), at position 4"),
    "negative": (_negative, r"weight 'indices' \(stored as '2'\) entry \[0, -1\] is out of range for dense_shape \(5, 4\), at position 0"),
    "transpose_length": (_short_transpose, r"weight 'transpose_perm' \(stored as '3'\) has shape \(4,\), expected \(5,\)"),
    "values_length": (_short_values, r"weight 'values' \(stored as '0'\) must have shape \[nnz\] matching weight 'indices'"),
}


@pytest.mark.parametrize("case", sorted(LOAD_ERRORS))
@pytest.mark.usefixtures("old_format")
def test_loading_a_tampered_keras_file_is_refused(tmp_path, case):
    edit, match = LOAD_ERRORS[case]
    path = _tampered_keras(tmp_path, edit, matmul="csr")
    with pytest.raises(ValueError, match=r"loading SparseDense layer 'sd'[^\n]*: " + match):
        keras.models.load_model(path)


@pytest.mark.usefixtures("old_format")
def test_loading_a_tampered_weights_file_names_it_and_changes_nothing(tmp_path):
    path = tmp_path / "w.weights.h5"
    _model().save_weights(path)
    with h5py.File(path, "r+") as f:
        _edit_vars(f, _reorder)
    target = keras.Sequential([keras.Input((N_IN,)), SparseDense.from_sparse(OTHER_INDICES, OTHER_VALUES, (N_IN, N_OUT), name="sd")])
    before = _named(target.layers[0])
    with pytest.raises(ValueError, match=rf"loading SparseDense layer 'sd' from '{re.escape(str(path))}': weight 'indices' \(stored as '2'\) entry \[1, 3\]"):
        target.load_weights(path)
    _assert_same_weights(target.layers[0], before)


@pytest.mark.parametrize("matmul", MATMULS)
@pytest.mark.usefixtures("old_format")
def test_loading_ignores_stored_derived_arrays(tmp_path, matmul):
    rng = np.random.default_rng(5)

    def garble(s):
        s["3"] = rng.integers(-(10**6), 10**6, 5)  # transpose_perm
        s["4"] = rng.integers(-(10**6), 10**6, (5, 2))  # transpose_indices
        s["6"] = rng.integers(-(10**6), 10**6, 9).astype(np.int32)  # native_structure, another length

    layer = keras.models.load_model(_tampered_keras(tmp_path, garble, matmul)).layers[0]
    perm, t_idx = kernels.transpose_structure(INDICES, (N_IN, N_OUT))
    np.testing.assert_array_equal(layer.transpose_perm.numpy(), perm)
    np.testing.assert_array_equal(layer.transpose_indices.numpy(), t_idx)
    np.testing.assert_array_equal(layer.native_structure.numpy(), native.structure(INDICES, N_IN, N_OUT))
    for batch in BATCHES:
        x = rng.standard_normal((batch, N_IN)).astype(np.float32)
        np.testing.assert_allclose(layer(x).numpy(), x.astype(np.float64) @ _dense(INDICES, VALUES) + BIAS, rtol=1e-5, atol=1e-5)


@pytest.mark.usefixtures("old_format")
def test_loading_a_file_without_native_structure_still_works(tmp_path):
    path = tmp_path / "old.weights.h5"
    _model().save_weights(path)
    with h5py.File(path, "r+") as f:
        group = f["layers/sparse_dense/vars"]
        del group["6"]
    target = keras.Sequential([keras.Input((N_IN,)), SparseDense.from_sparse(OTHER_INDICES, OTHER_VALUES, (N_IN, N_OUT), name="sd")])
    target.load_weights(path)
    np.testing.assert_array_equal(target.layers[0].native_structure.numpy(), native.structure(INDICES, N_IN, N_OUT))
    np.testing.assert_array_equal(target.layers[0].to_dense(), _dense(INDICES, VALUES).astype(np.float32))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_low_precision_weights_pass_the_checks(tmp_path, dtype):
    # Keras loads bfloat16 weights as ml_dtypes.bfloat16, which NumPy files under "void": still real numbers.
    layer = SparseDense.from_sparse(INDICES, VALUES, (N_IN, N_OUT), matmul="dense", bias=BIAS, dtype=dtype, name="sd")
    model = keras.Sequential([keras.Input((N_IN,)), layer])
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras").layers[0]
    loaded.set_weights(loaded.get_weights())
    assert str(loaded.values.dtype) == dtype
    np.testing.assert_array_equal(loaded.indices.numpy(), INDICES)
    np.testing.assert_array_equal(np.asarray(loaded.values.numpy(), np.float32), VALUES)


# -- the compact store (values, CSR row pointers, int32 columns) ----------------------------------------------------------


def _set(key, value):
    def edit(s):
        s[key] = np.asarray(value, dtype=s[key].dtype if key in s else None)
    return edit


@pytest.fixture
def csr_format(monkeypatch):
    """Saves write the CSR store (format 2), which a 5 x 4 layer, smaller as a bitmap, would not otherwise get."""
    monkeypatch.setattr(sparse_module, "store_format", lambda n_in, n_out, nnz: sparse_module.STORE_FORMAT)


def _compact_keras(tmp_path, edit):
    """A .keras file in the compact format with ``edit`` applied to the layer's stored arrays."""
    return _tampered_keras(tmp_path, edit, matmul="csr", keys=None)


@pytest.mark.parametrize("n_in, n_out, nnz, expected", [
    (5, 4, 5, 3),  # bitmap 3 bytes, CSR 44
    (1024, 1024, 512 * 1024, 3),  # 2:4: bitmap 131,072 bytes, CSR 2,101,252
    (1024, 1024, 31_742, 2),  # CSR 4 * (1025 + 31,742) = 131,068 bytes, under the bitmap's 131,072
    (1024, 1024, 31_743, 2),  # CSR 131,072: a tie keeps CSR
    (1024, 1024, 31_744, 3),  # CSR 131,076
])
def test_the_store_format_is_the_smaller_one(n_in, n_out, nnz, expected):
    assert sparse_module.store_format(n_in, n_out, nnz) == expected


def test_the_bitmap_store_holds_values_and_the_packed_mask(tmp_path):
    seen = {}
    _compact_keras(tmp_path, seen.update)
    assert sorted(seen) == ["bias", "format", "mask_bits", "pruning_step", "values"]
    np.testing.assert_array_equal(seen["format"], [3])
    # the 5 x 4 mask row-major: cells 1, 4, 7, 10, 16 -> bits 0100 1001 0010 0000 1000 (then 4 zero bits)
    np.testing.assert_array_equal(seen["mask_bits"], [0b01001001, 0b00100000, 0b10000000])
    assert seen["mask_bits"].dtype == np.uint8
    loaded = keras.models.load_model(tmp_path / "model.keras").layers[0]
    np.testing.assert_array_equal(loaded.indices.numpy(), INDICES)
    np.testing.assert_array_equal(loaded.values.numpy(), VALUES)
    np.testing.assert_array_equal(loaded.native_structure.numpy(), native.structure(INDICES, N_IN, N_OUT))


def test_a_2_to_4_layer_file_holds_its_values_and_2_bits_of_structure_per_entry(tmp_path):
    rng = np.random.default_rng(1)
    w = rng.standard_normal((512, 256)).astype(np.float32)
    keep = np.zeros((128, 4, 256), bool)  # 2 of every 4 consecutive inputs of each output
    order = np.argsort(rng.random((128, 4, 256)), axis=1)
    np.put_along_axis(keep, order[:, :2], True, axis=1)
    layer = SparseDense.from_dense(w, keep.reshape(512, 256))
    model = keras.Sequential([keras.Input((512,)), layer])
    model.save(tmp_path / "m.keras")
    with zipfile.ZipFile(tmp_path / "m.keras") as z, h5py.File(io.BytesIO(z.read("model.weights.h5"))) as f:
        group = f["layers/sparse_dense/vars"]
        assert group["mask_bits"].size == 512 * 256 // 8 and group["values"].size == layer.nnz == 512 * 128
    x = rng.standard_normal((3, 512)).astype(np.float32)
    np.testing.assert_array_equal(keras.models.load_model(tmp_path / "m.keras")(x).numpy(), model(x).numpy())


BITMAP_ERRORS = {
    "short": (_set("mask_bits", [0b01001001, 0b00100000]), r"weight 'mask_bits' has 2 bytes, expected ceil\(n_in \* n_out / 8\) = 3 for dense_shape \(5, 4\)"),
    "bits_past_the_end": (_set("mask_bits", [0b01001001, 0b00100000, 0b10000001]), r"weight 'mask_bits' sets bits past the 20 cells of dense_shape \(5, 4\) \(in its last byte, 129\)"),
    "not_bytes": (lambda s: s.update(mask_bits=s["mask_bits"].astype(np.int32)), r"weight 'mask_bits' must be a 1-D uint8 array, got shape \(3,\), dtype int32"),
    "one_entry_more": (_set("mask_bits", [0b11001001, 0b00100000, 0b10000000]), r"weight 'values' \(stored as 'values'\) must have shape \[nnz\] matching weight 'indices' \(stored as 'mask_bits'\): weight 'indices' \(stored as 'mask_bits'\) has 6 entries"),
    "with_row_pointers": (lambda s: s.update(row_ptr=np.zeros(6, np.int32)), r"the store has keys \['bias', 'format', 'mask_bits', 'pruning_step', 'row_ptr', 'values'\], expected \['bias', 'format', 'mask_bits', 'pruning_step', 'values'\]"),
}


@pytest.mark.parametrize("case", sorted(BITMAP_ERRORS))
def test_a_tampered_bitmap_file_is_refused_naming_the_stored_array(tmp_path, case):
    edit, match = BITMAP_ERRORS[case]
    with pytest.raises(ValueError, match=r"loading SparseDense layer 'sd'[^\n]*: " + match):
        keras.models.load_model(_compact_keras(tmp_path, edit))


@pytest.mark.usefixtures("csr_format")
def test_the_compact_store_holds_values_row_pointers_and_int32_columns(tmp_path):
    seen = {}
    _compact_keras(tmp_path, seen.update)
    assert sorted(seen) == ["bias", "cols", "format", "pruning_step", "row_ptr", "values"]
    np.testing.assert_array_equal(seen["row_ptr"], [0, 1, 3, 4, 4, 5])  # rows 0, 1, 1, 2, 4
    np.testing.assert_array_equal(seen["cols"], INDICES[:, 1])
    assert seen["row_ptr"].dtype == seen["cols"].dtype == np.int32 and seen["values"].dtype == np.float32
    np.testing.assert_array_equal(seen["format"], [2])
    loaded = keras.models.load_model(tmp_path / "model.keras").layers[0]
    np.testing.assert_array_equal(loaded.indices.numpy(), INDICES)
    np.testing.assert_array_equal(loaded.values.numpy(), VALUES)
    np.testing.assert_array_equal(loaded.native_structure.numpy(), native.structure(INDICES, N_IN, N_OUT))


def test_a_90_percent_layer_file_is_at_most_9_bytes_per_entry_and_a_quarter_of_dense(tmp_path):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((512, 512)).astype(np.float32)
    mask = np.zeros(w.size, bool)
    mask[rng.permutation(w.size)[: w.size // 10]] = True
    mask = mask.reshape(w.shape)
    sparse = keras.Sequential([keras.Input((512,)), SparseDense.from_dense(w, mask)])
    dense = keras.Sequential([keras.Input((512,)), keras.layers.Dense(512)])
    sparse.save(tmp_path / "s.keras")
    dense.save(tmp_path / "d.keras")
    size_s, size_d = (tmp_path / "s.keras").stat().st_size, (tmp_path / "d.keras").stat().st_size
    assert size_s / int(mask.sum()) <= 9.0
    assert size_s <= 0.25 * size_d
    x = rng.standard_normal((3, 512)).astype(np.float32)
    np.testing.assert_array_equal(keras.models.load_model(tmp_path / "s.keras")(x).numpy(), sparse(x).numpy())


COMPACT_ERRORS = {
    "row_ptr_falls": (_set("row_ptr", [0, 3, 1, 4, 4, 5]), r"weight 'row_ptr' must rise from 0 to len\(cols\) = 5; row_ptr\[2\] = 1 after row_ptr\[1\] = 3"),
    "row_ptr_short": (_set("row_ptr", [0, 1, 3, 5]), r"weight 'row_ptr' has 4 entries, expected n_in \+ 1 = 6"),
    "row_ptr_end": (_set("row_ptr", [0, 1, 3, 4, 4, 4]), r"weight 'row_ptr' must rise from 0 to len\(cols\) = 5; row_ptr\[5\] = 4"),
    "cols_unsorted": (_set("cols", [1, 3, 0, 2, 0]), r"weight 'indices' \(stored as 'row_ptr' and 'cols'\) entry \[1, 0\] \(position 2\) follows \[1, 3\] \(position 1\)"),
    "cols_out_of_range": (_set("cols", [1, 0, 4, 2, 0]), r"weight 'indices' \(stored as 'row_ptr' and 'cols'\) entry \[1, 4\] is out of range for dense_shape \(5, 4\), at position 2"),
    "values_short": (lambda s: s.update(values=s["values"][:4]), r"weight 'values' \(stored as 'values'\) must have shape \[nnz\] matching weight 'indices'"),
    "format": (_set("format", [4]), r"stored 'format' is \[4\], this version reads formats 2 and 3"),
    "missing_bias": (lambda s: s.pop("bias"), r"the store has keys \['cols', 'format', 'pruning_step', 'row_ptr', 'values'\], expected \['bias', "),
}


@pytest.mark.usefixtures("csr_format")
@pytest.mark.parametrize("case", sorted(COMPACT_ERRORS))
def test_a_tampered_compact_file_is_refused_naming_the_stored_array(tmp_path, case):
    edit, match = COMPACT_ERRORS[case]
    with pytest.raises(ValueError, match=r"loading SparseDense layer 'sd'[^\n]*: " + match):
        keras.models.load_model(_compact_keras(tmp_path, edit))
