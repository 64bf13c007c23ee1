"""prune's sparse fully-connected kernel inside LiteRT (issue 38): ``to_tflite(model, kernels="prune")``.

``SparseDense`` layers become the custom operator ``PruneSparseFC`` (CSR of
``W^T``), run by prune's external delegate (``prune/native/litert_delegate.c``,
built on first use). Outputs equal Keras's within rtol=atol=1e-5 at odd shapes
and batches; a corrupt structure in the flatbuffer is refused when the node is
prepared, with the kernel's message. Also the canary for the hand-declared
TFLite C ABI (``prune/native/litert_abi.h``).
"""

from __future__ import annotations

import re
import warnings

import keras
import numpy as np
import pytest

import prune
from prune.deploy import export
from prune.layers import SparseDense
from prune.native import litert as native_litert

s = pytest.importorskip("ai_edge_litert.schema_py_generated")
litert = pytest.importorskip("ai_edge_litert.interpreter")

N_IN, HIDDEN, N_OUT = 37, 53, 11
BATCHES = (1, 3, 8, 13)


def _mlp(sparsity: float) -> keras.Model:
    """37 -> 53 (relu) -> 11, pruned to ``sparsity`` by magnitude and converted to ``SparseDense``."""
    keras.utils.set_random_seed(1)
    plain = keras.Sequential(
        [keras.Input((N_IN,)), keras.layers.Dense(HIDDEN, activation="relu", name="hidden"), keras.layers.Dense(N_OUT, name="out")]
    )
    for layer in plain.layers:  # non-zero biases, so that a dropped bias shows
        layer.bias.assign(np.random.default_rng(2).normal(size=layer.bias.shape).astype("float32"))
    masked = prune.prune_low_magnitude(plain, prune.OneShot(sparsity, 0))
    prune.update_masks(masked, 0)
    return prune.convert(masked, to="sparse")


def _holes() -> tuple[keras.Model, int, int]:
    """A 9 -> 7 layer without bias whose output 4 has no entry and whose input 2 is used by no output."""
    rng = np.random.default_rng(3)
    w = rng.normal(size=(9, 7)).astype("float32")
    mask = rng.random((9, 7)) < 0.6
    mask[:, 4] = False  # all-zero output row of W^T
    mask[2, :] = False  # all-zero input column of W^T
    mask[0, 0] = True
    layer = SparseDense.from_dense(w, mask, use_bias=False, name="holes")
    return keras.Sequential([keras.Input((9,)), layer]), 4, 2


@pytest.fixture(scope="module")
def mlps() -> dict[float, tuple[keras.Model, bytes, bytes]]:
    out = {}
    for sparsity in (0.9, 0.5):
        model = _mlp(sparsity)
        out[sparsity] = (model, export.to_tflite(model, kernels="prune"), export.to_tflite(model, sparsity=False))
    return out


def _ops(content: bytes) -> list[tuple[int, bytes, list[int], bytes]]:
    """(builtin code, custom code, inputs, custom options) of each operator of subgraph 0."""
    model = s.Model.GetRootAsModel(content, 0)
    graph = model.Subgraphs(0)
    ops = []
    for i in range(graph.OperatorsLength()):
        op = graph.Operators(i)
        code = model.OperatorCodes(op.OpcodeIndex())
        options = op.CustomOptionsAsNumpy() if op.CustomOptionsLength() else np.zeros(0, np.uint8)
        ops.append((code.BuiltinCode(), code.CustomCode() or b"", list(op.InputsAsNumpy()), bytes(options)))
    return ops


def _vector(content: bytes, suffix: str) -> list[tuple[int, np.ndarray]]:
    """(tensor index, data) of each tensor whose name ends with ``suffix``."""
    model = s.Model.GetRootAsModel(content, 0)
    graph = model.Subgraphs(0)
    found = []
    for i in range(graph.TensorsLength()):
        t = graph.Tensors(i)
        if t.Name().decode().endswith(suffix):
            dtype = np.float32 if t.Type() == s.TensorType.FLOAT32 else np.int32
            found.append((i, model.Buffers(t.Buffer()).DataAsNumpy().view(dtype).copy()))
    return found


