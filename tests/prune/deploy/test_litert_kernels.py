"""prune's sparse fully-connected kernel inside LiteRT (issue 38): ``to_tflite(model, kernels="prune")``.

``SparseDense`` layers become the custom operator ``PruneSparseFC`` (CSR of
``W^T``), run by prune's external delegate (``prune/native/litert_delegate.c``,
built on first use). Outputs equal Keras's within rtol=atol=1e-5 at odd shapes
and batches; a corrupt structure in the flatbuffer is refused when the node is
prepared, with the kernel's message. Also the canary for the hand-declared
TFLite C ABI (``prune/native/litert_abi.h``).

The kernel's vector path (AVX-512, AVX2 or scalar: whichever the build's flags
give) is checked at every tail length of its blocks, batches 1-13, one and two
threads (the pool, chunking, ``recommended_num_threads`` and the delegate's
``num_threads``/``parallel_min_work`` options). Each of the kernel's paths
(tile, dot, gather, scatter, forced with the delegate's ``kernel`` option, and
auto's own choice) is checked against a float64 reference at batches 1-33
(partly and wholly filled tiles of 8 and 16 rows), each activation, with and
without bias, on inputs with zero features, with and without the thread pool. To cover the other paths on an
AVX-512 machine, run this file with ``PRUNE_NATIVE_CXXFLAGS=-march=x86-64-v3``
(AVX2) or ``-march=x86-64-v2`` (scalar) and a separate ``PRUNE_NATIVE_CACHE``.
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
from prune import native
from prune.native import litert as native_litert

s = pytest.importorskip("ai_edge_litert.schema_py_generated")
litert = pytest.importorskip("ai_edge_litert.interpreter")

FORCED_OFF = not native.enabled()


@pytest.fixture(autouse=True)
def _needs_the_delegate(request):
    """Under ``PRUNE_NATIVE=0`` the delegate is refused by design: only the test of that refusal runs."""
    if FORCED_OFF and request.node.name != "test_prune_native_0_refuses_the_delegate":
        pytest.skip("PRUNE_NATIVE=0 turns prune's LiteRT delegate off")


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


def _hand_made(keep_num_dims: int, shape: tuple[int, ...], w_t: np.ndarray, activation: int = 0,
               bias: np.ndarray | None = None) -> bytes:
    """A flatbuffer with one PruneSparseFC operator (with ``bias``, else none) on an input of ``shape``, written by
    hand."""
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
                                   ("row_ptr", [arrays[2].size], s.TensorType.INT32, arrays[2]),
                                   *((("bias", [n_out], s.TensorType.FLOAT32, bias.astype(np.float32)),)
                                     if bias is not None else ())):
        t = s.TensorT()
        t.name, t.shape, t.type, t.buffer = name, dims, kind, 0
        if data is not None:
            buf = s.BufferT()
            buf.data = np.frombuffer(data.tobytes(), np.uint8)
            m.buffers.append(buf)
            t.buffer = len(m.buffers) - 1
        graph.tensors.append(t)
    op = s.OperatorT()
    op.opcodeIndex, op.inputs, op.outputs = 0, [0, 2, 3, 4, 5 if bias is not None else -1], [1]
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


# ---- the vectorised, threaded kernel -------------------------------------------------------------------------

TAIL_NNZ = (0, 1, 15, 16, 17, 31, 32, 33, 47, 48, 65)  # entries per output row: empty, tails of 16 and 8 lanes, 2 x 16
KERNEL_BATCHES = (1, 2, 3, 4, 5, 8, 13)


def _last_path() -> str:
    """The path the last step run took ("gather", "dot", "scatter" or "tile"), from the loaded delegate library."""
    import ctypes

    fn = ctypes.CDLL(str(native_litert.delegate_path())).prune_litert_delegate_last_path
    fn.restype = ctypes.c_char_p
    return fn().decode()


def _counters() -> tuple[int, int]:
    """(steps run on several threads so far, threads of the last step) from the loaded delegate library."""
    import ctypes

    lib = ctypes.CDLL(str(native_litert.delegate_path()))  # the handle load_delegate opened: same globals
    lib.prune_litert_delegate_parallel_runs.restype = ctypes.c_ulonglong
    return int(lib.prune_litert_delegate_parallel_runs()), int(lib.prune_litert_delegate_last_threads())


def _interpreter(content: bytes, threads: int | None = None, **options) -> object:
    """A LiteRT interpreter with ``num_threads=threads`` and prune's delegate with ``options`` (delegate_options)."""
    delegate = litert.load_delegate(str(native_litert.delegate_path()), native_litert.delegate_options(**options))
    kwargs = {} if threads is None else {"num_threads": threads}
    return litert.Interpreter(model_content=content, experimental_delegates=[delegate], **kwargs)


