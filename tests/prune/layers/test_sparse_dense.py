"""SparseDense: agreement with MaskedDense, bad input, save/load, shrinking under a schedule, trajectories."""

import numpy as np
import pytest
import tensorflow as tf
import keras

import prune
from prune.layers.masked import MaskedDense
from prune.layers.sparse import SparseDense
from prune.layers.optimizer_state import slots_for

SPARSITIES = [0.0, 0.5, 0.9, 0.999]
MATMULS = ["auto", "coo", "csr", "dense"]
OPTIMIZERS = {
    "sgd": lambda: keras.optimizers.SGD(0.05),
    "sgd_momentum": lambda: keras.optimizers.SGD(0.02, momentum=0.9),
    "adam": lambda: keras.optimizers.Adam(0.01),
}


def _weights(n_in, n_out, sparsity, seed=0):
    rng = np.random.default_rng(seed)
    mask = rng.random((n_in, n_out)) >= sparsity
    return rng.standard_normal((n_in, n_out)).astype(np.float32), mask


def _masked_twin(w, mask, bias, **kwargs):
    layer = MaskedDense(w.shape[1], **kwargs)
    layer.build((None, w.shape[0]))
    layer.kernel.assign(w)
    layer.bias.assign(bias)
    layer.set_mask("kernel", mask)
    return layer


@pytest.mark.parametrize("sparsity", SPARSITIES)
@pytest.mark.parametrize("matmul", MATMULS)
def test_forward_and_gradient_match_masked_dense(sparsity, matmul):
    w, mask = _weights(33, 17, sparsity)
    bias = np.linspace(-1, 1, 17).astype(np.float32)
    sparse = SparseDense.from_dense(w, mask, matmul=matmul, bias=bias, activation="tanh")
    masked = _masked_twin(w, mask, bias, activation="tanh")
    x = tf.constant(np.random.default_rng(1).standard_normal((2, 3, 33)).astype(np.float32))  # rank 3 input
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        ys, ym = sparse(x), masked(x)
        ls, lm = tf.reduce_sum(ys**2), tf.reduce_sum(ym**2)
    np.testing.assert_allclose(ys.numpy(), ym.numpy(), rtol=1e-5, atol=1e-6)
    gvals, gbias_s, gx_s = tape.gradient(ls, [sparse.values, sparse.bias, x])
    gkernel, gbias_m, gx_m = tape.gradient(lm, [masked.kernel, masked.bias, x])
    np.testing.assert_allclose(gvals.numpy(), gkernel.numpy()[mask], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gbias_s.numpy(), gbias_m.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gx_s.numpy(), gx_m.numpy(), rtol=1e-5, atol=1e-5)
    assert sparse.nnz == int(mask.sum())


@pytest.mark.parametrize("matmul", MATMULS)
def test_rank2_input_with_and_without_a_static_feature_dim(matmul):
    # [batch, n_in] skips the reshapes; a rank-2 input whose n_in is unknown at trace time takes them.
    w, mask = _weights(33, 17, 0.8)
    sparse = SparseDense.from_dense(w, mask, matmul=matmul, bias=np.linspace(-1, 1, 17).astype(np.float32))
    x = np.random.default_rng(2).standard_normal((5, 33)).astype(np.float32)
    want = x @ (w * mask) + sparse.bias.numpy()
    for spec in (tf.TensorSpec([None, 33], tf.float32), tf.TensorSpec([None, None], tf.float32)):
        fn = tf.function(lambda t: sparse(t), input_signature=[spec])
        y = fn(tf.constant(x))
        np.testing.assert_allclose(y.numpy(), want, rtol=1e-5, atol=1e-5)
        assert fn.get_concrete_function().outputs[0].shape.as_list()[-1] == 17


