"""tfmot's own pruning tests, ported to ``prune`` on Keras 3.

Sources: tensorflow/model-optimization, ``tensorflow_model_optimization/python/
core/sparsity/keras/`` ``pruning_schedule_test.py``, ``prune_test.py``,
``pruning_wrapper_test.py``, ``pruning_callbacks_test.py``,
``prune_integration_test.py`` and ``pruning_policy_test.py``. Each test names
the tfmot test it ports. Where ``prune`` differs from tfmot on purpose, the
test checks ``prune``'s behaviour and says so; docs/porting-from-tfmot.md's "Porting from
tfmot" table lists every difference. Models are tiny and train one or a few
steps, so that the file runs in seconds.
"""

from __future__ import annotations

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import prune
from prune.layers import MaskedDense

L = keras.layers
PARAMS = {"pruning_schedule": prune.ConstantSparsity(0.5, 0), "block_size": (1, 1)}


def simple_dense_model() -> keras.Sequential:
    """tfmot's ``keras_test_utils.build_simple_dense_model``."""
    return keras.Sequential([keras.Input((10,)), L.Dense(8, activation="relu"), L.Dense(5, activation="softmax")])


def count_pruned(model) -> int:
    """tfmot's ``_count_pruned_layers``: masked layers, nested models included."""
    return len(prune.prunable_layers(model))


def prunable_weights(model):
    for layer in prune.prunable_layers(model):
        for name in layer.prunable_weight_names:
            yield np.asarray(layer.weight_and_mask(name)[0].numpy())


def assert_model_sparsity(sparsity: float, model, atol: float = 1e-6) -> None:
    """tfmot's ``test_utils.assert_model_sparsity``, and at least one weight checked."""
    weights = list(prunable_weights(model))
    assert weights
    for w in weights:
        np.testing.assert_allclose(1.0 - np.count_nonzero(w) / w.size, sparsity, atol=atol)


def train(model, x, y, epochs=1, batch_size=20, callbacks=None):
    """tfmot's ``_train_model``: compile if needed, add UpdatePruningStep to pruned models."""
    if getattr(model, "optimizer", None) is None:
        model.compile(loss="categorical_crossentropy", optimizer="sgd")
    if callbacks is None:
        callbacks = [prune.UpdatePruningStep()] if prune.is_pruned(model) else []
    model.fit(x, y, epochs=epochs, batch_size=batch_size, callbacks=callbacks, verbose=0)


def dense_data(n=20, seed=0):
    rng = np.random.default_rng(seed)
    return rng.random((n, 10)).astype("float32"), keras.utils.to_categorical(rng.integers(5, size=n), 5)


# --------------------------------------------------------------------------
# pruning_schedule_test.py


def _schedule(kind, begin, end, frequency=10):
    if kind == "constant":
        return prune.ConstantSparsity(0.5, begin, end, frequency)
    return prune.PolynomialDecay(0.2, 0.8, begin, end, 3, frequency)


KINDS = ["constant", "polynomial"]


@pytest.mark.parametrize("kind", KINDS)
def test_schedule_validation(kind):
    """testBeginStepGreaterThanEqualsZero, testEndStepGreaterThanEqualsZero,
    testEndStepGreaterThanEqualsBeginStep, testFrequencyIsPositive."""
    for begin, end, freq in [(-1, 1000, 10), (-5, 1000, 10), (10, -5, 10), (10, 5, 10), (10, 1000, 0), (10, 1000, -1)]:
        with pytest.raises(ValueError):
            _schedule(kind, begin, end, freq)
    for begin, end, freq in [(0, 1000, 10), (1, 1000, 10), (100, 1000, 10), (0, 1, 10), (0, 100, 10), (10, 20, 10),
                             (10, 1000, 1)]:
        _schedule(kind, begin, end, freq)
    for begin, end in [(0, 0), (10, 10)]:
        if kind == "constant":
            _schedule(kind, begin, end)
        else:  # tfmot accepts begin == end for PolynomialDecay and then divides 0 by 0; we refuse (README)
            with pytest.raises(ValueError, match="end_step must be > begin_step"):
                _schedule(kind, begin, end)


@pytest.mark.parametrize("kind", KINDS)
def test_schedule_sparsity_value_is_valid(kind):
    """testSparsityValueIsValid."""
    makers = [lambda s: prune.ConstantSparsity(s, 0)] if kind == "constant" else [
        lambda s: prune.PolynomialDecay(s, 0.8, 0, 10), lambda s: prune.PolynomialDecay(0.2, s, 0, 10)]
    for make in makers:
        for bad in (-0.001, -1.0, -10.0, 1.0, 10.0):
            with pytest.raises(ValueError):
                make(bad)
        for good in (0.0, 0.001, 0.5, 0.99):
            make(good)


@pytest.mark.parametrize("kind", KINDS)
def test_schedule_prunes_only_in_range_and_at_frequency(kind):
    """testPrunesOnlyInBeginEndStepRange, testOnlyPrunesAtValidFrequencySteps (steps as tf.Variable, as there)."""
    s = _schedule(kind, 100, 200, 1)
    assert [s(tf.Variable(t))[0] for t in (90, 99, 100, 110, 200, 201, 210)] == [False, False, True, True, True,
                                                                                   False, False]
    s = _schedule(kind, 100, 200, 10)
    assert [s(tf.Variable(t))[0] for t in (109, 111, 100, 110)] == [False, False, True, True]


def test_constant_sparsity_forever_and_values():
    """testPrunesForeverIfEndStepIsNegativeOne, testPrunesWithConstantSparsity."""
    s = prune.ConstantSparsity(0.5, 0, -1, 10)
    assert s(10000) == (True, 0.5) and s(100000000) == (True, 0.5)
    s = prune.ConstantSparsity(0.5, 100, 200, 10)
    assert [s(t)[1] for t in (100, 110, 200)] == [0.5, 0.5, 0.5]


def test_polynomial_decay_values_and_negative_end():
    """testPolynomialDecay_PrunesCorrectly, testRaisesErrorIfEndStepIsNegative."""
    with pytest.raises(ValueError):
        prune.PolynomialDecay(0.4, 0.8, 10, -1)
    s = prune.PolynomialDecay(0.2, 0.8, 100, 110, 3, 2)
    np.testing.assert_allclose([s(t)[1] for t in (100, 102, 105, 110)], [0.2, 0.4928, 0.725, 0.8], rtol=1e-6)


@pytest.mark.parametrize(
    "schedule", [prune.ConstantSparsity(0.7, 10, 20, 10), prune.PolynomialDecay(0.2, 0.6, 10, 20, 5, 10)]
)
def test_schedule_serialize_deserialize(schedule):
    """testSerializeDeserialize (both classes): Keras's deserializer returns an equal schedule."""
    config = schedule.get_config()
    assert set(config) == {"class_name", "config"} and config["class_name"] == type(schedule).__name__
    again = keras.saving.deserialize_keras_object(
        config, custom_objects={"ConstantSparsity": prune.ConstantSparsity, "PolynomialDecay": prune.PolynomialDecay}
    )
    assert again == schedule and again.__dict__ == schedule.__dict__
    assert keras.saving.deserialize_keras_object(json.loads(json.dumps(config))) == schedule  # registered: no custom_objects


# --------------------------------------------------------------------------
# prune_test.py


