"""The command line of a configuration dataclass: flat underscore flags, help, defaults."""

from __future__ import annotations

import dataclasses
import importlib
import pathlib
from typing import Annotated

import pytest
import tyro

from deqjax import harness
from deqjax._src.harness.cli import paragraphs

ROOT = pathlib.Path(__file__).resolve().parents[2]


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


@dataclasses.dataclass(frozen=True)
class Flags:
    """Boolean settings of each kind."""

    jr: bool = True  # regularise
    pre_ln: bool = False  # pre-layer-norm cells
    sweep: harness.Switch = False  # the sweep instead of one run
    loud: Annotated[bool, tyro.conf.arg(help_behavior_hint="(default: quiet)")] = False  # talk
    run: harness.RunConfig = harness.RunConfig()


def _options(text: str) -> dict[str, str]:
    options = {}
    for line in text.splitlines():
        content = line.strip("│ ")
        if content.startswith("--"):
            flags, _, help_text = content.partition("  ")
            options[flags.strip()] = help_text.strip()
    return options


def _help(default, capsys, monkeypatch, argv=("--help",)) -> dict[str, str]:
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit) as e:
        harness.parse_config(default, list(argv))
    assert e.value.code == 0
    return _options(capsys.readouterr().out)


def test_a_boolean_shows_its_default_as_the_flag_in_effect(capsys, monkeypatch):
    """``--quiet, --no_progress  no progress bar (default: True)`` read as if the bar were off
    by default: a pair names the flag in effect, a one-way switch says what it does."""
    options = _help(Flags(), capsys, monkeypatch)
    assert options["--jr, --no_jr"] == "regularise (default: --jr)"
    assert options["--pre_ln, --no_pre_ln"] == "pre-layer-norm cells (default: --no_pre_ln)"
    assert options["--sweep"] == "the sweep instead of one run"
    assert options["--loud, --no_loud"] == "talk (default: quiet)"  # a field's own hint wins
    assert options["--quiet, --no_progress"] == "hide the progress bar (default: the bar is shown)"
    assert options["--smoke"].startswith("tiny run") and "(default:" not in options["--smoke"]
    flipped = Flags(jr=False, pre_ln=True)  # the default in effect (e.g. under --smoke)
    options = _help(flipped, capsys, monkeypatch)
    assert options["--jr, --no_jr"] == "regularise (default: --no_jr)"
    assert options["--pre_ln, --no_pre_ln"] == "pre-layer-norm cells (default: --pre_ln)"
    assert harness.parse_config(Flags(), ["--no_jr", "--pre_ln", "--sweep", "--quiet"]) == Flags(
        jr=False, pre_ln=True, sweep=True, run=harness.RunConfig(progress=False)
    )


SCRIPTS = sorted(p.stem for p in (ROOT / "experiments").glob("*.py") if p.stem != "__init__")


@pytest.mark.parametrize("name", SCRIPTS)
def test_no_script_shows_a_boolean_default_as_true_or_false(name, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit) as e:
        importlib.import_module(f"experiments.{name}").main(["--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    assert "(default: True)" not in text and "(default: False)" not in text
