"""The WikiText reader on small files in the upstream ``wiki.*.tokens`` format."""

from __future__ import annotations

import pytest

from deqjax._src.data import sources
from deqjax._src.data.errors import DataNotFoundError
from deqjax._src.data.wikitext import load_wikitext

_WIKI = {
    "train": " \n = Valkyria Chronicles III = \n \n Senjō no Valkyria 3 : <unk> Chronicles is a "
    "tactical role @-@ playing video game . \n \n = = Gameplay = = \n \n The game 's battle system "
    "was carried over . \n",
    "valid": " \n = Homarus gammarus = \n \n Homarus gammarus is a species of clawed lobster . \n",
    "test": " \n = Robert Boulter = \n \n Robert Boulter is an English film actor . \n",
}


@pytest.fixture
def wiki_dir(tmp_path):
    d = tmp_path / "data" / "wikitext-103"
    d.mkdir(parents=True)
    for split, body in _WIKI.items():
        (d / f"wiki.{split}.tokens").write_text(body, encoding="utf-8")
    return d


def test_wikitext_reader(wiki_dir):
    corpus = load_wikitext(wiki_dir.parent)
    assert corpus.train == [
        "= Valkyria Chronicles III =",
        "Senjō no Valkyria 3 : <unk> Chronicles is a tactical role @-@ playing video game .",
        "= = Gameplay = =",
        "The game 's battle system was carried over .",
    ]
    assert corpus.valid[1].startswith("Homarus gammarus is") and len(corpus.test) == 2
    assert not corpus.is_standin and corpus.name == "wikitext-103"
    # The same files through the dispatcher, by name (data_dir) and by path.
    by_name = sources.load_lm_corpus("wikitext-103", data_dir=wiki_dir.parent)
    by_path = sources.load_lm_corpus(wiki_dir)
    assert by_name.train == by_path.train == corpus.train
    assert "wiki.*.tokens" in by_name.source and not by_path.is_standin


def test_wikitext_missing_without_standin(tmp_path):
    with pytest.raises(DataNotFoundError) as err:
        sources.load_lm_corpus("wikitext-103", data_dir=tmp_path)
    msg = str(err.value)
    assert "wiki.train.tokens" in msg and str(tmp_path) in msg and "bible-kjv" in msg