def test_from_dense_tiny_exact():
    w = np.array([[0.0, 2.0], [3.0, 4.0]], np.float32)
    layer = SparseDense.from_dense(w, [[1, 1], [0, 1]], use_bias=False)
    np.testing.assert_array_equal(layer.indices.numpy(), [[0, 0], [0, 1], [1, 1]])  # row-major
    np.testing.assert_array_equal(layer.values.numpy(), [0.0, 2.0, 4.0])  # a stored zero stays stored
    np.testing.assert_array_equal(layer(np.array([[1.0, 10.0]], np.float32)).numpy(), [[0.0, 42.0]])
    np.testing.assert_array_equal(layer.get_mask(), [[True, True], [False, True]])
    assert [v.name for v in layer.trainable_weights] == ["values"]


def test_unsorted_indices_are_sorted_with_their_values():
    layer = SparseDense.from_sparse([[1, 0], [0, 1]], [5.0, 7.0], (2, 2), use_bias=False)
    np.testing.assert_array_equal(layer.indices.numpy(), [[0, 1], [1, 0]])
    np.testing.assert_array_equal(layer.values.numpy(), [7.0, 5.0])


def test_random_structure_has_exact_sparsity():
    layer = SparseDense(10, sparsity=0.75, seed=3)
    layer.build((None, 8))
    assert layer.nnz == 20
    assert layer.get_mask().sum() == 20
    again = SparseDense(10, sparsity=0.75, seed=3)
    again.build((None, 8))
    np.testing.assert_array_equal(layer.indices.numpy(), again.indices.numpy())


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: SparseDense.from_sparse([[0, 0], [3, 1]], [1.0, 2.0], (3, 2)), r"indices entry \[3, 1\] is out of range"),
        (lambda: SparseDense.from_sparse([[0, 1], [0, 1]], [1.0, 2.0], (3, 2)), r"indices has duplicate entry \[0, 1\]"),
        (lambda: SparseDense.from_sparse([[0, 1]], [1.0, 2.0], (3, 2)), r"indices has 1 entries, values has shape \(2,\)"),
        (lambda: SparseDense.from_sparse([[0, 1]], [1.0], (3, 2), matmul="gemm"), r"matmul must be one of .* got 'gemm'"),
        (lambda: SparseDense(4, matmul="cusparse"), r"matmul must be one of .* got 'cusparse'"),
        (lambda: SparseDense.from_dense(np.ones((2, 2)), np.ones((2, 3))), r"mask must have shape \(2, 2\)"),
        (lambda: SparseDense.from_dense(np.ones((2, 2)), [[0, 2], [1, 1]]), r"mask"),
        (lambda: SparseDense.from_dense(np.array([[1.0, np.nan], [2.0, 3.0]]), np.ones((2, 2))),
         r"weights holds 1 NaN or infinite entries \(the first at \(0, 1\)"),
        (lambda: SparseDense(4, scope="global", pattern=prune.NByM(2, 4)), r"needs scope='layer', got scope='global'"),
        (lambda: SparseDense(0), r"units must be a positive integer, got 0"),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_compact_rejects_growth_before_changing_anything():
    w, mask = _weights(4, 3, 0.5)
    layer = SparseDense.from_dense(w, mask)
    before = layer.values.numpy().copy()
    with pytest.raises(ValueError, match="not stored"):
        layer.compact(np.ones((4, 3)))
    with pytest.raises(ValueError, match=r"keep must have shape"):
        layer.compact(np.ones(layer.nnz + 1))
    np.testing.assert_array_equal(layer.values.numpy(), before)


def _model(layer_in, layer_out, n_in):
    return keras.Sequential([keras.Input((n_in,)), layer_in, layer_out])


def _fit_steps(model, x, y, steps, callbacks):
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(16).repeat()
    hist = model.fit(ds, epochs=steps, steps_per_epoch=1, verbose=0, callbacks=callbacks, shuffle=False)
    return np.array(hist.history["loss"])