def _invoke(interpreter, x: np.ndarray) -> np.ndarray:
    interpreter.resize_tensor_input(interpreter.get_input_details()[0]["index"], x.shape)
    interpreter.allocate_tensors()
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], x)
    interpreter.invoke()
    return np.array(interpreter.get_tensor(interpreter.get_output_details()[0]["index"]))


def _tails() -> np.ndarray:
    """W^T [n_out, 80] whose output rows hold TAIL_NNZ entries each (twice, at other columns), no zero value."""
    rng = np.random.default_rng(10)
    rows = []
    for count in TAIL_NNZ * 2:
        row = np.zeros(80, np.float32)
        cols = rng.choice(80, size=count, replace=False)
        row[cols] = rng.uniform(0.5, 1.5, size=count) * rng.choice((-1, 1), size=count)
        rows.append(row)
    return np.stack(rows)


def test_compiled_vector_path_is_reported():
    path = native_litert.delegate_vector_path()
    print(f"\nprune LiteRT delegate vector path: {path}")
    assert path in ("avx512 (16 lanes)", "avx2 (8 lanes)", "scalar (1 lane)")
    compiler = native._compiler()
    macros = native._predefined_macros(compiler, [*native_litert.build_attempts()[0], *native.extra_flags()])
    if macros:  # the path the flags of the first attempt imply (it builds on this machine)
        want = ("avx512 (16 lanes)" if "__AVX512F__" in macros else
                "avx2 (8 lanes)" if {"__AVX2__", "__FMA__"} <= macros else "scalar (1 lane)")
        assert path == want
    if not native.extra_flags() and "avx512f" in native._cpu_isa().split():
        assert path == "avx512 (16 lanes)"  # -march=native reached the build


@pytest.mark.parametrize("threads", (1, 2))
def test_tails_and_batches_equal_a_float64_reference(threads):
    w_t = _tails()
    nnz = np.count_nonzero(w_t, axis=1)
    assert sorted(set(nnz)) == sorted(TAIL_NNZ)
    content = _hand_made(0, (1, 80), w_t)
    # parallel_min_work=0: this small layer takes the threaded path too when threads == 2
    interpreter = _interpreter(content, num_threads=threads, parallel_min_work=0)
    rng = np.random.default_rng(11)
    before, _ = _counters()
    for batch in KERNEL_BATCHES:  # one interpreter, resized: the kernel is prepared again each time
        x = rng.normal(size=(batch, 80)).astype(np.float32)
        y = _invoke(interpreter, x)
        want = x.astype(np.float64) @ w_t.T.astype(np.float64)
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5, err_msg=f"batch {batch}, {threads} threads")
        assert (y[:, nnz == 0] == 0).all()
    runs, last = _counters()
    assert runs - before == (len(KERNEL_BATCHES) if threads == 2 else 0) and last == threads


def _wide_layer() -> keras.Model:
    """1024 -> 512 at 50% with a bias and relu: nnz x rows >= 32768 at batch 1, so 2 threads split it."""
    rng = np.random.default_rng(12)
    w = (rng.normal(size=(1024, 512)) * 0.05).astype(np.float32)
    mask = rng.random((1024, 512)) < 0.5
    layer = SparseDense.from_dense(w, mask, use_bias=True, activation="relu", name="wide")
    layer.bias.assign(rng.normal(size=512).astype(np.float32) * 0.1)
    return keras.Sequential([keras.Input((1024,)), layer])