def _validate_pruned_layer(original, pruned):
    """``_validate_pruned_layer``: here the pruned layer is the masked twin, not a wrapper around the original."""
    assert isinstance(pruned, prune.PrunableLayer) and isinstance(pruned, type(original))
    assert pruned is not original and pruned.get_config()["units"] == original.get_config()["units"]
    assert pruned.pruning_schedule == PARAMS["pruning_schedule"]


def test_prune_keras_prunable_layer_in_built_sequential():
    """testPruneKerasPrunableLayer."""
    layer = L.Dense(10)
    wrapped = prune.prune_low_magnitude(layer, **PARAMS)
    model = keras.Sequential([wrapped])
    model.build(input_shape=(10, 1))
    _validate_pruned_layer(layer, wrapped)
    assert wrapped.kernel_mask.shape == (1, 10)


def test_prune_keras_non_prunable_layer_passes_through():
    """testPruneKerasNonPrunableLayer: tfmot wraps Dropout with no prunable weight; here it is returned as it is."""
    layer = L.Dropout(0.4)
    assert prune.prune_low_magnitude(layer, **PARAMS) is layer
    for weightless in (L.Flatten(), L.MaxPooling2D(), L.ReLU(), L.BatchNormalization(), L.DepthwiseConv2D(3)):
        assert prune.prune_low_magnitude(weightless, **PARAMS) is weightless


def test_prune_keras_unsupported_layer_raises():
    """testPruneKerasUnsupportedLayer, testPruneCustomNonPrunableLayer."""
    with pytest.raises(ValueError, match="ConvLSTM2D, which is not prunable"):
        prune.prune_low_magnitude(L.ConvLSTM2D(2, (5, 5)), **PARAMS)

    class CustomNonPrunableLayer(L.Dense):
        pass

    with pytest.raises(ValueError, match="CustomNonPrunableLayer, which is not prunable"):
        prune.prune_low_magnitude(CustomNonPrunableLayer(10), **PARAMS)


def test_prune_model_with_unsupported_layer_keeps_it_dense():
    """testPruneModelUnsupportedKerasLayerRaisesError: tfmot raises; here the layer stays dense and is reported."""
    model = keras.Sequential([keras.Input((4, 5, 5, 1)), L.ConvLSTM2D(2, 3), L.Flatten(), L.Dense(3)])
    pruned = prune.prune_low_magnitude(model, **PARAMS)
    assert count_pruned(pruned) == 1
    assert prune.unsupported_layers(pruned) == [model.layers[0].name]


def test_prune_model_valid_layers():
    """testPruneModelValidLayersSuccessful."""
    model = keras.Sequential([L.Dense(10), L.Dropout(0.4), L.Dense(10)])
    pruned = prune.prune_low_magnitude(model, **PARAMS)
    pruned.build(input_shape=(1, 28))
    assert len(model.layers) == len(pruned.layers)
    _validate_pruned_layer(model.layers[0], pruned.layers[0])
    _validate_pruned_layer(model.layers[2], pruned.layers[2])
    assert type(pruned.layers[1]) is L.Dropout


def test_prune_model_keeps_already_pruned_layer():
    """testPruneModelDoesNotWrapAlreadyWrappedLayer: the pruned layer keeps its schedule (copied, not shared)."""
    own = prune.ConstantSparsity(0.9, 3)
    model = keras.Sequential([keras.Input((10,)), L.Dense(10), prune.prune_low_magnitude(L.Dense(10), own)])
    pruned = prune.prune_low_magnitude(model, **PARAMS)
    assert len(model.layers) == len(pruned.layers)
    _validate_pruned_layer(model.layers[0], pruned.layers[0])
    assert type(pruned.layers[1]) is MaskedDense and pruned.layers[1].pruning_schedule == own
    assert pruned.layers[1] is not model.layers[1]
    np.testing.assert_array_equal(pruned.layers[1].kernel.numpy(), model.layers[1].kernel.numpy())


def test_prune_list_of_layers():
    """testPruneValidLayersListSuccessful."""
    layers = [L.Dense(10), L.Dropout(0.4), L.Dense(10)]
    pruned = prune.prune_low_magnitude(layers, **PARAMS)
    assert len(pruned) == 3
    _validate_pruned_layer(layers[0], pruned[0])
    _validate_pruned_layer(layers[2], pruned[2])
    assert pruned[1] is layers[1]
    model = keras.Sequential(pruned)  # test_utils.build_mnist_model('layer_list') does this
    model.build((None, 6))
    assert count_pruned(model) == 2


def test_prune_inference_does_not_need_callback():
    """testPruneInferenceWorks_PruningStepCallbackNotRequired."""
    model = prune.prune_low_magnitude(
        keras.Sequential([keras.Input((100,)), L.Dense(10, activation="relu"), L.Dense(2, activation="sigmoid")]),
        **PARAMS,
    )
    model.compile(loss="categorical_crossentropy", optimizer="sgd", metrics=["accuracy"])
    x = np.random.default_rng(0).random((40, 100)).astype("float32")
    model.predict(x, verbose=0)
    model.evaluate(x, keras.utils.to_categorical(np.arange(40) % 2, 2), verbose=0)
    assert prune.get_step(model) == 0


def test_prune_sequential_model_with_and_without_input():
    """testPruneSequentialModel, testPruneSequentialModelPreservesBuiltState."""
    for model, built in [(keras.Sequential([L.Dense(10), L.Dense(10)]), False),
                         (keras.Sequential([L.Dense(10, input_shape=(10,)), L.Dense(10)]), True)]:
        assert model.built is built
        pruned = prune.prune_low_magnitude(model, **PARAMS)
        assert count_pruned(pruned) == 2 and pruned.built is built and model.built is built
        with prune.prune_scope():
            loaded = keras.models.model_from_json(pruned.to_json())
        assert loaded.built is built and count_pruned(loaded) == 2


def _two_input_model():
    i1, i2 = keras.Input((10,)), keras.Input((10,))
    return keras.Model([i1, i2], L.Add()([L.Dense(10)(i1), L.Dense(10)(i2)]))


def test_prune_functional_model():
    """testPruneFunctionalModel, testPruneFunctionalModelPreservesBuiltState: tfmot counts 3 (it wraps Add too)."""
    model = _two_input_model()
    pruned = prune.prune_low_magnitude(model, **PARAMS)
    assert count_pruned(pruned) == 2 and pruned.built and model.built
    with prune.prune_scope():
        assert keras.models.model_from_json(pruned.to_json()).built


def test_prune_functional_model_with_layer_reused():
    """testPruneFunctionalModelWithLayerReused: the shared layer is pruned once."""
    inp = keras.Input((10,))
    dense = L.Dense(10)
    model = keras.Model(inp, dense(dense(inp)))
    assert count_pruned(prune.prune_low_magnitude(model, **PARAMS)) == 1


def test_prune_model_recursively():
    """testPruneModelRecursively."""
    internal = keras.Sequential([L.Dense(10, input_shape=(10,))])
    original = keras.Sequential([internal, L.Dense(10)])
    pruned = prune.prune_low_magnitude(original, **PARAMS)
    assert count_pruned(pruned) == 2
    assert count_pruned(original) == 0 and pruned.layers[0] is not internal