@pytest.mark.parametrize("matmul", ["auto", "dense", "csr"])
def test_compact_shrinks_values_indices_and_slots_and_training_continues(matmul):
    # Starting full (0% sparsity) also covers the "dense" kernel's reshape shortcut for a fully
    # stored W: after compaction the compiled step must take the scatter branch.
    w, mask = _weights(12, 8, 0.0)
    layer = SparseDense.from_dense(w, mask, activation="relu", matmul=matmul)
    model = _model(layer, keras.layers.Dense(1), 12)
    model.compile(keras.optimizers.Adam(0.01), "mse")
    rng = np.random.default_rng(2)
    x = rng.standard_normal((64, 12)).astype(np.float32)
    y = x[:, :1]
    _fit_steps(model, x, y, 3, [])
    slots = slots_for(model.optimizer, layer.values)
    assert len(slots) == 2 and all(tuple(s.shape) == (96,) for s in slots)
    keep = np.zeros(96, bool)
    keep[::4] = True
    expected_values = layer.values.numpy()[keep]
    expected_slots = [s.numpy()[keep] for s in slots]
    params_before = model.count_params()
    assert layer.compact(keep, model.optimizer) is True  # static slots replaced: retrace needed
    model.make_train_function(force=True)
    np.testing.assert_array_equal(layer.values.numpy(), expected_values)
    for slot, expected in zip(slots_for(model.optimizer, layer.values), expected_slots):
        np.testing.assert_array_equal(slot.numpy(), expected)
    assert layer.nnz == 24 and tuple(layer.indices.shape) == (24, 2)
    assert model.count_params() < params_before
    losses = _fit_steps(model, x, y, 3, [])
    assert np.isfinite(losses).all()
    # a second compaction reuses the now dynamic variables: no retrace needed
    assert layer.compact(np.arange(24) % 2 == 0, model.optimizer) is False
    _fit_steps(model, x, y, 2, [])
    assert layer.nnz == 12 and tuple(slots_for(model.optimizer, layer.values)[0].shape) == (12,)


def test_stale_compiled_step_fails_loudly_instead_of_training_old_slots():
    w, mask = _weights(6, 4, 0.0)
    layer = SparseDense.from_dense(w, mask)
    model = _model(layer, keras.layers.Dense(1), 6)
    model.compile(keras.optimizers.Adam(0.01), "mse")
    x = np.ones((16, 6), np.float32)
    _fit_steps(model, x, x[:, :1], 1, [])
    layer.compact(np.arange(24) < 10, model.optimizer)  # not retraced on purpose
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError)):
        model.train_function(iter(tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(16)))


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_trajectory_matches_masked_dense_under_schedule(optimizer):
    """Same init, masks, batches and optimizer: the loss curves agree within 1e-4 relative over 100 steps."""
    rng = np.random.default_rng(0)
    w1, w2 = rng.standard_normal((10, 24)).astype(np.float32) * 0.4, rng.standard_normal((24, 3)).astype(np.float32) * 0.3
    b1, b2 = np.zeros(24, np.float32), np.zeros(3, np.float32)
    x = rng.standard_normal((160, 10)).astype(np.float32)
    y = np.tanh(x @ rng.standard_normal((10, 3)).astype(np.float32))
    schedule = prune.PolynomialDecay(0.2, 0.9, begin_step=0, end_step=60, frequency=10)
    ones1, ones2 = np.ones_like(w1, bool), np.ones_like(w2, bool)

    masked = _model(
        _masked_twin(w1, ones1, b1, activation="tanh", pruning_schedule=schedule),
        _masked_twin(w2, ones2, b2, pruning_schedule=schedule),
        10,
    )
    # matmul="native": the compiled kernels (TensorFlow's under PRUNE_NATIVE=0).
    sparse = _model(
        SparseDense.from_dense(w1, ones1, bias=b1, activation="tanh", pruning_schedule=schedule, matmul="native"),
        SparseDense.from_dense(w2, ones2, bias=b2, pruning_schedule=schedule, matmul="native"),
        10,
    )
    masked.compile(OPTIMIZERS[optimizer](), "mse")
    sparse.compile(OPTIMIZERS[optimizer](), "mse")
    loss_masked = _fit_steps(masked, x, y, 100, [prune.UpdatePruningStep()])
    loss_sparse = _fit_steps(sparse, x, y, 100, [prune.UpdatePruningStep()])

    np.testing.assert_allclose(loss_sparse, loss_masked, rtol=1e-4)
    assert loss_masked[-1] < loss_masked[0]  # it trained
    for m_layer, s_layer in zip(masked.layers, sparse.layers):
        mask = m_layer.get_masks()["kernel"]
        np.testing.assert_array_equal(s_layer.get_mask(), mask)
        assert s_layer.nnz == int(mask.sum()) == round(0.1 * mask.size)  # shrunk to 90% sparsity
        np.testing.assert_allclose(s_layer.to_dense(), m_layer.masked_weight("kernel").numpy(), rtol=1e-4, atol=1e-5)
    assert int(sparse.layers[0].pruning_step.numpy()) == 100


