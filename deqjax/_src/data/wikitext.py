"""Reader for WikiText-103 / WikiText-2 in their upstream tokenized form (``wiki.*.tokens``).

The upstream archives (``wikitext-103-v1.zip``, ``wikitext-2-v1.zip``) extract to ``wikitext-103/``
(or ``wikitext-2/``) holding ``wiki.train.tokens``, ``wiki.valid.tokens`` and ``wiki.test.tokens``:
UTF-8 text, one paragraph or heading (`` = Title = ``) per line, blank lines between, words already
split on white space with rare words replaced by ``<unk>``.
"""

from __future__ import annotations

import os
from pathlib import Path

from deqjax._src.data.errors import DataNotFoundError, missing_data_message
from deqjax._src.data.text import LMCorpus, read_lines

WIKITEXT_SPLIT_FILES = {
    "train": "wiki.train.tokens",
    "valid": "wiki.valid.tokens",
    "test": "wiki.test.tokens",
}
WIKITEXT_NAMES = ("wikitext-103", "wikitext-2")


def wikitext_how_to_get(name: str) -> str:
    """How to obtain the WikiText files, for error messages."""
    return (
        f"Download the {name} word-level archive ({name}-v1.zip, the tokenized version, not -raw) "
        f"from the WikiText page of Salesforce Research (or the Hugging Face 'wikitext' data set, "
        f"config {name}-v1), unzip it, and pass the directory containing {name}/ (or {name}/ "
        f"itself) as data_dir. Offline, the King James Bible stand-in (apt-get install bible-kjv) "
        f"is used when allow_standin=True."
    )


def find_wikitext_dir(
    data_dir: str | os.PathLike[str], *, name: str = "wikitext-103"
) -> Path | None:
    """The directory holding the three ``wiki.*.tokens`` files: ``data_dir/<name>`` or
    ``data_dir`` itself; ``None`` if neither has all three."""
    root = Path(data_dir).expanduser()
    for candidate in (root / name, root):
        if all((candidate / f).is_file() for f in WIKITEXT_SPLIT_FILES.values()):
            return candidate
    return None


def wikitext_looked_for(data_dir: str | os.PathLike[str], *, name: str) -> list[Path]:
    """The paths :func:`find_wikitext_dir` checks, for error messages."""
    root = Path(data_dir).expanduser()
    return [root / name / "wiki.train.tokens", root / "wiki.train.tokens"]


def load_wikitext(data_dir: str | os.PathLike[str], *, name: str = "wikitext-103") -> LMCorpus:
    """Loads WikiText-103 (or WikiText-2) from its ``wiki.{train,valid,test}.tokens`` files.

    Args:
      data_dir: a directory containing ``<name>/``, or that directory itself.
      name: ``"wikitext-103"``, ``"wikitext-2"`` (the same format; only the label and the
        subdirectory differ) or another label for a directory of ``wiki.*.tokens`` files.

    Returns:
      An ``LMCorpus`` with the upstream splits (lines stripped, blank lines dropped),
      ``is_standin=False``.

    Raises:
      ValueError: for an empty ``name``.
      DataNotFoundError: if the files are not there; the message says how to get them.
    """
    if not name or "/" in name:
        raise ValueError(f"name must be a non-empty directory name, got {name!r}.")
    directory = find_wikitext_dir(data_dir, name=name)
    if directory is None:
        raise DataNotFoundError(
            missing_data_message(
                f"{name} (wiki.*.tokens)",
                wikitext_looked_for(data_dir, name=name),
                wikitext_how_to_get(name),
            )
        )
    splits = {split: read_lines(directory / f) for split, f in WIKITEXT_SPLIT_FILES.items()}
    return LMCorpus(name, f"{name} ({directory}/wiki.*.tokens)", False, **splits)
