"""Deployment: TFLite (LiteRT) flatbuffers and SavedModels, from masked, stripped and ``SparseDense`` models.

TFLite::

    content = prune.deploy.export.to_tflite(model)            # strip_pruning, then convert with EXPERIMENTAL_SPARSITY
    y = prune.deploy.export.run_tflite(content, x)            # ai_edge_litert's interpreter, else tf.lite's
    content = prune.deploy.export.to_tflite(model, int8=True)  # weights in int8 (dynamic range), still sparse
    y = prune.deploy.export.run_tflite(content, x, default_delegates=False)
    content = prune.deploy.export.to_tflite(model, kernels="prune")  # SparseDense -> prune's PruneSparseFC op
    y = prune.deploy.export.run_tflite(content, x)            # loads prune's LiteRT delegate (built on first use)

:func:`to_tflite` first calls :func:`prune.strip_pruning`, which turns masked
layers into their plain Keras layers and ``SparseDense`` into a plain
``Dense`` holding its zeros, so every implementation converts to the same
flatbuffer. With ``Optimize.EXPERIMENTAL_SPARSITY`` the converter stores
sparse enough weights in TFLite's sparse format (a 90%-sparse LeNet-300-100:
6.5x smaller, ``results/benchmarks/deployment_size.csv``). Upstream
limitation (TF 2.21): a flatbuffer both int8-quantised and sparse fails to
prepare under the default XNNPACK delegate (``failed to delegate
FULLY_CONNECTED``); it runs with the built-in kernels only, which
``default_delegates=False`` selects
(``OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES``).

``kernels="prune"`` (issue 38) writes each ``SparseDense`` layer as prune's
custom operator ``PruneSparseFC`` (only its stored entries, as CSR), which
LiteRT runs with prune's external delegate (:mod:`prune.native.litert`);
:func:`tflite_interpreter` and :func:`run_tflite` load it when the flatbuffer
holds such operators. Float32 only; AVX-512, AVX2 or scalar as the CPU allows, on the interpreter's threads.

SavedModel::

    prune.deploy.export.saved_model(model, path)                 # the model's own kernels
    prune.deploy.export.saved_model(model, path, portable=True)  # TensorFlow ops only: loads without prune

Masked and dense layers export TensorFlow ops only. A ``SparseDense`` with
``matmul="native"`` or ``"auto"`` (when the native library is loaded) exports
the native ops ``PruneSpmm``/``PruneSddmm``, which a process must register
before ``tf.saved_model.load``: ``import prune`` first. ``portable=True``
traces every ``SparseDense`` with a TensorFlow kernel instead
(``portable_matmul``, default ``"csr"``), so the SavedModel loads in a
process that never imports ``prune``. Both export Keras's ``serve``
endpoint (``keras.Model.export``).
"""

from __future__ import annotations

import contextlib
import tempfile
import warnings
from pathlib import Path
from typing import Any, Iterator

import numpy as np

__all__ = [
    "to_tflite",
    "tflite_interpreter",
    "run_tflite",
    "saved_model",
    "load_saved_model",
    "PORTABLE_MATMULS",
    "TFLITE_KERNELS",
    "prune_ops",
]

PORTABLE_MATMULS = ("csr", "coo", "dense")
"""``SparseDense`` kernels built from TensorFlow's own ops (see :mod:`prune.layers.kernels`)."""

TFLITE_KERNELS = ("builtin", "prune")
"""What :func:`to_tflite` writes for ``SparseDense`` layers: TFLite's ``FULLY_CONNECTED``, or prune's ``PruneSparseFC``."""

_RUN_KERNELS = ("auto", "prune", "builtin")

# TfLiteFusedActivation codes that PruneSparseFC applies itself (none, relu, relu6)
_FUSED = {0: "none", 1: "relu", 3: "relu6"}