def test_update_masks_prunes_sparse_smallest_and_reports():
    w = np.array([[0.1, -0.9], [0.5, -0.2]], np.float32)
    layer = SparseDense.from_dense(w, np.ones((2, 2)), pruning_schedule=prune.OneShot(0.5, 3))
    model = keras.Sequential([keras.Input((2,)), layer])
    none = prune.update_masks(model, 2)
    assert none == [] and not none.retrace
    names = prune.update_masks(model, 3)
    assert names == [f"{layer.name}/kernel"]
    np.testing.assert_array_equal(layer.indices.numpy(), [[0, 1], [1, 0]])
    np.testing.assert_array_equal(layer.values.numpy(), np.float32([-0.9, 0.5]))


def test_training_a_scheduled_layer_without_its_callback_raises_before_any_step():
    """As for masked layers (tfmot's rule): a schedule nobody drives would leave the structure unpruned, silently."""
    w, _ = _weights(6, 4, 0.0)
    model = _model(
        SparseDense.from_dense(w, np.ones((6, 4)), pruning_schedule=prune.OneShot(0.75, 0)),
        SparseDense.from_dense(np.ones((4, 2), np.float32), np.ones((4, 2))),  # no schedule: trains freely
        6,
    )
    model.compile("sgd", "mse")
    before = [v.numpy().copy() for v in model.weights]
    x, y = np.ones((16, 6), np.float32), np.zeros((16, 2), np.float32)
    with pytest.raises(ValueError, match=f"layer '{model.layers[0].name}' is pruned with a schedule.*UpdatePruningStep"):
        _fit_steps(model, x, y, 1, [])
    for a, v in zip(before, model.weights):
        np.testing.assert_array_equal(a, v.numpy())
    _fit_steps(model, x, y, 1, [prune.UpdatePruningStep()])  # with the callback: prunes and trains
    assert model.layers[0].nnz == 6 and int(model.layers[0].pruning_step.numpy()) == 1


@pytest.fixture(scope="module")
def trained_sparse_model():
    w, mask = _weights(9, 7, 0.6)
    model = _model(
        SparseDense.from_dense(w, mask, activation="relu", matmul="csr"), SparseDense(2, sparsity=0.5, seed=1), 9
    )
    model.compile(keras.optimizers.Adam(0.01), "mse")
    x = np.random.default_rng(0).standard_normal((32, 9)).astype(np.float32)
    _fit_steps(model, x, x[:, :2], 2, [])
    model.layers[0].compact(np.arange(model.layers[0].nnz) % 3 != 0, model.optimizer)
    model.make_train_function(force=True)
    _fit_steps(model, x, x[:, :2], 2, [])
    return model, x