def _patched(content: bytes, suffix: str, change) -> bytes:
    """A copy of ``content`` whose first int32 tensor named ``*suffix`` is changed in place by ``change(array)``."""
    model = s.Model.GetRootAsModel(content, 0)
    graph = model.Subgraphs(0)
    out = bytearray(content)
    for i in range(graph.TensorsLength()):
        t = graph.Tensors(i)
        if t.Name().decode().endswith(suffix):
            buf = model.Buffers(t.Buffer())
            start, n = buf._tab.Vector(buf._tab.Offset(4)), buf.DataLength()
            arr = np.frombuffer(bytes(out[start : start + n]), dtype=np.int32).copy()
            change(arr)
            out[start : start + n] = arr.tobytes()
            return bytes(out)
    raise AssertionError(f"no tensor named *{suffix}")


@pytest.mark.parametrize("sparsity", (0.9, 0.5))
def test_prune_kernels_equal_keras_at_odd_shapes_and_batches(mlps, sparsity):
    model, content, _ = mlps[sparsity]
    rng = np.random.default_rng(4)
    for batch in BATCHES:
        x = rng.normal(size=(batch, N_IN)).astype("float32")
        y = export.run_tflite(content, x)
        assert y.shape == (batch, N_OUT)
        np.testing.assert_allclose(y, model(x).numpy(), rtol=1e-5, atol=1e-5, err_msg=f"batch {batch}")


def test_flatbuffer_holds_prune_ops_only_for_sparse_layers_and_is_smaller(mlps):
    model, content, dense = mlps[0.9]
    ops = _ops(content)
    custom = [op for op in ops if op[1] == b"PruneSparseFC"]
    assert export.prune_ops(content) == len(custom) == 2 and export.prune_ops(dense) == 0
    assert not [op for op in ops if op[0] == s.BuiltinOperator.FULLY_CONNECTED]
    assert len(content) < len(dense) / 2  # 10% of the weights, 8 bytes each, and no dense copy left
    # the stored entries, exactly: nnz values, cols and n_out + 1 row pointers per layer
    layers = [layer for layer in model.layers if isinstance(layer, SparseDense)]
    values = sorted(v.size for _, v in _vector(content, "/prune_sparse_fc/values"))
    assert values == sorted(layer.nnz for layer in layers)
    assert sorted(v.size for _, v in _vector(content, "/prune_sparse_fc/row_ptr")) == [N_OUT + 1, HIDDEN + 1]


def test_relu_is_fused_and_applied(mlps):
    model, content, _ = mlps[0.9]
    custom = [op for op in _ops(content) if op[1] == b"PruneSparseFC"]
    assert [op[3] for op in custom] == [bytes([1, 1, 0, 0]), bytes([1, 0, 0, 0])]  # relu, then linear
    x = np.random.default_rng(5).normal(size=(13, N_IN)).astype("float32")
    hidden = model.layers[0]
    pre = x @ hidden.to_dense() + hidden.bias.numpy()
    assert (pre < 0).any() and (pre > 0).any()  # the relu changes this batch's hidden layer
    np.testing.assert_allclose(export.run_tflite(content, x), model(x).numpy(), rtol=1e-5, atol=1e-5)
    # the same flatbuffer with the relu turned off in the options computes something else
    no_relu = bytearray(content)
    at = bytes(content).find(bytes([1, 1, 0, 0]))
    assert at > 0
    no_relu[at + 1] = 0
    assert not np.allclose(export.run_tflite(bytes(no_relu), x), model(x).numpy(), rtol=1e-5, atol=1e-5)


def test_empty_output_row_and_unused_input_column():
    model, row, col = _holes()
    content = export.to_tflite(model, kernels="prune")
    ((_, row_ptr),) = _vector(content, "/row_ptr")
    ((_, cols),) = _vector(content, "/cols")
    assert row_ptr[row] == row_ptr[row + 1] and col not in cols and row_ptr[-1] == model.layers[0].nnz
    assert _ops(content)[0][2][-1] == -1  # no bias: TFLite's optional-tensor index
    x = np.random.default_rng(6).normal(size=(13, 9)).astype("float32")
    y = export.run_tflite(content, x)
    np.testing.assert_allclose(y, model(x).numpy(), rtol=1e-5, atol=1e-5)
    assert (y[:, row] == 0).all() and (y[:, np.arange(7) != row] != 0).all()