def test_prune_subclassed_model_is_changed_in_place():
    """testPruneSubclassModel: tfmot raises; here the attribute layers are replaced in place."""

    class TestSubclassedModel(keras.Model):
        def __init__(self):
            super().__init__(name="test_model")
            self.layer1 = L.Dense(10, activation="relu")

        def call(self, inputs):
            return self.layer1(inputs)

    model = TestSubclassedModel()
    assert prune.prune_low_magnitude(model, **PARAMS) is model and isinstance(model.layer1, MaskedDense)


def test_prune_misc_object_raises():
    """testPruneMiscObject."""
    with pytest.raises(ValueError, match="to_prune must be a Keras 3 layer, a list of layers or a model, got builtins.object"):
        prune.prune_low_magnitude(object(), **PARAMS)


@pytest.mark.parametrize("build", [lambda: keras.Sequential([L.Dense(10), L.Dense(10)]), _two_input_model])
def test_strip_pruning_restores_config(build):
    """testStripPruningSequentialModel, testStripPruningFunctionalModel."""
    model = build()
    stripped = prune.strip_pruning(prune.prune_low_magnitude(model, **PARAMS))
    assert count_pruned(stripped) == 0
    # Keras 3's clone_model names the new Input layers afresh; every other layer config is equal.
    plain = lambda m: [layer.get_config() for layer in m.layers if not isinstance(layer, L.InputLayer)]  # noqa: E731
    assert plain(model) == plain(stripped)
    if isinstance(model, keras.Sequential):
        assert model.get_config() == stripped.get_config()


def test_prune_scope_and_checkpoints(tmp_path):
    """testPruneScope_NeededForKerasModel (not needed here, but accepted), testPruneScope_NotNeededForKerasCheckpoint,
    testPruneScope_NotNeededForTF2SavedModel."""
    pruned = prune.prune_low_magnitude(simple_dense_model())
    path = str(tmp_path / "m.keras")
    pruned.save(path)
    keras.models.load_model(path)  # tfmot needs prune_scope() here; our classes are registered
    with prune.prune_scope():
        keras.models.load_model(path)
    weights = str(tmp_path / "m.weights.h5")
    pruned.save_weights(weights)
    same = prune.prune_low_magnitude(simple_dense_model())
    same.load_weights(weights)
    tf.saved_model.save(pruned, str(tmp_path / "saved"))
    tf.saved_model.load(str(tmp_path / "saved"))


# --------------------------------------------------------------------------
# pruning_wrapper_test.py


def _mask_count(model) -> int:
    return sum(len(layer.prunable_weight_names) for layer in prune.prunable_layers(model))


def test_wrapper_dense_embedding_conv2d():
    """testDense, testEmbedding, testConv2D: one mask each."""
    for layer, shape in [(L.Dense(10), (10, 1)), (L.Conv2D(4, (3, 3)), (1, 16, 16, 4))]:
        model = keras.Sequential([prune.prune_low_magnitude(layer, **PARAMS)])
        model.build(input_shape=shape)
        assert _mask_count(model) == 1
    model = keras.Sequential([prune.prune_low_magnitude(L.Embedding(10, 10), input_shape=(10,), **PARAMS)])
    assert model.built and _mask_count(model) == 1


def test_wrapper_prune_model_and_serialize():
    """testPruneModel: 4 masks, and the config survives from_config."""
    model = keras.Sequential([
        prune.prune_low_magnitude(L.Conv2D(32, 5)),
        prune.prune_low_magnitude(L.MaxPooling2D((2, 2), (2, 2))),
        prune.prune_low_magnitude(L.Conv2D(64, 5)),
        prune.prune_low_magnitude(L.MaxPooling2D((2, 2), (2, 2))),
        prune.prune_low_magnitude(L.Flatten()),
        prune.prune_low_magnitude(L.Dense(1024)),
        prune.prune_low_magnitude(L.Dropout(0.4)),
        prune.prune_low_magnitude(L.Dense(10)),
    ])
    model.build(input_shape=(1, 28, 28, 1))
    assert _mask_count(model) == 4
    config = model.get_config()
    again = type(model).from_config(config)
    strip = lambda c: [{k: v for k, v in layer.items() if k != "build_config"} for layer in c["layers"]]  # noqa: E731
    assert strip(config) == strip(again.get_config())


def test_wrapper_custom_layer_non_prunable_raises():
    """testCustomLayerNonPrunable."""

    class CustomLayer(L.Layer):
        def __init__(self):
            super().__init__()
            self.weight = self.add_weight(shape=(16, 32), initializer="random_normal")

        def call(self, inputs):
            return inputs @ self.weight

    layer = CustomLayer()
    layer(keras.Input((16,)))
    with pytest.raises(ValueError, match="not prunable"):
        prune.prune_low_magnitude(layer)


def test_wrapper_collect_prunable_layers():
    """testCollectPrunableLayers: tfmot collects 5 wrappers (3 with nothing to prune); here the LSTM and Dense."""
    model = keras.Sequential([
        keras.Input((None, 4)),
        prune.prune_low_magnitude(L.LSTM(4, dropout=0.5, recurrent_dropout=0.5, return_sequences=True)),
        prune.prune_low_magnitude(L.BatchNormalization()),
        prune.prune_low_magnitude(L.Flatten()),
    ])
    assert [type(layer).__name__ for layer in prune.prunable_layers(model)] == ["MaskedLSTM"]
    assert _mask_count(model) == 2  # kernel and recurrent_kernel


# --------------------------------------------------------------------------
# pruning_callbacks_test.py