def to_tflite(model: Any, *, sparsity: bool = True, int8: bool = False, kernels: str = "builtin") -> bytes:
    """Strip ``model`` and convert it to a TFLite flatbuffer.

    With ``kernels="prune"``, every ``FULLY_CONNECTED`` operator whose weight is
    a ``SparseDense`` layer's (the same shape and exactly the same float32
    contents as its dense weight, transposed) becomes prune's custom operator
    ``PruneSparseFC``, holding only the stored entries (values, int32 columns
    and row pointers of ``W^T`` by output; the bias is kept), and the dense
    weight is dropped. The fused activation (none, relu, relu6) and
    ``keep_num_dims`` are carried over; other activations stay separate
    operators as the converter writes them. LiteRT runs it with prune's delegate
    (:mod:`prune.native.litert`), which :func:`run_tflite` and
    :func:`tflite_interpreter` load. Other layers convert as with
    ``"builtin"`` but without TFLite's sparse format (``sparsity`` is then
    ignored), and ``int8`` is refused.

    Args:
        model: A Keras model: masked, stripped or with ``SparseDense`` layers
            (stripped first, with :func:`prune.strip_pruning`; ``model`` is
            not changed).
        sparsity: Add ``tf.lite.Optimize.EXPERIMENTAL_SPARSITY``, which
            stores sparse enough weights in TFLite's sparse format.
        int8: Add ``tf.lite.Optimize.DEFAULT``: weights quantised to int8
            (dynamic range; activations stay float). Run the result with
            ``default_delegates=False`` when ``sparsity`` is on too.
        kernels: ``"builtin"`` (default: TFLite's own operators only, the
            portable form) or ``"prune"`` (``SparseDense`` layers as
            ``PruneSparseFC``, see above).

    Returns:
        The flatbuffer's bytes.

    Raises:
        ValueError: ``sparsity`` or ``int8`` is not a bool, ``kernels`` is not
            one of :data:`TFLITE_KERNELS`, ``int8`` with ``kernels="prune"``,
            ``model`` is not a Keras model, or (``"prune"``) a ``SparseDense``
            layer whose ``FULLY_CONNECTED`` operator cannot be found or
            translated (the message names the layer).
    """
    import keras
    import tensorflow as tf

    from prune.api import strip_pruning

    for name, value in (("sparsity", sparsity), ("int8", int8)):
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be True or False, got {value!r}")
    if not isinstance(kernels, str) or kernels not in TFLITE_KERNELS:
        raise ValueError(f"kernels must be one of {list(TFLITE_KERNELS)}, got {kernels!r}")
    if kernels == "prune" and int8:
        raise ValueError("kernels='prune' writes float32 PruneSparseFC operators: int8=True is not supported with it")
    if not isinstance(model, keras.Model):
        raise ValueError(f"model must be a Keras model, got {type(model).__module__}.{type(model).__name__}")
    if kernels == "prune":
        sparsity = False  # the rewrite reads the dense weights; TFLite's sparse format would hide them
    with tempfile.TemporaryDirectory() as directory:  # from_keras_model would print the export's endpoints
        strip_pruning(model).export(directory, format="tf_saved_model", verbose=False)
        converter = tf.lite.TFLiteConverter.from_saved_model(directory)
        options = ((tf.lite.Optimize.DEFAULT, int8), (tf.lite.Optimize.EXPERIMENTAL_SPARSITY, sparsity))
        converter.optimizations = [option for option, on in options if on]
        content = converter.convert()
    if kernels == "prune":
        content = _with_prune_ops(content, model)
    return content


def _schema() -> Any:
    """TFLite's flatbuffer schema (generated object API): ai-edge-litert's, else TensorFlow's copy."""
    import importlib

    try:
        return importlib.import_module("ai_edge_litert.schema_py_generated")
    except ImportError:
        return importlib.import_module("tensorflow.lite.python.schema_py_generated")


def prune_ops(content: bytes) -> int:
    """How many ``PruneSparseFC`` operators the flatbuffer ``content`` holds (0 for a plain export)."""
    s = _schema()

    from prune.native.litert import OP_NAME

    model = s.Model.GetRootAsModel(content, 0)
    codes = {
        i for i in range(model.OperatorCodesLength())
        if model.OperatorCodes(i).BuiltinCode() == s.BuiltinOperator.CUSTOM
        and (model.OperatorCodes(i).CustomCode() or b"").decode() == OP_NAME
    }
    if not codes:
        return 0
    count = 0
    for g in range(model.SubgraphsLength()):
        graph = model.Subgraphs(g)
        count += sum(graph.Operators(i).OpcodeIndex() in codes for i in range(graph.OperatorsLength()))
    return count


