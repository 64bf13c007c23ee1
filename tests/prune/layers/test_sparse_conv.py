"""SparseConv2D: float64 exactness against tf.nn.conv2d, gradients, conversion, save/load, pruning, bad input."""

import itertools
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import prune
from prune.deploy.convert import convert, unconvertible_layers
from prune.layers.sparse_conv import SparseConv2D, conv_output_size

MATMULS = ["native", "auto", "csr", "coo", "dense"]
# (kernel, stride, dilation): 1x1, 3x3 and 5x5; stride 2; dilation 2 (Keras refuses both above 1)
GEOMETRIES = [(k, s, d) for k, s, d in itertools.product([1, 3, 5], [1, 2], [1, 2]) if not (s > 1 and d > 1)]


def _kernel(shape, density, seed):
    rng = np.random.default_rng(seed)
    mask = rng.random(shape) < density
    return np.where(mask, rng.standard_normal(shape), 0.0), mask


def _reference(x, kernel, bias, stride, dilation, padding):
    y = tf.nn.convolution(x, kernel, [stride, stride], padding.upper(), dilations=[dilation, dilation])
    return y + bias


@pytest.mark.parametrize("kernel_size,stride,dilation", GEOMETRIES)
@pytest.mark.parametrize("padding", ["same", "valid"])
def test_float64_forward_matches_conv2d_for_every_kernel_eager_and_traced(kernel_size, stride, dilation, padding):
    c_in, c_out = 3, 5
    w, mask = _kernel((kernel_size, kernel_size, c_in, c_out), 0.4, seed=kernel_size * 10 + stride)
    bias = np.linspace(-1, 1, c_out)
    for batch, (h, wd) in ((1, (11, 9)), (3, (13, 10))):  # odd sizes, batch 1 and 3
        x = tf.constant(np.random.default_rng(batch).standard_normal((batch, h, wd, c_in)))
        ref = _reference(x, w, bias, stride, dilation, padding).numpy()
        for matmul in MATMULS:
            layer = SparseConv2D.from_dense(
                w, mask, matmul=matmul, bias=bias, strides=stride, dilation_rate=dilation, padding=padding, dtype="float64"
            )
            eager = layer(x).numpy()
            traced = tf.function(lambda t: layer(t))(x).numpy()
            assert eager.shape == ref.shape == layer.compute_output_shape(tuple(x.shape)), matmul
            np.testing.assert_allclose(eager, ref, rtol=0, atol=1e-12, err_msg=matmul)
            np.testing.assert_allclose(traced, ref, rtol=0, atol=1e-12, err_msg=matmul)


@pytest.mark.parametrize("kernel_size,stride,dilation", [(1, 1, 1), (1, 2, 1), (3, 1, 1), (3, 2, 1), (3, 1, 2), (5, 1, 1)])
@pytest.mark.parametrize("matmul", MATMULS)
def test_float64_gradients_match_the_dense_layers_tape(kernel_size, stride, dilation, matmul):
    c_in, c_out = 4, 6
    w, mask = _kernel((kernel_size, kernel_size, c_in, c_out), 0.3, seed=7)
    bias = np.arange(c_out) * 0.1
    layer = SparseConv2D.from_dense(
        w, mask, matmul=matmul, bias=bias, strides=stride, dilation_rate=dilation, padding="same", activation="tanh",
        dtype="float64",
    )
    x = tf.constant(np.random.default_rng(3).standard_normal((5, 9, 10, c_in)))  # odd batch
    kernel, b = tf.Variable(w), tf.Variable(bias)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        ys = layer(x)
        yd = tf.tanh(_reference(x, kernel, b, stride, dilation, "same"))
        ls, ld = tf.reduce_sum(ys**2), tf.reduce_sum(yd**2)
    np.testing.assert_allclose(ys.numpy(), yd.numpy(), rtol=0, atol=1e-12)
    g_values, g_bias, g_x = tape.gradient(ls, [layer.values, layer.bias, x])
    g_kernel, g_b, g_xd = tape.gradient(ld, [kernel, b, x])
    np.testing.assert_allclose(g_values.numpy(), g_kernel.numpy()[mask], rtol=0, atol=1e-10)
    np.testing.assert_allclose(g_bias.numpy(), g_b.numpy(), rtol=0, atol=1e-10)
    np.testing.assert_allclose(g_x.numpy(), g_xd.numpy(), rtol=0, atol=1e-10)