def test_callbacks_update_step_and_log_summaries(tmp_path):
    """testUpdatePruningStepsAndLogsSummaries: 3 steps counted, and TensorBoard can read the scalars back."""
    model = prune.prune_low_magnitude(simple_dense_model())
    model.compile(loss="categorical_crossentropy", optimizer="sgd", metrics=["accuracy"])
    x, y = dense_data()
    kernels = []
    snapshot = keras.callbacks.LambdaCallback(on_epoch_begin=lambda e, logs: kernels.append(model.layers[1].kernel.numpy()))
    model.fit(x, y, batch_size=20, epochs=3, verbose=0,
              callbacks=[prune.UpdatePruningStep(), snapshot, prune.PruningSummaries(log_dir=str(tmp_path))])
    assert [int(layer.pruning_step.numpy()) for layer in model.layers] == [3, 3]
    scalars = _read_scalars(tmp_path / "metrics")
    l1, l2 = (layer.name for layer in model.layers)
    # Logged at the start of epochs 1, 2, 3 (steps 0, 1, 2), after that step's mask update (step 0 prunes), as
    # tfmot; and at the end (step 3).
    assert [s for s, _ in scalars[f"{l1}/kernel/sparsity"]] == [0, 1, 2, 3]
    assert [v for _, v in scalars[f"{l1}/kernel/sparsity"]] == [0.5, 0.5, 0.5, 0.5]
    kernel = model.layers[1].kernel.numpy()
    assert scalars[f"{l2}/kernel/threshold"][-1][1] == np.abs(kernel[kernel != 0]).min()  # the smallest kept |w|
    kernel = np.abs(kernels[0]).ravel()  # at the start of epoch 1, before step 0 pruned half of it
    assert scalars[f"{l2}/kernel/threshold"][0][1] == np.sort(kernel)[kernel.size // 2]  # the smallest kept |w|


@pytest.mark.parametrize("summaries_first", [True, False])
def test_pruning_summaries_log_after_the_mask_update_and_the_final_sparsity(tmp_path, summaries_first):
    """tfmot's curve: at the start of an epoch at step k, the masks of the last update at a step <= k (tfmot
    updates inside the step, prune before it), whichever order the callbacks come in; then the final masks."""
    schedule = prune.PolynomialDecay(0.0, 0.9, 0, 12, power=1, frequency=3)
    model = prune.prune_low_magnitude(simple_dense_model(), pruning_schedule=schedule)
    model.compile(loss="categorical_crossentropy", optimizer="sgd")
    callbacks = [prune.PruningSummaries(log_dir=str(tmp_path)), prune.UpdatePruningStep()]
    x, y = dense_data(40)
    model.fit(x, y, batch_size=10, epochs=4, verbose=0, callbacks=callbacks if summaries_first else callbacks[::-1])
    logged = _read_scalars(tmp_path / "metrics")[f"{model.layers[0].name}/kernel/sparsity"]
    n = model.layers[0].kernel.numpy().size
    expected = [(k, round(schedule(k - k % 3)[1] * n) / n) for k in (0, 4, 8, 12, 16)]  # last update at step <= k
    assert [s for s, _ in logged] == [k for k, _ in expected]
    np.testing.assert_allclose([v for _, v in logged], [v for _, v in expected], rtol=1e-6)
    assert logged[3] == (12, pytest.approx(0.9))  # before, step 12 logged step 9's masks: 0.675


def _read_scalars(log_dir):
    """Read event files back with TensorBoard's own reader (tf.compat.v1.train.summary_iterator)."""
    out: dict[str, list] = {}
    files = sorted(os.listdir(log_dir))
    assert files and all(f.startswith("events.out.tfevents") for f in files)
    for name in files:
        for event in tf.compat.v1.train.summary_iterator(str(log_dir / name)):
            for value in event.summary.value:
                assert value.metadata.plugin_data.plugin_name == "scalars"  # what TensorBoard's scalar tab reads
                out.setdefault(value.tag, []).append((event.step, float(tf.make_ndarray(value.tensor))))
    return out


def test_callbacks_custom_training_loop(tmp_path):
    """testUpdatePruningStepsAndLogsSummaries_CustomTrainingLoop and
    PruneIntegrationCustomTrainingLoopTest.testPrunesModel_CustomTrainingLoop_ReachesTargetSparsity,
    as tfmot's guide writes the loop (on_epoch_end(batch=...), the model's optimizer attribute)."""
    model = prune.prune_low_magnitude(simple_dense_model(), pruning_schedule=prune.ConstantSparsity(0.5, 0, frequency=1))
    x, y = dense_data()
    loss = keras.losses.categorical_crossentropy
    optimizer = keras.optimizers.SGD()
    unused_arg = -1
    step_callback = prune.UpdatePruningStep()
    log_callback = prune.PruningSummaries(log_dir=str(tmp_path))
    step_callback.set_model(model)
    log_callback.set_model(model)
    model.optimizer = optimizer
    step_callback.on_train_begin()
    for _ in range(3):
        log_callback.on_epoch_begin(epoch=unused_arg)
        step_callback.on_train_batch_begin(batch=unused_arg)
        with tf.GradientTape() as tape:
            loss_value = keras.ops.mean(loss(y, model(x, training=True)))
        grads = tape.gradient(loss_value, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        step_callback.on_epoch_end(batch=unused_arg)
    assert [int(layer.pruning_step.numpy()) for layer in model.layers] == [3, 3]
    assert_model_sparsity(0.5, model)
    assert os.listdir(tmp_path / "metrics")


def test_callbacks_inference_leaves_step():
    """testUpdatePruningStepsAndLogsSummaries_RunInference: the counter stays at 0 (tfmot: -1, a sentinel)."""
    model = prune.prune_low_magnitude(simple_dense_model())
    model(dense_data()[0])
    assert [int(layer.pruning_step.numpy()) for layer in model.layers] == [0, 0]


def test_callbacks_training_without_callback_raises():
    """testPruneTrainingRaisesError_PruningStepCallbackMissing (+ _CustomTrainingLoop): a ValueError, before any step."""
    model = prune.prune_low_magnitude(simple_dense_model())
    model.compile(loss="categorical_crossentropy", optimizer="sgd")
    before = [w.numpy().copy() for w in model.weights]
    x, y = dense_data()
    with pytest.raises(ValueError, match="without prune.UpdatePruningStep"):
        model.fit(x, y, verbose=0)
    with pytest.raises(ValueError, match="without prune.UpdatePruningStep"):
        with tf.GradientTape():
            model(x, training=True)
    for a, b in zip(before, model.weights):
        np.testing.assert_array_equal(a, b.numpy())


def test_pruning_summaries_log_dir_validation():
    """testPruningSummariesRaisesError_LogDirNotNonEmptyString."""
    for bad in ("", None, object()):
        with pytest.raises(ValueError, match="`log_dir` must be a non-empty string"):
            prune.PruningSummaries(log_dir=bad)


# --------------------------------------------------------------------------
# prune_integration_test.py

INTEGRATION = {"pruning_schedule": prune.ConstantSparsity(0.5, 0, -1, 1), "block_size": (1, 1)}


def test_integration_zero_sparsity_is_no_op():
    """testPrunesZeroSparsity_IsNoOp: same values after training, different variable objects."""
    model = simple_dense_model()
    model2 = simple_dense_model()
    model2.set_weights(model.get_weights())
    pruned = prune.prune_low_magnitude(model2, pruning_schedule=prune.ConstantSparsity(0, 0, frequency=1))
    x, y = dense_data()
    train(model, x, y)
    train(pruned, x, y)
    ids = {id(v) for v in model.weights}
    assert not any(id(v) in ids for v in pruned.weights)
    for a, b in zip(model.trainable_weights, pruned.trainable_weights):
        # tfmot: assertAllClose. Not bitwise here: with a softmax output and SGD the compiled graphs of the plain
        # and the masked model round differently (|diff| ~1e-10; the relu/Adam models of test_api are bitwise).
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-9)


def test_integration_high_sparsity_exact_counts():
    """testPruneWithHighSparsity: tfmot keeps at least one weight per tensor (1 and 1 here); prune keeps exactly
    n - round(0.99 n): 80 - 79 = 1 and 40 - 40 = 0 (README)."""
    model = prune.prune_low_magnitude(simple_dense_model(), pruning_schedule=prune.ConstantSparsity(0.99, 0, frequency=1))
    train(model, *dense_data())
    assert [np.count_nonzero(w) for w in prunable_weights(model)] == [1, 0]


def test_integration_pretrained_model():
    """testPrunePretrainedModel_RemovesOptimizer, _SameInferenceWithoutTraining; _PreservesWeightObjects is the
    other way round here: the pruned model shares no variable with the original (README)."""
    model = simple_dense_model()
    train(model, *dense_data())
    assert model.optimizer is not None
    pruned = prune.prune_low_magnitude(model, **INTEGRATION)
    # tfmot removes the optimizer. Keras 3's clone_model compiles the clone from the original's compile config:
    # a new optimizer, sharing no state (README).
    assert pruned.optimizer is not model.optimizer
    assert int(pruned.optimizer.iterations.numpy()) == 0 and int(model.optimizer.iterations.numpy()) == 1
    x = dense_data(10, seed=1)[0]
    np.testing.assert_array_equal(model.predict(x, verbose=0), pruned.predict(x, verbose=0))
    ids = {id(v) for v in model.weights}
    assert not any(id(v) in ids for v in pruned.weights)


def test_integration_load_weights_then_prune(tmp_path):
    """testLoadTFWeightsThenPrune_SameInferenceWithoutTraining, testPruneThenLoadsKerasWeights_Fails."""
    model = simple_dense_model()
    train(model, *dense_data())
    path = str(tmp_path / "w.weights.h5")
    model.save_weights(path)
    same = simple_dense_model()
    same.load_weights(path)
    pruned = prune.prune_low_magnitude(same, **INTEGRATION)
    x = dense_data(10, seed=1)[0]
    np.testing.assert_array_equal(model.predict(x, verbose=0), pruned.predict(x, verbose=0))
    with pytest.raises(ValueError):
        prune.prune_low_magnitude(simple_dense_model(), **INTEGRATION).load_weights(path)


def _check_strip_matches(model, sparsity, x):
    assert_model_sparsity(sparsity, model)
    stripped = prune.strip_pruning(model)
    np.testing.assert_allclose(model.predict(x, verbose=0), stripped.predict(x, verbose=0), rtol=1e-6, atol=1e-6)


SINGLE_LAYERS = {
    "Conv1D": (lambda: L.Conv1D(4, 2), (3, 6)),
    "Conv2D": (lambda: L.Conv2D(4, (2, 2)), (4, 6, 1)),
    "Conv3D": (lambda: L.Conv3D(2, (3, 3, 3)), (5, 7, 6, 3)),
    "Conv2DTranspose": (lambda: L.Conv2DTranspose(2, (3, 3)), (7, 6, 3)),
    "Conv3DTranspose": (lambda: L.Conv3DTranspose(2, (3, 3, 3)), (5, 7, 6, 3)),
    "SeparableConv1D": (lambda: L.SeparableConv1D(4, 3), (3, 6)),
    "SeparableConv2D": (lambda: L.SeparableConv2D(4, (2, 2)), (4, 6, 1)),
    "Dense": (lambda: L.Dense(4), (6,)),
    "SimpleRNN": (lambda: L.SimpleRNN(10), (3, 4)),
    "GRU": (lambda: L.GRU(10), (3, 4)),
    "LSTM": (lambda: L.LSTM(10), (3, 4)),
}


@pytest.mark.parametrize("name", sorted(SINGLE_LAYERS))
def test_integration_single_layer_reaches_target_sparsity(name):
    """testPrunesSingleLayer_ReachesTargetSparsity (tfmot skips the transposed convs: their weights became NaN there),
    testRNNLayersSingleCell_ReachesTargetSparsity."""
    make, shape = SINGLE_LAYERS[name]
    keras.utils.set_random_seed(0)
    model = keras.Sequential([prune.prune_low_magnitude(make(), input_shape=shape, **INTEGRATION)])
    assert model.built
    model.compile(loss="mse", optimizer="sgd")
    assert_model_sparsity(0.0, model)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, *shape)).astype("float32")
    model.fit(x, rng.normal(size=model.compute_output_shape((8, *shape))), batch_size=8, verbose=0,
              callbacks=[prune.UpdatePruningStep()])
    assert_model_sparsity(0.5, model)
    assert np.isfinite(model.predict(x, verbose=0)).all()
    _check_strip_matches(model, 0.5, x)