def test_keras_save_and_load(tmp_path, trained_sparse_model):
    model, x = trained_sparse_model
    path = tmp_path / "sparse.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    assert isinstance(loaded.layers[0], SparseDense) and loaded.layers[0].matmul == "csr"
    assert loaded.layers[0].nnz == model.layers[0].nnz
    np.testing.assert_array_equal(loaded.layers[0].indices.numpy(), model.layers[0].indices.numpy())
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), model.predict(x, verbose=0))
    # the optimizer state came back too: one more step is identical
    a = _fit_steps(model, x, x[:, :2], 1, [])
    b = _fit_steps(loaded, x, x[:, :2], 1, [])
    np.testing.assert_allclose(a, b, rtol=1e-6)


def test_checkpoint_save_and_restore(tmp_path, trained_sparse_model):
    model, x = trained_sparse_model
    prefix = tf.train.Checkpoint(model=model).save(str(tmp_path / "ckpt"))
    config = model.get_config()
    clone = keras.Sequential.from_config(config)
    assert clone.layers[0].nnz == model.layers[0].nnz
    tf.train.Checkpoint(model=clone).restore(prefix).assert_existing_objects_matched().expect_partial()
    np.testing.assert_array_equal(clone.layers[0].values.numpy(), model.layers[0].values.numpy())
    np.testing.assert_array_equal(clone.layers[0].indices.numpy(), model.layers[0].indices.numpy())
    np.testing.assert_array_equal(clone(x).numpy(), model(x).numpy())


def test_checkpoint_restores_a_longer_structure_after_compaction(tmp_path):
    w, mask = _weights(5, 4, 0.3)
    layer = SparseDense.from_dense(w, mask)
    x = np.random.default_rng(3).standard_normal((2, 5)).astype(np.float32)
    before, nnz = layer(x).numpy(), layer.nnz
    prefix = tf.train.Checkpoint(layer=layer).save(str(tmp_path / "ckpt"))
    layer.compact(np.arange(nnz) < 3)
    assert layer.nnz == 3
    tf.train.Checkpoint(layer=layer).restore(prefix).assert_consumed()
    assert layer.nnz == nnz and tuple(layer.values.shape) == (nnz,)
    np.testing.assert_array_equal(layer.get_mask(), mask)
    np.testing.assert_allclose(layer(x).numpy(), before, rtol=1e-6)


@pytest.fixture
def no_op_determinism():
    """Keras never compiles with XLA while op determinism is on, which the runner's tests leave on in this process."""
    from tensorflow.python.framework import config as tf_config

    was = tf_config.is_op_determinism_enabled()
    tf_config.disable_op_determinism()
    yield
    if was:
        tf_config.enable_op_determinism()


def test_jit_compile_runs_the_dense_kernel_under_xla_and_names_a_kernel_xla_cannot_compile(no_op_determinism):
    """Keras turned XLA off for any SparseDense model, with a warning naming no layer; now XLA runs it."""
    w, mask = _weights(6, 4, 0.5)
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((16, 6)).astype("float32"), rng.standard_normal((16, 4)).astype("float32")

    def fit(matmul: str, jit: bool) -> tuple[keras.Model, SparseDense]:
        layer = SparseDense.from_dense(w, mask, matmul=matmul, name="sd")
        model = keras.Sequential([keras.Input((6,)), layer])
        model.compile(keras.optimizers.SGD(0.1), "mse", jit_compile=jit)
        model.fit(x, y, epochs=2, batch_size=4, shuffle=False, verbose=0)
        return model, layer

    plain, under_xla = fit("dense", False)[1], fit("dense", True)
    assert under_xla[0].jit_compile is True
    np.testing.assert_allclose(under_xla[1].values.numpy(), plain.values.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(fit("auto", True)[1].values.numpy(), plain.values.numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"SparseDense layer 'sd' uses matmul='csr', which XLA cannot compile .* use matmul='dense'"):
        fit("csr", True)
