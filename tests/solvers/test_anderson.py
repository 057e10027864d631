"""Anderson acceleration: its history and mixing against the plain iteration it generalises."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from deqjax import solvers
from tests.helpers.solver_problems import assert_solutions_equal, noncontractive_problem, tanh_map


@pytest.mark.parametrize("beta", [1.0, 0.6])
def test_history_of_one_is_damped_iteration(beta):
    """m = 1 mixes one iterate with weight 1: x + beta (f(x) - x), damped iteration's step."""
    a, x = noncontractive_problem(d=6, seed=3)
    f = tanh_map(0.3 * jnp.asarray(a), jnp.asarray(x))
    kw = dict(tol=1e-10, max_steps=60)
    anderson = solvers.anderson(f, jnp.zeros(6), m=1, beta=beta, **kw)
    damped = solvers.fixed_point_iteration(f, jnp.zeros(6), damping=beta, **kw)
    assert int(anderson.status) == solvers.CONVERGED
    assert_solutions_equal(anderson, damped)


def test_longer_history_converges_in_fewer_steps():
    a, x = noncontractive_problem()
    f = tanh_map(0.8 * jnp.asarray(a), jnp.asarray(x))
    steps = [
        # stall_steps=None: the comparison is of convergence speed (m=1 oscillates and would
        # stop STALLED, not run its budget)
        int(
            solvers.anderson(
                f, jnp.zeros(10), m=m, tol=1e-10, max_steps=200, stall_steps=None
            ).num_steps
        )
        for m in (1, 5)
    ]
    assert steps[1] < steps[0] / 2, steps
    sol = solvers.anderson(f, jnp.zeros(10), m=5, tol=1e-10, max_steps=200)
    np.testing.assert_allclose(sol.f_value, f(sol.value), rtol=1e-12)