def _aligned_buffer_type() -> Any:
    """``BufferT`` whose data is packed 16-byte aligned (as the converter writes it); the generated one aligns to 1."""
    s = _schema()

    class AlignedBufferT(s.BufferT):
        def Pack(self, builder: Any) -> int:  # noqa: N802 - the generated API's name
            data = None
            if self.data is not None:
                payload = np.asarray(self.data, dtype=np.uint8).tobytes()
                builder.StartVector(1, len(payload), 16)
                builder.head = builder.head - len(payload)
                builder.Bytes[builder.head : builder.head + len(payload)] = payload
                builder.vectorNumElems = len(payload)
                data = builder.EndVector()
            s.BufferStart(builder)
            if data is not None:
                s.BufferAddData(builder, data)
            s.BufferAddOffset(builder, self.offset)
            s.BufferAddSize(builder, self.size)
            return s.BufferEnd(builder)

    return AlignedBufferT


def _with_prune_ops(content: bytes, model: Any) -> bytes:
    """``content`` with each ``SparseDense`` layer's ``FULLY_CONNECTED`` operator rewritten as ``PruneSparseFC``."""
    import flatbuffers
    s = _schema()

    from prune.layers.sparse import sparse_layers
    from prune.native.litert import OP_NAME

    # SparseConv2D layers (a SparseDense subclass) stay CONV_2D: PruneSparseFC is a fully-connected operator;
    # SparseEinsumDense layers (another) stay the converter's own operators for their einsum (not translated yet)
    layers = [layer for layer in sparse_layers(model)
              if type(layer).__name__ not in ("SparseConv2D", "SparseEinsumDense") and layer.nnz > 0]
    # the weight FULLY_CONNECTED holds: W^T, [n_out, n_in], float32, exactly the layer's dense weight (+0.0 where
    # absent); layers with the same weight share the key (their operators compute the same)
    wanted: dict[tuple[tuple[int, ...], bytes], list[Any]] = {}
    for layer in layers:
        if len(layer.dense_shape) != 2 or layer.to_dense().ndim != 2:
            raise ValueError(f"kernels='prune' translates SparseDense layers with a 2-D weight; layer {layer.name!r} "
                             f"is a {type(layer).__name__} (export it with kernels='builtin')")
        w_t = np.ascontiguousarray(layer.to_dense().astype(np.float32).T)
        wanted.setdefault((w_t.shape, w_t.tobytes()), []).append(layer)
    m = s.ModelT.InitFromObj(s.Model.GetRootAsModel(content, 0))
    code = next((i for i, c in enumerate(m.operatorCodes)
                 if c.builtinCode == s.BuiltinOperator.CUSTOM and (c.customCode or b"") in (OP_NAME, OP_NAME.encode())),
                None)
    matched: set[int] = set()
    replaced: set[tuple[int, int]] = set()  # (subgraph, weight tensor) of rewritten operators
    for g, graph in enumerate(m.subgraphs):
        for op in graph.operators:
            if m.operatorCodes[op.opcodeIndex].builtinCode != s.BuiltinOperator.FULLY_CONNECTED or len(op.inputs) < 2:
                continue
            weight = graph.tensors[op.inputs[1]]
            data = m.buffers[weight.buffer].data if weight.buffer < len(m.buffers) else None
            if weight.type != s.TensorType.FLOAT32 or data is None or weight.sparsity is not None:
                continue
            key = (tuple(int(d) for d in weight.shape), np.asarray(data, dtype=np.uint8).tobytes())
            if key not in wanted:
                continue
            layer = wanted[key][0]
            options = op.builtinOptions
            act = 0 if options is None else int(options.fusedActivationFunction)
            keep = False if options is None else bool(options.keepNumDims)
            if act not in _FUSED or (options is not None and options.weightsFormat != 0):
                raise ValueError(f"SparseDense layer {layer.name!r}: its FULLY_CONNECTED operator has a fused "
                                 f"activation (code {act}) or weights format PruneSparseFC does not implement; export "
                                 f"it with kernels='builtin'")
            x = graph.tensors[op.inputs[0]]
            if x.type != s.TensorType.FLOAT32 or len(op.outputs) != 1:
                raise ValueError(f"SparseDense layer {layer.name!r}: its FULLY_CONNECTED operator is not float32 "
                                 f"with one output; export it with kernels='builtin'")
            if code is None:
                oc = s.OperatorCodeT()
                oc.builtinCode = oc.deprecatedBuiltinCode = s.BuiltinOperator.CUSTOM
                oc.customCode, oc.version = OP_NAME, 1
                m.operatorCodes.append(oc)
                code = len(m.operatorCodes) - 1
            # CSR of W^T by output row, from the layer's own entries (row-major indices (i, j) of W)
            idx, vals = layer.indices.numpy(), layer.values.numpy().astype(np.float32)
            order = np.lexsort((idx[:, 0], idx[:, 1]))
            n_out = layer.dense_shape[1]
            row_ptr = np.searchsorted(idx[order, 1], np.arange(n_out + 1)).astype(np.int32)
            arrays = (("values", vals[order], s.TensorType.FLOAT32), ("cols", idx[order, 0].astype(np.int32), s.TensorType.INT32),
                      ("row_ptr", row_ptr, s.TensorType.INT32))
            new_inputs = []
            for name, arr, kind in arrays:
                buf = s.BufferT()
                buf.data = np.frombuffer(np.ascontiguousarray(arr).tobytes(), dtype=np.uint8)
                m.buffers.append(buf)
                t = s.TensorT()
                t.shape, t.type, t.buffer = [int(arr.shape[0])], kind, len(m.buffers) - 1
                t.name = f"{layer.name}/prune_sparse_fc/{name}"
                graph.tensors.append(t)
                new_inputs.append(len(graph.tensors) - 1)
            bias = op.inputs[2] if len(op.inputs) > 2 else -1
            replaced.add((g, op.inputs[1]))
            op.opcodeIndex = code
            op.inputs = [op.inputs[0], *new_inputs, bias]
            op.builtinOptionsType, op.builtinOptions = s.BuiltinOptions.NONE, None
            op.customOptions = [1, act, int(keep), 0]
            op.customOptionsFormat = s.CustomOptionsFormat.FLEXBUFFERS
            matched.update(id(each) for each in wanted[key])
    missing = [layer.name for layer in layers if id(layer) not in matched]
    if missing:
        raise ValueError(f"kernels='prune': no FULLY_CONNECTED operator with the weight of SparseDense layer(s) "
                         f"{missing} was found in the converted model (the converter wrote another operator for them); "
                         f"export with kernels='builtin'")
    # drop the dense weights no operator reads any more: the tensor keeps its place (indices stay valid), with no data
    used_tensors = {(g, t) for g, graph in enumerate(m.subgraphs) for op in graph.operators
                    for t in [*op.inputs, *op.outputs, *(op.intermediates or [])]}
    used_tensors |= {(g, t) for g, graph in enumerate(m.subgraphs) for t in [*graph.inputs, *graph.outputs]}
    for g, t in replaced - used_tensors:
        m.subgraphs[g].tensors[t].buffer = 0
    used_buffers = {tensor.buffer for graph in m.subgraphs for tensor in graph.tensors}
    used_buffers |= {meta.buffer for meta in m.metadata or []} | set(m.metadataBuffer or [])
    aligned = _aligned_buffer_type()
    buffers = []
    for i, buf in enumerate(m.buffers):
        new = aligned()
        new.data = buf.data if i in used_buffers else None
        new.offset, new.size = buf.offset, buf.size
        buffers.append(new)
    m.buffers = buffers
    builder = flatbuffers.Builder(max(1024, len(content)))
    builder.Finish(m.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def tflite_interpreter(
    content: bytes, *, default_delegates: bool = True, num_threads: int | None = None, kernels: str = "auto"
) -> Any:
    """An interpreter for ``content``, tensors allocated.

    ``ai_edge_litert``'s (LiteRT, the supported runtime) when it is
    installed, else ``tf.lite.Interpreter`` (deprecated by TensorFlow in
    favour of LiteRT; its deprecation warning is silenced here).

    Args:
        content: A flatbuffer, e.g. from :func:`to_tflite`.
        default_delegates: Apply the default delegates (XNNPACK). ``False``
            runs the built-in kernels only, which int8 + sparse models need.
        num_threads: The interpreter's threads; ``None`` leaves LiteRT's
            default. prune's ``PruneSparseFC`` kernel splits a large step over
            as many threads (small steps run on the caller alone).
        kernels: ``"auto"`` (default) loads prune's LiteRT delegate
            (:func:`prune.native.litert.delegate_path`, built on first use)
            when ``content`` holds ``PruneSparseFC`` operators
            (``to_tflite(..., kernels="prune")``); ``"prune"`` always loads it;
            ``"builtin"`` never does (such a model then fails to load).

    Raises:
        ValueError: ``num_threads`` is not a positive integer or ``None``, or
            ``kernels`` is not ``"auto"``, ``"prune"`` or ``"builtin"``.
        RuntimeError: prune's delegate is needed but cannot be built
            (``PRUNE_NATIVE=0``, no compiler); or ``allocate_tensors`` fails,
            e.g. on a corrupt ``PruneSparseFC`` structure, with the kernel's message.
    """
    if num_threads is not None and (
        isinstance(num_threads, (bool, np.bool_)) or not isinstance(num_threads, (int, np.integer)) or num_threads < 1
    ):
        raise ValueError(f"num_threads must be a positive integer or None, got {num_threads!r}")
    if not isinstance(kernels, str) or kernels not in _RUN_KERNELS:
        raise ValueError(f"kernels must be one of {list(_RUN_KERNELS)}, got {kernels!r}")
    if num_threads is not None:
        num_threads = int(num_threads)
    try:
        from ai_edge_litert.interpreter import Interpreter, OpResolverType, load_delegate
    except ImportError:
        import tensorflow as tf

        Interpreter, OpResolverType = tf.lite.Interpreter, tf.lite.experimental.OpResolverType
        load_delegate = tf.lite.experimental.load_delegate
    kwargs: dict[str, Any] = {} if default_delegates else {"experimental_op_resolver_type": OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES}
    if num_threads is not None:
        kwargs["num_threads"] = num_threads
    if kernels == "prune" or (kernels == "auto" and prune_ops(content) > 0):
        from prune.native.litert import delegate_path

        kwargs["experimental_delegates"] = [load_delegate(str(delegate_path()))]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"(?s).*tf\.lite\.Interpreter is deprecated")
        interpreter = Interpreter(model_content=content, **kwargs)
    interpreter.allocate_tensors()
    return interpreter