def test_rank3_input_runs():
    """Keras's Dense on [batch, 4, 9]: the converter writes a reshape, FULLY_CONNECTED, reshape."""
    model, _, _ = _holes()
    wide = keras.Sequential([keras.Input((4, 9)), model.layers[0]])
    content = export.to_tflite(wide, kernels="prune")
    assert export.prune_ops(content) == 1
    x = np.random.default_rng(7).normal(size=(3, 4, 9)).astype("float32")
    np.testing.assert_allclose(export.run_tflite(content, x), wide(x).numpy(), rtol=1e-5, atol=1e-5)


CORRUPT = {
    "col_equals_n_in": ("/cols", lambda a: a.__setitem__(0, N_IN), r"cols\[0\] = 37 is outside \[0, n_in = 37\)"),
    "negative_col": ("/cols", lambda a: a.__setitem__(-1, -1), r"cols\[\d+\] = -1 is outside \[0, n_in = 37\)"),
    "decreasing_row_ptr": ("/row_ptr", lambda a: a.__setitem__(2, a[1] - 1), r"row_ptr decreases at output 1"),
    "last_row_ptr_not_nnz": ("/row_ptr", lambda a: a.__setitem__(-1, a[-1] - 1), r"row_ptr\[n_out\] = row_ptr\[53\] = \d+ must equal nnz"),
    "first_row_ptr_not_0": ("/row_ptr", lambda a: a.__setitem__(0, 1), r"row_ptr\[0\] must be 0, got 1"),
}


@pytest.mark.parametrize("case", sorted(CORRUPT))
def test_corrupt_structure_is_refused_at_allocate_tensors(mlps, case):
    _, content, _ = mlps[0.9]
    suffix, change, message = CORRUPT[case]
    bad = _patched(content, "hidden/prune_sparse_fc" + suffix, change)  # the first layer: n_in 37, n_out 53
    assert bad != content
    interpreter = litert.Interpreter(model_content=bad, experimental_delegates=[litert.load_delegate(
        str(native_litert.delegate_path()))])
    with pytest.raises(RuntimeError, match=r"PruneSparseFC node \d+ \(output '[^']*hidden[^']*'\): " + message):
        interpreter.allocate_tensors()
    with pytest.raises(RuntimeError, match=message):
        export.tflite_interpreter(bad)
    export.tflite_interpreter(content)  # the intact flatbuffer prepares


def test_bad_kernels_are_named(mlps):
    model, content, _ = mlps[0.9]
    for bad in ("bogus", None, 1):
        with pytest.raises(ValueError, match=re.escape(f"kernels must be one of ['builtin', 'prune'], got {bad!r}")):
            export.to_tflite(model, kernels=bad)
        with pytest.raises(ValueError, match=re.escape(f"kernels must be one of ['auto', 'prune', 'builtin'], got {bad!r}")):
            export.run_tflite(content, np.zeros((1, N_IN), np.float32), kernels=bad)
    with pytest.raises(ValueError, match="int8=True is not supported"):
        export.to_tflite(model, kernels="prune", int8=True)
    with pytest.raises(RuntimeError, match="PruneSparseFC"):  # without prune's delegate the op is unresolved
        export.tflite_interpreter(content, kernels="builtin")


def test_delegate_runs_in_tf_lite_too(mlps):
    tf = pytest.importorskip("tensorflow")
    model, content, _ = mlps[0.5]
    delegate = tf.lite.experimental.load_delegate(str(native_litert.delegate_path()))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"(?s).*tf\.lite\.Interpreter is deprecated")
        interpreter = tf.lite.Interpreter(model_content=content, experimental_delegates=[delegate])
    x = np.random.default_rng(8).normal(size=(8, N_IN)).astype("float32")
    interpreter.resize_tensor_input(0, x.shape)
    interpreter.allocate_tensors()
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], x)
    interpreter.invoke()
    y = interpreter.get_tensor(interpreter.get_output_details()[0]["index"])
    np.testing.assert_allclose(y, model(x).numpy(), rtol=1e-5, atol=1e-5)


def test_prune_native_0_refuses_the_delegate(monkeypatch):
    monkeypatch.setenv("PRUNE_NATIVE", "0")
    with pytest.raises(RuntimeError, match="PRUNE_NATIVE=0"):
        native_litert.delegate_path()


