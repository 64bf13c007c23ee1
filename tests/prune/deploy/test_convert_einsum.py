"""``convert`` for EinsumDense and MultiHeadAttention: plain and masked to sparse, sparse back to masked and dense,
equations outside the family named, strip_pruning, and SparseMultiHeadAttention's .keras round trip and report."""

import warnings

import keras
import numpy as np
import pytest

import prune
from prune.core.targets import iter_layers
from prune.deploy.convert import ConversionWarning, convert, unconvertible_layers
from prune.layers.sparse_attention import SparseMultiHeadAttention, projection_equation
from prune.layers.sparse_einsum import SparseEinsumDense

SCHEDULE = prune.ConstantSparsity(0.5, begin_step=0, frequency=1)


def _kinds(model):
    return {layer.name: type(layer).__name__ for layer in iter_layers(model)}


def _einsum_model(seed=0):
    keras.utils.set_random_seed(seed)
    x_in = keras.Input((5, 7))
    h = keras.layers.EinsumDense("abc,cde->abde", (None, 3, 4), bias_axes="de", name="heads")(x_in)
    h = keras.layers.EinsumDense("abcd,cde->abe", (None, 6), bias_axes="e", activation="relu", name="merge")(h)
    y = keras.layers.EinsumDense("abc,dc->abd", (None, 2), name="transposed")(h)  # W^T: outside the family
    return keras.Model(x_in, y)


