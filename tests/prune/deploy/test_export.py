"""Deployment round trips (issue 23): TFLite and SavedModel, for masked, stripped and SparseDense models.

One tiny MLP at 90% sparsity in three forms. TFLite outputs equal Keras's
within ``rtol=1e-5`` (float; measured: 0 to 6e-8 absolute) and within 2% of
the output range with int8 weights (measured: 0.3%). SavedModels are loaded
in a fresh process, without ``prune`` when exported with portable kernels.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import keras
import numpy as np
import pytest

import prune
from prune.deploy import export

ROOT = Path(__file__).resolve().parents[3]
FORMS = ("masked", "stripped", "sparse")


def _models() -> dict[str, keras.Model]:
    keras.utils.set_random_seed(0)
    plain = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(4)])
    masked = prune.prune_low_magnitude(plain, prune.OneShot(0.9, 0))
    prune.update_masks(masked, 0)
    return {"masked": masked, "stripped": prune.strip_pruning(masked), "sparse": prune.convert(masked, to="sparse")}


@pytest.fixture(scope="module")
def models() -> dict[str, keras.Model]:
    return _models()


X = np.random.default_rng(0).normal(size=(5, 32)).astype("float32")


def test_strip_pruning_turns_sparse_dense_into_dense_with_its_zeros(models):
    sparse = models["sparse"]
    stripped = prune.strip_pruning(sparse)
    assert [type(layer) for layer in stripped.layers] == [keras.layers.Dense] * 2
    for s, d in zip(sparse.layers, stripped.layers):
        np.testing.assert_array_equal(d.kernel.numpy() != 0, s.get_mask())
        assert not np.signbit(d.kernel.numpy()[~s.get_mask()]).any()  # +0.0 where absent
    np.testing.assert_allclose(stripped.predict(X, verbose=0), sparse.predict(X, verbose=0), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="SparseDense layer 'lazy' must be built"):
        prune.strip_pruning(prune.layers.SparseDense(3, name="lazy"))


@pytest.mark.parametrize("form", FORMS)
def test_tflite_round_trip(models, form):
    model = models[form]
    content = export.to_tflite(model)
    np.testing.assert_allclose(export.run_tflite(content, X), model.predict(X, verbose=0), rtol=1e-5, atol=1e-6)
    if form == "stripped":  # every form strips to this one, so the flatbuffers are the same size
        assert len(content) == len(export.to_tflite(models["masked"])) == len(export.to_tflite(models["sparse"]))
        assert len(content) < len(export.to_tflite(model, sparsity=False)) / 2  # stored in TFLite's sparse format


def test_tflite_interpreter_takes_a_thread_count_and_names_a_bad_one(models):
    content = export.to_tflite(models["stripped"], sparsity=False)
    x = X
    want = export.run_tflite(content, x)
    interpreter = export.tflite_interpreter(content, num_threads=2)
    index = interpreter.get_input_details()[0]["index"]
    interpreter.resize_tensor_input(index, x.shape)
    interpreter.allocate_tensors()
    interpreter.set_tensor(index, x)
    interpreter.invoke()
    np.testing.assert_array_equal(interpreter.get_tensor(interpreter.get_output_details()[0]["index"]), want)
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match=rf"num_threads must be a positive integer or None, got {bad!r}"):
            export.tflite_interpreter(content, num_threads=bad)


def test_tflite_interpreter_hands_its_thread_count_to_the_interpreter(models, monkeypatch):
    """The outputs above cannot tell 2 threads from LiteRT's default: check what the interpreter is given."""
    litert = pytest.importorskip("ai_edge_litert.interpreter")
    content = export.to_tflite(models["stripped"], sparsity=False)
    seen = []
    real = litert.Interpreter

    def recording(*args, **kwargs):
        seen.append(kwargs.get("num_threads", "unset"))
        return real(*args, **kwargs)

    monkeypatch.setattr(litert, "Interpreter", recording)
    export.tflite_interpreter(content, num_threads=2)
    export.tflite_interpreter(content, num_threads=np.int64(3))
    export.tflite_interpreter(content)
    assert seen == [2, 3, "unset"] and type(seen[1]) is int


def test_tflite_int8_and_sparse_runs_without_default_delegates(models):
    model = models["stripped"]
    content = export.to_tflite(model, int8=True)
    expected = model.predict(X, verbose=0)
    got = export.run_tflite(content, X, default_delegates=False)  # XNNPACK refuses int8 + sparse (TF 2.21)
    np.testing.assert_allclose(got, expected, atol=0.02 * np.abs(expected).max())
    with pytest.raises(ValueError, match="sparsity must be True or False, got 1"):
        export.to_tflite(model, sparsity=1)


_LOAD = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import tensorflow as tf
    paths, x, import_prune = json.loads(sys.argv[1])
    if import_prune:
        import prune
    loaded = [tf.saved_model.load(p) for p in paths]  # kept: a loaded object's variables die with it
    out = [np.asarray(m.serve(np.asarray(x, "float32"))).tolist() for m in loaded]
    print(json.dumps({"outputs": out, "prune_imported": "prune" in sys.modules}))
    """
)


def _load_in_fresh_process(paths: list[str], import_prune: bool) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, "-c", _LOAD, json.dumps([paths, X.tolist(), import_prune])], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_saved_model_with_portable_kernels_loads_without_prune(models, tmp_path):
    """Masked layers export TensorFlow ops; SparseDense traces with a TensorFlow kernel (csr, coo)."""
    paths = [export.saved_model(models["masked"], tmp_path / "masked")]
    for matmul in ("csr", "coo"):
        paths.append(export.saved_model(models["sparse"], tmp_path / matmul, portable=True, portable_matmul=matmul))
    assert [layer.matmul for layer in models["sparse"].layers] == ["auto", "auto"]  # restored
    result = _load_in_fresh_process(paths, import_prune=False)
    assert not result["prune_imported"]
    expected = [models["masked"].predict(X, verbose=0)] + [models["sparse"].predict(X, verbose=0)] * 2
    for got, want in zip(result["outputs"], expected):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"portable_matmul must be one of \['csr', 'coo', 'dense'\], got 'native'"):
        export.saved_model(models["sparse"], tmp_path / "x", portable=True, portable_matmul="native")


def test_saved_model_with_native_kernels_loads_after_import_prune(tmp_path):
    if prune.native.load() is None:
        pytest.skip(f"native kernels unavailable: {prune.native.status().reason}")
    model = prune.convert(_models()["masked"], to="sparse", matmul="native")
    path = export.saved_model(model, tmp_path / "native")
    result = _load_in_fresh_process([path], import_prune=True)
    np.testing.assert_allclose(result["outputs"][0], model.predict(X, verbose=0), rtol=1e-5, atol=1e-6)