def run_tflite(content: bytes, x: Any, *, default_delegates: bool = True, kernels: str = "auto") -> np.ndarray:
    """The output of the single-input, single-output flatbuffer ``content`` on the batch ``x``.

    Args:
        content: A flatbuffer, e.g. from :func:`to_tflite`.
        x: One batch, of the model's input shape and dtype.
        default_delegates: See :func:`tflite_interpreter`.
        kernels: See :func:`tflite_interpreter` (``"auto"`` loads prune's
            delegate for a flatbuffer that holds ``PruneSparseFC`` operators).

    Raises:
        ValueError: the model has several inputs or outputs; a bad ``kernels``.
    """
    interpreter = tflite_interpreter(content, default_delegates=default_delegates, kernels=kernels)
    inputs, outputs = interpreter.get_input_details(), interpreter.get_output_details()
    if len(inputs) != 1 or len(outputs) != 1:
        raise ValueError(f"run_tflite takes a model with one input and one output, got {len(inputs)} and {len(outputs)}")
    x = np.asarray(x, dtype=inputs[0]["dtype"])
    interpreter.resize_tensor_input(inputs[0]["index"], x.shape)
    interpreter.allocate_tensors()
    interpreter.set_tensor(inputs[0]["index"], x)
    interpreter.invoke()
    return np.array(interpreter.get_tensor(outputs[0]["index"]))


