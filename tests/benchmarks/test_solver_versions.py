"""``benchmarks.solver_versions``: an old module file loaded beside the installed one."""

from __future__ import annotations

import inspect

import jax

from benchmarks import solver_versions
from deqjax._src.solvers import broyden


def test_the_same_module_twice_gives_the_same_solution_and_every_row(capsys):
    argv = ["--old", inspect.getfile(broyden), "--d", "8", "--batch", "4", "--calls", "1"]
    with jax.numpy_rank_promotion("allow"):  # the benchmarks' cells broadcast their bias
        medians = solver_versions.main(argv)
    assert set(medians) == {
        "floor (24 evaluations)",
        "FixedPointIteration",
        "old Broyden",
        "new Broyden",
    }
    assert "max |old - new| = 0" in capsys.readouterr().out
