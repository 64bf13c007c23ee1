"""Deployment: TFLite (LiteRT) flatbuffers and SavedModels, from masked, stripped and ``SparseDense`` models.

TFLite::

    content = prune.deploy.export.to_tflite(model)            # strip_pruning, then convert with EXPERIMENTAL_SPARSITY
    y = prune.deploy.export.run_tflite(content, x)            # ai_edge_litert's interpreter, else tf.lite's
    content = prune.deploy.export.to_tflite(model, int8=True)  # weights in int8 (dynamic range), still sparse
    y = prune.deploy.export.run_tflite(content, x, default_delegates=False)

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

__all__ = ["to_tflite", "tflite_interpreter", "run_tflite", "saved_model", "load_saved_model", "PORTABLE_MATMULS"]

PORTABLE_MATMULS = ("csr", "coo", "dense")
"""``SparseDense`` kernels built from TensorFlow's own ops (see :mod:`prune.layers.kernels`)."""


def to_tflite(model: Any, *, sparsity: bool = True, int8: bool = False) -> bytes:
    """Strip ``model`` and convert it to a TFLite flatbuffer.

    Args:
        model: A Keras model: masked, stripped or with ``SparseDense`` layers
            (stripped first, with :func:`prune.strip_pruning`; ``model`` is
            not changed).
        sparsity: Add ``tf.lite.Optimize.EXPERIMENTAL_SPARSITY``, which
            stores sparse enough weights in TFLite's sparse format.
        int8: Add ``tf.lite.Optimize.DEFAULT``: weights quantised to int8
            (dynamic range; activations stay float). Run the result with
            ``default_delegates=False`` when ``sparsity`` is on too.

    Returns:
        The flatbuffer's bytes.

    Raises:
        ValueError: ``sparsity`` or ``int8`` is not a bool, or ``model`` is
            not a Keras model.
    """
    import keras
    import tensorflow as tf

    from prune.api import strip_pruning

    for name, value in (("sparsity", sparsity), ("int8", int8)):
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be True or False, got {value!r}")
    if not isinstance(model, keras.Model):
        raise ValueError(f"model must be a Keras model, got {type(model).__module__}.{type(model).__name__}")
    with tempfile.TemporaryDirectory() as directory:  # from_keras_model would print the export's endpoints
        strip_pruning(model).export(directory, format="tf_saved_model", verbose=False)
        converter = tf.lite.TFLiteConverter.from_saved_model(directory)
        options = ((tf.lite.Optimize.DEFAULT, int8), (tf.lite.Optimize.EXPERIMENTAL_SPARSITY, sparsity))
        converter.optimizations = [option for option, on in options if on]
        return converter.convert()


def tflite_interpreter(content: bytes, *, default_delegates: bool = True, num_threads: int | None = None) -> Any:
    """An interpreter for ``content``, tensors allocated.

    ``ai_edge_litert``'s (LiteRT, the supported runtime) when it is
    installed, else ``tf.lite.Interpreter`` (deprecated by TensorFlow in
    favour of LiteRT; its deprecation warning is silenced here).

    Args:
        content: A flatbuffer, e.g. from :func:`to_tflite`.
        default_delegates: Apply the default delegates (XNNPACK). ``False``
            runs the built-in kernels only, which int8 + sparse models need.
        num_threads: The interpreter's threads; ``None`` leaves LiteRT's
            default.

    Raises:
        ValueError: ``num_threads`` is not a positive integer or ``None``.
    """
    if num_threads is not None and (
        isinstance(num_threads, (bool, np.bool_)) or not isinstance(num_threads, (int, np.integer)) or num_threads < 1
    ):
        raise ValueError(f"num_threads must be a positive integer or None, got {num_threads!r}")
    if num_threads is not None:
        num_threads = int(num_threads)
    try:
        from ai_edge_litert.interpreter import Interpreter, OpResolverType
    except ImportError:
        import tensorflow as tf

        Interpreter, OpResolverType = tf.lite.Interpreter, tf.lite.experimental.OpResolverType
    kwargs: dict[str, Any] = {} if default_delegates else {"experimental_op_resolver_type": OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES}
    if num_threads is not None:
        kwargs["num_threads"] = num_threads
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"(?s).*tf\.lite\.Interpreter is deprecated")
        interpreter = Interpreter(model_content=content, **kwargs)
    interpreter.allocate_tensors()
    return interpreter


def run_tflite(content: bytes, x: Any, *, default_delegates: bool = True) -> np.ndarray:
    """The output of the single-input, single-output flatbuffer ``content`` on the batch ``x``.

    Args:
        content: A flatbuffer, e.g. from :func:`to_tflite`.
        x: One batch, of the model's input shape and dtype.
        default_delegates: See :func:`tflite_interpreter`.

    Raises:
        ValueError: the model has several inputs or outputs.
    """
    interpreter = tflite_interpreter(content, default_delegates=default_delegates)
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
