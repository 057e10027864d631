"""OneStepAdjoint: Jacobian-free backprop, the gradient of one f at a detached z* (Fung et al.)."""

import functools

import jax
import jax.numpy as jnp

import deqjax as dq
from tests.helpers.dense_ift import (
    contractive_problem,
    dense_reference,
    loss_of_z,
    rel_err,
    tanh_cell,
    tanh_grad,
)

D = 5


def test_one_step_equals_gradient_of_f_at_detached_fixed_point():
    p, x = contractive_problem(seed=5)
    solver = functools.partial(dq.solvers.broyden, tol=1e-12, max_steps=100)
    got = tanh_grad(solver, dq.OneStepAdjoint())(p, x)
    z_star = solver(lambda z: tanh_cell(p, x, z), jnp.zeros(D)).value
    want = jax.grad(lambda p, x: loss_of_z(tanh_cell(p, x, z_star)), argnums=(0, 1))(p, x)
    assert rel_err(got, want) < 1e-10
    assert rel_err(got, dense_reference(p, x)) > 1e-3  # and it is not the implicit gradient
