"""prune_low_magnitude / strip_pruning on Sequential, functional and subclassed models."""

import subprocess
import sys

import keras
import numpy as np
import pytest

import prune
from prune.layers import MaskedConv2D, MaskedDense
from tests.helpers import mixed_data, mixed_model, mlp, mlp_data


class Net(keras.Model):
    def __init__(self):
        super().__init__()
        self.fc1 = keras.layers.Dense(16, activation="relu")
        self.fc2 = keras.layers.Dense(3)

    def call(self, x):
        return self.fc2(self.fc1(x))


def _functional_cnn():
    keras.utils.set_random_seed(1)
    inp = keras.Input((8, 8, 1))
    x = keras.layers.Conv2D(4, 3, activation="relu")(inp)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.Flatten()(x)
    return keras.Model(inp, keras.layers.Dense(2)(x))


def test_import_does_not_import_tfmot():
    code = "import sys, prune; print('tensorflow_model_optimization' in sys.modules, __import__('os').environ.get('TF_USE_LEGACY_KERAS'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "None"]


@pytest.mark.parametrize("build", [mlp, mixed_model, _functional_cnn])
def test_all_ones_mask_changes_nothing(build):
    """An unpruned masked model computes bitwise what the plain model computes, before and after training."""
    plain = build()
    pruned = prune.prune_low_magnitude(build(), prune.ConstantSparsity(0.5, begin_step=10**6))
    x = mixed_data(32)[0] if build is mixed_model else (
        mlp_data(32)[0] if build is mlp else np.random.default_rng(0).normal(size=(32, 8, 8, 1)).astype("float32")
    )
    np.testing.assert_array_equal(plain.predict(x, verbose=0), pruned.predict(x, verbose=0))
    y = np.arange(32) % 2
    for m in (plain, pruned):
        m.compile(keras.optimizers.Adam(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    plain.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    pruned.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=[prune.UpdatePruningStep()])
    for a, b in zip(plain.trainable_weights, pruned.trainable_weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_sequential_prune_and_strip():
    model = mlp()
    x, y = mlp_data()
    before = model.predict(x, verbose=0)
    pm = prune.prune_low_magnitude(model, prune.OneShot(0.5, 0))
    assert [type(l) for l in pm.layers] == [MaskedDense, MaskedDense]
    assert [w.name for w in pm.layers[0].weights] == ["kernel", "bias", "kernel_mask", "pruning_step"]
    assert not pm.layers[0].kernel_mask.trainable and pm.layers[0].kernel_mask.shape == pm.layers[0].kernel.shape
    np.testing.assert_array_equal(before, pm.predict(x, verbose=0))  # weights were copied
    assert prune.is_pruned(pm) and not prune.is_pruned(model)
    pm.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    pm.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[prune.UpdatePruningStep()])
    stripped = prune.strip_pruning(pm)
    assert [type(l) for l in stripped.layers] == [keras.layers.Dense, keras.layers.Dense]
    np.testing.assert_array_equal(stripped.predict(x, verbose=0), pm.predict(x, verbose=0))
    k = stripped.layers[0].kernel.numpy()
    assert (k == 0).sum() == 12 * 16 // 2 and not np.signbit(k[k == 0]).any()


def test_functional_with_unsupported_layer_is_reported():
    model = _functional_cnn()
    pm = prune.prune_low_magnitude(model, prune.OneShot(0.75, 0))
    kinds = [type(l).__name__ for l in pm.layers]
    assert kinds == ["InputLayer", "MaskedConv2D", "BatchNormalization", "Flatten", "MaskedDense"]
    pm.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = np.random.default_rng(0).normal(size=(16, 8, 8, 1)).astype("float32")
    pm.fit(x, np.arange(16) % 2, epochs=1, verbose=0, callbacks=[prune.UpdatePruningStep()])
    report = prune.sparsity_report(pm)
    pruned = report[report.status == "pruned"]
    assert list(pruned.layer) == [pm.layers[1].name, pm.layers[4].name]
    assert list(pruned.nnz) == [9, 72]  # 36 -> 9 and 288 -> 72 at 75%
    # Conv2D: 2 FLOPs per multiply-add at each of the 6x6 output positions.
    assert pruned.dense_flops.iloc[0] == 2 * 36 * 36 and pruned.nonzero_flops.iloc[0] == 2 * 9 * 36
    assert prune.unsupported_layers(pm) == []  # BatchNorm has only 1-D weights, nothing to prune
    lstm = keras.Sequential([keras.Input((5, 4, 3)), keras.layers.ConvLSTM1D(4, 2), keras.layers.Flatten(),
                             keras.layers.Dense(2)])
    plstm = prune.prune_low_magnitude(lstm)
    assert type(plstm.layers[0]) is keras.layers.ConvLSTM1D  # left dense, never half-wrapped
    assert prune.unsupported_layers(plstm) == [plstm.layers[0].name]
    assert set(prune.sparsity_report(plstm).status) == {"pruned", "dense (unsupported)"}


def test_report_counts_every_application_of_a_weight():
    """FLOPs per example = 2 x entries x applications, on tiny models where the applications are known exactly."""
    from prune.layers.sparse import SparseDense

    def flops(model):
        report = prune.sparsity_report(model)
        return {(r.layer.split("_")[0], r.weight): r.dense_flops for r in report.itertuples()}

    image = keras.Input((5, 6, 3))
    depthwise = keras.layers.DepthwiseConv2D(2)(image)  # -> 4x5
    separable = keras.layers.SeparableConv2D(2, 3, padding="same", name="separable")(depthwise)  # 4x5 positions
    transposed = keras.layers.Conv2DTranspose(4, 3, strides=2, name="transposed")(separable)  # meets 4x5 inputs
    got = flops(prune.prune_low_magnitude(keras.Model(image, transposed)))
    assert got[("separable", "pointwise_kernel")] == 2 * 6 * 20
    assert got[("transposed", "kernel")] == 2 * 72 * 20

    seq = keras.Input((7, 3))
    lstm = keras.layers.LSTM(4, return_sequences=True, name="lstm")(seq)
    got = flops(prune.prune_low_magnitude(keras.Model(seq, keras.layers.Dense(2, name="dense")(lstm))))
    assert got == {("lstm", "kernel"): 2 * 48 * 7, ("lstm", "recurrent_kernel"): 2 * 64 * 7, ("dense", "kernel"): 2 * 8 * 7}

    query, value = keras.Input((7, 8)), keras.Input((5, 6))
    attention = keras.layers.MultiHeadAttention(2, 3, name="mha")(query, value)
    got = flops(prune.prune_low_magnitude(keras.Model([query, value], attention)))
    assert got == {("mha", "query_kernel"): 2 * 48 * 7, ("mha", "key_kernel"): 2 * 36 * 5,
                   ("mha", "value_kernel"): 2 * 36 * 5, ("mha", "output_kernel"): 2 * 48 * 7}

    sparse = SparseDense.from_dense(np.ones((3, 2), np.float32), np.eye(3, 2), name="sparse")  # built from (None, 3)
    got = flops(keras.Sequential([keras.Input((4, 3)), sparse]))  # then applied to 4 rows per example
    assert got == {("sparse", "kernel"): 2 * 6 * 4}

    # ConvLSTM1D (unsupported): per timestep and per position, which the report does not count: NaN, not a wrong number.
    conv_lstm = keras.Sequential([keras.Input((5, 4, 3)), keras.layers.ConvLSTM1D(4, 2, name="convlstm")])
    assert all(np.isnan(v) for v in flops(prune.prune_low_magnitude(conv_lstm)).values())


@pytest.mark.parametrize("built", [False, True])
def test_subclassed_model(built):
    keras.utils.set_random_seed(0)
    net = Net()
    x, y = mlp_data()
    if built:
        before = net(x).numpy()
    pm = prune.prune_low_magnitude(net, prune.ConstantSparsity(0.5, 0, frequency=1))
    assert pm is net and isinstance(net.fc1, MaskedDense) and isinstance(net.fc2, MaskedDense)
    if built:
        np.testing.assert_array_equal(before, net(x).numpy())
    net.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    net.fit(x, y, epochs=1, batch_size=16, verbose=0, callbacks=[prune.UpdatePruningStep()])
    assert len(net.trainable_weights) == 4  # the replaced plain layers are no longer tracked
    assert (net.fc1.kernel.numpy() == 0).sum() == 12 * 16 // 2
    stripped = prune.strip_pruning(net)
    assert type(stripped.fc1) is keras.layers.Dense


def test_layer_level_wrapping_for_subclassed_models():
    layer = prune.prune_low_magnitude(keras.layers.Conv2D(3, 2), prune.OneShot(0.5, 0))
    assert isinstance(layer, MaskedConv2D) and not layer.built


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(criterion="l3"), r"unknown criterion 'l3'"),
        (dict(scope="network"), r"unknown scope 'network'"),
        (dict(pruning_schedule=3), r"pruning_schedule must be a schedule"),
        (dict(block_size=(2, 0)), r"block_size must be two positive integers \(r, c\), got \(2, 0\)"),
        (dict(block_pooling_type="MIN"), r"block_pooling_type must be 'AVG' or 'MAX', got 'MIN'"),
        (dict(sparsity_m_by_n=(4, 4)), r"sparsity_m_by_n=\(m, n\) needs 0 <= m < n, got \(4, 4\)"),
        (dict(sparsity_m_by_n=(2, 4), block_size=(2, 2)), r"sparsity_m_by_n=\(2, 4\) cannot be combined with block_size"),
        (dict(pattern=prune.Channel(), block_size=(2, 2)), r"give the pattern once"),
        (dict(pattern=prune.NByM(2, 4), scope="global"), r"needs scope='layer', got scope='global'"),
        (dict(seed=1.5), r"seed must be an integer, got 1.5"),
    ],
)
def test_bad_arguments(kwargs, message):
    model = mlp()
    with pytest.raises(ValueError, match=message):
        prune.prune_low_magnitude(model, **kwargs)


