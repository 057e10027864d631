"""Plain-text corpora: one file split 90/5/5, or a directory of split files."""

from __future__ import annotations

import pytest

from deqjax._src.data import sources
from deqjax._src.data import text as text_lib
from deqjax._src.data.errors import DataNotFoundError


def test_text_file_split_and_directory(tmp_path):
    lines = [f"line number {i}" for i in range(100)]
    f = tmp_path / "book.txt"
    f.write_text("\n\n".join(lines) + "\n", encoding="utf-8")  # blank lines are dropped
    corpus = sources.load_lm_corpus(f)
    assert (len(corpus.train), len(corpus.valid), len(corpus.test)) == (90, 5, 5)
    assert corpus.train + corpus.valid + corpus.test == lines  # contiguous, in order
    assert corpus.name == "book" and not corpus.is_standin
    d = tmp_path / "splits"
    d.mkdir()
    for split, body in (("train", "a b\nc"), ("valid", "d"), ("test", " e \n")):
        (d / f"{split}.txt").write_text(body, encoding="utf-8")
    corpus = sources.load_lm_corpus(d)
    assert (corpus.train, corpus.valid, corpus.test) == (["a b", "c"], ["d"], ["e"])
    with pytest.raises(DataNotFoundError, match="not found"):
        sources.load_lm_corpus(tmp_path / "missing.txt")
    with pytest.raises(ValueError, match="valid_fraction"):
        text_lib.split_lines(lines, valid_fraction=1.5)
    with pytest.raises(ValueError, match="too few"):
        text_lib.split_lines(lines[:3])
