"""Canaries: one test per private Keras attribute prune touches (prune/_internals.py).

Each checks the attribute still exists *and* still means what prune assumes,
on real Keras objects, so a Keras upgrade that changes one fails here with
the attribute's name rather than somewhere deep in a training run.
"""

from __future__ import annotations

import configparser
import re
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from prune import _internals as internals

REPO = Path(__file__).resolve().parent.parent


def _built_adam(amsgrad: bool = False) -> tuple[keras.optimizers.Adam, list[keras.Variable]]:
    variables = [keras.Variable(np.ones((3, 2), "float32"), name="a"), keras.Variable(np.ones(4, "float32"), name="b")]
    opt = keras.optimizers.Adam(0.1, amsgrad=amsgrad)
    opt.apply_gradients([(tf.ones((3, 2)), variables[0]), (tf.ones(4), variables[1])])
    return opt, variables


def test_tested_keras_line_is_installed_and_pinned():
    assert keras.__version__.startswith(internals.TESTED_KERAS + "."), keras.__version__
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    requires = cfg["options"]["install_requires"]
    major, minor = internals.TESTED_KERAS.split(".")
    assert re.search(rf"keras>={major}\.{minor},<{major}\.{int(minor) + 1}\b", requires), requires


def test_optimizer_variables_are_the_trained_variables_in_slot_order():
    opt, variables = _built_adam()
    tracked = internals.optimizer_variables(opt)
    assert [v is w for v, w in zip(tracked, variables)] == [True, True]
    assert internals.OPTIMIZER_VARIABLES in vars(opt)
    # slot i shadows variable i: the contract prune.layers.optimizer_state relies on
    assert [tuple(m.shape) for m in opt._momentums] == [(3, 2), (4,)]


def test_optimizer_variable_index_and_adam_moments():
    opt, variables = _built_adam(amsgrad=True)
    index = internals.optimizer_variable_index(opt, variables[1])
    assert int(index) == 1
    m, v, hat = internals.adam_moments(opt, index)
    # one Adam step from zero with gradient 1: m = 1 - beta_1, v = 1 - beta_2
    np.testing.assert_allclose(m.numpy(), np.full(4, 0.1), rtol=1e-6)
    np.testing.assert_allclose(v.numpy(), np.full(4, 0.001), rtol=1e-6)
    np.testing.assert_allclose(hat.numpy(), v.numpy())
    assert internals.adam_moments(_built_adam()[0], 0)[2] is None


def test_uses_weight_decay_honours_the_exclusion_list():
    opt = keras.optimizers.AdamW(0.1, weight_decay=0.01)
    keep, skip = keras.Variable(np.ones(2, "float32"), name="keep"), keras.Variable(np.ones(2, "float32"), name="bias")
    opt.exclude_from_weight_decay(var_names=["bias"])
    opt.build([keep, skip])
    assert internals.uses_weight_decay(opt, keep) is True
    assert internals.uses_weight_decay(opt, skip) is False
    # LazyAdam overrides this private hook to apply decay per row
    assert callable(getattr(keras.optimizers.Adam, "_apply_weight_decay", None))


def test_backing_variable_can_be_replaced_with_a_dynamic_shape():
    var = keras.Variable(np.arange(6, dtype="float32").reshape(3, 2))
    backing = internals.backing_variable(var)
    assert isinstance(backing, tf.Variable) and backing.shape == (3, 2)
    grown = tf.Variable(np.zeros((5, 2), "float32"), shape=tf.TensorShape([None, 2]))
    internals.set_backing_variable(var, grown)
    internals.set_variable_shape(var, (5, 2))
    assert var.shape == (5, 2) and internals.backing_variable(var) is grown
    np.testing.assert_array_equal(var.numpy(), np.zeros((5, 2)))


def test_layer_tracker_replaces_a_tracked_sublayer():
    class Net(keras.Model):
        def __init__(self):
            super().__init__()
            self.inner = keras.layers.Dense(2)

        def call(self, x):
            return self.inner(x)

    net = Net()
    net(np.ones((1, 3), "float32"))
    tracker = internals.layer_tracker(net)
    assert tracker is not None and callable(tracker.replace_tracked_value)
    new = keras.layers.Dense(2)
    locked = tracker.locked
    tracker.unlock()
    tracker.replace_tracked_value("layers", net.inner, new)
    if locked:
        tracker.lock()
    assert any(layer is new for layer in net.layers)
    assert internals.has_sublayers(net) and not internals.has_sublayers(keras.layers.Dense(2))