@pytest.mark.parametrize("kernel_size,stride,dilation", [(1, 1, 1), (1, 2, 1), (3, 1, 1), (3, 2, 1), (3, 1, 2), (5, 1, 1)])
@pytest.mark.parametrize("batch", [1, 3, 8])
def test_float32_native_kernels_match_the_float64_reference_with_gradients(kernel_size, stride, dilation, batch):
    # the native ops are float32 only (float64 layers run TensorFlow's kernels): compare them with float64 conv2d
    c_in, c_out = 7, 19  # odd widths: partial vector lanes on every path
    w, mask = _kernel((kernel_size, kernel_size, c_in, c_out), 0.25, seed=batch)
    layer = SparseConv2D.from_dense(w.astype("float32"), mask, matmul="native", strides=stride, dilation_rate=dilation,
                                    padding="same", use_bias=False)
    x64 = np.random.default_rng(5).standard_normal((batch, 9, 11, c_in))
    x = tf.constant(x64.astype("float32"))
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x)
        loss = tf.reduce_sum(y * tf.cast(tf.range(c_out), tf.float32))
    g_values, g_x = tape.gradient(loss, [layer.values, x])
    x_ref, kernel = tf.constant(x64), tf.Variable(w.astype("float32").astype("float64"))
    with tf.GradientTape() as tape:
        tape.watch(x_ref)
        y_ref = _reference(x_ref, kernel, 0.0, stride, dilation, "same")
        loss_ref = tf.reduce_sum(y_ref * tf.cast(tf.range(c_out), tf.float64))
    g_kernel, g_x_ref = tape.gradient(loss_ref, [kernel, x_ref])
    for got, want in ((y, y_ref), (g_values, g_kernel.numpy()[mask]), (g_x, g_x_ref)):  # float32 sums: error ~ eps * scale
        want = np.asarray(want)
        np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=1e-6 * np.abs(want).max())