def test_integration_rnn_with_cells_reaches_target_sparsity():
    """testRNNLayersWithRNNCellParams_ReachesTargetSparsity: a generic RNN over three stacked cell kinds."""
    layer = L.RNN([L.LSTMCell(10), L.GRUCell(10), L.SimpleRNNCell(10)])
    model = keras.Sequential([prune.prune_low_magnitude(layer, input_shape=(3, 4), **INTEGRATION)])
    model.compile(loss="mse", optimizer="sgd")
    assert_model_sparsity(0.0, model)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 3, 4)).astype("float32")
    model.fit(x, rng.normal(size=(8, 10)), batch_size=8, verbose=0, callbacks=[prune.UpdatePruningStep()])
    assert _mask_count(model) == 6
    assert_model_sparsity(0.5, model)
    _check_strip_matches(model, 0.5, x)


@keras.saving.register_keras_serializable(package="tests")
class MinimalCell(L.Layer):
    """An RNN cell no registry knows."""

    def __init__(self, units=3, **kwargs):
        super().__init__(**kwargs)
        self.units, self.state_size = units, units

    def build(self, input_shape):
        self.kernel = self.add_weight(shape=(input_shape[-1], self.units))

    def call(self, inputs, states):
        out = inputs @ self.kernel + states[0]
        return out, [out]

    def get_config(self):
        return {**super().get_config(), "units": self.units}


def test_rnn_with_an_unknown_cell_stays_dense():
    """tfmot raises for a cell it does not know (unless it implements PrunableLayer); here it stays dense, reported."""

    model = keras.Sequential([keras.Input((3, 4)), L.RNN(MinimalCell(), name="custom_rnn"), L.Dense(2)])
    pruned = prune.prune_low_magnitude(model, **PARAMS)
    assert type(pruned.layers[0]) is L.RNN and count_pruned(pruned) == 1
    assert prune.unsupported_layers(pruned) == ["custom_rnn"]
    with pytest.raises(ValueError, match="RNN, which is not prunable"):
        prune.prune_low_magnitude(L.RNN(MinimalCell()))


def test_integration_embedding_reaches_target_sparsity():
    """testPrunesEmbedding_ReachesTargetSparsity."""
    model = keras.Sequential([
        prune.prune_low_magnitude(L.Embedding(input_dim=10, output_dim=3), input_shape=(5,), **INTEGRATION),
        L.Flatten(),
        L.Dense(1, activation="sigmoid"),
    ])
    model.compile(loss="binary_crossentropy", optimizer="sgd")
    rng = np.random.default_rng(0)
    model.fit(rng.integers(10, size=(32, 5)), rng.integers(2, size=(32, 1)), verbose=0,
              callbacks=[prune.UpdatePruningStep()])
    assert_model_sparsity(0.5, model)
    _check_strip_matches(model, 0.5, rng.integers(10, size=(32, 5)))


def test_integration_nested_model_reaches_target_sparsity():
    """testPruneRecursivelyReachesTargetSparsity (which in tfmot never calls prune_low_magnitude; ported as meant)."""
    internal = keras.Sequential([L.Dense(10, input_shape=(10,))])
    model = prune.prune_low_magnitude(keras.Sequential([internal, L.Flatten(), L.Dense(1)]), **INTEGRATION)
    model.compile(loss="binary_crossentropy", optimizer="sgd")
    rng = np.random.default_rng(0)
    model.fit(rng.integers(10, size=(32, 10)), rng.integers(2, size=(32, 1)), verbose=0,
              callbacks=[prune.UpdatePruningStep()])
    assert count_pruned(model) == 2
    assert_model_sparsity(0.5, model)
    _check_strip_matches(model, 0.5, rng.integers(10, size=(32, 10)).astype("float32"))
    assert np.count_nonzero(internal.layers[0].kernel.numpy()) == 100  # the original is untouched