def test_bad_targets():
    with pytest.raises(ValueError, match=r"to_prune must be a Keras 3 layer, a list of layers or a model, got numpy"):
        prune.prune_low_magnitude(np.zeros(3))
    with pytest.raises(ValueError, match=r"to_prune is a ConvLSTM2D, which is not prunable"):
        prune.prune_low_magnitude(keras.layers.ConvLSTM2D(2, 3))
    pm = prune.prune_low_magnitude(mlp())
    with pytest.raises(ValueError, match=r"already pruned"):
        prune.prune_low_magnitude(pm.layers[0])


def test_repruning_with_another_schedule_warns_naming_the_layers_that_keep_theirs():
    """tfmot passes already pruned layers through silently; 0.8 asked over 0.5 kept must be said."""
    import warnings

    pm = prune.prune_low_magnitude(mlp(), prune.ConstantSparsity(0.5, 0))
    with pytest.warns(UserWarning, match=r"not applied to layers already pruned.*'fc1' \(ConstantSparsity\(target_sparsity=0.5"):
        again = prune.prune_low_magnitude(pm, prune.ConstantSparsity(0.8, 0))
    assert [layer.pruning_schedule.target_sparsity for layer in prune.prunable_layers(again)] == [0.5, 0.5]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same schedule, or none given, is not a change
        prune.prune_low_magnitude(pm, prune.ConstantSparsity(0.5, 0))
        prune.prune_low_magnitude(pm)


