"""``benchmarks.solver_versions``: an old module file loaded beside the installed one."""

from __future__ import annotations

import inspect
import sys

import jax

import deqjax as dq
from benchmarks import solver_versions
from deqjax._src.solvers import (
    broyden,
    broyden_inverse,
    broyden_line_search,
    broyden_steps,
    registry,
)


def test_the_same_module_twice_gives_the_same_solution_and_every_row(capsys):
    """Broyden's class module with its form modules (dependencies first), loaded beside the
    installed ones; the installed modules and the registry are untouched afterwards."""
    modules = [broyden, broyden_inverse, broyden_steps, broyden_line_search]
    old = [inspect.getfile(m) for m in modules]
    argv = ["--old", *old, "--d", "8", "--batch", "4", "--calls", "1"]
    with jax.numpy_rank_promotion("allow"):  # the benchmarks' cells broadcast their bias
        medians = solver_versions.main(argv)
    assert set(medians) == {
        "floor (24 evaluations)",
        "FixedPointIteration",
        "old Broyden",
        "new Broyden",
    }
    assert "max |old - new| = 0" in capsys.readouterr().out
    assert registry.BY_NAME["Broyden"] is dq.solvers.Broyden
    assert registry.BY_FUNCTION[dq.solvers.broyden] is dq.solvers.Broyden
    assert len(registry.BY_FUNCTION) == len(registry.BY_NAME)
    for m in modules:
        assert sys.modules[m.__name__] is m


def test_the_old_class_runs_the_old_versions_of_the_modules_it_imports():
    modules = [broyden, broyden_inverse, broyden_steps, broyden_line_search]
    old = solver_versions.load([inspect.getfile(m) for m in modules], name="old_broyden_test")
    assert old.Broyden is not dq.solvers.Broyden
    assert old.broyden_steps is not broyden_steps
    assert old.broyden_steps.broyden_inverse is old.broyden_inverse is not broyden_inverse
    assert sys.modules[broyden_steps.__name__] is broyden_steps