def test_integration_mha_reaches_target_sparsity():
    """testMHALayerReachesTargetSparsity (smaller)."""
    inp = keras.Input((8, 8))
    out = L.Flatten()(L.MultiHeadAttention(num_heads=2, key_dim=4)(query=inp, value=inp))
    model = prune.prune_low_magnitude(keras.Model(inp, out), **INTEGRATION)
    model.compile(optimizer=keras.optimizers.Adam(1e-4), loss="mse")
    assert_model_sparsity(0.0, model)
    rng = np.random.default_rng(0)
    x = rng.uniform(size=(16, 8, 8)).astype("float32")
    model.fit(x, rng.normal(size=(16, 64)), batch_size=16, verbose=0, callbacks=[prune.UpdatePruningStep()])
    assert_model_sparsity(0.5, model)
    assert _mask_count(model) == 4
    _check_strip_matches(model, 0.5, x)


@pytest.mark.parametrize("model_type", ["layer_list", "sequential", "functional"])
def test_integration_mnist_model_reaches_target_sparsity(model_type):
    """testPrunesMnist_ReachesTargetSparsity (test_utils.build_mnist_model, smaller)."""
    layers = [L.Conv2D(4, 5, activation="relu"), L.MaxPooling2D((2, 2), (2, 2)), L.Flatten(), L.Dense(10)]
    if model_type == "layer_list":
        model = keras.Sequential([keras.Input((12, 12, 1)), *prune.prune_low_magnitude(layers, **INTEGRATION)])
    elif model_type == "sequential":
        model = prune.prune_low_magnitude(keras.Sequential([keras.Input((12, 12, 1)), *layers]), **INTEGRATION)
    else:
        inp = keras.Input((12, 12, 1))
        x = inp
        for layer in layers:
            x = layer(x)
        model = prune.prune_low_magnitude(keras.Model(inp, x), **INTEGRATION)
    model.compile(loss="categorical_crossentropy", optimizer="sgd")
    assert_model_sparsity(0.0, model)
    rng = np.random.default_rng(0)
    x = rng.random((16, 12, 12, 1)).astype("float32")
    model.fit(x, keras.utils.to_categorical(rng.integers(10, size=16), 10), verbose=0,
              callbacks=[prune.UpdatePruningStep()])
    assert_model_sparsity(0.5, model)
    _check_strip_matches(model, 0.5, x)


@pytest.mark.parametrize("begin_end", [(1, 4), (0, 2)])
def test_integration_stop_and_restart_preserves_sparsity(tmp_path, begin_end):
    """testPruneStopAndRestart_PreservesSparsity, testPruneWithPolynomialDecayPastEndStep_PreservesSparsity
    (save_restore_fns: the .keras file)."""
    begin, end = begin_end
    model = prune.prune_low_magnitude(
        simple_dense_model(), pruning_schedule=prune.PolynomialDecay(0.2, 0.6, begin, end, 3, 1)
    )
    model.compile(loss="categorical_crossentropy", optimizer="sgd")
    assert_model_sparsity(0.0, model)
    x, y = dense_data()
    if begin == 1:
        train(model, x, y, epochs=1)  # 1 step: the first update (step 1) is still ahead
        assert_model_sparsity(0.0, model)  # tfmot: 0.2 -- its first update runs on step 1 (README: one-step shift)
        train(model, x, y, epochs=1)
        assert_model_sparsity(0.2, model)
    else:
        train(model, x, y, epochs=3)
        assert_model_sparsity(0.6, model)
    path = str(tmp_path / "m.keras")
    model.save(path)
    model = keras.models.load_model(path)
    train(model, x, y, epochs=3)
    assert_model_sparsity(0.6, model)
    _check_strip_matches(model, 0.6, x)


# --------------------------------------------------------------------------
# pruning_policy_test.py

XNN = prune.PruneForLatencyOnXNNPack


def _xnn_start(x, filters=16):
    x = L.ZeroPadding2D(padding=1)(x)
    return L.Conv2D(filters=filters, kernel_size=(3, 3), strides=(2, 2), padding="valid")(x)


def test_policy_no_start_layer():
    """testPruneUnsupportedModelForLatencyOnXNNPackPolicyNoStartLayer."""
    i = keras.Input((8, 8, 3))
    x = L.Conv2D(16, (3, 3), strides=(2, 2), padding="same")(i)
    model = keras.Model(i, L.GlobalAveragePooling2D()(L.Conv2D(16, [1, 1])(x)))
    with pytest.raises(ValueError) as e:
        prune.prune_low_magnitude(model, pruning_policy=XNN(), **PARAMS)
    assert str(e.value) == (
        "Could not find `Conv2D 3x3` layer with stride 2x2, `input filters == 3` and `VALID` padding and preceding "
        "`ZeroPadding2D` with `padding == 1` in all input branches of the model"
    )


def test_policy_no_stop_and_unsupported_middle_layer():
    """testPruneUnsupportedModelForLatencyOnXNNPackPolicyNoStopLayer, ...MiddleLayer."""
    i = keras.Input((8, 8, 3))
    x = L.Conv2D(16, [1, 1])(_xnn_start(i))
    with pytest.raises(ValueError, match=r"^Could not find a `GlobalAveragePooling2D` layer in all output branches$"):
        prune.prune_low_magnitude(keras.Model(i, L.AveragePooling2D(2)(x)), pruning_policy=XNN(), **PARAMS)
    y = L.GlobalAveragePooling2D()(L.MaxPooling2D((2, 2), (2, 2))(x))
    with pytest.raises(ValueError, match=r"^Layer MaxPooling2D is not supported for the PruneForLatencyOnXNNPack"):
        prune.prune_low_magnitude(keras.Model(i, y), pruning_policy=XNN(), **PARAMS)


def test_policy_sequential_model():
    """testPruneSequentialModelForLatencyOnXNNPackPolicy."""
    layers = lambda: [L.ZeroPadding2D(padding=1), L.Conv2D(4, (3, 3), strides=(2, 2), padding="valid"),  # noqa: E731
                      L.DepthwiseConv2D(kernel_size=(3, 3), padding="same"), L.Conv2D(8, [1, 1]),
                      L.GlobalAveragePooling2D()]
    with pytest.raises(ValueError, match=r"^Unbuilt models are not supported currently.$"):
        prune.prune_low_magnitude(keras.Sequential(layers()), pruning_policy=XNN(), **PARAMS)
    pruned = prune.prune_low_magnitude(keras.Sequential([keras.Input((8, 8, 3)), *layers()]), pruning_policy=XNN(),
                                       **PARAMS)
    assert count_pruned(pruned) == 1 and type(pruned.layers[3]).__name__ == "MaskedConv2D"


def test_policy_functional_models():
    """testPruneFunctionalModelWithLayerReusedForLatencyOnXNNPackPolicy, testFunctionalModelNoPruningLayers...,
    testFunctionalModelWithTFOps... (Keras ops instead of TF ops), testFunctionalModelForLatencyOnDoubleXNNPackPolicy."""
    i = keras.Input((8, 8, 3))
    x = _xnn_start(i)
    conv = L.Conv2D(16, [1, 1])
    model = keras.Model(i, L.GlobalAveragePooling2D()(conv(conv(x))))
    pruned = prune.prune_low_magnitude(model, pruning_policy=XNN(), **PARAMS)
    assert count_pruned(pruned) == 1
    assert count_pruned(prune.prune_low_magnitude(pruned, pruning_policy=XNN(), **PARAMS)) == 1

    i = keras.Input((8, 8, 3))  # a new input for each model: Keras 3 keeps every call in the layer's nodes
    x = L.Activation("relu")(L.DepthwiseConv2D(kernel_size=(3, 3), padding="same")(_xnn_start(i)))
    model = keras.Model(i, L.GlobalAveragePooling2D()(x))
    assert count_pruned(prune.prune_low_magnitude(model, pruning_policy=XNN(), **PARAMS)) == 0

    i = keras.Input((8, 8, 3))
    x = _xnn_start(i)
    residual = L.Conv2D(16, [1, 1])(x)
    x = ((x + residual) - residual) * residual
    model = keras.Model(i, L.GlobalAveragePooling2D()(x))
    assert count_pruned(prune.prune_low_magnitude(model, pruning_policy=XNN(), **PARAMS)) == 1


