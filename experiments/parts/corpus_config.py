"""The data section of the language models: a corpus, tokenized by a sentencepiece model.

The language model's (``experiments/language_model.py``, and ``repro_lm_init.py`` through it).
Flags ``--corpus --data_dir --vocab_size --max_train_lines --max_eval_lines``;
:meth:`CorpusConfig.load` reads the corpus (:func:`deqjax.data.load_lm_corpus`, offline the King
James Bible labelled ``STAND-IN``), trains the tokenizer on its training split and encodes both
splits.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, NamedTuple

import numpy as np

from deqjax import data
from deqjax.harness import NonNegativeInt, PositiveInt


class TokenizedCorpus(NamedTuple):
    """A corpus's token ids and where they came from."""

    vocab_size: int  # the tokenizer's (may be below --vocab_size for a small corpus)
    train: np.ndarray  # int32 [N] token ids of the training split
    valid: np.ndarray  # int32 [M] token ids of the validation split
    source: str  # the data source line (``STAND-IN: ...`` offline)
    is_standin: bool
    tokenizer: str  # path of the sentencepiece model


@dataclasses.dataclass(frozen=True)
class CorpusConfig:
    """Data: a corpus, tokenized by a sentencepiece model trained on its training split."""

    # Its settings under --smoke: a small tokenizer on part of the corpus.
    SMOKE: ClassVar[dict[str, Any]] = {
        "vocab_size": 300,
        "max_train_lines": 1500,
        "max_eval_lines": 200,
    }

    corpus: str = "kjv"  # kjv | wikitext-103 | path
    data_dir: str | None = None  # directory with WikiText-103 wiki.*.tokens
    vocab_size: PositiveInt = 2000  # sentencepiece vocabulary size
    max_train_lines: NonNegativeInt = 0  # training lines read (0: all)
    max_eval_lines: NonNegativeInt = 2000  # validation lines read (0: all)

    def load(self) -> TokenizedCorpus:
        """Reads, tokenizes and encodes the corpus, printing its source and token counts."""
        name = self.corpus if self.data_dir is None or self.corpus != "kjv" else "wikitext-103"
        corpus = data.load_lm_corpus(name, data_dir=self.data_dir, allow_standin=True)
        print(f"data source: {corpus.source}")
        lines = corpus.train[: self.max_train_lines] if self.max_train_lines else corpus.train
        tok = data.train_sentencepiece(lines, vocab_size=self.vocab_size)
        train = np.asarray(tok.encode_lines(lines), np.int32)
        lines = corpus.valid[: self.max_eval_lines] if self.max_eval_lines else corpus.valid
        valid = np.asarray(tok.encode_lines(lines), np.int32)
        print(f"tokens: train={train.size} valid={valid.size} vocab={tok.vocab_size}")
        return TokenizedCorpus(
            tok.vocab_size, train, valid, corpus.source, corpus.is_standin, str(tok.model_path)
        )
