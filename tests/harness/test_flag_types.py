"""Checked flag types: a bad value stops the command line at once, naming its flag (status 2)."""

from __future__ import annotations

import dataclasses
from typing import Annotated

import pytest

from deqjax import harness


@dataclasses.dataclass(frozen=True)
class Config:
    """Every checked type once."""

    epochs: harness.PositiveInt = 4  # passes
    train_size: harness.NonNegativeInt = 0  # subset
    clip_norm: harness.NonNegativeFloat = 1.0  # clipping
    lr: harness.PositiveFloat = 1e-3  # learning rate
    n: Annotated[int, harness.at_least(2)] = 5  # width
    scales: harness.FloatList = (0.5, 1.0)  # scales
    seeds: harness.IntList = (0,)  # seeds
    families: harness.choice_list(("gaussian", "goe")) = ("goe",)  # families
    sweep: harness.Switch = False  # a mode
    progress: harness.Switch = True  # a bar


def _parse(argv):
    return harness.parse_config(Config(), argv)


def test_values_in_range_parse():
    argv = ["--epochs", "2", "--train_size", "0", "--clip_norm", "0", "--lr", "1e-3", "--n", "2"]
    c = _parse(argv + ["--scales", "0.5,1.5", "--seeds", "0,1,2"])
    assert (c.epochs, c.train_size, c.clip_norm, c.lr, c.n) == (2, 0, 0.0, 1e-3, 2)
    assert c.scales == (0.5, 1.5) and c.seeds == (0, 1, 2)
    c = _parse(["--families", "gaussian,goe", "--sweep", "--no_progress"])
    assert c.families == ("gaussian", "goe") and c.sweep and not c.progress
    assert _parse([]) == Config()


@pytest.mark.parametrize(
    "argv, flag, message",
    [
        (["--epochs", "-1"], "--epochs", "must be an int >= 1, got -1"),
        (["--epochs", "x"], "--epochs", "expected int, got 'x'"),
        (["--train_size", "-5"], "--train_size", "must be an int >= 0"),
        (["--clip_norm", "-1"], "--clip_norm", "must be a finite number >= 0"),
        (["--lr", "inf"], "--lr", "must be a finite number > 0"),
        (["--lr", "0"], "--lr", "must be a finite number > 0"),
        (["--n", "1"], "--n", "must be an int >= 2"),
        (["--scales", "0.5,x"], "--scales", "expected float, got 'x'"),
        (["--families", "gaussian,cauchy"], "--families", "got 'cauchy'"),
    ],
)
def test_bad_values_exit_2_naming_the_flag(argv, flag, message, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")  # one line per message
    with pytest.raises(SystemExit) as e:
        _parse(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"Error parsing {flag}" in err or flag in err, err
    assert message in err, err


def test_switches_have_no_negated_twin(capsys):
    with pytest.raises(SystemExit) as e:
        _parse(["--no_sweep"])
    assert e.value.code == 2
