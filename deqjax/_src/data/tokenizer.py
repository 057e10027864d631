"""SentencePiece tokenization for language modelling (init paper App. D: DEQ transformer on
WikiText-103 with a sentencepiece tokenizer).

The model is trained on the **training split only**, once: it is cached under
``<cache_dir>/sentencepiece/`` with a file name holding a hash of the training text and every
training setting (vocabulary size included), so a second call with the same text and settings loads
it instead of training, and a different text or vocabulary size never reuses a wrong model. Encoded
splits are cached beside it as ``.npy`` files, keyed by the model and the split's own hash.

Ids: ``pad = 0``, ``unk = 1``, ``eos = 2`` (appended after every line), no ``bos``; the rest are
pieces. Lines are encoded independently and concatenated into one int32 stream per split.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

from deqjax._src.data.cache import atomic_write_bytes, resolve_cache_dir
from deqjax._src.data.text import LMCorpus

PAD_ID = 0
UNK_ID = 1
EOS_ID = 2
MODEL_TYPES = ("unigram", "bpe", "char", "word")
_ENCODE_CHUNK = 20_000  # lines per sentencepiece encode call (bounds the Python list overhead)


def _import_sentencepiece():
    try:
        import sentencepiece
    except ImportError as e:
        raise ImportError(
            "Tokenization needs sentencepiece: `pip install sentencepiece` "
            "(or `pip install deqjax[experiments]`)."
        ) from e
    return sentencepiece


def hash_lines(lines: Iterable[str]) -> str:
    """SHA-256 (hex) of the lines joined by newlines: the identity of a text for cache keys."""
    h = hashlib.sha256()
    for line in lines:
        h.update(line.encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()


class SentencePieceTokenizer:
    """A trained sentencepiece model: ``encode_lines`` to an int32 stream, ``decode`` back.

    Attributes:
      model_path: the ``.model`` file.
      vocab_size: number of ids (pieces plus the pad/unk/eos ids).
    """

    pad_id = PAD_ID
    unk_id = UNK_ID
    eos_id = EOS_ID

    def __init__(self, model_path: str | os.PathLike[str]):
        spm = _import_sentencepiece()
        self.model_path = Path(model_path)
        self._processor = spm.SentencePieceProcessor(model_file=os.fspath(self.model_path))
        self.vocab_size = int(self._processor.get_piece_size())
        if (self._processor.pad_id(), self._processor.eos_id()) != (PAD_ID, EOS_ID):
            raise ValueError(
                f"{model_path}: expected pad id {PAD_ID} and eos id {EOS_ID}, got "
                f"{self._processor.pad_id()} and {self._processor.eos_id()} (not a deqjax model)."
            )

    def encode_lines(self, lines: Sequence[str], *, add_eos: bool = True) -> np.ndarray:
        """Encodes each line (plus ``eos`` if ``add_eos``), concatenated: int32 ``[num_tokens]``."""
        parts = []
        for start in range(0, len(lines), _ENCODE_CHUNK):
            ids = self._processor.encode(
                list(lines[start : start + _ENCODE_CHUNK]), out_type=int, add_eos=add_eos
            )
            flat = itertools.chain.from_iterable(ids)
            parts.append(np.fromiter(flat, dtype=np.int32, count=sum(map(len, ids))))
        return np.concatenate(parts) if parts else np.zeros((0,), np.int32)

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """Decodes ids to text; ``pad`` and ``eos`` ids are dropped."""
        ids = [int(i) for i in np.asarray(ids).reshape(-1) if i not in (PAD_ID, EOS_ID)]
        return self._processor.decode(ids)

    def __repr__(self) -> str:
        return f"SentencePieceTokenizer({str(self.model_path)!r}, vocab_size={self.vocab_size})"


class SentencePieceSettings(NamedTuple):
    """The training settings a sentencepiece model depends on: with the text, its cache key."""

    vocab_size: int  # number of ids, including pad/unk/eos; at least 8
    model_type: str = "unigram"  # "unigram" (sentencepiece's default), "bpe", "char" or "word"
    character_coverage: float = 1.0  # share of characters covered (1.0 for small alphabets)
    max_sentences: int = 2_000_000  # at most this many lines are sampled for training
    seed: int = 0  # seed of sentencepiece's sampling (determinism of the trained model)

    def check(self) -> None:
        """Raises ``ValueError`` naming the first invalid setting."""
        if not isinstance(self.vocab_size, int) or self.vocab_size < 8:
            raise ValueError(f"vocab_size must be an int >= 8, got {self.vocab_size!r}.")
        if self.model_type not in MODEL_TYPES:
            raise ValueError(f"model_type must be one of {MODEL_TYPES}, got {self.model_type!r}.")
        if not 0.0 < self.character_coverage <= 1.0:
            raise ValueError(
                f"character_coverage must lie in (0, 1], got {self.character_coverage}."
            )
        if self.max_sentences < 1:
            raise ValueError(f"max_sentences must be >= 1, got {self.max_sentences}.")


def tokenizer_model_path(
    train_lines: Sequence[str],
    settings: SentencePieceSettings,
    cache_dir: str | os.PathLike[str] | None = None,
) -> Path:
    """Where :func:`train_sentencepiece` caches the model for these lines and settings."""
    spm = _import_sentencepiece()
    key = hashlib.sha256(
        json.dumps(
            {
                "text": hash_lines(train_lines),
                "sentencepiece": spm.__version__,
                **settings._asdict(),
            },
            sort_keys=True,
        ).encode()
    ).hexdigest()[:16]
    name = f"{settings.model_type}{settings.vocab_size}-{key}.model"
    return resolve_cache_dir(cache_dir) / "sentencepiece" / name


def train_sentencepiece(
    train_lines: Sequence[str],
    *,
    vocab_size: int,
    cache_dir: str | os.PathLike[str] | None = None,
    model_type: str = "unigram",
    character_coverage: float = 1.0,
    max_sentences: int = 2_000_000,
    seed: int = 0,
    num_threads: int = 2,
) -> SentencePieceTokenizer:
    """Trains a sentencepiece model on ``train_lines``, or loads the cached one.

    Args:
      train_lines: the training split's lines (never valid/test: they would leak into the vocab).
      vocab_size: number of ids, including pad/unk/eos; at least 8. Training fails (ValueError from
        sentencepiece) if the text is too small for it.
      cache_dir: cache root (``None``: the deqjax cache directory).
      model_type: ``"unigram"`` (the sentencepiece default), ``"bpe"``, ``"char"`` or ``"word"``.
      character_coverage: share of characters covered by the vocabulary (1.0 for small alphabets).
      max_sentences: at most this many lines are sampled for training (large corpora).
      seed: seed of sentencepiece's sampling (determinism of the trained model).
      num_threads: training threads (not part of the cache key).

    Returns:
      The tokenizer; ``tokenizer.model_path`` is the cache file.

    Raises:
      ValueError: for a bad argument (named) or an empty ``train_lines``.
    """
    settings = SentencePieceSettings(
        vocab_size, model_type, character_coverage, max_sentences, seed
    )
    settings.check()
    if num_threads < 1:
        raise ValueError(f"num_threads must be >= 1, got {num_threads}.")
    if len(train_lines) == 0:
        raise ValueError("train_lines is empty.")
    path = tokenizer_model_path(train_lines, settings, cache_dir)
    if not path.is_file():
        atomic_write_bytes(path, _train(train_lines, settings, num_threads))
    return SentencePieceTokenizer(path)


def _train(train_lines: Sequence[str], settings: SentencePieceSettings, num_threads: int) -> bytes:
    """The serialized model sentencepiece trains on ``train_lines`` (ids: pad 0, unk 1, eos 2)."""
    spm = _import_sentencepiece()
    spm.set_random_generator_seed(settings.seed)
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(train_lines),
            model_writer=model,
            vocab_size=settings.vocab_size,
            model_type=settings.model_type,
            character_coverage=settings.character_coverage,
            input_sentence_size=settings.max_sentences,
            shuffle_input_sentence=True,
            pad_id=PAD_ID,
            unk_id=UNK_ID,
            eos_id=EOS_ID,
            bos_id=-1,
            num_threads=num_threads,
            minloglevel=2,
        )
    except RuntimeError as e:
        raise ValueError(
            f"sentencepiece training failed (vocab_size={settings.vocab_size}): {e}"
        ) from e
    return model.getvalue()


def encode_corpus(
    tokenizer: SentencePieceTokenizer,
    corpus: LMCorpus,
    *,
    splits: Sequence[str] = ("train", "valid", "test"),
    cache: bool = True,
) -> dict[str, np.ndarray]:
    """Encodes corpus splits to int32 token streams (cached as ``.npy`` beside the model).

    Args:
      tokenizer: a trained tokenizer.
      corpus: the corpus (see :func:`~deqjax.data.load_lm_corpus`).
      splits: which splits to encode.
      cache: read/write ``<model stem>-<split>-<hash>.npy`` next to the model file.

    Returns:
      ``{split: int32[num_tokens]}``, each line's ids followed by ``eos``.
    """
    out = {}
    for split in splits:
        lines = corpus.split(split)
        path = tokenizer.model_path.with_name(
            f"{tokenizer.model_path.stem}-{split}-{hash_lines(lines)[:16]}.npy"
        )
        if cache and path.is_file():
            out[split] = np.load(path)
            continue
        ids = tokenizer.encode_lines(lines)
        if cache:
            buf = io.BytesIO()
            np.save(buf, ids)
            atomic_write_bytes(path, buf.getvalue())
        out[split] = ids
    return out