def test_policy_two_branch_model():
    """testFunctionalModelForLatencyOnXNNPackPolicy: 6 pruned 1x1 convolutions."""
    i1 = keras.Input((16, 16, 3))
    x1 = _xnn_start(i1)
    x1 = L.Add()([L.DepthwiseConv2D(kernel_size=(3, 3), padding="same")(x1), L.Conv2D(16, [1, 1])(x1)])
    i2 = keras.Input((16, 16, 3))
    x2 = L.ZeroPadding2D(padding=1)(_xnn_start(i2, filters=8))
    x2 = L.DepthwiseConv2D(kernel_size=(3, 3), strides=(2, 2), padding="valid")(x2)
    x2_1 = L.Activation("sigmoid")(L.Conv2D(32, [1, 1])(L.GlobalAveragePooling2D(keepdims=True)(x2)))
    x2_2 = L.UpSampling2D(interpolation="bilinear")(L.Conv2D(32, [1, 1])(x2))
    x2 = L.Conv2D(16, [1, 1])(L.Multiply()([x2_1, x2_2]))
    x = L.GlobalAveragePooling2D(keepdims=True)(L.Add()([x1, x2]))
    model = keras.Model([i1, i2], [L.Conv2D(7, [1, 1])(x), L.Conv2D(3, [1, 1])(x)])
    assert count_pruned(prune.prune_low_magnitude(model, pruning_policy=XNN(), **PARAMS)) == 6


def test_policy_only_for_graph_models():
    """tfmot ignores pruning_policy for a layer or a list; here that is an error naming the argument."""
    with pytest.raises(ValueError, match="pruning_policy applies to Sequential and functional models only"):
        prune.prune_low_magnitude(L.Conv2D(2, 1), pruning_policy=XNN())



def test_new_layer_kinds_save_load_and_strip(tmp_path):
    """Each masked layer kind beyond Dense/Conv/Embedding keeps masks, weights and outputs through .keras files."""
    rng = np.random.default_rng(0)
    for name in ("Conv3D", "Conv2DTranspose", "SeparableConv1D", "GRU"):  # one per masking mechanism
        make, shape = SINGLE_LAYERS[name]
        keras.utils.set_random_seed(0)
        model = prune.prune_low_magnitude(keras.Sequential([keras.Input(shape), make()]), prune.OneShot(0.5, 0))
        prune.update_masks(model, 0)
        x = rng.normal(size=(2, *shape)).astype("float32")
        path = str(tmp_path / f"{name}.keras")
        model.save(path)
        loaded = keras.models.load_model(path)
        assert type(loaded.layers[0]) is type(model.layers[0]), name
        np.testing.assert_array_equal(model.predict(x, verbose=0), loaded.predict(x, verbose=0), err_msg=name)
        for (k, a), (_, b) in zip(sorted(model.layers[0].get_masks().items()), sorted(loaded.layers[0].get_masks().items())):
            assert a.sum() * 2 == a.size and np.array_equal(a, b), (name, k)


# --------------------------------------------------------------------------
# Porting defects found by running tfmot's guides and tests against prune (issue 23), each failing before its fix.


class NoKwargsPrunable(L.Layer):
    """A custom layer as tfmot's guide writes one: its ``__init__`` takes no ``trainable``/``dtype``/``name``."""

    def __init__(self, units=4):
        super().__init__()
        self.units = units

    def build(self, input_shape):
        self.w = self.add_weight(shape=(input_shape[-1], self.units), initializer="glorot_uniform")

    def call(self, inputs):
        return inputs @ self.w

    def get_prunable_weights(self):
        return [self.w]


def _fit_one_step(model, x, y, **callback_kwargs):
    model.compile(loss="mse", optimizer="sgd")
    model.fit(x, y, batch_size=len(x), epochs=1, verbose=0, callbacks=[prune.UpdatePruningStep(**callback_kwargs)])


def test_custom_layer_whose_init_takes_no_keras_arguments_is_wrapped_itself():
    """Copying it through get_config/from_config raised Keras's TypeError; tfmot wraps the object, so does prune."""
    layer = NoKwargsPrunable()
    with pytest.raises(TypeError):
        NoKwargsPrunable.from_config(layer.get_config())  # why a copy cannot work
    wrapped = prune.prune_low_magnitude(layer, **INTEGRATION)
    assert isinstance(wrapped, prune.PruneLowMagnitude) and wrapped.layer is layer
    original = keras.Sequential([keras.Input((6,)), NoKwargsPrunable(), L.Dense(2)])
    with pytest.warns(prune.PruningWarning, match="cannot be copied"):
        model = prune.prune_low_magnitude(original, **INTEGRATION)
    assert model.layers[0].layer is original.layers[0]  # shared, as tfmot shares it (the warning says so)
    rng = np.random.default_rng(0)
    _fit_one_step(model, rng.normal(size=(4, 6)).astype("float32"), rng.normal(size=(4, 2)))
    assert_model_sparsity(0.5, model)


class UnregisteredCell(MinimalCell):
    """MinimalCell under a name registered with nobody: Keras cannot rebuild an RNN over it from its config."""


def test_rnn_over_an_unregistered_cell_stays_dense_in_a_pruned_model():
    """Copying the kept RNN through its config raised Keras's TypeError; it is now kept as the object, as in tfmot."""
    model = keras.Sequential([keras.Input((3, 4)), L.RNN(UnregisteredCell(), name="rnn"), L.Dense(2)])
    with pytest.warns(prune.PruningWarning):
        pruned = prune.prune_low_magnitude(model, **PARAMS)
    assert pruned.layers[0] is model.layers[0] and count_pruned(pruned) == 1


def _depthwise_only_model():
    return keras.Sequential([keras.Input((4, 4, 2)), L.DepthwiseConv2D(3), L.GlobalAveragePooling2D()])


def test_update_pruning_step_does_nothing_on_a_model_with_nothing_to_prune():
    """tfmot's callback does nothing there; prune's raised ValueError (DepthwiseConv2D only, or a policy pruning
    nothing)."""
    rng = np.random.default_rng(0)
    model = prune.prune_low_magnitude(_depthwise_only_model(), **PARAMS)
    assert count_pruned(model) == 0
    _fit_one_step(model, rng.normal(size=(2, 4, 4, 2)).astype("float32"), rng.normal(size=(2, 2)))
    i = keras.Input((8, 8, 3))
    x = L.DepthwiseConv2D(kernel_size=(3, 3), padding="same")(_xnn_start(i))
    model = prune.prune_low_magnitude(keras.Model(i, L.GlobalAveragePooling2D()(x)), pruning_policy=XNN(), **PARAMS)
    assert count_pruned(model) == 0
    _fit_one_step(model, rng.normal(size=(2, 8, 8, 3)).astype("float32"), rng.normal(size=(2, 16)))


