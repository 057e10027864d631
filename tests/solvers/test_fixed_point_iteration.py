"""Damped fixed-point iteration: where plain iteration fails, and the damped step."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from deqjax import solvers
from tests.helpers.solver_problems import (
    ACCELERATED,
    jitted_tanh_solve,
    noncontractive_problem,
    scipy_root,
)


def test_noncontractive_map_iteration_fails_acceleration_converges():
    a, x = noncontractive_problem()
    z_star = scipy_root(a, x)
    # The fixed point is repelling for plain iteration: the Jacobian diag(1 - z*^2) A there has an
    # eigenvalue below -1, so iterates oscillate around it.
    jac = (1 - z_star**2)[:, None] * a
    assert np.min(np.linalg.eigvals(jac).real) < -1.05

    fpi = jitted_tanh_solve("fixed_point_iteration", 1e-8, 100)(jnp.asarray(a), jnp.asarray(x))
    assert fpi.status == solvers.STALLED  # it oscillates: no new best residual in 30 steps
    tail = np.asarray(fpi.trace[50:])
    assert tail.min() > 0.1  # never gets anywhere near the fixed point
    # Oscillation: successive differences of the iterates do not shrink (period-2 cycle).
    z1 = np.asarray(fpi.value)
    z2 = np.tanh(a @ z1 + x)
    z3 = np.tanh(a @ z2 + x)
    assert np.linalg.norm(z3 - z1) < 0.5 * np.linalg.norm(z2 - z1)

    for name in ACCELERATED:
        sol = jitted_tanh_solve(name, 1e-8, 100)(jnp.asarray(a), jnp.asarray(x))
        assert sol.status == solvers.CONVERGED, name
        np.testing.assert_allclose(sol.value, z_star, atol=1e-7)


def test_damped_step_is_the_average_with_f():
    """x_1 = (1 - damping) x_0 + damping f(x_0), sampled after one step."""
    f = lambda z: jnp.cos(z) * jnp.asarray([0.5, 0.3])  # noqa: E731
    z0 = jnp.asarray([1.0, -2.0])
    sol = solvers.fixed_point_iteration(f, z0, damping=0.25, max_steps=3, sample_steps=(1,))
    np.testing.assert_allclose(sol.samples[0], 0.75 * z0 + 0.25 * f(z0), rtol=1e-15)
