"""Damaged input files name themselves: GloVe text with a truncated gzip stream or bytes that are not UTF-8."""

from __future__ import annotations

import gzip

import pytest

from prune.embeddings import load_glove


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
