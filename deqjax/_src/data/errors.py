"""The errors every data source raises: files missing, or files present but unreadable."""

from __future__ import annotations

from collections.abc import Sequence
from os import PathLike


class DataNotFoundError(FileNotFoundError):
    """A data set's files are not where a source looked, and the source cannot make them.

    The message names every path that was looked at and how to get the data (a Debian package,
    the upstream archive's file names, or a TFDS command). It subclasses ``FileNotFoundError`` so
    callers that already catch that keep working.
    """


class DataFormatError(ValueError):
    """A data file exists but cannot be decoded (corrupt, truncated, not the expected format).

    The message names the file. It subclasses ``ValueError`` so callers that already catch that
    keep working.
    """


def missing_data_message(
    what: str, looked_for: Sequence[str | PathLike[str]], how_to_get: str
) -> str:
    """Formats the message of a :class:`DataNotFoundError`.

    Args:
      what: the data set, e.g. ``"CIFAR-10 (python pickles)"``.
      looked_for: every file or directory that was checked, in the order checked.
      how_to_get: one or more sentences on how to obtain the files.

    Returns:
      A multi-line message: what is missing, each path looked for, then ``how_to_get``.
    """
    paths = "\n".join(f"  - {p}" for p in looked_for) or "  (no location given)"
    return f"{what} not found. Looked for:\n{paths}\n{how_to_get}"