def _x(shape=(3, 5, 7), seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


def _convert(model, to):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = convert(model, to=to)
    return out, [str(w.message) for w in caught if issubclass(w.category, ConversionWarning)]


def test_a_plain_einsum_dense_converts_to_sparse_with_its_nonzeros_and_names_the_transposed_one():
    model = _einsum_model()
    kernel = model.get_layer("heads").kernel.numpy()
    kernel[kernel < 0.1] = 0.0  # structure = the nonzeros
    model.get_layer("heads").kernel.assign(kernel)
    assert unconvertible_layers(model, "sparse") == ["transposed"]
    sparse, caught = _convert(model, "sparse")
    assert caught == ["convert(to='sparse') left 1 layer(s) unconverted: ['transposed']"]
    kinds = _kinds(sparse)
    assert (kinds["heads"], kinds["merge"], kinds["transposed"]) == ("SparseEinsumDense", "SparseEinsumDense", "EinsumDense")
    heads = sparse.get_layer("heads")
    np.testing.assert_array_equal(heads.get_mask(), kernel != 0)
    np.testing.assert_array_equal(heads.to_dense(), kernel)
    assert heads.nnz == int((kernel != 0).sum()) < kernel.size
    assert sparse.get_layer("merge").activation is keras.activations.relu
    np.testing.assert_allclose(sparse(_x()).numpy(), model(_x()).numpy(), rtol=1e-5, atol=1e-6)
    dense, caught = _convert(sparse, "dense")
    assert caught == [] and {type(layer).__name__ for layer in dense.layers[1:]} == {"EinsumDense"}
    np.testing.assert_array_equal(dense.get_layer("heads").kernel.numpy(), kernel)
    np.testing.assert_allclose(dense(_x()).numpy(), model(_x()).numpy(), rtol=1e-5, atol=1e-6)


def test_masked_to_sparse_to_masked_to_dense_keeps_masks_and_outputs():
    masked = prune.prune_low_magnitude(_einsum_model(), SCHEDULE)
    prune.update_masks(masked, 0)
    masks = {n: masked.get_layer(n).get_masks()["kernel"] != 0 for n in ("heads", "merge", "transposed")}
    assert all(m.mean() == 0.5 for m in masks.values())
    x = _x()
    expected = masked(x).numpy()
    sparse, caught = _convert(masked, "sparse")
    assert caught == ["convert(to='sparse') left 1 layer(s) unconverted: ['transposed']"]
    assert type(sparse.get_layer("transposed")).__name__ == "MaskedEinsumDense"
    for name in ("heads", "merge"):
        layer = sparse.get_layer(name)
        assert type(layer) is SparseEinsumDense and layer.pruning_schedule == SCHEDULE
        np.testing.assert_array_equal(layer.get_mask(), masks[name])
    np.testing.assert_allclose(sparse(x).numpy(), expected, rtol=1e-5, atol=1e-6)
    back, caught = _convert(sparse, "masked")
    assert caught == [] and {type(layer).__name__ for layer in back.layers[1:]} == {"MaskedEinsumDense"}
    for name, mask in masks.items():
        np.testing.assert_array_equal(back.get_layer(name).get_masks()["kernel"] != 0, mask)
    np.testing.assert_allclose(back(x).numpy(), expected, rtol=1e-5, atol=1e-6)
    dense, _ = _convert(back, "dense")
    assert {type(layer).__name__ for layer in dense.layers[1:]} == {"EinsumDense"}
    for name, mask in masks.items():
        np.testing.assert_array_equal(dense.get_layer(name).kernel.numpy() != 0, mask)
    np.testing.assert_allclose(dense(x).numpy(), expected, rtol=1e-5, atol=1e-6)
    stripped = prune.strip_pruning(sparse)
    assert {type(layer).__name__ for layer in stripped.layers[1:]} == {"EinsumDense"} and not prune.is_pruned(stripped)
    np.testing.assert_allclose(stripped(x).numpy(), expected, rtol=1e-5, atol=1e-6)


def _attention_model(seed=0, **mha_kwargs):
    keras.utils.set_random_seed(seed)
    q, v = keras.Input((5, 8), name="q"), keras.Input((3, 6), name="v")
    y = keras.layers.MultiHeadAttention(2, 3, name="mha", **mha_kwargs)(q, v)
    return keras.Model([q, v], keras.layers.Dense(4, name="head")(y))


def _xs(batch=3, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((batch, 5, 8)).astype("float32"), rng.standard_normal((batch, 3, 6)).astype("float32")]


def _masked_kernels(layer):
    return {name: layer.weight_and_mask(f"{name}_kernel")[1].numpy() != 0 for name in ("query", "key", "value", "output")}


def test_projection_equations_are_keras_own():
    assert projection_equation(2, 1, 2) == ("abc,cde->abde", "de", 4)
    assert projection_equation(2, 2, 1) == ("abcd,cde->abe", "e", 3)
    assert projection_equation(3, 1, 2) == ("abcd,def->abcef", "ef", 5)


def test_a_pruned_multi_head_attention_converts_to_sparse_with_the_same_outputs_and_back():
    masked = prune.prune_low_magnitude(_attention_model(), SCHEDULE)
    prune.update_masks(masked, 0)
    mha = masked.get_layer("mha")
    masks = _masked_kernels(mha)
    assert all(m.mean() == 0.5 for m in masks.values())
    xs = _xs()
    expected = masked(xs).numpy()
    sparse, caught = _convert(masked, "sparse")
    assert caught == []
    layer = sparse.get_layer("mha")
    assert type(layer) is SparseMultiHeadAttention
    projections = layer.projections
    assert [(n, type(p).__name__, p.equation) for n, p in projections.items()] == [
        ("query", "SparseEinsumDense", "abc,cde->abde"), ("key", "SparseEinsumDense", "abc,cde->abde"),
        ("value", "SparseEinsumDense", "abc,cde->abde"), ("attention_output", "SparseEinsumDense", "abcd,cde->abe")]
    for (name, proj), mask in zip(projections.items(), masks.values()):
        np.testing.assert_array_equal(proj.get_mask(), mask, err_msg=name)
        assert proj.pruning_schedule == SCHEDULE
    assert layer._query_dense is projections["query"] and layer._output_dense is projections["attention_output"]
    np.testing.assert_allclose(sparse(xs).numpy(), expected, rtol=1e-5, atol=1e-5)
    for batch in (1, 5):  # other batches than the one it was built for
        np.testing.assert_allclose(sparse(_xs(batch)).numpy(), masked(_xs(batch)).numpy(), rtol=1e-5, atol=1e-5)
    back, caught = _convert(sparse, "masked")
    assert caught == [] and type(back.get_layer("mha")).__name__ == "MaskedMultiHeadAttention"
    for name, mask in _masked_kernels(back.get_layer("mha")).items():
        np.testing.assert_array_equal(mask, masks[name], err_msg=name)
    np.testing.assert_allclose(back(xs).numpy(), expected, rtol=1e-5, atol=1e-5)
    for dense in (_convert(sparse, "dense")[0], prune.strip_pruning(sparse)):
        assert type(dense.get_layer("mha")) is keras.layers.MultiHeadAttention and not prune.is_pruned(dense)
        assert {type(x).__name__ for x in iter_layers(dense)} & {"SparseEinsumDense", "SparseDense"} == set()
        np.testing.assert_array_equal(dense.get_layer("mha")._query_dense.kernel.numpy() != 0, masks["query"])
        np.testing.assert_allclose(dense(xs).numpy(), expected, rtol=1e-5, atol=1e-5)


def test_a_plain_multi_head_attention_converts_with_its_nonzeros_as_structure():
    model = _attention_model(seed=1)
    kernel = model.get_layer("mha")._value_dense.kernel
    zeroed = np.where(np.abs(kernel.numpy()) < 0.2, 0.0, kernel.numpy()).astype("float32")
    kernel.assign(zeroed)
    sparse, caught = _convert(model, "sparse")
    assert caught == []
    layer = sparse.get_layer("mha")
    assert type(layer) is SparseMultiHeadAttention and layer.projections["query"].nnz == 8 * 2 * 3
    np.testing.assert_array_equal(layer.projections["value"].get_mask(), zeroed != 0)
    assert layer.projections["value"].nnz < zeroed.size
    np.testing.assert_allclose(sparse(_xs()).numpy(), model(_xs()).numpy(), rtol=1e-5, atol=1e-5)


def test_a_gated_multi_head_attention_converts_through_its_projections_unless_masked_as_a_whole():
    """No SparseMultiHeadAttention form (its gate): a plain one converts its five projections where they are;
    a masked one, whose masks sit on the outer layer, is copied whole and named."""
    model = _attention_model(use_gate=True)
    assert unconvertible_layers(model, "sparse") == []
    sparse, caught = _convert(model, "sparse")
    assert caught == []
    inner = [layer for layer in iter_layers(sparse) if isinstance(layer, keras.layers.MultiHeadAttention)]
    assert len(inner) == 1 and type(inner[0]) is keras.layers.MultiHeadAttention
    assert sorted(layer.name for layer in iter_layers(inner[0]) if type(layer) is SparseEinsumDense) == sorted(
        ["query", "key", "value", "gate", "attention_output"])
    np.testing.assert_allclose(sparse(_xs()).numpy(), model(_xs()).numpy(), rtol=1e-5, atol=1e-5)
    masked = prune.prune_low_magnitude(model, SCHEDULE)
    prune.update_masks(masked, 0)
    assert unconvertible_layers(masked, "sparse") == ["mha"]
    sparse, caught = _convert(masked, "sparse")
    assert caught == ["convert(to='sparse') left 1 layer(s) unconverted: ['mha']"]
    assert type(sparse.get_layer("mha")).__name__ == "MaskedMultiHeadAttention"
    assert not any(type(layer) is SparseEinsumDense for layer in iter_layers(sparse))
    np.testing.assert_allclose(sparse(_xs()).numpy(), masked(_xs()).numpy(), rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match=r"use_gate=True"):
        SparseMultiHeadAttention(2, 3, use_gate=True)


def test_a_sparse_multi_head_attention_saves_and_loads_and_keeps_pruning(tmp_path):
    masked = prune.prune_low_magnitude(_attention_model(), SCHEDULE)
    prune.update_masks(masked, 0)
    sparse = convert(masked, to="sparse")
    config = sparse.get_layer("mha").get_config()
    assert config["projection_nnz"] == {"query": 24, "key": 18, "value": 18, "attention_output": 24}
    path = tmp_path / "mha.keras"
    sparse.save(path)
    loaded = keras.models.load_model(path)
    layer = loaded.get_layer("mha")
    assert type(layer) is SparseMultiHeadAttention
    for name, proj in layer.projections.items():
        np.testing.assert_array_equal(proj.get_mask(), sparse.get_layer("mha").projections[name].get_mask())
        np.testing.assert_array_equal(proj.values.numpy(), sparse.get_layer("mha").projections[name].values.numpy())
    np.testing.assert_array_equal(loaded(_xs()).numpy(), sparse(_xs()).numpy())
    # the projections are sparse layers the engine drives: a further step prunes them further
    layer.projections["query"].pruning_schedule = prune.ConstantSparsity(0.75, begin_step=0, frequency=1)
    prune.update_masks(loaded, 1)
    assert layer.projections["query"].nnz == 12 and layer.projections["key"].nnz == 18


def test_the_report_counts_the_sparse_projections_per_token():
    masked = prune.prune_low_magnitude(_attention_model(), SCHEDULE)
    prune.update_masks(masked, 0)
    report = prune.sparsity_report(convert(masked, to="sparse"))
    rows = report.set_index("layer")
    assert list(report.status) == ["sparse"] * 5  # the four projections and the head; no rows for the biases
    for name, shape, tokens in (("query", (8, 2, 3), 5), ("key", (6, 2, 3), 3), ("value", (6, 2, 3), 3),
                                ("attention_output", (2, 3, 8), 5)):
        size = int(np.prod(shape))
        assert rows.loc[name, "shape"] == shape and rows.loc[name, "nnz"] == size // 2
        assert rows.loc[name, "dense_flops"] == 2.0 * size * tokens
        assert rows.loc[name, "nonzero_flops"] == 2.0 * (size // 2) * tokens


def test_bad_projections_are_refused_before_anything_is_built(monkeypatch):
    def boom(self, *args, **kwargs):
        raise AssertionError("a layer was built")

    monkeypatch.setattr(SparseMultiHeadAttention, "build", boom)
    mha = keras.layers.MultiHeadAttention(2, 3)
    mha.build((None, 5, 8), (None, 3, 6))
    parts = {n: (np.ones((d, 2, 3)), np.ones((d, 2, 3)), None) for n, d in (("query", 8), ("key", 6), ("value", 6))}
    with pytest.raises(ValueError, match=r"missing \['attention_output'\]"):
        SparseMultiHeadAttention.from_projections(mha.get_config(), mha.get_build_config(), parts)
    parts["attention_output"] = (np.ones((2, 3, 8)), np.ones((2, 3)), None)
    with pytest.raises(ValueError, match=r"parts\['attention_output'\] mask"):
        SparseMultiHeadAttention.from_projections(mha.get_config(), mha.get_build_config(), parts)
    parts["attention_output"] = (np.ones((2, 3, 7)), np.ones((2, 3, 7)), None)
    with pytest.raises(ValueError, match=r"parts\['attention_output'\] kernel has shape \(2, 3, 7\), expected \(2, 3, 8\)"):
        SparseMultiHeadAttention.from_projections(mha.get_config(), mha.get_build_config(), parts)
    parts["attention_output"] = (np.ones((2, 3, 8)), np.ones((2, 3, 8)), np.ones(7))
    with pytest.raises(ValueError, match=r"parts\['attention_output'\] bias has shape \(7,\), expected \(8,\)"):
        SparseMultiHeadAttention.from_projections(mha.get_config(), mha.get_build_config(), parts)
    with pytest.raises(ValueError, match=r"build_config must be"):
        SparseMultiHeadAttention.from_projections(mha.get_config(), None, parts)
    with pytest.raises(ValueError, match=r"projection_nnz=\{'queries': 3\}"):
        SparseMultiHeadAttention(2, 3, projection_nnz={"queries": 3})


def test_a_sparse_multi_head_attention_trains_under_its_schedule_to_the_target():
    schedule = prune.PolynomialDecay(0.0, 0.75, begin_step=0, end_step=4, frequency=1)
    sparse = convert(prune.prune_low_magnitude(_attention_model(), schedule), to="sparse")
    sizes = {n: int(np.prod(p.weight_shape)) for n, p in sparse.get_layer("mha").projections.items()}
    assert [p.nnz for p in sparse.get_layer("mha").projections.values()] == list(sizes.values())  # all kept at first
    sparse.compile(keras.optimizers.Adam(0.01), "mse")
    xs, target = _xs(12), np.random.default_rng(5).standard_normal((12, 5, 4)).astype("float32")
    sparse.fit(xs, target, batch_size=2, epochs=1, verbose=0, callbacks=[prune.UpdatePruningStep()])
    for name, proj in sparse.get_layer("mha").projections.items():
        assert proj.nnz == sizes[name] - round(0.75 * sizes[name]), name
    assert sparse.get_layer("head").nnz == 32 - 24
    np.testing.assert_allclose(sparse(xs).numpy(), prune.strip_pruning(sparse)(xs).numpy(), rtol=1e-5, atol=1e-5)