def test_set_mask_validates_before_changing_anything():
    pm = prune.prune_low_magnitude(mlp(), prune.OneShot(0.5, 0))
    layer = pm.layers[0]
    before = layer.kernel.numpy().copy()
    with pytest.raises(ValueError, match=r"must have shape \(12, 16\), got shape \(16, 12\)"):
        layer.set_mask("kernel", np.ones((16, 12)))
    with pytest.raises(ValueError, match=r"only 0 and 1, got values \[2.0\]"):
        layer.set_mask("kernel", np.full((12, 16), 2.0))
    with pytest.raises(ValueError, match=r"weight 'bias' is not prunable"):
        layer.set_mask("bias", np.ones(16))
    np.testing.assert_array_equal(before, layer.kernel.numpy())
    np.testing.assert_array_equal(layer.kernel_mask.numpy(), np.ones((12, 16)))
    mask = np.zeros((12, 16))
    mask[:, :4] = 1
    layer.set_mask("kernel", mask)
    assert (layer.kernel.numpy()[:, 4:] == 0).all() and (layer.kernel.numpy()[:, :4] == before[:, :4]).all()


def test_global_scope_prunes_small_layers_less():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(50, name="a"), keras.layers.Dense(2, name="b")])
    rng = np.random.default_rng(0)
    model.layers[0].kernel.assign(rng.uniform(-1, 1, (4, 50)))
    model.layers[1].kernel.assign(10 + rng.uniform(0, 1, (50, 2)))  # every entry larger than any of layer a
    pm = prune.prune_low_magnitude(model, prune.OneShot(0.5, 0), scope="global")
    prune.update_masks(pm, 0)
    zeros = [int((~l.get_masks()["kernel"]).sum()) for l in pm.layers]
    assert sum(zeros) == int(np.round(0.5 * (200 + 100)))
    assert zeros[1] == 0  # every weight of the large layer survives the global threshold


