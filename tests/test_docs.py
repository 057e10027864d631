"""docs/design.md's "What is where" table names every module of the package, and only paths
that exist, so it cannot drift from the source tree."""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
DESIGN_MD = ROOT / "docs" / "design.md"


def _where_paths() -> list[str]:
    """The paths in the first column of design.md's "What is where" table, in order."""
    text = DESIGN_MD.read_text(encoding="utf-8")
    section = re.search(r"^## What is where\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert section, 'docs/design.md has no "## What is where" section'
    paths = re.findall(r"^\| `([^`]+)` \|", section.group(1), re.M)
    assert paths, 'docs/design.md: the "What is where" table is empty'
    return paths


def test_every_module_of_the_package_is_in_the_table():
    listed = set(_where_paths())
    modules = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "deqjax").rglob("*.py"))
    missing = [m for m in modules if m not in listed]
    assert not missing, f'docs/design.md "What is where" lacks {missing}'


def test_every_path_in_the_table_exists_once():
    paths = _where_paths()
    assert len(paths) == len(set(paths)), "docs/design.md names a path twice"
    gone = [p for p in paths if not (ROOT / p).exists()]
    assert not gone, f'docs/design.md "What is where" names paths that do not exist: {gone}'
