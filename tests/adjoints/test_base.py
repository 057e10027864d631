"""What every gradient strategy shares (``deqjax._src.adjoints.base``): the forward solve of the
strategies whose gradient comes from elsewhere runs once, on gradient-free inputs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import deqjax as dq
from tests.helpers.dense_ift import small_cell, small_problem


@pytest.mark.parametrize("adjoint", [dq.PhantomAdjoint(steps=3), dq.OneStepAdjoint()], ids=repr)
def test_forward_solve_runs_once_under_grad(adjoint):
    """No tangent enters the solver loop: f runs num_steps times in the solve plus the strategy's
    own differentiated applications (a loop carrying tangents made grad fail with an effect)."""
    w, x, z0 = small_problem()
    calls = []

    def cell(p, x_, z):
        jax.debug.callback(lambda _: calls.append(1), z[0])
        return small_cell(p, x_, z)

    def loss(p):
        z, sol = dq.fixed_point(
            cell, p, x, z0, solver=dq.solvers.Anderson(tol=1e-10), adjoint=adjoint
        )
        return jnp.sum(z), sol.num_steps

    g, steps = jax.jit(jax.grad(loss, has_aux=True))(w)
    jax.effects_barrier()
    extra = adjoint.steps if isinstance(adjoint, dq.PhantomAdjoint) else 1
    assert len(calls) == int(steps) + extra
    assert np.all(np.isfinite(g))