class PrunableCell(L.Layer):
    """An RNN cell implementing tfmot's get_prunable_weights()."""

    def __init__(self, units=3, **kwargs):
        super().__init__(**kwargs)
        self.units, self.state_size = units, units

    def build(self, input_shape):
        self.kernel = self.add_weight(shape=(input_shape[-1], self.units), name="kernel")
        self.recurrent = self.add_weight(shape=(self.units, self.units), name="recurrent")

    def call(self, inputs, states, training=None):
        out = keras.ops.tanh(inputs @ self.kernel + states[0] @ self.recurrent)
        return out, [out]

    def get_prunable_weights(self):
        return [self.kernel]


def test_rnn_over_a_custom_cell_with_get_prunable_weights_is_pruned():
    """tfmot prunes an RNN whose cells are known or implement get_prunable_weights(); prune called it "not
    prunable" on its own, and inside a model fit failed with "multiple values for argument 'training'"."""
    wrapped = prune.prune_low_magnitude(L.RNN([PrunableCell(), L.SimpleRNNCell(3)]), **INTEGRATION)
    assert isinstance(wrapped, prune.PruneLowMagnitude)
    model = prune.prune_low_magnitude(
        keras.Sequential([keras.Input((5, 4)), L.RNN(PrunableCell(4), name="rnn"), L.Dense(2)]), **INTEGRATION
    )
    rnn = model.layers[0]
    assert isinstance(rnn, prune.PruneLowMagnitude) and rnn.prunable_weight_names == ("kernel",)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 5, 4)).astype("float32")
    _fit_one_step(model, x, rng.normal(size=(4, 2)))
    assert_model_sparsity(0.5, model)
    _check_strip_matches(model, 0.5, x)


def test_policy_accepts_keras_identity_layers():
    """XNNPACK runs identity; tfmot accepts it, prune rejected keras.layers.Identity."""
    i = keras.Input((8, 8, 3))
    x = L.Identity()(L.Conv2D(16, [1, 1])(_xnn_start(i)))
    model = keras.Model(i, L.GlobalAveragePooling2D()(x))
    assert count_pruned(prune.prune_low_magnitude(model, pruning_policy=XNN(), **PARAMS)) == 1


def test_block_rejects_weights_that_are_not_2d_as_tfmot():
    """tfmot's Pruning._validate_block refuses every weight whose rank is not 2; prune squeezed a (1, 4, 4) kernel."""
    layer = prune.prune_low_magnitude(L.Conv1D(4, 1), block_size=(2, 2))
    with pytest.raises(ValueError, match=r"block_size=\(2, 2\) needs a 2-D weight.*shape \(1, 4, 4\)"):
        keras.Sequential([keras.Input((3, 4)), layer])
    with pytest.raises(ValueError, match=r"shape \(1, 4, 4\)"):
        prune.Block((2, 2)).select(np.ones((1, 4, 4)), 0.5)


# --------------------------------------------------------------------------
# Documented differences users trip on (issue 23): each now warns, or has an option.


def test_unsupported_layers_left_dense_warn():
    """The model ends less sparse than its target: say which layers stay dense."""
    model = keras.Sequential([keras.Input((4, 5, 5, 1)), L.ConvLSTM2D(2, 3, name="clstm"), L.Flatten(), L.Dense(3)])
    with pytest.warns(prune.PruningWarning, match=r"1 layer\(s\) with weights stay dense.*'clstm'"):
        prune.prune_low_magnitude(model, **PARAMS)


def test_keep_one_is_tfmot_rule_and_exact_counts_warn_when_a_weight_is_emptied():
    """testPruneWithHighSparsity: tfmot keeps max(round((1 - s) n), 1) entries; keep_one=True does the same."""
    model = prune.prune_low_magnitude(simple_dense_model(), pruning_schedule=prune.ConstantSparsity(0.99, 0, frequency=1))
    with pytest.warns(prune.PruningWarning, match=r"prunes every entry of .*kernel.*keep_one=True"):
        train(model, *dense_data())
    model = prune.prune_low_magnitude(simple_dense_model(), pruning_schedule=prune.ConstantSparsity(0.99, 0, frequency=1),
                                      pattern=prune.Unstructured(keep_one=True))
    train(model, *dense_data())
    assert [np.count_nonzero(w) for w in prunable_weights(model)] == [1, 1]
    assert prune.Block((2, 2), keep_one=True).select(np.ones((4, 4)), 0.99).sum() == 4  # one block
    with pytest.raises(ValueError, match="keep_one.*scope='layer'.*scope='global'"):
        prune.prune_low_magnitude(simple_dense_model(), pattern=prune.Unstructured(keep_one=True), scope="global")


def test_step_alignment_tfmot_reproduces_tfmot_update_steps():
    """tfmot asks its schedule about step k + 1 during batch k: the PolynomialDecay(0.2, 0.6, 1, 4, 3, 1) of
    testPruneStopAndRestart_PreservesSparsity gives 0.2 after one step there, 0.0 with prune's default."""
    x, y = dense_data()
    for alignment, expected in (("prune", 0.0), ("tfmot", 0.2)):
        model = prune.prune_low_magnitude(simple_dense_model(), pruning_schedule=prune.PolynomialDecay(0.2, 0.6, 1, 4, 3, 1))
        model.compile(loss="categorical_crossentropy", optimizer="sgd")
        model.fit(x, y, batch_size=20, epochs=1, verbose=0, callbacks=[prune.UpdatePruningStep(step_alignment=alignment)])
        assert_model_sparsity(expected, model)
    with pytest.raises(ValueError, match="step_alignment must be 'prune' or 'tfmot', got 'keras'"):
        prune.UpdatePruningStep(step_alignment="keras")


def test_second_fit_reusing_the_compiled_step_without_callback_raises():
    """The compiled step of a fit that had the callback refuses to run without it, before any step."""
    model = prune.prune_low_magnitude(simple_dense_model(), **INTEGRATION)
    x, y = dense_data()
    train(model, x, y)
    before = [w.numpy().copy() for w in model.weights]
    with pytest.raises(ValueError, match="without prune.UpdatePruningStep"):
        model.fit(x, y, batch_size=20, verbose=0)  # the same batch shape: Keras reuses the compiled step
    for a, b in zip(before, model.weights):
        np.testing.assert_array_equal(a, b.numpy())
    train(model, x, y)  # with the callback again: trains
    assert prune.get_step(model) == 2


def test_schedule_that_can_never_reach_its_final_sparsity_warns():
    """end_step - begin_step < frequency: the only update is at begin_step, at initial_sparsity."""
    with pytest.warns(prune.PruningWarning, match=r"only at begin_step=0.*final_sparsity=0.8 is never reached"):
        prune.PolynomialDecay(0.2, 0.8, 0, 50)  # frequency=100


def test_custom_layer_wrapper_keeps_input_shape():
    """tfmot's wrapper passes the layer's input_shape on, so Sequential([wrapper]) is built."""
    model = keras.Sequential([prune.prune_low_magnitude(CustomWithShape(input_shape=(6,)), **PARAMS)])
    assert model.built and model.layers[0].built


class CustomWithShape(L.Layer):
    def build(self, input_shape):
        self.w = self.add_weight(shape=(input_shape[-1], 3))

    def call(self, inputs):
        return inputs @ self.w

    def get_prunable_weights(self):
        return [self.w]
