"""The public names of DESIGN.md's contract are importable from the package."""

import deqjax as dq


def test_solver_names():
    for name in ["fixed_point_iteration", "anderson", "broyden", "Solution"]:
        assert callable(getattr(dq.solvers, name))
    codes = {dq.solvers.CONVERGED, dq.solvers.MAX_STEPS, dq.solvers.DIVERGED, dq.solvers.NONFINITE}
    assert len(codes) == 4
