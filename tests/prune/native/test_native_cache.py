"""The native build cache never takes a process down: verified loads, torn files set aside, unusable caches named.

Issue 31: a truncated library under the cached name killed every ``import prune; import tensorflow`` with SIGBUS
(rc 135) until someone deleted it; an unusable cache surfaced as TensorFlow's "Op type not registered" or as
"FileExistsError: File exists"; an unbalanced quote in PRUNE_NATIVE_CXXFLAGS read "No closing quotation".
"""

import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from prune import native

ROOT = Path(__file__).resolve().parents[3]
FORCED_OFF = os.environ.get("PRUNE_NATIVE", "1").strip() == "0"
needs_native = pytest.mark.skipif(FORCED_OFF, reason="PRUNE_NATIVE=0 forces the fallback")


def _env(cache: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PRUNE_NATIVE", "CXX", "PYTEST_XDIST_WORKER")}
    env.update(PYTHONPATH=str(ROOT), PRUNE_NATIVE_CACHE=str(cache), TF_CPP_MIN_LOG_LEVEL="3", **extra)
    return env


def _run(code: str, cache: Path, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=_env(cache, **extra), cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


def _copy_of_this_build(cache: Path) -> Path:
    """The library this session loaded, with its build record, copied into ``cache`` under its own name."""
    st = native.status()
    assert st.available, st.reason
    src = Path(st.path)
    cache.mkdir(parents=True)
    shutil.copy2(src, cache / src.name)
    shutil.copy2(src.with_suffix(".json"), cache / src.with_suffix(".json").name)
    return cache / src.name


@needs_native
def test_a_build_records_its_size_and_hash_and_verify_accepts_only_that_file(tmp_path):
    lib = _copy_of_this_build(tmp_path / "cache")
    assert native.verify(lib) is None
    data = lib.read_bytes()
    lib.write_bytes(data[: len(data) // 3])  # torn: cut short
    assert native.verify(lib) == f"{len(data) // 3} bytes where its build wrote {len(data)}"
    lib.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # foreign: same size, other bytes
    assert native.verify(lib) == "its SHA-256 differs from the one its build recorded"
    lib.write_bytes(data)
    lib.with_suffix(".json").unlink()  # a library whose build never finished writing its record
    assert native.verify(lib).startswith("no record of its build")
    lib.with_suffix(".json").write_text("{not json")
    assert "unreadable" in native.verify(lib)


@needs_native
def test_import_with_a_torn_library_in_the_cache_neither_dies_nor_loads_it_and_first_use_rebuilds(tmp_path):
    cache = tmp_path / "cache"
    lib = _copy_of_this_build(cache)
    data = lib.read_bytes()
    lib.write_bytes(data[:100_000])  # what killed `import prune; import tensorflow` with SIGBUS
    imported = _run("import prune, tensorflow\nfrom prune import native\nprint(native._state.get('status'))", cache)
    assert imported.returncode == 0, imported.stderr[-2000:]  # was rc 135 (SIGBUS)
    assert imported.stdout.strip() == "None"  # nothing loaded, nothing compiled at import
    assert lib.stat().st_size == 100_000
    used = _run(
        "import warnings, numpy as np\nwarnings.simplefilter('always')\nfrom prune import native\n"
        "from prune.layers.sparse import SparseDense\n"
        "y = SparseDense.from_dense(np.eye(3, dtype='f4'), np.eye(3), matmul='native')(np.ones((2, 3), 'f4'))\n"
        "st = native.status()\nprint(st.available, st.built, float(y.numpy().sum()))", cache)
    assert used.returncode == 0, used.stderr[-2000:]
    assert used.stdout.split() == ["True", "True", "6.0"]
    assert "was not loaded (100000 bytes where its build wrote" in used.stderr and ".so.bad" in used.stderr
    assert (cache / (lib.name + ".bad")).stat().st_size == 100_000  # set aside, for whoever wants to look
    assert lib.read_bytes() == data and native.verify(lib) is None  # rebuilt: the same bytes as this session's


def test_a_cache_that_is_a_file_is_named_once_at_import_and_at_first_use(tmp_path):
    cache = tmp_path / "not-a-dir"
    cache.write_text("a file where the cache should be")
    code = ("import warnings\nwarnings.simplefilter('always')\nimport prune, tensorflow, numpy as np\n"
            "from prune import native\nfrom prune.layers.sparse import SparseDense\n"
            "y = SparseDense.from_dense(np.eye(3, dtype='f4'), np.eye(3), matmul='native')(np.ones((2, 3), 'f4'))\n"
            "print(native.status().available, float(y.numpy().sum()))")
    proc = _run(code, cache)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["False", "6.0"]  # TensorFlow's kernels ran
    said = [ln for ln in proc.stderr.splitlines() if "RuntimeWarning" in ln]
    assert len(said) == 1, proc.stderr[-3000:]  # once, not again at first use
    assert "is not a directory" in said[0] and "set PRUNE_NATIVE_CACHE to a writable directory" in said[0]
    assert "SavedModel" in said[0]
    assert "FileExistsError" not in proc.stderr


def test_cache_problem_names_what_is_wrong(tmp_path, monkeypatch):
    assert native.cache_problem(tmp_path / "new" / "deeper") is None  # created on first build
    (tmp_path / "file").write_text("x")
    assert native.cache_problem(tmp_path / "file" / "below") == f"{tmp_path / 'file'} is not a directory"
    monkeypatch.setattr(os, "access", lambda path, mode: False)  # a read-only mount (root writes anywhere else)
    assert native.cache_problem(tmp_path) == f"{tmp_path} is not writable"


@needs_native
def test_a_native_savedmodel_in_a_process_whose_cache_is_unusable_says_why(tmp_path):
    import keras

    from prune.deploy import export
    from prune.layers.sparse import SparseDense

    rng = np.random.default_rng(0)
    mask = rng.random((6, 4)) < 0.5
    model = keras.Sequential([keras.Input((6,)), SparseDense.from_dense(rng.standard_normal((6, 4)), mask,
                                                                        matmul="native")])
    path = export.saved_model(model, tmp_path / "sm")
    x = rng.standard_normal((3, 6)).astype("f4")
    want = model(x).numpy()
    loaded = export.load_saved_model(path)  # here: it loads (kept: its functions hold no reference to it)
    np.testing.assert_allclose(loaded.serve(x).numpy(), want, rtol=1e-6)
    (tmp_path / "cache-file").write_text("x")
    proc = _run(f"import prune\nfrom prune import export\nexport.load_saved_model({path!r})", tmp_path / "cache-file")
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("RuntimeError: the SavedModel") and "not usable" in last and "PRUNE_NATIVE_CACHE" in last
    assert "portable=True" in last
    with pytest.raises(ValueError, match="path must be a SavedModel directory"):
        export.load_saved_model(tmp_path / "missing")


def test_flags_that_cannot_be_split_name_the_variable(monkeypatch, tmp_path):
    monkeypatch.setenv(native.EXTRA_FLAGS_ENV, "-DX='unbalanced")
    with pytest.raises(ValueError, match=r"PRUNE_NATIVE_CXXFLAGS=.*cannot be split.*No closing quotation"):
        native.extra_flags()
    if native._compiler() is not None:  # what load() reports as its fallback reason
        with pytest.raises(ValueError, match="PRUNE_NATIVE_CXXFLAGS"):
            native._build(tmp_path)
    assert not list(tmp_path.iterdir())  # nothing written
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        monkeypatch.setenv(native.EXTRA_FLAGS_ENV, "-DA=1 '-DB=two words'")
        assert native.extra_flags() == ["-DA=1", "-DB=two words"]
