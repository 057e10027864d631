"""The King James Bible stand-in: parsing `bible`'s output, the chapter split, the cache."""

from __future__ import annotations

import shutil

import pytest

from deqjax._src.data import kjv as kjv_lib
from deqjax._src.data.errors import DataNotFoundError
from tests.data.conftest import needs_bible


def test_kjv_parse_wrapped_output_and_chapter_split():
    # `bible` without -f wraps long verses; continuation lines must join the verse before them.
    out = "Ge1:1 In the beginning\n  God created.\nGe1:2 And the earth.\nGe2:1 Thus the heavens.\n"
    verses = kjv_lib.parse_verses(out)
    assert verses == [
        ("Ge", 1, 1, "In the beginning God created."),
        ("Ge", 1, 2, "And the earth."),
        ("Ge", 2, 1, "Thus the heavens."),
    ]
    verses = [("B", c, 1, f"chapter {c}") for c in range(7)]
    train, valid, test = kjv_lib.split_kjv(verses, holdout_every=3)
    assert (train, valid, test) == (
        ["chapter 0", "chapter 3", "chapter 6"],
        ["chapter 1", "chapter 4"],
        ["chapter 2", "chapter 5"],
    )
    with pytest.raises(ValueError, match="holdout_every"):
        kjv_lib.split_kjv(verses, holdout_every=2)


def test_kjv_missing_program_names_the_package(tmp_path):
    with pytest.raises(DataNotFoundError) as err:
        kjv_lib.load_kjv(cache_dir=tmp_path, bible_executable="no-such-bible-program")
    assert "bible-kjv" in str(err.value) and str(tmp_path) in str(err.value)


@needs_bible
def test_kjv_standin(kjv_cache):
    cache, corpus = kjv_cache
    assert corpus.is_standin and corpus.source.startswith("STAND-IN: King James Bible")
    assert corpus.train[0] == "In the beginning God created the heaven and the earth."
    total = len(corpus.train) + len(corpus.valid) + len(corpus.test)
    assert total == kjv_lib.KJV_NUM_VERSES
    # Chapters 18 and 19 (0-based), Genesis 19 and 20, open valid and test: about 90/5/5 overall.
    assert corpus.valid[0].startswith("And there came two angels to Sodom")
    assert corpus.test[0].startswith("And Abraham journeyed from thence")
    assert 0.04 < len(corpus.valid) / total < 0.06 and 0.04 < len(corpus.test) / total < 0.06
    words = sum(len(line.split()) for line in corpus.train + corpus.valid + corpus.test)
    assert 780_000 < words < 800_000  # ~790k words (DESIGN.md)


@needs_bible
def test_kjv_cache_is_used_and_repaired(kjv_cache, tmp_path):
    cache, corpus = kjv_cache
    path = kjv_lib.kjv_cache_path(cache)
    assert path.is_file()
    # A cached copy is enough: no `bible` program needed the second time, same split.
    again = kjv_lib.load_kjv(cache_dir=cache, bible_executable="no-such-bible-program")
    assert again == corpus
    # A truncated cache file is detected and regenerated.
    other = tmp_path / "cache2"
    shutil.copytree(cache, other)
    broken = kjv_lib.kjv_cache_path(other)
    broken.write_text(path.read_text(encoding="utf-8")[:10_000], encoding="utf-8")
    assert kjv_lib.load_kjv(cache_dir=other).train == corpus.train