@contextlib.contextmanager
def _sparse_kernels(model: Any, matmul: str) -> Iterator[None]:
    """While the block runs, every ``SparseDense`` of ``model`` traces with ``matmul``; restored after."""
    from prune.layers.sparse import sparse_layers

    layers = sparse_layers(model)
    saved = [layer.matmul for layer in layers]
    try:
        for layer in layers:
            layer.matmul = matmul
        yield
    finally:
        for layer, value in zip(layers, saved):
            layer.matmul = value


def saved_model(model: Any, path: str | Path, *, portable: bool = False, portable_matmul: str = "csr") -> str:
    """Export ``model``'s inference function as a SavedModel with a ``serve`` endpoint.

    Load it with ``tf.saved_model.load(path).serve(x)``. With native
    ``SparseDense`` kernels, ``import prune`` before loading; with
    ``portable=True`` no import of ``prune`` is needed.

    Args:
        model: A built Keras model (masked, stripped or with ``SparseDense`` layers).
        path: Directory to write.
        portable: Trace every ``SparseDense`` with ``portable_matmul``
            instead of its own ``matmul`` (which may be native), so the
            SavedModel holds TensorFlow ops only. The layers' ``matmul`` is
            restored afterwards.
        portable_matmul: ``"csr"`` (default, multithreaded), ``"coo"`` or ``"dense"``.

    Returns:
        ``path``, as a string.

    Raises:
        ValueError: ``portable`` is not a bool, ``portable_matmul`` is not
            one of :data:`PORTABLE_MATMULS`, or ``model`` is not a built Keras model.
    """
    import keras

    if not isinstance(portable, bool):
        raise ValueError(f"portable must be True or False, got {portable!r}")
    if portable_matmul not in PORTABLE_MATMULS:
        raise ValueError(f"portable_matmul must be one of {list(PORTABLE_MATMULS)}, got {portable_matmul!r}")
    if not isinstance(model, keras.Model) or not model.built:
        raise ValueError(f"model must be a built Keras model, got {model!r}")
    path = str(path)
    with _sparse_kernels(model, portable_matmul) if portable else contextlib.nullcontext():
        model.export(path, format="tf_saved_model", verbose=False)
    return path


