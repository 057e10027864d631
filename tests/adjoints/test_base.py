"""What every gradient strategy shares (``deqjax._src.adjoints.base``): the forward solve of the
strategies whose gradient comes from elsewhere runs once, on gradient-free inputs."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import deqjax as dq
from tests.adjoints.strategies import every_strategy
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


def test_a_wrong_adjoint_is_refused_naming_every_strategy_including_a_new_one():
    """The list in the message is derived from the subclasses of dq.Adjoint: a strategy added
    by subclassing is named with no edit of the message."""

    class NewAdjoint(dq.Adjoint):
        pass

    w, x, z0 = small_problem()
    with pytest.raises(ValueError, match="adjoint must be a deqjax adjoint object") as info:
        dq.fixed_point(small_cell, w, x, z0, adjoint="implicit")
    for strategy in [*every_strategy(), NewAdjoint]:
        assert f"{strategy.__name__}()" in str(info.value)
    assert not re.search(r"[ (]Adjoint\(\)", str(info.value))  # the base class is no strategy
