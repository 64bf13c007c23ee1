"""Damaged input files name themselves: GloVe text with a truncated gzip stream or bytes that are not UTF-8."""

from __future__ import annotations

import gzip

import pytest

from prune.layers.embeddings import load_glove


def _glove(n: int) -> bytes:
    return b"".join(f"w{i} {i}.5 -{i}.25\n".encode() for i in range(n))


def test_truncated_gzip_names_path_and_line(tmp_path):
    path = tmp_path / "vectors.txt.gz"
    data = gzip.compress(_glove(20000))
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"vectors\.txt\.gz: line \d+: the gzip data is truncated or corrupt") as info:
        load_glove(path)
    line = int(str(info.value).split(": line ")[1].split(":")[0])
    assert 1000 < line < 20000  # where the stream broke off, not line 1


def test_non_utf8_bytes_name_path_line_and_byte(tmp_path):
    path = tmp_path / "vectors.txt"
    path.write_bytes(_glove(3) + b"caf\xe9 1.0 2.0\n" + _glove(2))
    with pytest.raises(ValueError, match=r"vectors\.txt: line 4: not UTF-8 at byte 3 of the line"):
        load_glove(path)
    gz = tmp_path / "vectors.txt.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    with pytest.raises(ValueError, match=r"vectors\.txt\.gz: line 4: not UTF-8"):
        load_glove(gz)


@pytest.mark.slow
def test_keras_file_needs_prune_imported_first(tmp_path):
    """Keras 3 imports a custom class's ``module`` itself only for keras/keras_hub/keras_cv/keras_nlp
    (``serialization_lib._retrieve_class_or_fn``), so a process must import prune before loading; the
    README says so. This canary fails when Keras starts importing such modules (then drop the advice)."""
    import subprocess
    import sys
    from pathlib import Path

    import prune
    from tests.helpers import mlp

    path = tmp_path / "pruned.keras"
    prune.prune_low_magnitude(mlp(), prune.ConstantSparsity(0.5, begin_step=0)).save(path)
    script = (
        "import keras, sys\n"
        "try:\n    keras.saving.load_model(sys.argv[1])\nexcept TypeError as e:\n    print('refused:', repr(str(e)))\n"
        "import prune\nkeras.saving.load_model(sys.argv[1])\nprint('loaded after import prune')\n"
    )
    repo = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-c", script, str(path)], cwd=repo, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    refused, loaded = out.stdout.strip().splitlines()[-2:]
    assert refused.startswith("refused:") and "'module': 'prune.layers" in refused  # names the module to import
    assert loaded == "loaded after import prune"
