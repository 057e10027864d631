"""The command line of a configuration dataclass: flat underscore flags, help, defaults."""

from __future__ import annotations

import dataclasses

import pytest

from deqjax import harness
from deqjax._src.harness.cli import paragraphs


@dataclasses.dataclass(frozen=True)
class Inner:
    """Inner section."""

    max_steps: int = 20  # forward steps
    jr: bool = True  # regularise


@dataclasses.dataclass(frozen=True)
class Outer:
    """Outer configuration."""

    width: int = 8  # the width
    gammas: tuple[float, ...] = (0.0, 1.0)  # several values
    inner: Inner = Inner()


@dataclasses.dataclass(frozen=True)
class Clash:
    """Two sections with a setting of the same name."""

    max_steps: int = 1  # clashes with inner.max_steps
    inner: Inner = Inner()


def test_flags_are_flat_with_underscores_and_hyphens_also_parse():
    c = harness.parse_config(Outer(), ["--max_steps", "3", "--no_jr", "--gammas", "0", "2"])
    assert c == Outer(gammas=(0.0, 2.0), inner=Inner(max_steps=3, jr=False))
    assert harness.parse_config(Outer(), ["--max-steps", "4"]).inner.max_steps == 4
    with pytest.raises(SystemExit):
        harness.parse_config(Outer(), ["--inner.max_steps", "3"])  # no section prefix


def test_defaults_come_from_the_instance(capsys):
    c = harness.parse_config(Outer(width=3), [])
    assert c.width == 3
    with pytest.raises(SystemExit) as e:
        harness.parse_config(Outer(width=3), ["--help"], description="Does a thing.\n\nUsage:")
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "Does a thing." in out and "--width" in out and "the width" in out
    assert "(default: 3)" in out and "forward steps" in out


def test_clashing_setting_names_are_refused():
    with pytest.raises(ValueError, match="share the flag --max_steps"):
        harness.parse_config(Clash(), [])


def test_required_fields_need_the_class():
    @dataclasses.dataclass(frozen=True)
    class Needs:
        path: str  # the input

    assert harness.parse_config(Needs, ["--path", "x"]).path == "x"
    with pytest.raises(SystemExit) as e:
        harness.parse_config(Needs, [])
    assert e.value.code == 2


def test_help_paragraphs_join_lines_but_keep_indented_blocks():
    doc = "Title line.\n\nA paragraph\nover two lines.\n\nUsage:\n  python a.py\n  python b.py\n"
    assert paragraphs(doc) == (
        "Title line.\n\nA paragraph over two lines.\n\nUsage:\n  python a.py\n  python b.py"
    )
