"""prune.oneshot on real Keras models: sequential calibration (each layer sees the pruned layers before it), every
layer kind it prunes (Dense, Conv1D, Conv2D, MultiHeadAttention projections), an ordinary pruned model as the
result (fine-tuning keeps the mask, convert, strip, save and load), and bad input refused before any change."""

import numpy as np
import pytest

import keras
import prune
from prune.algorithms.sparsegpt import sparsegpt_prune
from prune.core.targets import mask_targets


def _mlp(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((12,)), keras.layers.Dense(16, activation="relu", name="d0"),
                             keras.layers.Dense(8, activation="relu", name="d1"), keras.layers.Dense(3, name="out")])


def _transformerish(seed=0):
    keras.utils.set_random_seed(seed)
    inp = keras.Input((10, 16))
    x = keras.layers.Dense(32, activation="relu", name="d0")(inp)
    a = keras.layers.MultiHeadAttention(4, 8, name="mha")(x, x)
    x = keras.layers.LayerNormalization(name="ln")(keras.layers.Add()([x, a]))
    c = keras.layers.Conv1D(12, 3, padding="causal", name="c1")(x)
    i = keras.layers.Reshape((10, 3, 4))(c)
    c2 = keras.layers.Conv2D(4, 3, strides=2, padding="same", name="c2")(i)
    y = keras.layers.Dense(5, name="out")(keras.layers.Flatten()(c2))
    return keras.Model(inp, y)


def _weights(model):
    return [np.array(w) for w in model.get_weights()]


@pytest.mark.parametrize("method", ["magnitude", "wanda", "sparsegpt"])
@pytest.mark.parametrize("pattern", [None, prune.NByM(2, 4)])
def test_every_layer_kind_is_pruned_exactly_and_the_original_is_untouched(method, pattern):
    model = _transformerish()
    x = np.random.default_rng(0).standard_normal((24, 10, 16)).astype("float32")
    before = _weights(model)
    pruned = prune.oneshot(model, x, None if pattern else 0.5, method, pattern=pattern, batch_size=8)
    keys = [t.key for t in mask_targets(pruned)]
    assert keys == ["d0/kernel", "mha/query_kernel", "mha/key_kernel", "mha/value_kernel", "mha/output_kernel",
                    "c1/kernel", "c2/kernel", "out/kernel"]
    for t in mask_targets(pruned):
        w, keep = np.asarray(t.weight), np.asarray(t.keep)
        assert np.all(w[~keep] == 0.0) and np.all(np.asarray(t.variable)[~keep] == 0.0), t.key
        assert (~keep).sum() == round(0.5 * keep.size), t.key  # every d_in here is a multiple of 4
    for a, b in zip(before, _weights(model)):
        np.testing.assert_array_equal(a, b)  # a clone was pruned
    if method == "sparsegpt":  # its reconstruction helps even on random weights and inputs (Wanda's needs real ones)
        err = np.linalg.norm(np.asarray(pruned(x)) - np.asarray(model(x)))
        plain = prune.oneshot(model, None, None if pattern else 0.5, "magnitude", pattern=pattern)
        assert err < np.linalg.norm(np.asarray(plain(x)) - np.asarray(model(x)))


def test_calibration_is_sequential_each_layer_sees_the_pruned_layers_before_it():
    """SparseGPT by hand, layer after layer, on the outputs of the already pruned layers: the same weights."""
    model = _mlp()
    x = np.random.default_rng(1).standard_normal((50, 12)).astype("float32")
    pruned = prune.oneshot(model, x, 0.5, "sparsegpt", batch_size=16, blocksize=8)
    h = x.astype(np.float64)
    for layer, got in zip(model.layers, pruned.layers):
        w, b = np.asarray(layer.kernel, np.float64), np.asarray(layer.bias, np.float64)
        keep, new = sparsegpt_prune(w, h.T @ h, 0.5, blocksize=8)
        np.testing.assert_array_equal(np.asarray(got.kernel_mask) == 1.0, keep)
        np.testing.assert_allclose(np.asarray(got.kernel), new, rtol=1e-4, atol=1e-5)
        h = h @ (new.astype(np.float32).astype(np.float64)) + b
        if layer.activation is keras.activations.relu:
            h = np.maximum(h, 0.0)


def test_the_result_fine_tunes_converts_strips_saves_and_loads(tmp_path):
    model = _mlp()
    rng = np.random.default_rng(2)
    x, y = rng.standard_normal((64, 12)).astype("float32"), rng.integers(0, 3, 64)
    for pattern in (None, prune.NByM(2, 4)):
        pruned = prune.oneshot(model, x, None if pattern else 0.5, "wanda", pattern=pattern, scope="layer")
        masks = [np.asarray(t.keep).copy() for t in mask_targets(pruned)]
        pruned.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        pruned.fit(x, y, epochs=2, batch_size=16, verbose=0, callbacks=[prune.UpdatePruningStep()])
        for t, mask in zip(mask_targets(pruned), masks):
            np.testing.assert_array_equal(np.asarray(t.keep), mask)  # ConstantSparsity re-selects the same mask
            assert np.all(np.asarray(t.weight)[~mask] == 0.0)
    path = tmp_path / "oneshot.keras"
    pruned.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_allclose(np.asarray(loaded(x)), np.asarray(pruned(x)), rtol=1e-6, atol=1e-6)
    stripped = prune.strip_pruning(pruned)
    sparse = prune.convert(pruned, to="sparse", matmul="dense")
    for other in (stripped, sparse):
        np.testing.assert_allclose(np.asarray(other(x)), np.asarray(pruned(x)), rtol=1e-5, atol=1e-5)