def test_random_criterion_is_reproducible():
    masks = []
    for _ in range(2):
        pm = prune.prune_low_magnitude(mlp(), prune.OneShot(0.6, 0), criterion="random", seed=7)
        prune.update_masks(pm, 0)
        masks.append(pm.layers[0].get_masks()["kernel"])
    np.testing.assert_array_equal(*masks)
    mag = prune.prune_low_magnitude(mlp(), prune.OneShot(0.6, 0))
    prune.update_masks(mag, 0)
    assert not np.array_equal(masks[0], mag.layers[0].get_masks()["kernel"])


def test_lazily_built_model_gets_its_first_masks():
    model = keras.Sequential([keras.layers.Dense(8), keras.layers.Dense(2)])  # no Input: built in fit
    pm = prune.prune_low_magnitude(model, prune.ConstantSparsity(0.5, 0, frequency=1000))
    pm.compile("sgd", "mse")
    x = np.random.default_rng(0).normal(size=(16, 4)).astype("float32")
    pm.fit(x, x[:, :2], batch_size=8, epochs=1, verbose=0, callbacks=[prune.UpdatePruningStep()])
    assert [int((l.kernel.numpy() == 0).sum()) for l in pm.layers] == [16, 8]


class _Scaled(keras.layers.Dense):
    """A user layer: a Dense whose output is doubled."""

    def call(self, x):
        return 2.0 * super().call(x)


@keras.saving.register_keras_serializable(package="tests")
class _MaskedScaled(prune.PrunableLayer, _Scaled):
    def call(self, x):
        return 2.0 * (keras.ops.matmul(x, self.masked_weight("kernel")) + self.bias)


def test_register_a_user_layer():
    with pytest.raises(ValueError, match=r"masked_class must subclass prune.layers.PrunableLayer"):
        prune.register_prunable(_Scaled, keras.layers.Dense)
    prune.register_prunable(_Scaled, _MaskedScaled)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), _Scaled(6)])
    x = np.ones((2, 4), "float32")
    pm = prune.prune_low_magnitude(model, prune.OneShot(0.5, 0))
    assert isinstance(pm.layers[0], _MaskedScaled)
    np.testing.assert_array_equal(model(x).numpy(), pm(x).numpy())
    prune.update_masks(pm, 0)
    assert int((pm.layers[0].kernel.numpy() == 0).sum()) == 12
    assert type(prune.strip_pruning(pm).layers[0]) is _Scaled


def _nested_model():
    keras.utils.set_random_seed(3)
    inner = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, name="inner_dense"),
                              keras.layers.BatchNormalization(name="inner_bn")], name="inner")
    inp = keras.Input((6,))
    x = inner(inp)
    x = keras.layers.LayerNormalization(name="ln")(x)
    deep_in = keras.Input((8,))
    block = keras.Model(deep_in, keras.layers.Dense(4, name="deep")(deep_in), name="deep_block")  # functional in functional
    return keras.Model(inp, keras.layers.Dense(3, name="head")(block(x)), name="outer")


def test_nested_models_are_pruned_and_share_nothing():
    model = _nested_model()
    x = np.random.default_rng(0).normal(size=(16, 6)).astype("float32")
    y = np.arange(16) % 3
    before = [w.numpy().copy() for w in model.weights]
    pm = prune.prune_low_magnitude(model, prune.ConstantSparsity(0.5, 0, frequency=1))
    np.testing.assert_array_equal(model.predict(x, verbose=0), pm.predict(x, verbose=0))
    assert sorted(l.name for l in prune.prunable_layers(pm)) == ["deep", "head", "inner_dense"]
    assert prune.prunable_layers(model) == []
    original = {id(v) for v in model.weights} | {id(l) for l in prune.core.targets.iter_layers(model)}
    assert not [v.path for v in pm.weights if id(v) in original]
    assert not [l.name for l in prune.core.targets.iter_layers(pm) if id(l) in original]
    pm.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    pm.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[prune.UpdatePruningStep()])
    for a, b in zip(before, model.weights):  # training the pruned model leaves the original alone (BN stats too)
        np.testing.assert_array_equal(a, b.numpy())
    report = prune.sparsity_report(pm)
    assert sorted(report["layer"]) == ["deep", "head", "inner_dense"]
    assert (report["sparsity"] == 0.5).all()
    assert prune.unsupported_layers(pm) == []
    stripped = prune.strip_pruning(pm)
    assert prune.prunable_layers(stripped) == [] and type(stripped.get_layer("inner").layers[0]) is keras.layers.Dense
    np.testing.assert_allclose(stripped.predict(x, verbose=0), pm.predict(x, verbose=0), rtol=1e-6, atol=1e-6)