def test_pointwise_block_tiles_run_the_block_kernels_and_agree():
    # whole 1x16 tiles along the output channels of the patch matrix: the native structure's block section
    rng = np.random.default_rng(0)
    c_in, c_out = 24, 48
    tiles = rng.random((c_in, c_out // 16)) < 0.2
    mask = np.repeat(tiles, 16, axis=1).reshape(1, 1, c_in, c_out)
    w = np.where(mask, rng.standard_normal(mask.shape), 0.0).astype("float32")
    layer = SparseConv2D.from_dense(w, mask, matmul="native", use_bias=False)
    if prune.native.load() is not None:
        assert layer._blocked()
    x = tf.constant(rng.standard_normal((3, 7, 7, c_in)).astype("float32"))
    np.testing.assert_allclose(layer(x).numpy(), tf.nn.conv2d(x, w, 1, "VALID").numpy(), rtol=1e-5, atol=1e-5)


def test_random_structure_counts_and_the_4d_views():
    layer = SparseConv2D(8, 3, sparsity=0.75, seed=1, padding="same")
    y = layer(tf.zeros((2, 6, 6, 4)))
    assert y.shape == (2, 6, 6, 8)
    assert layer.weight_shape == (3, 3, 4, 8) and layer.dense_shape == (36, 8)
    assert layer.nnz == 288 - round(0.75 * 288)
    assert layer.to_dense().shape == layer.get_mask().shape == (3, 3, 4, 8)
    assert int(layer.get_mask().sum()) == layer.nnz
    # patch row (dy * kw + dx) * C_in + c holds kernel[dy, dx, c]
    dense = layer.to_dense()
    for (row, col), value in zip(layer.indices.numpy(), layer.values.numpy()):
        dy, rest = divmod(int(row), 3 * 4)
        dx, c = divmod(rest, 4)
        assert dense[dy, dx, c, col] == value


@pytest.mark.parametrize(
    "size,kernel,stride,dilation,padding,expected",
    [(28, 5, 1, 1, "same", 28), (28, 5, 1, 1, "valid", 24), (11, 3, 2, 1, "same", 6), (11, 3, 2, 1, "valid", 5),
     (9, 3, 1, 2, "valid", 5), (2, 5, 1, 1, "valid", 0), (None, 3, 1, 1, "same", None)],
)
def test_conv_output_size(size, kernel, stride, dilation, padding, expected):
    assert conv_output_size(size, kernel, stride, dilation, padding) == expected


def _lenet5(seed=0):
    keras.utils.set_random_seed(seed)
    inp = keras.Input((14, 14, 1))
    h = keras.layers.Conv2D(4, 3, padding="same", activation="relu", name="c1")(inp)
    h = keras.layers.MaxPooling2D()(h)
    h = keras.layers.Conv2D(8, 3, activation="relu", name="c2")(h)
    h = keras.layers.Conv2D(6, 1, strides=2, name="c3")(h)
    h = keras.layers.Flatten()(h)
    return keras.Model(inp, keras.layers.Dense(3, name="d")(h))


def _data(n=16, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 14, 14, 1)).astype("float32"), rng.integers(0, 3, n)


def test_convert_round_trips_masked_sparse_dense_and_strip_gives_conv2d():
    masked = prune.prune_low_magnitude(_lenet5(), prune.ConstantSparsity(0.7, begin_step=0, frequency=1))
    prune.update_masks(masked, 0)
    x, _ = _data()
    assert unconvertible_layers(masked, "sparse") == []
    sparse = convert(masked, to="sparse")
    kinds = {layer.name: type(layer).__name__ for layer in sparse.layers}
    assert kinds["c1"] == kinds["c2"] == kinds["c3"] == "SparseConv2D" and kinds["d"] == "SparseDense"
    np.testing.assert_allclose(sparse(x).numpy(), masked(x).numpy(), rtol=1e-5, atol=1e-6)
    for name in ("c1", "c2", "c3"):
        a, b = masked.get_layer(name), sparse.get_layer(name)
        np.testing.assert_array_equal(a.get_masks()["kernel"], b.get_mask())
        assert b.nnz == int(a.get_masks()["kernel"].sum()) and b.pruning_schedule == a.pruning_schedule
        assert b.strides == a.strides and b.padding == a.padding
    back = convert(sparse, to="masked")
    assert type(back.get_layer("c2")).__name__ == "MaskedConv2D"
    np.testing.assert_array_equal(back.get_layer("c2").get_masks()["kernel"], sparse.get_layer("c2").get_mask())
    plain = prune.strip_pruning(sparse)
    assert {type(layer).__name__ for layer in plain.layers} >= {"Conv2D", "Dense"}
    assert not any("Sparse" in type(layer).__name__ for layer in plain.layers)
    np.testing.assert_allclose(plain(x).numpy(), sparse(x).numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(plain.get_layer("c2").kernel.numpy(), sparse.get_layer("c2").to_dense())


def test_grouped_and_1d_convolutions_are_named_not_converted():
    inp = keras.Input((8, 8, 4))
    h = keras.layers.Conv2D(4, 3, groups=2, name="grouped")(inp)
    h = keras.layers.Reshape((36, 4))(h)
    h = keras.layers.Conv1D(2, 3, name="c1d")(h)
    model = keras.Model(inp, h)
    assert sorted(unconvertible_layers(model, "sparse")) == ["c1d", "grouped"]
    with pytest.warns(prune.deploy.convert.ConversionWarning, match="grouped"):
        out = convert(model, to="sparse")
    assert type(out.get_layer("grouped")) is keras.layers.Conv2D


def test_sparsity_report_counts_conv_flops_from_the_output_positions():
    sparse = convert(prune.prune_low_magnitude(_lenet5(), prune.ConstantSparsity(0.5, begin_step=0, frequency=1)), to="sparse")
    report = prune.sparsity_report(sparse).set_index("layer")
    c2 = sparse.get_layer("c2")
    assert report.loc["c2", "shape"] == (3, 3, 4, 8) and report.loc["c2", "status"] == "sparse"
    positions = 5 * 5  # 7x7 input, 3x3 valid
    assert report.loc["c2", "dense_flops"] == 2.0 * 288 * positions
    assert report.loc["c2", "nonzero_flops"] == 2.0 * int(np.count_nonzero(c2.values.numpy())) * positions
    assert report.loc["c3", "dense_flops"] == 2.0 * 48 * 9  # 5x5 input, 1x1 stride 2: 3x3 positions


def test_keras_file_round_trip_keeps_structure_values_and_config(tmp_path):
    sparse = convert(prune.prune_low_magnitude(_lenet5(), prune.ConstantSparsity(0.8, begin_step=0, frequency=1)), to="sparse")
    prune.update_masks(sparse, 0)
    x, _ = _data()
    path = os.fspath(tmp_path / "m.keras")
    sparse.save(path)
    loaded = keras.models.load_model(path)
    for name in ("c1", "c2", "c3"):
        a, b = sparse.get_layer(name), loaded.get_layer(name)
        assert type(b) is SparseConv2D and b.get_config() == a.get_config()
        np.testing.assert_array_equal(b.indices.numpy(), a.indices.numpy())
        np.testing.assert_array_equal(b.values.numpy(), a.values.numpy())
    np.testing.assert_array_equal(loaded(x).numpy(), sparse(x).numpy())


def test_a_masked_and_a_sparse_convnet_pruned_alike_select_the_same_masks():
    for pattern in (prune.Unstructured(), prune.NByM(2, 4), prune.Channel()):
        masked = prune.prune_low_magnitude(
            _lenet5(), prune.PolynomialDecay(0.0, 0.75, begin_step=0, end_step=4, frequency=2), pattern=pattern
        )
        prune.update_masks(masked, 0)
        sparse = convert(masked, to="sparse")
        for step in (2, 4):
            prune.update_masks(masked, step)
            prune.update_masks(sparse, step)
            for name in ("c1", "c2", "c3"):
                np.testing.assert_array_equal(
                    masked.get_layer(name).get_masks()["kernel"], sparse.get_layer(name).get_mask(), err_msg=f"{pattern} {name} {step}"
                )
        assert sparse.get_layer("c2").nnz == int(masked.get_layer("c2").get_masks()["kernel"].sum()) < 288


def test_fit_under_a_schedule_shrinks_the_stored_kernel_and_keeps_the_function():
    sparse = convert(prune.prune_low_magnitude(_lenet5(), prune.PolynomialDecay(0.0, 0.8, begin_step=0, end_step=6, frequency=2)), to="sparse")
    sparse.compile(keras.optimizers.Adam(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = _data()
    before = sparse.get_layer("c2").nnz
    sparse.fit(x, y, batch_size=2, epochs=1, verbose=0, callbacks=[prune.UpdatePruningStep()])
    c2 = sparse.get_layer("c2")
    assert before == 288 and c2.nnz == 288 - round(0.8 * 288)
    np.testing.assert_allclose(sparse(x).numpy(), prune.strip_pruning(sparse)(x).numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("method", ["set", "rigl"])
def test_dynamic_sparse_training_moves_the_conv_structure_like_the_masked_layer(method):
    masked = prune.prune_low_magnitude(_lenet5())
    prune.sparse_init(masked, 0.7, seed=0)
    sparse = convert(masked, to="sparse")
    x, y = _data()
    for model in (masked, sparse):
        model.compile(keras.optimizers.SGD(0.05), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    grads = [prune.dense_gradients(m, x, y) for m in (masked, sparse)]
    assert grads[0]["c2/kernel"].shape == (3, 3, 4, 8)
    for key in grads[0]:
        np.testing.assert_allclose(grads[0][key], grads[1][key], rtol=1e-4, atol=1e-6)
    histories = []
    for model in (masked, sparse):
        cb = prune.DynamicSparsity(method, update_every=1, drop_fraction=0.5, decay="constant", gradient_data=(x, y), seed=0)
        cb.set_model(model)
        cb.update(3)
        histories.append(cb.history)
    assert histories[0] == histories[1] and sum(r["grown"] for r in histories[0]) > 0
    for name in ("c1", "c2", "c3"):
        np.testing.assert_array_equal(masked.get_layer(name).get_masks()["kernel"], sparse.get_layer(name).get_mask())


def test_tflite_and_portable_saved_model_export_compute_the_same_function(tmp_path):
    from prune.deploy import export

    sparse = convert(prune.prune_low_magnitude(_lenet5(), prune.ConstantSparsity(0.8, begin_step=0, frequency=1)), to="sparse")
    prune.update_masks(sparse, 0)
    x, _ = _data(3)
    expected = sparse(x).numpy()
    np.testing.assert_allclose(export.run_tflite(export.to_tflite(sparse), x), expected, rtol=1e-5, atol=1e-5)
    for portable in (True, False):  # TensorFlow ops only, and the model's own (native) kernels
        path = os.fspath(tmp_path / f"saved-{portable}")
        export.saved_model(sparse, path, portable=portable)
        loaded = export.load_saved_model(path)  # held: its variables live as long as the object
        served = loaded.serve(tf.constant(x))
        np.testing.assert_allclose(np.asarray(served), expected, rtol=1e-5, atol=1e-5, err_msg=f"portable={portable}")


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(filters=0, kernel_size=3), "filters must be a positive integer, got 0"),
        (dict(filters=4, kernel_size=(3, 0)), r"kernel_size must be .* got \(3, 0\)"),
        (dict(filters=4, kernel_size=3, strides=2, dilation_rate=2), "strides > 1 with dilation_rate > 1"),
        (dict(filters=4, kernel_size=3, padding="full"), "padding must be one of .* got 'full'"),
        (dict(filters=4, kernel_size=3, data_format="channels_first"), "data_format must be 'channels_last'"),
        (dict(filters=4, kernel_size=3, groups=2), "groups must be 1"),
        (dict(filters=4, kernel_size=3, matmul="fast"), "fast"),
    ],
)
def test_bad_constructor_arguments_name_the_argument_and_value(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SparseConv2D(**kwargs)


def test_bad_entries_and_inputs_are_refused_before_anything_is_built():
    w, mask = _kernel((3, 3, 2, 4), 0.5, seed=0)
    with pytest.raises(ValueError, match=r"indices\[0\] = \[3, 0, 0, 0\] is out of range"):
        SparseConv2D.from_sparse([[3, 0, 0, 0]], [1.0], (3, 3, 2, 4))
    with pytest.raises(ValueError, match="duplicate|repeated"):
        SparseConv2D.from_sparse([[0, 0, 0, 0], [0, 0, 0, 0]], [1.0, 2.0], (3, 3, 2, 4))
    with pytest.raises(ValueError, match="kernel must be a 4-D"):
        SparseConv2D.from_dense(w[0], mask[0])
    with pytest.raises(ValueError, match="mask"):
        SparseConv2D.from_dense(w, mask[..., :2])
    with pytest.raises(ValueError, match="NaN or infinite"):
        SparseConv2D.from_dense(np.where(mask, np.nan, 0.0), mask)
    with pytest.raises(ValueError, match=r"input_shape must be \(batch, H, W, 2\)"):
        SparseConv2D.from_dense(w, mask, input_shape=(None, 5, 5, 3))
    layer = SparseConv2D.from_dense(w, mask)
    before = layer.values.numpy().copy()
    weights = layer.get_weights()
    indices_at = [v.name for v in layer.weights].index("indices")
    weights[indices_at] = weights[indices_at][::-1].copy()  # unsorted: stored state is refused, not re-sorted
    with pytest.raises(ValueError, match="set_weights on SparseConv2D layer"):
        layer.set_weights(weights)
    np.testing.assert_array_equal(layer.values.numpy(), before)
    with pytest.raises(ValueError, match="keep"):
        layer.restructure(np.ones((3, 3, 2, 5), bool))


def _op_types(fn, *args):
    graph = fn.get_concrete_function(*args).graph
    types = {op.type for op in graph.get_operations()}
    for f in graph.as_graph_def().library.function:  # inside switch_case branches and gradient functions
        types |= {node.op for node in f.node_def}
    return types


@pytest.mark.skipif(os.environ.get("PRUNE_NATIVE", "1").strip() == "0", reason="PRUNE_NATIVE=0 forces the fallback")
@pytest.mark.parametrize("matmul", ["native", "auto"])
def test_the_native_ops_run_forward_and_backward_without_a_patch_matrix_in_the_forward(matmul):
    w, mask = _kernel((3, 3, 8, 16), 0.2, seed=4)
    layer = SparseConv2D.from_dense(w.astype("float32"), mask, matmul=matmul, padding="same")
    dilated = SparseConv2D.from_dense(w.astype("float32"), mask, matmul=matmul, padding="same", dilation_rate=2)
    pointwise = SparseConv2D.from_dense(w[:1, :1].astype("float32"), mask[:1, :1], matmul=matmul)
    x = tf.constant(np.random.default_rng(0).standard_normal((2, 9, 9, 8)).astype("float32"))

    @tf.function
    def forward(x):
        return layer(x)

    @tf.function
    def train(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(layer(x) ** 2) + tf.reduce_sum(pointwise(x) ** 2) + tf.reduce_sum(dilated(x) ** 2)
        return tape.gradient(loss, [x, layer.values, pointwise.values, dilated.values])

    fwd = _op_types(forward, x)
    assert "PruneConv2d" in fwd and "ExtractImagePatches" not in fwd  # auto: in a switch_case branch
    back = _op_types(train, x)
    # kxk without dilation: TF's dense convolution gradients; with dilation: the native ones; 1x1: PruneSpmm's
    assert {"PruneConv2d", "Conv2DBackpropInput", "Conv2DBackpropFilter", "PruneCol2im", "PruneSddmm", "PruneSpmm"} <= back
    gx, gv, gp, gd = train(x)
    assert gx.shape == x.shape and gv.shape == layer.values.shape and gp.shape == pointwise.values.shape
    assert gd.shape == dilated.values.shape


@pytest.mark.parametrize("matmul", MATMULS)
def test_unknown_spatial_sizes_in_a_traced_graph(matmul):
    # a graph traced for any H and W (as a SavedModel serves): the output sizes come from the input at run time
    w, mask = _kernel((3, 3, 2, 4), 0.5, seed=9)
    layer = SparseConv2D.from_dense(w.astype("float32"), mask, matmul=matmul, strides=2, padding="valid")
    fn = tf.function(lambda t: layer(t), input_signature=[tf.TensorSpec([None, None, None, 2], tf.float32)])
    for shape in ((1, 7, 9, 2), (2, 12, 5, 2)):
        x = np.random.default_rng(1).standard_normal(shape).astype("float32")
        ref = _reference(x, w.astype("float32"), 0.0, 2, 1, "valid").numpy()
        np.testing.assert_allclose(fn(tf.constant(x)).numpy(), ref, rtol=1e-5, atol=1e-5, err_msg=f"{matmul} {shape}")
