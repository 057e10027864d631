"""SentencePiece tokenization: trained once, cached, and its ids batched into LM segments."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from deqjax._src.data import tokenizer as tok_lib
from deqjax._src.data.lm_batching import lm_segments
from deqjax._src.data.text import LMCorpus

needs_spm = pytest.mark.skipif(
    importlib.util.find_spec("sentencepiece") is None,
    reason="sentencepiece not installed (pip install sentencepiece)",
)

_WORDS = (
    "the cat sat on a mat while the dog ran far away from home and then slept deeply under an "
    "old oak tree beside the quiet river"
).split()


def _lines(seed: int, n: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(_WORDS, size=int(rng.integers(3, 12)))) for _ in range(n)]


@pytest.fixture(scope="module")
def corpus():
    return LMCorpus("toy", "synthetic", False, _lines(0, 600), _lines(1, 40), _lines(2, 40))


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory):
    cache = tmp_path_factory.mktemp("spm_cache")
    return cache, tok_lib.train_sentencepiece(corpus.train, vocab_size=48, cache_dir=cache)


@needs_spm
def test_train_encode_decode(trained, corpus):
    cache, tok = trained
    assert tok.vocab_size == 48
    assert tok.model_path.is_file() and tok.model_path.parent == cache / "sentencepiece"
    ids = tok.encode_lines(corpus.valid)
    assert ids.dtype == np.int32 and ids.ndim == 1
    assert ids.min() >= 0 and ids.max() < tok.vocab_size
    # One eos after every line; never pad; these words are all seen in training: no unk.
    assert (ids == tok.eos_id).sum() == len(corpus.valid)
    assert not (ids == tok.pad_id).any() and not (ids == tok.unk_id).any()
    # Lines come back exactly, split at the eos ids.
    bounds = np.flatnonzero(ids == tok.eos_id)
    starts = np.concatenate([[0], bounds[:-1] + 1])
    decoded = [tok.decode(ids[a:b]) for a, b in zip(starts, bounds)]
    assert decoded == corpus.valid
    # Subword pieces compress: fewer ids than characters.
    assert ids.size < sum(len(line) + 1 for line in corpus.valid) / 2


@needs_spm
def test_cache_hit_and_key(trained, corpus, monkeypatch):
    cache, tok = trained

    def no_training(*args, **kwargs):
        raise AssertionError("trained again instead of loading the cached model")

    import sentencepiece as spm

    monkeypatch.setattr(spm.SentencePieceTrainer, "train", no_training)
    again = tok_lib.train_sentencepiece(corpus.train, vocab_size=48, cache_dir=cache)
    assert again.model_path == tok.model_path
    np.testing.assert_array_equal(again.encode_lines(corpus.test), tok.encode_lines(corpus.test))
    # The key covers the vocabulary size and the text (and only the training split is hashed).
    path, settings = tok_lib.tokenizer_model_path, tok_lib.SentencePieceSettings
    assert path(corpus.train, settings(vocab_size=40), cache) != tok.model_path
    assert path(corpus.train[:-1], settings(vocab_size=48), cache) != tok.model_path
    assert path(list(corpus.train), settings(vocab_size=48), cache) == tok.model_path


@needs_spm
def test_training_is_deterministic(trained, corpus, tmp_path):
    _, tok = trained
    fresh = tok_lib.train_sentencepiece(corpus.train, vocab_size=48, cache_dir=tmp_path)
    assert fresh.model_path.read_bytes() == tok.model_path.read_bytes()


@needs_spm
def test_encode_corpus_caches_splits(trained, corpus, monkeypatch):
    _, tok = trained
    encoded = tok_lib.encode_corpus(tok, corpus)
    assert set(encoded) == {"train", "valid", "test"}
    np.testing.assert_array_equal(encoded["valid"], tok.encode_lines(corpus.valid))
    cached = sorted(p.name for p in tok.model_path.parent.glob(f"{tok.model_path.stem}-*.npy"))
    assert len(cached) == 3 and any("-train-" in name for name in cached)

    def no_encoding(*args, **kwargs):
        raise AssertionError("encoded again instead of loading the cached split")

    monkeypatch.setattr(tok_lib.SentencePieceTokenizer, "encode_lines", no_encoding)
    again = tok_lib.encode_corpus(tok, corpus, splits=("test",))
    np.testing.assert_array_equal(again["test"], encoded["test"])


@needs_spm
def test_bad_arguments(corpus, tmp_path):
    with pytest.raises(ValueError, match="vocab_size"):
        tok_lib.train_sentencepiece(corpus.train, vocab_size=4, cache_dir=tmp_path)
    with pytest.raises(ValueError, match="model_type"):
        tok_lib.train_sentencepiece(
            corpus.train, vocab_size=48, model_type="wordpiece", cache_dir=tmp_path
        )
    with pytest.raises(ValueError, match="vocab_size=5000"):  # too large for this tiny text
        tok_lib.train_sentencepiece(corpus.train, vocab_size=5000, cache_dir=tmp_path)
    assert not list((tmp_path / "sentencepiece").glob("*.model"))  # nothing half-written


@needs_spm
def test_tokenized_corpus_to_segments(trained, corpus):
    # The pipeline end to end: encode the training split, batch it, and read a segment back.
    _, tok = trained
    ids = tok_lib.encode_corpus(tok, corpus, splits=("train",), cache=False)["train"]
    seg = next(lm_segments(ids, num_streams=2, segment_length=16))
    np.testing.assert_array_equal(seg.inputs[0], ids[:16])
    np.testing.assert_array_equal(seg.targets[0], ids[1:17])
    assert tok.decode(seg.inputs[0]).startswith(corpus.train[0][:10])
