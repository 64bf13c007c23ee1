"""load_glove: formats, vocabulary order, seeded missing rows, errors with line numbers, bounded memory."""

from __future__ import annotations

import gzip
import tracemalloc

import numpy as np
import pytest

from prune.layers.embeddings import load_glove

TEXT = "the 0.5 -1.0 2.0\ncat 1.5 0.25 -0.75\ndog -2.0 1.0 0.0\n"


def _write(tmp_path, text, name="g.txt", gz=False):
    path = tmp_path / (name + (".gz" if gz else ""))
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("header", ["", "3 3\n"])
def test_reads_plain_gzip_and_word2vec_header(tmp_path, gz, header):
    words, matrix, known = load_glove(_write(tmp_path, header + TEXT, gz=gz))
    assert words == ["the", "cat", "dog"]
    assert matrix.dtype == np.float32
    assert np.array_equal(matrix, np.array([[0.5, -1.0, 2.0], [1.5, 0.25, -0.75], [-2.0, 1.0, 0.0]], np.float32))
    assert known.tolist() == [True, True, True]


def test_vocab_order_and_seeded_missing_rows_scaled_like_the_file(tmp_path):
    rng = np.random.default_rng(0)
    vecs = rng.normal(0.0, 3.0, size=(50, 20))
    text = "".join(f"w{i} " + " ".join(f"{v:.6f}" for v in row) + "\n" for i, row in enumerate(vecs))
    path = _write(tmp_path, text)
    vocab = ["w7", "unknown_a", "w0"] + [f"new{i}" for i in range(60)]
    words, matrix, known = load_glove(path, vocab, seed=3)
    assert words == vocab
    assert known.tolist() == [True, False, True] + [False] * 60
    np.testing.assert_allclose(matrix[0], vecs[7], atol=1e-6)
    np.testing.assert_allclose(matrix[2], vecs[0], atol=1e-6)
    file_std = float(np.std(np.round(vecs, 6)))
    assert 0.9 * file_std < float(np.std(matrix[~known])) < 1.1 * file_std  # 1220 draws: std within 10%
    again = load_glove(path, vocab, seed=3)[1]
    other = load_glove(path, vocab, seed=4)[1]
    assert np.array_equal(again, matrix)
    assert not np.array_equal(other[~known], matrix[~known])
    assert np.array_equal(other[known], matrix[known])


def test_duplicate_word_keeps_first_and_warns(tmp_path):
    path = _write(tmp_path, TEXT + "cat 9 9 9\n")
    with pytest.warns(UserWarning, match=r"duplicate.*'cat' \(line 4\)"):
        words, matrix, _ = load_glove(path)
    assert words == ["the", "cat", "dog"]
    assert np.array_equal(matrix[1], np.array([1.5, 0.25, -0.75], np.float32))


@pytest.mark.parametrize(
    "text, message",
    [
        (TEXT + "bird 1.0 2.0\n", r"line 4: word 'bird' has 2 values, expected dimension 3"),
        ("the 1 2 3\ncat 1 x 3\n", r"line 2: word 'cat' has a non-numeric value"),
        ("the 1 2 3\nlonely\n", r"line 2: expected a word followed by floats"),
        ("5 3\nthe 1 2\n", r"line 2: word 'the' has 2 values, expected dimension 3"),
    ],
)
def test_malformed_lines_name_the_line(tmp_path, text, message):
    with pytest.raises(ValueError, match=message):
        load_glove(_write(tmp_path, text))


def test_bad_vocab_and_empty_file(tmp_path):
    path = _write(tmp_path, TEXT)
    with pytest.raises(ValueError, match=r"vocab entries must be strings, got 7 \(int\) at position 1"):
        load_glove(path, ["the", 7])
    with pytest.raises(ValueError, match=r"vocab must be a sequence of strings.*'the'"):
        load_glove(path, "the")
    with pytest.raises(ValueError, match=r"duplicate word 'cat'"):
        load_glove(path, ["cat", "cat"])
    with pytest.raises(ValueError, match=r"no vectors found"):
        load_glove(_write(tmp_path, "\n", name="empty.txt"))


def test_memory_is_bounded_by_the_vocabulary(tmp_path):
    rows, dim = 6000, 50
    line_tail = " ".join(["0.123456"] * dim)
    path = _write(tmp_path, "".join(f"w{i} {line_tail}\n" for i in range(rows)), gz=True)

    def peak(vocab):
        tracemalloc.start()
        try:
            load_glove(path, vocab)
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    small = peak(["w1", "w5000", "missing"])
    full = peak(None)
    assert full > rows * dim * 4  # loading everything holds the whole table
    assert small < 300_000  # a 3-word vocabulary does not, although the file has 6000 rows