def test_layers_picks_what_is_pruned_and_names_what_is_left_dense():
    model = _mlp()
    x = np.ones((4, 12), "float32")
    pruned = prune.oneshot(model, x, 0.5, "wanda", layers=["d0", "d1"])
    assert [t.key for t in mask_targets(pruned)] == ["d0/kernel", "d1/kernel"]
    assert type(pruned.get_layer("out")).__name__ == "Dense"
    pruned = prune.oneshot(model, x, 0.5, "magnitude", layers="d.*")
    assert [t.key for t in mask_targets(pruned)] == ["d0/kernel", "d1/kernel"]
    keras.utils.set_random_seed(0)
    emb = keras.Sequential([keras.Input((5,), dtype="int32"), keras.layers.Embedding(20, 8, name="emb"),
                            keras.layers.Flatten(), keras.layers.Dense(3, name="out")])
    with pytest.warns(prune.PruningWarning, match=r"oneshot leaves these prunable layers dense \(no one-shot form\): \['emb'\]"):
        pruned = prune.oneshot(emb, np.zeros((4, 5), "int32"), 0.5, "sparsegpt")
    assert [t.key for t in mask_targets(pruned)] == ["out/kernel"]


def test_progress_is_printed_layer_by_layer(capsys):
    prune.oneshot(_mlp(), np.ones((4, 12), "float32"), 0.5, "wanda", verbose=True)
    lines = capsys.readouterr().err.strip().splitlines()
    assert [line.split(" pruned")[0] for line in lines] == [
        "oneshot wanda: layer 1 of 3 (d0)", "oneshot wanda: layer 2 of 3 (d1)", "oneshot wanda: layer 3 of 3 (out)"]


def test_bad_input_is_refused_naming_the_argument_before_any_change():
    model = _mlp()
    x = np.ones((8, 12), "float32")
    before = _weights(model)
    cases = [
        (dict(data=x, sparsity=1.0, method="wanda"), r"sparsity must be a number in \[0, 1\), got 1.0"),
        (dict(data=x, sparsity=-0.5, method="sparsegpt"), r"sparsity must be a number in \[0, 1\), got -0.5"),
        (dict(data=x, method="obs"), r"method must be one of \['magnitude', 'sparsegpt', 'wanda'\], got 'obs'"),
        (dict(data=None, method="wanda"), r"data is required by method 'wanda'"),
        (dict(data=np.ones((0, 12), "float32"), method="wanda"), r"data must hold at least one calibration example"),
        (dict(data=[], method="sparsegpt"), r"data must hold at least one calibration batch, got none"),
        (dict(data=np.ones((8, 13), "float32"), method="wanda"), r"data batch 0 has shape \(8, 13\); the model takes"),
        (dict(data=x, method="wanda", layers=["nothing"]), r"layers=\['nothing'\] matches no layer; layers of a kind"),
        (dict(data=x, method="wanda", blocksize=64), r"method 'wanda' takes \[\] besides sparsity"),
        (dict(data=x, method="sparsegpt", batch_size=0), r"batch_size must be a positive integer, got 0"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            prune.oneshot(model, **kwargs)
    norm = keras.Sequential([keras.Input((12,)), keras.layers.LayerNormalization(name="ln"), keras.layers.Dense(3, name="o")])
    with pytest.raises(ValueError, match=r"layers=\['ln'\] names layers oneshot has no form for: \['ln \(LayerNormalization\)'\]"):
        prune.oneshot(norm, x, 0.5, "wanda", layers=["ln"])
    for a, b in zip(before, _weights(model)):
        np.testing.assert_array_equal(a, b)


def test_oneshot_keeps_a_custom_prunable_layer_dense_under_its_own_name():
    """A layer with get_prunable_weights() is wrapped by prune_low_magnitude (prune_low_magnitude_<name>); oneshot
    names it as the model does, and one that declares no prunable weight is neither pruned nor warned about."""
    import warnings

    import keras

    class Scale(keras.layers.Layer):
        def build(self, shape):
            self.table = self.add_weight(shape=(shape[-1], shape[-1]), initializer="ones", name="table")

        def call(self, x):
            return x @ self.table

        def get_prunable_weights(self):
            return []

    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, name="fc"), Scale(name="scale"),
                              keras.layers.Dense(4, name="out")])
    x = np.random.default_rng(0).standard_normal((32, 8)).astype("float32")
    with warnings.catch_warnings():
        warnings.simplefilter("error", prune.PruningWarning)
        pruned = prune.oneshot(model, x, 0.5, method="wanda")
    report = prune.sparsity_report(pruned).set_index("layer")
    assert report.loc["fc", "sparsity"] == 0.5 and report.loc["out", "sparsity"] == 0.5
    np.testing.assert_array_equal(pruned.get_layer("prune_low_magnitude_scale").layer.table.numpy(), np.ones((8, 8)))
