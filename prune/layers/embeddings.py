"""Pretrained word vectors: a streaming GloVe / word2vec-text loader.

The result feeds :class:`prune.layers.PartiallyFrozenEmbedding` directly::

    words, matrix, known = prune.layers.embeddings.load_glove("glove.6B.50d.txt", vocab)
    layer = prune.layers.PartiallyFrozenEmbedding(matrix, frozen=known)
"""

from __future__ import annotations

import gzip
import os
import warnings
import zlib
from typing import IO, Iterator, Sequence

import numpy as np

__all__ = ["load_glove"]


def _open(path: str | os.PathLike) -> IO[bytes]:
    with open(path, "rb") as probe:
        magic = probe.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rb")  # type: ignore[return-value]
    return open(path, "rb")


def _is_header(parts: list[str]) -> bool:
    return len(parts) == 2 and all(p.isdigit() for p in parts)


def _lines(path: str | os.PathLike) -> Iterator[tuple[int, list[str]]]:
    """``(line number, fields)`` of each non-blank line, decoded as UTF-8 line by line.

    Raises:
        ValueError: a line is not UTF-8, or a gzip file is truncated or corrupt;
            the message names the file, the line number and the cause.
    """
    number = 0
    with _open(path) as f:
        it = iter(f)
        while True:
            try:
                raw = next(it)
            except StopIteration:
                return
            except (EOFError, gzip.BadGzipFile, zlib.error) as err:
                raise ValueError(
                    f"{os.fspath(path)}: line {number + 1}: the gzip data is truncated or corrupt "
                    f"({type(err).__name__}: {err})"
                ) from None
            number += 1
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise ValueError(
                    f"{os.fspath(path)}: line {number}: not UTF-8 at byte {err.start} of the line "
                    f"({raw[max(0, err.start - 10):err.start + 10]!r})"
                ) from None
            parts = line.rstrip("\r\n").rstrip().split(" ")
            if parts == [""]:
                continue  # blank line
            yield number, parts


def _parse(number: int, parts: list[str], dim: int | None, path: str) -> tuple[str, np.ndarray]:
    word = parts[0]
    if len(parts) < 2 or word == "":
        raise ValueError(f"{path}: line {number}: expected a word followed by floats, got {' '.join(parts)[:80]!r}")
    try:
        vec = np.array([float(x) for x in parts[1:]], dtype=np.float32)
    except ValueError as err:
        raise ValueError(f"{path}: line {number}: word {word!r} has a non-numeric value ({err})") from None
    if dim is not None and vec.shape[0] != dim:
        raise ValueError(
            f"{path}: line {number}: word {word!r} has {vec.shape[0]} values, expected dimension {dim}"
        )
    return word, vec


def load_glove(
    path: str | os.PathLike, vocab: Sequence[str] | None = None, seed: int = 0
) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Read GloVe text vectors (``word v1 v2 ...`` per line), plain or gzip.

    A word2vec text header line ``"N D"`` is detected and skipped (its ``D``
    is then enforced). A duplicate word keeps its first occurrence and a
    warning names the duplicates (among the words kept). The file is streamed line by line: with ``vocab``, only
    vectors of vocabulary words are kept, so memory is bounded by the
    vocabulary, not the file. (A word that is a number, such as ``"3"``, followed by
    one value on the first line is read as a header; that only happens for
    1-dimensional vectors.)

    Args:
        path: File path; gzip is detected from its magic bytes.
        vocab: Words wanted, in order (strings, no duplicates). ``None`` loads
            every word of the file in file order.
        seed: Seed of the random vectors of words missing from the file.

    Returns:
        ``(words, matrix, pretrained_mask)``: the words (``vocab`` order, or
        file order), a float32 ``[len(words), D]`` matrix, and a bool mask,
        True where the row came from the file. Missing words get vectors drawn
        from ``N(0, s^2)`` with ``s`` the standard deviation of the loaded
        values (so they are scaled like the file's), seeded by ``seed``.

    Raises:
        ValueError: ``vocab`` not a sequence of strings (naming the entry), a
            malformed line, a dimension mismatch, bytes that are not UTF-8 or a
            truncated/corrupt gzip stream (naming the path and line number), an
            empty file, or ``vocab`` given with no word in the file and no way
            to know ``D``.
        FileNotFoundError: ``path`` does not exist.
    """
    path_s = os.fspath(path)
    index: dict[str, int] | None = None
    if vocab is not None:
        if isinstance(vocab, (str, bytes)):
            raise ValueError(f"vocab must be a sequence of strings, got a single {type(vocab).__name__}: {vocab!r}")
        vocab = list(vocab)
        index = {}
        for i, w in enumerate(vocab):
            if not isinstance(w, str):
                raise ValueError(f"vocab entries must be strings, got {w!r} ({type(w).__name__}) at position {i}")
            if w in index:
                raise ValueError(f"vocab has duplicate word {w!r} at positions {index[w]} and {i}")
            index[w] = i
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ValueError(f"seed must be an integer, got {seed!r}")

    dim: int | None = None
    found: dict[str, np.ndarray] = {}
    order: list[str] = []
    duplicates: list[tuple[str, int]] = []
    total, total_sq, count = 0.0, 0.0, 0
    first = True
    for number, parts in _lines(path_s):
        if first:
            first = False
            if _is_header(parts):
                dim = int(parts[1])
                continue
        word, vec = _parse(number, parts, dim, path_s)
        if dim is None:
            dim = int(vec.shape[0])
        # Statistics over every vector of the file, for scaling the random rows.
        v64 = vec.astype(np.float64)
        total += float(v64.sum())
        total_sq += float((v64 * v64).sum())
        count += v64.size
        if word in found:  # only kept words are tracked: memory stays bounded by vocab
            duplicates.append((word, number))
            continue
        if index is None or word in index:
            found[word] = vec
            if index is None:
                order.append(word)
    if dim is None:
        raise ValueError(f"{path_s}: no vectors found (empty file)")
    if duplicates:
        shown = ", ".join(f"{w!r} (line {n})" for w, n in duplicates[:5])
        warnings.warn(
            f"{path_s}: {len(duplicates)} duplicate word(s) ignored, first occurrence kept: {shown}",
            stacklevel=2,
        )
    words = order if index is None else list(vocab)  # type: ignore[arg-type]
    matrix = np.empty((len(words), dim), np.float32)
    known = np.zeros(len(words), bool)
    for i, w in enumerate(words):
        vec = found.get(w)
        if vec is not None:
            matrix[i] = vec
            known[i] = True
    missing = ~known
    if missing.any():
        mean = total / count if count else 0.0
        std = float(np.sqrt(max(total_sq / count - mean * mean, 0.0))) if count else 1.0
        rng = np.random.default_rng(int(seed))
        matrix[missing] = rng.normal(0.0, std if std > 0 else 1.0, size=(int(missing.sum()), dim)).astype(np.float32)
    return words, matrix, known

