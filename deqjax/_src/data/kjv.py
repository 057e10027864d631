"""King James Bible, the offline language-modelling stand-in (Debian packages ``bible-kjv``).

``bible -f gen1:1-rev22:21`` prints the whole text, one verse per line as ``<Book><ch>:<v> <text>``
(e.g. ``Ge1:1 In the beginning God created the heaven and the earth.``): 31,102 verses, about
790k words, 4.4 MB (its time: BENCHMARKS.md, "Import and data-source times"). The output is cached
once under the cache directory; the verse references are used to split by chapter and are dropped
from the text.

Split (deterministic, by whole chapters so no chapter straddles two splits): the 1,189 chapters in
canonical order are numbered ``c = 0, 1, ...``; chapter ``c`` goes to valid if
``c % holdout_every == holdout_every - 2``, to test if ``c % holdout_every == holdout_every - 1``,
else to train. With the default ``holdout_every=20`` that is about 90/5/5, with every part of the
Bible represented in each split.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from deqjax._src.data.cache import atomic_write_bytes, resolve_cache_dir
from deqjax._src.data.errors import DataNotFoundError, missing_data_message
from deqjax._src.data.text import LMCorpus

KJV_ARGS = ("-f", "gen1:1-rev22:21")
KJV_NUM_VERSES = 31102
KJV_NUM_CHAPTERS = 1189
KJV_CACHE_NAME = os.path.join("kjv", "kjv.txt")
KJV_HOW_TO_GET = (
    "Install the Debian package bible-kjv (`apt-get install bible-kjv`), which provides the "
    "`bible` program, or write the output of `bible -f gen1:1-rev22:21` to the cache file above."
)
_VERSE = re.compile(r"^(\d?[A-Za-z]+)(\d+):(\d+)\s+(.*)$")


def kjv_cache_path(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where the KJV text is cached: ``<cache_dir>/kjv/kjv.txt`` (default cache: see
    :func:`deqjax._src.data.cache.default_cache_dir`)."""
    return resolve_cache_dir(cache_dir) / KJV_CACHE_NAME


def parse_verses(text: str) -> list[tuple[str, int, int, str]]:
    """Parses ``bible -f`` output into ``(book, chapter, verse, text)`` tuples.

    A line that does not start with a reference continues the previous verse (output wrapped to a
    line width); leading lines before the first reference are ignored.
    """
    verses: list[tuple[str, int, int, str]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        m = _VERSE.match(line)
        if m:
            verses.append((m.group(1), int(m.group(2)), int(m.group(3)), m.group(4).strip()))
        elif verses:
            book, chapter, verse, body = verses[-1]
            verses[-1] = (book, chapter, verse, f"{body} {line}")
    return verses


def _valid_kjv(text: str) -> bool:
    """Whether ``text`` is the complete ``bible -f`` output (first and last verse, verse count)."""
    verses = parse_verses(text)
    return (
        len(verses) == KJV_NUM_VERSES
        and verses[0][:3] == ("Ge", 1, 1)
        and verses[-1][1:3] == (22, 21)
    )


def fetch_kjv_text(
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    bible_executable: str = "bible",
    timeout_s: float = 120.0,
) -> Path:
    """Makes sure the KJV text is cached, running ``bible -f gen1:1-rev22:21`` once if needed.

    Args:
      cache_dir: cache root (``None``: the default cache directory).
      bible_executable: the ``bible`` program (name on ``PATH`` or a path).
      timeout_s: limit for the ``bible`` run.

    Returns:
      The cache file's path (:func:`kjv_cache_path`). A cached file that is incomplete or corrupt is
      regenerated.

    Raises:
      DataNotFoundError: if there is no valid cached file and ``bible`` is not installed.
      RuntimeError: if ``bible`` runs but fails, or prints something that is not the full text.
    """
    path = kjv_cache_path(cache_dir)
    if path.is_file() and _valid_kjv(path.read_text(encoding="utf-8", errors="replace")):
        return path
    exe = shutil.which(bible_executable)
    if exe is None:
        raise DataNotFoundError(
            missing_data_message(
                "King James Bible text",
                [path, f"`{bible_executable}` on PATH (Debian package bible-kjv)"],
                KJV_HOW_TO_GET,
            )
        )
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    proc = subprocess.run(
        [exe, *KJV_ARGS],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=timeout_s,
        env=env,
        check=False,
    )
    text = proc.stdout.decode("utf-8", errors="replace")
    if proc.returncode != 0 or not _valid_kjv(text):
        raise RuntimeError(
            f"`{exe} {' '.join(KJV_ARGS)}` exited with {proc.returncode} and printed "
            f"{len(parse_verses(text))} verses (expected {KJV_NUM_VERSES}); stderr: "
            f"{proc.stderr.decode('utf-8', errors='replace')[:500]!r}"
        )
    return atomic_write_bytes(path, text.encode("utf-8"))


def split_kjv(
    verses: list[tuple[str, int, int, str]], *, holdout_every: int = 20
) -> tuple[list[str], list[str], list[str]]:
    """Splits verses by whole chapters (see the module docstring) into train/valid/test lines.

    Raises:
      ValueError: if ``holdout_every < 3``.
    """
    if holdout_every < 3:
        raise ValueError(f"holdout_every must be >= 3, got {holdout_every}.")
    splits: tuple[list[str], list[str], list[str]] = ([], [], [])
    chapter_index = -1
    previous = None
    for book, chapter, _, body in verses:
        if (book, chapter) != previous:
            chapter_index += 1
            previous = (book, chapter)
        r = chapter_index % holdout_every
        which = 1 if r == holdout_every - 2 else 2 if r == holdout_every - 1 else 0
        splits[which].append(body)
    return splits


def load_kjv(
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    holdout_every: int = 20,
    bible_executable: str = "bible",
    standin_for: str | None = None,
) -> LMCorpus:
    """Loads the King James Bible as an ``LMCorpus`` (one verse per line).

    Args:
      cache_dir: cache root for the text (``None``: the default cache directory).
      holdout_every: chapter split period, see :func:`split_kjv`.
      bible_executable: the ``bible`` program.
      standin_for: the data set this replaces (e.g. ``"wikitext-103"``), named in ``source``.

    Returns:
      ``LMCorpus(name="kjv", is_standin=True)``: the KJV is always an offline stand-in, and its
      ``source`` starts with ``"STAND-IN: "``.

    Raises:
      DataNotFoundError: see :func:`fetch_kjv_text`.
    """
    path = fetch_kjv_text(cache_dir=cache_dir, bible_executable=bible_executable)
    verses = parse_verses(path.read_text(encoding="utf-8"))
    train, valid, test = split_kjv(verses, holdout_every=holdout_every)
    target = standin_for or "a real language-modelling corpus"
    source = (
        f"STAND-IN: King James Bible (Debian bible-kjv, cached at {path}; chapter split "
        f"every {holdout_every}) in place of {target}"
    )
    return LMCorpus("kjv", source, True, train, valid, test)