def load_saved_model(path: str | Path) -> Any:
    """``tf.saved_model.load(path)``, with prune's native ops registered first when the model holds them.

    Loads (building on first use) the native library before TensorFlow reads the graph, so a SavedModel
    written by :func:`saved_model` with native ``SparseDense`` kernels loads in a fresh process.

    Args:
        path: A SavedModel directory.

    Returns:
        The loaded object (call ``.serve(x)``).

    Raises:
        RuntimeError: the SavedModel holds prune's native ops (``PruneSpmm``, ``PruneSddmm``) and they cannot
            be loaded here; the message gives :func:`prune.native.status`'s reason (an unusable cache names
            ``PRUNE_NATIVE_CACHE``) and the way out (``saved_model(..., portable=True)``).
        ValueError: ``path`` is not a directory.
    """
    import tensorflow as tf

    from prune import native

    if not Path(path).is_dir():
        raise ValueError(f"path must be a SavedModel directory, got {str(path)!r}")
    native.load()
    try:
        return tf.saved_model.load(str(path))
    except Exception as err:  # noqa: BLE001 - re-raised below, with the reason, when it is the missing native ops
        text = str(err)
        if "Op type not registered" not in text or "'Prune" not in text:
            raise
        raise RuntimeError(
            f"the SavedModel {str(path)!r} holds prune's native ops, which are not available in this process "
            f"({native.status().reason}); fix that, or export it with prune.deploy.export.saved_model(model, path, "
            f"portable=True), which needs TensorFlow's ops only"
        ) from err
