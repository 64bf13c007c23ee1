"""Blocks that build their own sublayers (KerasHub's style), EinsumDense and ReversibleEmbedding: pruned inside
a copy, never shared with the original, saved and loaded with their masks, stripped back to plain layers."""

from __future__ import annotations

import warnings

import keras
import numpy as np
import pytest

import prune
from prune.layers.blocks import PrunedBlock, replaced_sublayers

SCHEDULE = prune.ConstantSparsity(0.5, begin_step=0, frequency=1)


@keras.saving.register_keras_serializable(package="prune_tests")
class FeedForwardBlock(keras.layers.Layer):
    """As KerasHub's TransformerDecoder: sublayers in private attributes, made in ``build``, absent from the
    config; a residual, a LayerNormalization and an attention layer subclass beside the Dense pair."""

    def __init__(self, hidden: int = 8, **kwargs):
        super().__init__(**kwargs)
        self.hidden = hidden

    def build(self, input_shape):
        d = input_shape[-1]
        self._attention = SubclassedAttention(num_heads=2, key_dim=d // 2, name="attention")
        self._attention.build(input_shape, input_shape)
        self._up = keras.layers.Dense(self.hidden, activation="relu", name="up")
        self._up.build(input_shape)
        self._down = keras.layers.Dense(d, name="down")
        self._down.build((*input_shape[:-1], self.hidden))
        self._norm = keras.layers.LayerNormalization(name="norm")
        self._norm.build(input_shape)

    def call(self, x):
        x = self._norm(x + self._attention(x, x))
        return x + self._down(self._up(x))

    def get_config(self):
        return {**super().get_config(), "hidden": self.hidden}


@keras.saving.register_keras_serializable(package="prune_tests")
class SubclassedAttention(keras.layers.MultiHeadAttention):
    """A MultiHeadAttention subclass (as KerasHub's CachedMultiHeadAttention): the masked twin does not take it."""


class NoConfigBlock(keras.layers.Layer):
    """A block Keras cannot rebuild from its config (its __init__ takes no name/trainable/dtype)."""

    def __init__(self):
        super().__init__()
        self.inner = keras.layers.Dense(4)

    def call(self, x):
        return self.inner(x)


def _model(seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    i = keras.Input((5, 6))
    x = FeedForwardBlock(name="block")(i)
    return keras.Model(i, keras.layers.Dense(3, name="head")(x))


def _data(n: int = 4) -> np.ndarray:
    return np.random.default_rng(0).normal(size=(n, 5, 6)).astype("float32")


def _fit(model: keras.Model, x: np.ndarray) -> None:
    model.compile("adam", "mse")
    model.fit(x, np.zeros((len(x), 5, 3)), epochs=1, batch_size=len(x), verbose=0,
              callbacks=[prune.UpdatePruningStep()])


def test_a_block_building_its_own_sublayers_is_pruned_in_a_copy_and_the_original_is_untouched():
    original = _model()
    before = [w.numpy().copy() for w in original.weights]
    with warnings.catch_warnings():
        warnings.simplefilter("error", prune.PruningWarning)  # nothing stays dense, nothing is shared
        pruned = prune.prune_low_magnitude(original, SCHEDULE)
    block = pruned.get_layer("block")
    assert isinstance(block, PrunedBlock) and type(block.layer) is FeedForwardBlock
    paths = dict(replaced_sublayers(block.layer))
    assert {p: type(v).__name__ for p, v in paths.items()} == {
        "_attention._query_dense": "MaskedEinsumDense", "_attention._key_dense": "MaskedEinsumDense",
        "_attention._value_dense": "MaskedEinsumDense", "_attention._output_dense": "MaskedEinsumDense",
        "_up": "MaskedDense", "_down": "MaskedDense",
    }
    x = _data()
    np.testing.assert_array_equal(original.predict(x, verbose=0), pruned.predict(x, verbose=0))  # all-ones masks
    _fit(pruned, x)
    report = prune.sparsity_report(pruned)
    assert report.status.eq("pruned").all() and len(report) == 7
    np.testing.assert_array_equal(report.sparsity.to_numpy(), 0.5)
    for old, now in zip(before, original.weights):
        np.testing.assert_array_equal(old, now.numpy())  # the original shares nothing
    assert not any(isinstance(layer, prune.layers.PrunableLayer) for layer in prune.core.targets.iter_layers(original))


def test_a_pruned_block_saves_loads_strips_and_prunes_again(tmp_path):
    pruned = prune.prune_low_magnitude(_model(), SCHEDULE)
    x = _data()
    _fit(pruned, x)
    path = tmp_path / "block.keras"
    pruned.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_array_equal(pruned.predict(x, verbose=0), loaded.predict(x, verbose=0))
    for a, b in zip(pruned.weights, loaded.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert prune.get_step(loaded) == 1
    stripped = prune.strip_pruning(loaded)
    assert type(stripped.get_layer("block")) is FeedForwardBlock and not prune.is_pruned(stripped)
    np.testing.assert_array_equal(stripped.predict(x, verbose=0), pruned.predict(x, verbose=0))
    kernels = [w for w in stripped.weights if w.path.endswith("kernel")]
    assert len(kernels) == 7 and all(float(np.mean(k.numpy() == 0)) == 0.5 for k in kernels)
    again = prune.prune_low_magnitude(stripped, SCHEDULE)
    assert isinstance(again.get_layer("block"), PrunedBlock) and len(prune.sparsity_report(again)) == 7


def test_a_block_that_cannot_be_copied_is_pruned_in_place_and_the_warning_says_so():
    i = keras.Input((3,))
    original = keras.Model(i, NoConfigBlock()(i))
    with pytest.warns(prune.PruningWarning, match="pruned in place"):
        pruned = prune.prune_low_magnitude(original, SCHEDULE)
    assert type(original.layers[1].inner).__name__ == "MaskedDense"  # the same object: never shared unmasked
    assert pruned.layers[1].layer is original.layers[1]


def test_masked_einsum_dense_equals_einsum_dense_with_its_kernel_pruned():
    rng = np.random.default_rng(1)
    for equation, bias, x_shape, out in [("abc,cde->abde", "de", (3, 5, 6), (None, 2, 4)),
                                         ("abcd,cde->abe", "e", (3, 5, 2, 4), (None, 7)),
                                         ("ab,bc->ac", None, (3, 6), (5,))]:
        plain = keras.layers.EinsumDense(equation, out, bias_axes=bias, dtype="float64")
        x = rng.normal(size=x_shape)
        plain(x)
        masked = prune.prune_low_magnitude(plain, SCHEDULE)
        masked(x)
        keep = rng.random(tuple(plain.kernel.shape)) < 0.5
        masked.set_mask("kernel", keep)
        reference = keras.layers.EinsumDense(equation, out, bias_axes=bias, dtype="float64")
        reference(x)
        reference.set_weights([np.where(keep, w, 0.0) if i == 0 else w for i, w in enumerate(plain.get_weights())])
        np.testing.assert_allclose(masked(x).numpy(), reference(x).numpy(), rtol=1e-12, atol=1e-12)


def test_einsum_dense_flops_count_the_input_axes_the_kernel_does_not_have():
    i = keras.Input((5, 6))
    layer = keras.layers.EinsumDense("abc,cde->abde", (None, 2, 4), name="proj")
    model = prune.prune_low_magnitude(keras.Model(i, layer(i)), SCHEDULE)
    row = prune.sparsity_report(model).iloc[0]
    assert row.dense_flops == 2 * 6 * 2 * 4 * 5  # every kernel entry meets each of the 5 positions


@pytest.mark.parametrize("tie", [True, False])
def test_masked_reversible_embedding_masks_both_directions(tie):
    layer = keras.layers.ReversibleEmbedding(7, 4, tie_weights=tie, dtype="float64")
    ids = np.array([[0, 3, 6]])
    layer(ids)
    masked = prune.prune_low_magnitude(layer, SCHEDULE)
    masked(ids)
    assert masked.prunable_weight_names == (("embeddings",) if tie else ("embeddings", "reverse_embeddings"))
    rng = np.random.default_rng(2)
    keep = {n: rng.random(tuple(masked.weight_and_mask(n)[0].shape)) < 0.5 for n in masked.prunable_weight_names}
    for name, k in keep.items():
        masked.set_mask(name, k)
    table = np.where(keep["embeddings"], layer.embeddings.numpy(), 0.0)
    np.testing.assert_array_equal(masked(ids).numpy(), table[ids])
    h = rng.normal(size=(2, 4))
    reverse = table.T if tie else np.where(keep["reverse_embeddings"], layer.reverse_embeddings.numpy(), 0.0)
    np.testing.assert_allclose(masked(h, reverse=True).numpy(), h @ reverse, rtol=1e-12)
