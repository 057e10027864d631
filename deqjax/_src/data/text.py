"""Plain-text language-modelling corpora: the ``LMCorpus`` container and a reader for text files.

A corpus is three lists of lines (train, valid, test), each line stripped of surrounding white
space, empty lines dropped. Tokenizers (:mod:`deqjax._src.data.tokenizer`) encode each line and
append an end-of-sentence id, as Transformer-XL does for WikiText-103.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

from deqjax._src.data.errors import DataNotFoundError, missing_data_message

TEXT_SPLIT_FILES = {"train": "train.txt", "valid": "valid.txt", "test": "test.txt"}


class LMCorpus(NamedTuple):
    """A language-modelling corpus and where it came from.

    ``source`` is the line an experiment logs; it begins with ``"STAND-IN: "`` exactly when
    ``is_standin`` is true (an offline substitute for the data set that was asked for).
    """

    name: str  # short name, e.g. "wikitext-103", "kjv", or a file's stem
    source: str  # human-readable origin, logged by experiments
    is_standin: bool
    train: list[str]  # lines, stripped, non-empty
    valid: list[str]
    test: list[str]

    def split(self, name: str) -> list[str]:
        """The lines of split ``name`` (``"train"``, ``"valid"`` or ``"test"``)."""
        if name not in ("train", "valid", "test"):
            raise ValueError(f"split must be 'train', 'valid' or 'test', got {name!r}.")
        return getattr(self, name)


def clean_lines(text: str) -> list[str]:
    """Splits ``text`` into lines, strips each, drops the empty ones."""
    return [line for line in (raw.strip() for raw in text.splitlines()) if line]


def read_lines(path: str | os.PathLike[str]) -> list[str]:
    """Reads a UTF-8 text file as :func:`clean_lines`.

    Raises:
      ValueError: if the file is not valid UTF-8 (the message names the file).
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text: {e}") from e
    return clean_lines(text)


def split_lines(
    lines: list[str], *, valid_fraction: float = 0.05, test_fraction: float = 0.05
) -> tuple[list[str], list[str], list[str]]:
    """Deterministic contiguous split: train = head, valid = next block, test = tail.

    The same convention as text8/enwik8 (90/5/5 by default); no shuffling, so neighbouring lines
    stay together and the split never changes between runs.

    Args:
      lines: the corpus, in order.
      valid_fraction: fraction of lines (rounded down) in the validation block; in ``[0, 1)``.
      test_fraction: fraction of lines (rounded down) in the test block; in ``[0, 1)``.

    Returns:
      ``(train, valid, test)`` lists of lines.

    Raises:
      ValueError: for fractions outside ``[0, 1)`` or summing to 1 or more, or if ``lines`` is too
        short to give every requested split at least one line.
    """
    for name, value in (("valid_fraction", valid_fraction), ("test_fraction", test_fraction)):
        if not 0.0 <= value < 1.0:
            raise ValueError(f"{name} must lie in [0, 1), got {value}.")
    if valid_fraction + test_fraction >= 1.0:
        raise ValueError(
            f"valid_fraction + test_fraction must be < 1, got {valid_fraction + test_fraction}."
        )
    n = len(lines)
    n_valid = int(n * valid_fraction)
    n_test = int(n * test_fraction)
    if (valid_fraction > 0 and n_valid == 0) or (test_fraction > 0 and n_test == 0):
        raise ValueError(
            f"lines has only {n} non-empty lines: too few for valid_fraction={valid_fraction} "
            f"and test_fraction={test_fraction}."
        )
    n_train = n - n_valid - n_test
    return lines[:n_train], lines[n_train : n_train + n_valid], lines[n_train + n_valid :]


def load_text_corpus(
    path: str | os.PathLike[str],
    *,
    valid_fraction: float = 0.05,
    test_fraction: float = 0.05,
) -> LMCorpus:
    """Loads a plain-text corpus from one file or from a directory of split files.

    Args:
      path: a UTF-8 text file, split by :func:`split_lines`; or a directory holding ``train.txt``,
        ``valid.txt`` and ``test.txt``, used as they are.
      valid_fraction: for a single file, see :func:`split_lines`.
      test_fraction: for a single file, see :func:`split_lines`.

    Returns:
      An ``LMCorpus`` named after the file's stem (or the directory's name), ``is_standin=False``.

    Raises:
      DataNotFoundError: if ``path`` does not exist or a directory lacks a split file.
    """
    p = Path(path).expanduser()
    if p.is_file():
        train, valid, test = split_lines(
            read_lines(p), valid_fraction=valid_fraction, test_fraction=test_fraction
        )
        source = (
            f"text file {p} (contiguous split: last {test_fraction:.0%} test, the "
            f"{valid_fraction:.0%} before it valid)"
        )
        return LMCorpus(p.stem, source, False, train, valid, test)
    files = {split: p / name for split, name in TEXT_SPLIT_FILES.items()}
    if p.is_dir() and all(f.is_file() for f in files.values()):
        splits = {split: read_lines(f) for split, f in files.items()}
        return LMCorpus(p.name, f"text files {p}/{{train,valid,test}}.txt", False, **splits)
    raise DataNotFoundError(
        missing_data_message(
            "Text corpus",
            [p, *files.values()] if p.is_dir() else [p],
            "Pass a UTF-8 text file (split 90/5/5 into train/valid/test) or a directory with "
            "train.txt, valid.txt and test.txt.",
        )
    )