def test_layer_attributes_lists_public_and_tracked_private_sublayers_and_replace_swaps_one():
    mha = keras.layers.MultiHeadAttention(2, 4)
    x = np.ones((1, 3, 8), "float32")
    mha(x, x)
    names = {attr: v for attr, index, v in internals.layer_attributes(mha) if index is None}
    assert {"_query_dense", "_key_dense", "_value_dense", "_output_dense"} <= set(names)
    assert all(isinstance(v, keras.layers.Layer) for v in names.values())
    new = keras.layers.EinsumDense.from_config(mha._query_dense.get_config())
    old = mha._query_dense
    internals.replace_tracked_layer(mha, "_query_dense", old, new)
    assert mha._query_dense is new
    held = internals.sublayers(mha)
    assert any(v is new for v in held) and not any(v is old for v in held)

    class Stack(keras.layers.Layer):
        def __init__(self):
            super().__init__()
            self.blocks = [keras.layers.Dense(2), keras.layers.Dense(2)]

    stack = Stack()
    assert [(a, i) for a, i, _ in internals.layer_attributes(stack)] == [("blocks", 0), ("blocks", 1)]
    old, new = stack.blocks[1], keras.layers.Dense(3)
    internals.replace_tracked_layer(stack, "blocks", old, new, 1)
    assert stack.blocks[1] is new and [id(v) for v in internals.sublayers(stack)] == [id(stack.blocks[0]), id(new)]


def test_input_shape_arg_is_the_constructor_argument():
    assert internals.input_shape_arg(keras.layers.Dense(2, input_shape=(5,))) == (5,)
    assert internals.input_shape_arg(keras.layers.Dense(2)) is None


def test_a_missing_attribute_names_itself_and_the_keras_version():
    with pytest.raises(internals.KerasInternalsChanged, match=r"object\._trainable_variables .* Keras 3\.\d+"):
        internals.optimizer_variables(object())
    with pytest.raises(internals.KerasInternalsChanged, match=r"_value"):
        internals.backing_variable(object())


def test_in_xla_context_is_true_only_while_tracing_for_xla():
    seen = []

    def probe(x):
        seen.append(internals.in_xla_context())
        return x + 1

    tf.function(probe, jit_compile=True)(tf.constant(1.0))
    tf.function(probe)(tf.constant(1.0))
    probe(tf.constant(1.0))
    assert seen == [True, False, False]


def test_sublayers_lists_tracked_layers_of_models_blocks_and_rnns():
    class Block(keras.layers.Layer):
        def __init__(self):
            super().__init__()
            self.a, self.b = keras.layers.Dense(2), keras.layers.Dense(3)

        def call(self, x):
            return self.b(self.a(x))

    block = Block()
    model = keras.Sequential([keras.Input((4,)), block])
    assert internals.sublayers(model)[-1] is block and model.layers == [block]  # Sequential also tracks its InputLayer
    assert internals.sublayers(block) == [block.a, block.b]
    assert internals.has_sublayers(block) and not internals.has_sublayers(block.a)
    lstm = keras.layers.LSTM(2)
    lstm(np.ones((1, 5, 4), "float32"))
    assert internals.sublayers(lstm) == [lstm.cell]


def test_own_variables_are_what_save_own_variables_writes_in_order():
    layer = keras.layers.BatchNormalization()
    layer.build((None, 3))
    store: dict = {}
    layer.save_own_variables(store)
    own = internals.own_variables(layer)
    assert len(own) == len(store) == 4
    for i, v in enumerate(own):
        np.testing.assert_array_equal(np.asarray(store[str(i)]), v.numpy())
    assert [v.trainable for v in own] == [True, True, False, False]


def test_override_call_reroutes_one_layer_and_restores_it():
    layer = keras.layers.Dense(2, kernel_initializer="ones")
    x = np.ones((1, 3), "float32")
    before = np.asarray(layer(x))
    with internals.override_call(layer, lambda inputs, training=None: inputs[:, :2] * 0.0 + 7.0):
        np.testing.assert_array_equal(np.asarray(layer(x)), [[7.0, 7.0]])
    np.testing.assert_array_equal(np.asarray(layer(x)), before)
    assert "call" not in vars(layer)


def test_graph_walk_producers_inbound_and_outbound_nodes():
    inp = keras.Input((4,))
    a = keras.layers.Dense(3, name="a")
    b = keras.layers.Dense(2, name="b")
    out = b(a(inp))
    keras.Model(inp, out)
    assert internals.keras_producer(out) is b
    assert [internals.keras_producer(t) for node in internals.inbound_nodes(b) for t in node.input_tensors] == [a]
    assert [node.operation for node in internals.outbound_nodes(a)] == [b]


def test_private_weight_is_the_variable_behind_the_public_property():
    dense = keras.layers.Dense(2)
    dense.build((None, 3))
    assert internals.private_weight(dense, "kernel") is dense.kernel
    emb = keras.layers.Embedding(5, 2)
    emb.build((None,))
    assert internals.private_weight(emb, "embeddings") is emb.embeddings
    assert internals.private_weight(dense, "nothing") is None
