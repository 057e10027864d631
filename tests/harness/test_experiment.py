"""An experiment's command line: ``--smoke`` and mode defaults, out_dir defaults, explicit flags."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from deqjax import harness


@dataclasses.dataclass(frozen=True)
class Model:
    """A section with its own smoke settings."""

    SMOKE: ClassVar[dict[str, Any]] = {"width": 4, "depth": 1}

    width: int = 64  # width
    depth: int = 3  # depth


@dataclasses.dataclass(frozen=True)
class Config:
    """A configuration with a mode."""

    steps: int = 100  # steps
    sweep: harness.Switch = False  # sweep mode
    model: Model = Model()
    run: harness.RunConfig = harness.RunConfig()


EXP = harness.Experiment(
    name="exp",
    doc="An experiment.",
    config=Config(),
    setup=lambda c: (None, {}),
    run=lambda c, inputs, ctx: {},
    smoke={"steps": 2, "depth": 2},
    modes={"sweep": {"steps": 50}},
)


def test_smoke_mode_and_out_dir_defaults():
    c = EXP.parse([])
    assert (c.steps, c.model, c.run.out_dir) == (100, Model(), "runs/exp")
    c = EXP.parse(["--smoke", "--seed", "3"])
    assert (c.steps, c.model.width, c.model.depth) == (2, 4, 2)  # the experiment's smoke wins
    assert (c.run.seed, c.run.out_dir, c.run.smoke) == (3, "runs/exp_smoke", True)
    c = EXP.parse(["--sweep"])
    assert (c.steps, c.run.out_dir, EXP.mode(c)) == (50, "runs/exp_sweep", "sweep")
    c = EXP.parse(["--sweep", "--smoke"])
    assert (c.steps, c.run.out_dir) == (2, "runs/exp_sweep_smoke")
    assert EXP.mode(EXP.parse([])) is None


def test_explicit_flags_win_over_every_default():
    c = EXP.parse(["--smoke", "--steps", "7", "--width", "9", "--out_dir", "x"])
    assert (c.steps, c.model.width, c.run.out_dir) == (7, 9, "x")
    assert EXP.defaults(smoke=True).steps == 2