def test_nested_unsupported_layer_is_reported():
    inner = keras.Sequential([keras.Input((3, 5, 4)), keras.layers.ConvLSTM1D(2, 2, name="clstm")], name="inner")
    inp = keras.Input((3, 5, 4))
    model = keras.Model(inp, keras.layers.Dense(2)(keras.layers.Flatten()(inner(inp))))
    pm = prune.prune_low_magnitude(model)
    assert prune.unsupported_layers(pm) == ["clstm"]
    assert "dense (unsupported)" in set(prune.sparsity_report(pm)["status"])


def test_nested_model_in_subclassed_model_is_replaced_by_a_pruned_copy():
    class Net(keras.Model):
        def __init__(self):
            super().__init__()
            self.body = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5, name="body_dense")])
            self.head = keras.layers.Dense(2)

        def call(self, x):
            return self.head(self.body(x))

    net = Net()
    net(np.zeros((1, 4), "float32"))
    body = net.body
    pm = prune.prune_low_magnitude(net)
    assert pm is net and net.body is not body and isinstance(net.body.layers[0], MaskedDense)
    assert type(body.layers[0]) is keras.layers.Dense


def test_single_layer_keeps_input_shape_and_takes_layer_kwargs():
    layer = prune.prune_low_magnitude(keras.layers.Dense(20, input_shape=(7,)), name="pruned_fc", trainable=False)
    model = keras.Sequential([layer])
    assert model.built and model.input_shape == (None, 7)
    assert layer.name == "pruned_fc" and not layer.trainable
    with pytest.raises(ValueError, match=r"(?s)keyword arguments \['colour'\] do not fit Dense: .*Unrecognized keyword arguments passed to MaskedDense"):
        prune.prune_low_magnitude(keras.layers.Dense(2), colour=1)
    flatten = keras.layers.Flatten()
    passed = prune.prune_low_magnitude(flatten, input_shape=(2, 3))  # a layer with nothing to prune takes them too
    assert passed is not flatten and keras.Sequential([passed]).input_shape == (None, 2, 3)
    with pytest.raises(ValueError, match=r"keyword arguments \['name'\] are forwarded to a single layer only"):
        prune.prune_low_magnitude(mlp(), name="x")


def test_bad_list_and_policy():
    with pytest.raises(ValueError, match=r"a list of Keras 3 layers, got items of type \['int'\]"):
        prune.prune_low_magnitude([keras.layers.Dense(2), 3])
    with pytest.raises(ValueError, match=r"to_prune holds a model"):
        prune.prune_low_magnitude([mlp()])
    with pytest.raises(ValueError, match=r"pruning_policy must be a prune.PruningPolicy, got 'xnn'"):
        prune.prune_low_magnitude(mlp(), pruning_policy="xnn")


def test_training_without_callback_raises_only_for_scheduled_masks():
    x, y = mlp_data(16)
    fixed = prune.convert(mlp(), to="masked")  # masks without a schedule: nothing to drive
    fixed.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    fixed.fit(x, y, verbose=0)
    pm = prune.prune_low_magnitude(mlp(), prune.ConstantSparsity(0.5, 0))
    pm.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.raises(ValueError, match=r"layer 'fc1' is pruned with a schedule but is being trained without"):
        pm.fit(x, y, verbose=0)
    assert prune.get_step(pm) == 0 and not (pm.layers[0].kernel.numpy() == 0).any()
    pm.fit(x, y, verbose=0, callbacks=[prune.UpdatePruningStep()])  # the same model, now with the callback
    assert prune.get_step(pm) == 1 and int((pm.layers[0].kernel.numpy() == 0).sum()) == 96
