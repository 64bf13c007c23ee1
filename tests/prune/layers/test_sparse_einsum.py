"""SparseEinsumDense: the equation family, float64 exactness against keras.layers.EinsumDense, gradients, bias axes,
bad input, config and .keras round trips, masks chosen as the masked layer's, FLOPs, and training under a schedule."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import prune
from prune.deploy.convert import convert
from prune.layers.einsum_form import EinsumMatrixForm, einsum_matrix_form, matrix_shape
from prune.layers.sparse_einsum import SparseEinsumDense

# (equation, input shape with the batch, output_shape, bias_axes): odd sizes everywhere
CASES = [
    ("abc,cd->abd", (3, 5, 7), (5, 9), "d"),
    ("abc,cde->abde", (3, 5, 7), (None, 3, 5), "de"),  # MultiHeadAttention's query, key, value
    ("abcd,cde->abe", (3, 5, 3, 5), (None, 7), "e"),  # its output projection
    ("btd,dnh->btnh", (3, 5, 7), (5, 3, 5), "th"),  # a bias over an input axis too: shape (5, 1, 5)
    ("ab,bc->ac", (3, 7), (9,), "c"),
    ("...b,bc->...c", (3, 2, 5, 7), (9,), "c"),
]
MATMULS = ["dense", "coo", "native"]  # float64: native falls back to TensorFlow's kernels


def _kernel(shape, seed, density=0.45):
    rng = np.random.default_rng(seed)
    mask = rng.random(shape) < density
    return np.where(mask, rng.standard_normal(shape), 0.0), mask


def _reference(equation, x_shape, output_shape, bias_axes, kernel, bias, dtype="float64", activation=None):
    ref = keras.layers.EinsumDense(equation, output_shape, bias_axes=bias_axes, activation=activation, dtype=dtype)
    ref.build((None, *x_shape[1:]))
    ref.kernel.assign(kernel)
    if bias is not None:
        ref.bias.assign(bias)
    return ref


def _bias_shape(equation, x_shape, output_shape, bias_axes):
    ref = keras.layers.EinsumDense(equation, output_shape, bias_axes=bias_axes, dtype="float64")
    ref.build((None, *x_shape[1:]))
    return tuple(ref.kernel.shape), None if ref.bias is None else tuple(ref.bias.shape)


def test_the_equation_family_is_read_as_a_matrix_product_and_others_are_none():
    assert einsum_matrix_form("abc,cde->abde") == EinsumMatrixForm("abc", "cde", "abde", 1, False)
    assert einsum_matrix_form("abcd,cde->abe") == EinsumMatrixForm("abcd", "cde", "abe", 2, False)
    assert einsum_matrix_form("ab,bc->ac") == EinsumMatrixForm("ab", "bc", "ac", 1, False)
    assert einsum_matrix_form("...b,bc->...c") == EinsumMatrixForm("b", "bc", "c", 1, True)
    assert einsum_matrix_form("a bc, cd -> abd") == EinsumMatrixForm("abc", "cd", "abd", 1, False)
    for other in ["abc,dc->abd", "ab,bc->ca", "abc,cd->adb", "ab...,bc->ac...", "b,bc->c", "abc,acd->abd",
                  "abc,cd", "abc,cc->abc", "abc,cd->abd,e", 3, "abcd,dce->abe"]:
        assert einsum_matrix_form(other) is None, other


@pytest.mark.parametrize("equation,x_shape,output_shape,bias_axes", CASES)
@pytest.mark.parametrize("with_bias", [True, False])
def test_float64_forward_matches_einsum_dense_for_every_kernel_eager_and_traced(equation, x_shape, output_shape,
                                                                                 bias_axes, with_bias):
    axes = bias_axes if with_bias else None
    kernel_shape, bias_shape = _bias_shape(equation, x_shape, output_shape, axes)
    w, mask = _kernel(kernel_shape, seed=len(equation))
    bias = None if bias_shape is None else np.linspace(-1, 1, int(np.prod(bias_shape))).reshape(bias_shape)
    ref = _reference(equation, x_shape, output_shape, axes, w, bias, activation="tanh")
    for batch in (1, x_shape[0]):  # batch 1 and an odd batch
        x = tf.constant(np.random.default_rng(batch).standard_normal((batch, *x_shape[1:])))
        expected = ref(x).numpy()
        for matmul in MATMULS:
            layer = SparseEinsumDense.from_dense(w, mask, equation, output_shape=output_shape, bias_axes=axes,
                                                 bias=bias, matmul=matmul, activation="tanh", dtype="float64")
            assert layer.weight_shape == kernel_shape and layer.nnz == int(mask.sum())
            assert layer.dense_shape == (int(np.prod(kernel_shape[: layer.form.contracted])),
                                         int(np.prod(kernel_shape[layer.form.contracted :])))
            assert (layer.bias is None) == (bias is None) and (bias is None or tuple(layer.bias.shape) == bias_shape)
            eager = layer(x).numpy()
            traced = tf.function(lambda t: layer(t))(x).numpy()
            assert eager.shape == expected.shape == layer.compute_output_shape(tuple(x.shape)), matmul
            np.testing.assert_allclose(eager, expected, rtol=0, atol=1e-12, err_msg=matmul)
            np.testing.assert_allclose(traced, expected, rtol=0, atol=1e-12, err_msg=matmul)
            np.testing.assert_array_equal(layer.to_dense(), w)


@pytest.mark.parametrize("equation,x_shape,output_shape,bias_axes", CASES)
@pytest.mark.parametrize("matmul", MATMULS)
def test_float64_gradients_match_the_dense_layers_tape(equation, x_shape, output_shape, bias_axes, matmul):
    kernel_shape, bias_shape = _bias_shape(equation, x_shape, output_shape, bias_axes)
    w, mask = _kernel(kernel_shape, seed=11)
    bias = np.random.default_rng(2).standard_normal(bias_shape)
    layer = SparseEinsumDense.from_dense(w, mask, equation, output_shape=output_shape, bias_axes=bias_axes, bias=bias,
                                         matmul=matmul, activation="tanh", dtype="float64")
    ref = _reference(equation, x_shape, output_shape, bias_axes, w, bias, activation="tanh")
    x = tf.constant(np.random.default_rng(3).standard_normal(x_shape))
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        ys, yd = layer(x), ref(x)
        ls, ld = tf.reduce_sum(ys**2), tf.reduce_sum(yd**2)
    np.testing.assert_allclose(ys.numpy(), yd.numpy(), rtol=0, atol=1e-12)
    g_values, g_bias, g_x = tape.gradient(ls, [layer.values, layer.bias, x])
    g_kernel, g_b, g_xd = tape.gradient(ld, [ref.kernel, ref.bias, x])
    np.testing.assert_allclose(g_values.numpy(), np.asarray(g_kernel)[mask], rtol=0, atol=1e-10)  # row-major order
    np.testing.assert_allclose(g_bias.numpy(), np.asarray(g_b), rtol=0, atol=1e-10)
    np.testing.assert_allclose(g_x.numpy(), g_xd.numpy(), rtol=0, atol=1e-10)


@pytest.mark.parametrize("equation,x_shape,output_shape,bias_axes", CASES)
def test_float32_native_kernels_match_the_float64_reference_with_gradients(equation, x_shape, output_shape, bias_axes):
    kernel_shape, bias_shape = _bias_shape(equation, x_shape, output_shape, bias_axes)
    w, mask = _kernel(kernel_shape, seed=5)
    bias = np.random.default_rng(6).standard_normal(bias_shape)
    layer = SparseEinsumDense.from_dense(w.astype("float32"), mask, equation, output_shape=output_shape,
                                         bias_axes=bias_axes, bias=bias.astype("float32"), matmul="native")
    ref = _reference(equation, x_shape, output_shape, bias_axes, w, bias)
    for batch in (1, x_shape[0]):
        x = np.random.default_rng(batch).standard_normal((batch, *x_shape[1:]))
        x32 = tf.constant(x.astype("float32"))
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(x32)
            y = layer(x32)
            loss = tf.reduce_sum(y**2)
        x64 = tf.constant(x)
        with tf.GradientTape(persistent=True) as ref_tape:
            ref_tape.watch(x64)
            yd = ref(x64)
            ld = tf.reduce_sum(yd**2)
        np.testing.assert_allclose(y.numpy(), yd.numpy(), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(tape.gradient(loss, layer.values).numpy(),
                                   np.asarray(ref_tape.gradient(ld, ref.kernel))[mask], rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(tape.gradient(loss, x32).numpy(), ref_tape.gradient(ld, x64).numpy(),
                                   rtol=1e-5, atol=1e-4)


def test_an_equation_outside_the_family_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"equation='abc,dc->abd'"):
        SparseEinsumDense("abc,dc->abd", (None, 4))
    with pytest.raises(ValueError, match=r"equation='ab,bc->ca'"):
        SparseEinsumDense.from_dense(np.ones((3, 4)), np.ones((3, 4)), "ab,bc->ca")


def test_bad_arguments_are_refused_naming_them():
    with pytest.raises(ValueError, match=r"output_shape must have 2 entries .* got output_shape=\(4,\)"):
        SparseEinsumDense("abc,cd->abd", (4,))
    with pytest.raises(ValueError,
                       match=r"kernel's axes 'de'\) must be positive integers, got output_shape=\(None, None, 3\)"):
        SparseEinsumDense("abc,cde->abde", (None, None, 3))
    with pytest.raises(ValueError, match=r"output_shape=\(6, 4\) of 'e' gives 6 for an input axis that is 5"):
        SparseEinsumDense("abc,cd->abd", (6, 4), name="e").build((None, 5, 3))
    with pytest.raises(ValueError, match=r"bias_axes=.x."):
        SparseEinsumDense("abc,cd->abd", (None, 4), bias_axes="x")
    with pytest.raises(ValueError, match=r"bias must have shape \(4,\) .* got shape \(3,\)"):
        SparseEinsumDense.from_dense(np.ones((3, 4)), np.ones((3, 4)), "abc,cd->abd", bias_axes="d", bias=np.ones(3))
    with pytest.raises(ValueError, match=r"bias was given but bias_axes is None"):
        SparseEinsumDense.from_dense(np.ones((3, 4)), np.ones((3, 4)), "abc,cd->abd", bias=np.ones(4))
    with pytest.raises(ValueError, match=r"kernel must have 3 axes"):
        SparseEinsumDense.from_dense(np.ones((3, 4)), np.ones((3, 4)), "abc,cde->abde")


def test_a_mask_of_the_wrong_shape_raises_before_anything_is_built(monkeypatch):
    def boom(self, *args, **kwargs):
        raise AssertionError("a layer was built")

    monkeypatch.setattr(SparseEinsumDense, "build", boom)
    with pytest.raises(ValueError, match=r"mask"):
        SparseEinsumDense.from_dense(np.ones((3, 2, 4)), np.ones((3, 8)), "abc,cde->abde")
    with pytest.raises(ValueError, match=r"mask"):
        SparseEinsumDense.from_dense(np.ones((3, 4)), np.full((3, 4), 2), "abc,cd->abd")


def test_config_round_trip_and_the_dense_layer_compute_the_same_function():
    w, mask = _kernel((7, 3, 5), seed=1)
    layer = SparseEinsumDense.from_dense(w, mask, "abc,cde->abde", output_shape=(None, 3, 5), bias_axes="de",
                                         bias=np.arange(15.0).reshape(3, 5), activation="relu", matmul="coo",
                                         name="proj", dtype="float64")
    config = layer.get_config()
    assert (config["equation"], config["output_shape"], config["bias_axes"], config["nnz"]) == (
        "abc,cde->abde", (None, 3, 5), "de", int(mask.sum()))
    assert "units" not in config and "use_bias" not in config
    again = SparseEinsumDense.from_config(config)
    again.build((None, 5, 7))
    again.set_weights(layer.get_weights())
    x = np.random.default_rng(0).standard_normal((3, 5, 7))
    np.testing.assert_array_equal(again(x).numpy(), layer(x).numpy())
    dense = layer.to_dense_layer()
    assert type(dense) is keras.layers.EinsumDense and dense.name == "proj" and dense.bias_axes == "de"
    np.testing.assert_array_equal(dense.kernel.numpy(), w)
    np.testing.assert_allclose(dense(x).numpy(), layer(x).numpy(), rtol=0, atol=1e-12)


def test_a_model_with_sparse_einsum_layers_saves_and_loads(tmp_path):
    w1, m1 = _kernel((7, 3, 5), seed=1)
    w2, m2 = _kernel((3, 5, 6), seed=2)
    x_in = keras.Input((5, 7))
    h = SparseEinsumDense.from_dense(w1, m1, "abc,cde->abde", output_shape=(None, 3, 5), bias_axes="de",
                                     bias=np.ones((3, 5)), name="qkv")(x_in)
    y = SparseEinsumDense.from_dense(w2, m2, "abcd,cde->abe", output_shape=(None, 6), name="out")(h)
    model = keras.Model(x_in, y)
    path = tmp_path / "einsum.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    assert [type(layer).__name__ for layer in loaded.layers[1:]] == ["SparseEinsumDense"] * 2
    x = np.random.default_rng(0).standard_normal((3, 5, 7)).astype("float32")
    np.testing.assert_array_equal(loaded(x).numpy(), model(x).numpy())
    for name, mask in (("qkv", m1), ("out", m2)):
        np.testing.assert_array_equal(loaded.get_layer(name).get_mask(), mask)


def _einsum_model(equation, x_shape, output_shape, bias_axes, seed=0):
    keras.utils.set_random_seed(seed)
    x_in = keras.Input(x_shape[1:])
    y = keras.layers.EinsumDense(equation, output_shape, bias_axes=bias_axes, name="ein")(x_in)
    return keras.Model(x_in, y)


@pytest.mark.parametrize("pattern", [prune.Unstructured(), prune.NByM(2, 4), prune.Block((2, 3))])
@pytest.mark.parametrize("case", [0, 1, 2], ids=["2d", "heads", "output"])
def test_masked_and_sparse_einsum_layers_pruned_alike_choose_the_same_masks(pattern, case):
    """Both forms select on the kernel's [d_in, d_out] matrix: NByM's groups run along the inputs (d, not the
    heads of a [d, heads, key_dim] query kernel), and Block tiles the matrix of a 3-D kernel too."""
    equation, x_shape, output_shape, bias_axes = [
        ("abc,cd->abd", (3, 5, 8), (5, 9), "d"),
        ("abc,cde->abde", (3, 5, 8), (None, 4, 3), "de"),  # kernel [8, 4, 3]: the matrix [8, 12]
        ("abcd,cde->abe", (3, 5, 3, 8), (None, 7), "e"),  # kernel [3, 8, 7]: the matrix [24, 7]
    ][case]
    schedule = prune.PolynomialDecay(0.0, 0.75, begin_step=0, end_step=4, frequency=2)
    masked = prune.prune_low_magnitude(_einsum_model(equation, x_shape, output_shape, bias_axes), schedule,
                                       pattern=pattern)
    sparse = convert(masked, to="sparse")
    assert type(sparse.get_layer("ein")).__name__ == "SparseEinsumDense"
    for step in (0, 2, 4):
        prune.update_masks(masked, step)
        prune.update_masks(sparse, step)
        expected = masked.get_layer("ein").get_masks()["kernel"] != 0
        np.testing.assert_array_equal(sparse.get_layer("ein").get_mask(), expected, err_msg=f"step {step}")
    layer = sparse.get_layer("ein")
    size = int(np.prod(layer.weight_shape))
    assert layer.nnz == int(expected.sum())
    matrix = expected.reshape(layer.dense_shape)
    if isinstance(pattern, prune.Unstructured):
        assert layer.nnz == round(0.25 * size)
    if isinstance(pattern, prune.NByM):  # 2 of every 4 consecutive inputs of each output
        assert layer.nnz == size // 2
        np.testing.assert_array_equal(matrix.reshape(-1, 4, matrix.shape[1]).sum(axis=1), 2)
    if isinstance(pattern, prune.Block):  # whole 2 x 3 tiles of the matrix (the last column tiles may be cut)
        tiles = [matrix[r:r + 2, c:c + 3] for r in range(0, matrix.shape[0], 2) for c in range(0, matrix.shape[1], 3)]
        assert all(t.all() or not t.any() for t in tiles)
        assert sum(t.all() for t in tiles) == len(tiles) - round(0.75 * len(tiles))
    x = np.random.default_rng(0).standard_normal(x_shape).astype("float32")
    np.testing.assert_allclose(sparse(x).numpy(), masked(x).numpy(), rtol=1e-5, atol=1e-6)


def test_the_matrix_shape_of_an_einsum_kernel():
    assert matrix_shape("abc,cde->abde", (8, 4, 3)) == (8, 12)
    assert matrix_shape("abcd,cde->abe", (4, 3, 16)) == (12, 16)
    assert matrix_shape("...b,bc->...c", (5, 2)) == (5, 2)
    assert matrix_shape("abc,dc->abd", (4, 3)) is None  # a transposed kernel: not a product in order
    assert matrix_shape("abc,cde->abde", (8, 12)) is None  # a kernel of another rank


def test_nbym_on_a_masked_multi_head_attention_groups_each_projection_along_its_inputs():
    keras.utils.set_random_seed(0)
    q = keras.Input((5, 8))
    y = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4, name="mha")(q, q)
    masked = prune.prune_low_magnitude(keras.Model(q, y), prune.ConstantSparsity(0.5, 0), pattern=prune.NByM(2, 4))
    prune.update_masks(masked, 0)
    masks = masked.get_layer("mha").get_masks()
    for name, rows in (("query_kernel", 8), ("key_kernel", 8), ("value_kernel", 8), ("output_kernel", 8)):
        matrix = masks[name].reshape(rows, -1)  # [8, 2, 4] -> [8, 8]; the output kernel [2, 4, 8] -> [8, 8]
        np.testing.assert_array_equal(matrix.reshape(2, 4, -1).sum(axis=1), 2, err_msg=name)


def test_the_sparsity_report_counts_the_stored_entries_and_their_flops():
    w, mask = _kernel((3, 5, 6), seed=4)
    x_in = keras.Input((7, 3, 5))
    y = SparseEinsumDense.from_dense(w, mask, "abcd,cde->abe", output_shape=(None, 6), name="out")(x_in)
    report = prune.sparsity_report(keras.Model(x_in, y))
    row = report[report.layer == "out"].iloc[0]
    nnz = int(mask.sum())
    assert (row["shape"], row.nnz, row["size"], row.status) == ((3, 5, 6), nnz, 90, "sparse")
    assert row.dense_flops == 2.0 * 90 * 7 and row.nonzero_flops == 2.0 * nnz * 7  # 7 tokens per example


def test_fit_under_a_schedule_reaches_its_target_and_keeps_the_function():
    keras.utils.set_random_seed(0)
    x_in = keras.Input((5, 8))
    h = SparseEinsumDense("abc,cde->abde", (None, 4, 3), bias_axes="de", name="heads",
                          pruning_schedule=prune.PolynomialDecay(0.0, 0.75, begin_step=0, end_step=4, frequency=1))(x_in)
    y = SparseEinsumDense("abcd,cde->abe", (None, 2), name="out",
                          pruning_schedule=prune.ConstantSparsity(0.5, begin_step=0, frequency=1))(h)
    model = keras.Model(x_in, y)
    model.compile(keras.optimizers.Adam(0.01), "mse")
    rng = np.random.default_rng(0)
    x, target = rng.standard_normal((12, 5, 8)).astype("float32"), rng.standard_normal((12, 5, 2)).astype("float32")
    assert model.get_layer("heads").nnz == 96
    model.fit(x, target, batch_size=2, epochs=1, verbose=0, callbacks=[prune.UpdatePruningStep()])
    assert model.get_layer("heads").nnz == 96 - round(0.75 * 96)
    assert model.get_layer("out").nnz == 24 - 12
    np.testing.assert_allclose(model(x).numpy(), prune.strip_pruning(model)(x).numpy(), rtol=1e-5, atol=1e-6)


def test_the_dense_gradient_for_growth_has_the_kernels_shape():
    masked = prune.prune_low_magnitude(_einsum_model("abc,cde->abde", (3, 5, 7), (None, 4, 3), "de"))
    prune.sparse_init(masked, 0.6, seed=0)
    sparse = convert(masked, to="sparse")
    x = np.random.default_rng(0).standard_normal((3, 5, 7)).astype("float32")
    y = np.random.default_rng(1).standard_normal((3, 5, 4, 3)).astype("float32")
    for model in (masked, sparse):
        model.compile(keras.optimizers.SGD(0.05), "mse")
    grads = [prune.dense_gradients(m, x, y) for m in (masked, sparse)]
    assert grads[0]["ein/kernel"].shape == grads[1]["ein/kernel"].shape == (7, 4, 3)
    np.testing.assert_allclose(grads[0]["ein/kernel"], grads[1]["ein/kernel"], rtol=1e-4, atol=1e-6)