@pytest.mark.parametrize("threads", (1, 2))
def test_a_large_layer_splits_across_the_interpreters_threads(threads):
    model = _wide_layer()
    content = export.to_tflite(model, kernels="prune")
    interpreter = _interpreter(content, threads=threads)  # Interpreter(num_threads=...), no delegate option
    rng = np.random.default_rng(13)
    before, _ = _counters()
    for batch in (1, 2, 5, 8):
        x = rng.normal(size=(batch, 1024)).astype(np.float32)
        y = _invoke(interpreter, x)
        np.testing.assert_allclose(y, model(x).numpy(), rtol=1e-5, atol=1e-5, err_msg=f"batch {batch}")
        assert (y == 0).any() and (y > 0).any()
    runs, last = _counters()
    assert runs - before == (4 if threads == 2 else 0) and last == threads


def test_threads_option_overrides_the_interpreter_and_small_steps_stay_on_one_thread(mlps):
    model, content, _ = mlps[0.5]
    x = np.random.default_rng(14).normal(size=(13, N_IN)).astype(np.float32)
    # two steps in one partition (an internal buffer between them), both split by the delegate's own option
    before, _ = _counters()
    y = _invoke(_interpreter(content, threads=1, num_threads=2, parallel_min_work=0), x)
    runs, last = _counters()
    np.testing.assert_allclose(y, model(x).numpy(), rtol=1e-5, atol=1e-5)
    assert runs - before == 2 and last == 2
    # the default threshold (32768) keeps these small steps (nnz x 13 rows < 32768) on the caller
    y = _invoke(_interpreter(content, threads=2), x)
    assert _counters() == (runs, 1)
    np.testing.assert_allclose(y, model(x).numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("options, message", [
    ({"bogus": "1"}, r"unknown option 'bogus' \(known: num_threads, parallel_min_work, kernel\)"),
    ({"num_threads": "two"}, r"option num_threads must be an integer in \[0, 64\], got 'two'"),
    ({"num_threads": "65"}, r"option num_threads must be an integer in \[0, 64\], got '65'"),
    ({"parallel_min_work": "-1"}, r"option parallel_min_work must be an integer in \[0, \d+\], got '-1'"),
    ({"kernel": "fast"}, r"option kernel must be one of auto, gather, dot, scatter, tile, got 'fast'"),
])
def test_bad_delegate_options_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        litert.load_delegate(str(native_litert.delegate_path()), options)


def test_partitions_split_by_a_builtin_op_share_the_delegates_threads():
    """sparse -> plain Dense (LiteRT's own FULLY_CONNECTED) -> sparse: two delegate partitions, one thread pool."""
    keras.utils.set_random_seed(15)
    rng = np.random.default_rng(15)
    first = SparseDense.from_dense(rng.normal(size=(N_IN, 40)).astype(np.float32), rng.random((N_IN, 40)) < 0.4,
                                   use_bias=True, activation="relu", name="first")
    last = SparseDense.from_dense(rng.normal(size=(30, N_OUT)).astype(np.float32), rng.random((30, N_OUT)) < 0.4,
                                  use_bias=False, name="last")
    model = keras.Sequential([keras.Input((N_IN,)), first, keras.layers.Dense(30, name="plain"), last])
    content = export.to_tflite(model, kernels="prune")
    assert export.prune_ops(content) == 2
    assert [op[0] for op in _ops(content)].count(s.BuiltinOperator.FULLY_CONNECTED) == 1
    interpreter = _interpreter(content, threads=2, parallel_min_work=0)
    before, _ = _counters()
    for batch in (1, 5):
        x = np.random.default_rng(16).normal(size=(batch, N_IN)).astype(np.float32)
        np.testing.assert_allclose(_invoke(interpreter, x), model(x).numpy(), rtol=1e-5, atol=1e-5)
    assert _counters() == (before + 4, 2)


def test_a_forked_child_runs_on_one_thread_instead_of_waiting_for_the_parents_pool():
    """The pool's threads stay in the parent on ``fork()``: an interpreter used in the child runs the step on the
    caller alone, with the same output, instead of handing it to threads that are not there and waiting forever."""
    import os
    import signal
    import time

    w_t = _tails()
    interpreter = _interpreter(_hand_made(0, (1, 80), w_t), num_threads=2, parallel_min_work=0)
    x = np.random.default_rng(14).normal(size=(3, 80)).astype(np.float32)
    want = _invoke(interpreter, x)  # the pool's threads start here, in the parent
    assert _counters()[1] == 2
    pid = os.fork()
    if pid == 0:  # the child: exit status 0 when the step ran and gave the parent's output
        code = 3
        try:
            interpreter.invoke()
            code = 0 if np.array_equal(interpreter.get_tensor(interpreter.get_output_details()[0]["index"]), want) else 1
        finally:
            os._exit(code)
    deadline = time.monotonic() + 30
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child waited for the parent's pool threads for 30 s")
        time.sleep(0.02)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    np.testing.assert_array_equal(_invoke(interpreter, x), want)  # the parent's pool still runs


# ---- the kernel's paths: gather, dot, scatter, tile (auto picks per step and call) ------------------------------

KERNELS = ("auto", "gather", "dot", "scatter", "tile")
PATH_BATCHES = (1, 3, 4, 5, 8, 16, 17, 33)  # tiles: 8 lanes, 16 lanes, 16 + 8 padded, 16 + 16 + 8 padded
BATCH1_PATHS = ("gather", "dot", "scatter")  # auto at batch 1 (scatter when enough inputs are zero)


def _odd_layer(n_in: int = 83, seed: int = 20) -> tuple[np.ndarray, np.ndarray]:
    """W^T [37 + the TAIL_NNZ rows, n_in] at ~70% sparsity with the tail rows of :func:`_tails` (empty rows
    included), and a bias; odd n_in and n_out."""
    rng = np.random.default_rng(seed)
    w_t = (rng.normal(size=(37, n_in)) * (rng.random((37, n_in)) < 0.3)).astype(np.float32)
    tails = np.zeros((len(TAIL_NNZ) * 2, n_in), np.float32)
    tails[:, :80] = _tails()
    return np.concatenate([w_t, tails]), rng.normal(size=37 + len(TAIL_NNZ) * 2).astype(np.float32)


def _reference(x: np.ndarray, w_t: np.ndarray, bias: np.ndarray, activation: int) -> np.ndarray:
    y = x.astype(np.float64) @ w_t.T.astype(np.float64) + bias
    return {0: y, 1: np.maximum(y, 0), 3: np.clip(y, 0, 6)}[activation]


def _with_zeros(rng, batch: int, n_in: int) -> np.ndarray:
    """Inputs with zero features: ~half of each row zero (as after a ReLU), a zero column, and an all-zero row."""
    x = rng.normal(size=(batch, n_in)).astype(np.float32)
    x[rng.random((batch, n_in)) < 0.5] = 0.0
    x[:, 5] = 0.0
    if batch > 2:
        x[2] = 0.0
    return x


@pytest.mark.parametrize("threads", (1, 2))
@pytest.mark.parametrize("kernel", KERNELS)
def test_every_path_equals_a_float64_reference(kernel, threads):
    """Every path, forced with the delegate's kernel option (auto: its own choice), at batches that fill 1, 2 and 3
    tiles partly or wholly, each activation, bias or none, inputs with and without zero features; one and two threads
    (parallel_min_work=0: every step splits)."""
    w_t, bias = _odd_layer()
    rng = np.random.default_rng(21)
    for activation in (0, 1, 3):
        for with_bias in (True, False):
            b = bias * 3 if with_bias else np.zeros_like(bias)  # x3: relu6 clips at 6 on some outputs
            content = _hand_made(0, (1, w_t.shape[1]), w_t, activation=activation, bias=b if with_bias else None)
            interpreter = _interpreter(content, num_threads=threads, parallel_min_work=0, kernel=kernel)
            before, _ = _counters()
            for batch in PATH_BATCHES:
                for zeros in (False, True):
                    x = (_with_zeros(rng, batch, w_t.shape[1]) if zeros else
                         rng.normal(size=(batch, w_t.shape[1])).astype(np.float32) * 2)
                    y = _invoke(interpreter, x)
                    what = f"{kernel}, batch {batch}, activation {activation}, bias {with_bias}, zeros {zeros}"
                    np.testing.assert_allclose(y, _reference(x, w_t, b, activation), rtol=1e-5, atol=1e-5,
                                               err_msg=what)
                    path = _last_path()
                    if kernel != "auto":
                        assert path == kernel, what
                    else:
                        assert path == "tile" if batch >= 2 else path in BATCH1_PATHS, (what, path)
            runs, last = _counters()
            assert runs - before == (2 * len(PATH_BATCHES) if threads == 2 else 0) and last == threads


@pytest.mark.parametrize("kernel", KERNELS)
def test_every_path_on_a_large_layer_with_and_without_the_pool(kernel):
    """1024 -> 512 at 50% with bias and relu (Keras's output as reference): at the default threshold each step is
    split across the interpreter's two threads (nnz x passes >= 32768), and with num_threads=1 it is not."""
    model = _wide_layer()
    content = export.to_tflite(model, kernels="prune")
    rng = np.random.default_rng(22)
    for threads in (2, 1):
        interpreter = _interpreter(content, threads=2, num_threads=threads, kernel=kernel)
        before, _ = _counters()
        for batch in (1, 2, 8, 17):
            x = rng.normal(size=(batch, 1024)).astype(np.float32)
            if batch == 1:  # a ReLU-like input: auto may take the scatter path
                x[0, rng.random(1024) < 0.6] = 0.0
            y = _invoke(interpreter, x)
            np.testing.assert_allclose(y, model(x).numpy(), rtol=1e-5, atol=1e-5, err_msg=f"{kernel} batch {batch}")
            assert (y == 0).any() and (y > 0).any()
            assert _last_path() == kernel if kernel != "auto" else (_last_path() == "tile") == (batch >= 2)
        runs, last = _counters()
        assert runs - before == (4 if threads == 2 else 0) and last == threads, (kernel, threads)


def test_scatter_on_an_all_zero_input_gives_the_activated_bias():
    w_t, bias = _odd_layer()
    for activation in (0, 1, 3):
        content = _hand_made(0, (1, w_t.shape[1]), w_t, activation=activation, bias=bias * 4)
        for kernel in ("scatter", "auto"):
            x = np.zeros((1, w_t.shape[1]), np.float32)
            y = _invoke(_interpreter(content, kernel=kernel), x)
            want = {0: bias * 4, 1: np.maximum(bias * 4, 0), 3: np.clip(bias * 4, 0, 6)}[activation]
            np.testing.assert_allclose(y[0], want, rtol=1e-6, atol=1e-6)
            if kernel == "auto":
                assert _last_path() == "scatter"  # no entry to read: scatter costs nothing


def test_the_tile_paths_work_counts_tiles_not_rows():
    """A step of 8 rows takes one pass over its entries on the tile path: with nnz < 32768 <= nnz x 8 it stays on
    the caller (the gather path, 8 passes, splits)."""
    rng = np.random.default_rng(23)
    w_t = (rng.normal(size=(64, 512)) * (rng.random((64, 512)) < 0.25)).astype(np.float32)
    nnz = np.count_nonzero(w_t)
    assert nnz < 32768 <= nnz * 8
    content = _hand_made(0, (8, 512), w_t)
    x = rng.normal(size=(8, 512)).astype(np.float32)
    for kernel, threads in (("auto", 1), ("tile", 1), ("gather", 2)):
        y = _invoke(_interpreter(content, threads=2, kernel=kernel), x)
        np.testing.assert_allclose(y, _reference(x, w_t, np.zeros(64), 0), rtol=1e-5, atol=1e-5)
        assert _counters()[1] == threads, kernel