def test_a_failed_build_names_the_compiler_output(monkeypatch, tmp_path):
    compiler = tmp_path / "broken-cc"
    compiler.write_text("#!/bin/sh\necho 'litert_delegate.c:1: error: boom' >&2\nexit 1\n")
    compiler.chmod(0o755)
    monkeypatch.setenv("CXX", str(compiler))
    monkeypatch.setenv("PRUNE_NATIVE_CACHE", str(tmp_path / "cache"))
    with pytest.raises(RuntimeError, match=r"building prune's LiteRT delegate failed: .*error: boom \(compiler output in "):
        native_litert.delegate_path()
    assert not list((tmp_path / "cache").glob("*.so"))


def _hand_made(keep_num_dims: int, shape: tuple[int, ...], w_t: np.ndarray, activation: int = 0) -> bytes:
    """A flatbuffer with one PruneSparseFC operator (no bias) on an input of ``shape``, written by hand."""
    import flatbuffers

    n_out = w_t.shape[0]
    rows, cols = np.nonzero(w_t)
    arrays = (w_t[rows, cols].astype(np.float32), cols.astype(np.int32),
              np.searchsorted(rows, np.arange(n_out + 1)).astype(np.int32))
    m = s.ModelT()
    m.version, m.buffers = 3, [s.BufferT()]
    code = s.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = s.BuiltinOperator.CUSTOM
    code.customCode, code.version = "PruneSparseFC", 1
    m.operatorCodes = [code]
    graph = s.SubGraphT()
    out_shape = [*shape[:-1], n_out] if keep_num_dims else [int(np.prod(shape[:-1])), n_out]
    graph.tensors = []
    for name, dims, kind, data in (("x", list(shape), s.TensorType.FLOAT32, None), ("y", out_shape, s.TensorType.FLOAT32, None),
                                   ("values", [arrays[0].size], s.TensorType.FLOAT32, arrays[0]),
                                   ("cols", [arrays[1].size], s.TensorType.INT32, arrays[1]),
                                   ("row_ptr", [arrays[2].size], s.TensorType.INT32, arrays[2])):
        t = s.TensorT()
        t.name, t.shape, t.type, t.buffer = name, dims, kind, 0
        if data is not None:
            buf = s.BufferT()
            buf.data = np.frombuffer(data.tobytes(), np.uint8)
            m.buffers.append(buf)
            t.buffer = len(m.buffers) - 1
        graph.tensors.append(t)
    op = s.OperatorT()
    op.opcodeIndex, op.inputs, op.outputs = 0, [0, 2, 3, 4, -1], [1]
    op.customOptions, op.customOptionsFormat = [1, activation, keep_num_dims, 0], s.CustomOptionsFormat.FLEXBUFFERS
    graph.operators, graph.inputs, graph.outputs = [op], [0], [1]
    m.subgraphs = [graph]
    builder = flatbuffers.Builder(1024)
    builder.Finish(m.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


@pytest.mark.parametrize("keep_num_dims", (0, 1))
def test_keep_num_dims_and_relu6_on_a_rank3_input(keep_num_dims):
    rng = np.random.default_rng(9)
    w_t = rng.normal(size=(5, 6)).astype(np.float32) * (rng.random((5, 6)) < 0.5) * 4
    x = rng.normal(size=(2, 3, 6)).astype(np.float32)
    content = _hand_made(keep_num_dims, x.shape, w_t, activation=3)
    want = np.clip(x @ w_t.T, 0, 6)
    assert (x @ w_t.T > 6).any() and (x @ w_t.T < 0).any()  # relu6 clips both ways on this input
    y = export.run_tflite(content, x)
    np.testing.assert_allclose(y, want if keep_num_dims else want.reshape(6, 5), rtol=1e-5, atol=1e-5)


def test_unknown_custom_options_are_refused():
    content = _hand_made(0, (2, 6), np.eye(5, 6, dtype=np.float32), activation=2)  # 2: relu_n1_to_1, not implemented
    with pytest.raises(RuntimeError, match=r"PruneSparseFC node 0 \(output 'y'\): its custom options must be"):
        export.tflite_interpreter(content)
