"""The forward solver and adjoint by gradient name, and the solver section's objects."""

from __future__ import annotations

import pytest

import deqjax as dq
from deqjax import harness


def test_each_gradient_name_gives_its_solver_and_adjoint():
    kinds = {}
    for name in harness.GRADIENTS:
        solver, adjoint = harness.solver_and_adjoint(name, max_steps=7, tol=1e-4, stop_mode="abs")
        assert (solver.max_steps, solver.tol, solver.stop_mode) == (7, 1e-4, "abs")
        kinds[name] = (type(solver).__name__, type(adjoint).__name__)
    assert kinds == {
        "implicit": ("Anderson", "ImplicitAdjoint"),
        "phantom": ("Anderson", "PhantomAdjoint"),
        "one_step": ("Anderson", "OneStepAdjoint"),
        "unrolled": ("FixedPointIteration", "UnrolledAdjoint"),
        "shine": ("Broyden", "ShineAdjoint"),
        "reversible": ("Reversible", "ReversibleAdjoint"),
    }
    shine, adjoint = harness.solver_and_adjoint("shine", max_steps=5, tol=1e-3, steps=2)
    assert shine.return_inverse and adjoint.refine_steps == 2 and adjoint.fallback is None
    _, phantom = harness.solver_and_adjoint("phantom", max_steps=5, tol=1e-3, tau=0.8)
    assert (phantom.steps, phantom.tau) == (5, 0.8)
    with pytest.raises(ValueError, match="adjoint must be one of"):
        harness.solver_and_adjoint("newton", max_steps=5, tol=1e-3)


def test_solver_section_builds_forward_backward_and_logs_them():
    c = harness.SolverConfig(max_steps=8, tol=1e-3, anderson_m=3, bwd_max_steps=9, bwd_tol=1e-4)
    backward = c.backward()
    assert backward == dq.solvers.Anderson(max_steps=9, tol=1e-4, m=3, stop_mode="rel")
    solver, adjoint = c.solver_and_adjoint()
    assert solver == dq.solvers.Anderson(max_steps=8, tol=1e-3, m=3)
    assert adjoint == dq.ImplicitAdjoint(solver=backward)
    logged = harness.to_python({"solver": solver, "adjoint": adjoint})
    assert logged["solver"]["type"] == "Anderson" and logged["solver"]["m"] == 3
    assert logged["adjoint"]["solver"]["max_steps"] == 9  # the backward, field by field
