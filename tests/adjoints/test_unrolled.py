"""UnrolledAdjoint: backprop through every step of the forward solver.

Anderson and Broyden are refused unless ``accelerated=True`` (the derivative of their steps is not
the fixed point's). With the flag, through Anderson on a float64 transformer DEQ: Anderson's mixing
coefficients come from a tiny
ridge-regularised least-squares solve. Backprop through that solve multiplies rounding errors by up
to ~1/lam when the residual history is nearly collinear, which happens exactly when a solve
struggles: the unrolled gradient then came out as 1e17. The coefficients are now under
``stop_gradient``: the unrolled gradient differentiates the iteration with the coefficients frozen
(a convex-type combination, which cannot amplify errors), whose fixed point is still ``z*``.
"""

import functools

import haiku as hk
import jax
import jax.numpy as jnp
import pytest

import deqjax as dq
from deqjax.nn import TransformerCell, TransformerInput
from tests.helpers.dense_ift import contractive_problem, rel_err, tanh_cell, tanh_grad

SOLVERS = {"fpi": dq.solvers.fixed_point_iteration, "anderson": dq.solvers.anderson}

B, T, DX, D, M = 2, 5, 3, 8, 3


@pytest.mark.parametrize("name,bound", [("fpi", 1e-8), ("anderson", 1e-4)])
def test_unrolled_agrees_with_implicit_when_converged(name, bound):
    # Unrolled fixed-point iteration converges to the implicit gradient; unrolled Anderson holds
    # its mixing coefficients constant (stop_gradient), so it only approximates it.
    p, x = contractive_problem(seed=4)
    solver = functools.partial(SOLVERS[name], tol=1e-12, max_steps=300)
    implicit = tanh_grad(solver, dq.ImplicitAdjoint())(p, x)
    unrolled = tanh_grad(solver, dq.UnrolledAdjoint(accelerated=name == "anderson"))(p, x)
    assert rel_err(unrolled, implicit) < bound


@pytest.mark.parametrize(
    "solver", [dq.solvers.Anderson(), dq.solvers.broyden], ids=["Anderson()", "broyden"]
)
def test_unrolled_refuses_anderson_and_broyden_and_names_the_alternatives(solver):
    p, x = contractive_problem()
    with pytest.raises(ValueError, match="ImplicitAdjoint.*FixedPointIteration.*Reversible"):
        dq.fixed_point(tanh_cell, p, x, jnp.zeros(5), solver=solver, adjoint=dq.UnrolledAdjoint())


def test_unrolled_refuses_solver_without_loop_keyword():
    p, x = contractive_problem()

    def my_solver(f, z0):
        return dq.solvers.anderson(f, z0)

    with pytest.raises(ValueError, match="loop"):
        dq.fixed_point(
            tanh_cell, p, x, jnp.zeros(5), solver=my_solver, adjoint=dq.UnrolledAdjoint()
        )


def test_unrolled_refuses_a_solver_object_without_a_scan_loop():
    p, x = contractive_problem()
    with pytest.raises(ValueError, match="loop='scan'"):
        dq.fixed_point(
            tanh_cell, p, x, jnp.zeros(5), solver=dq.solvers.GMRES(), adjoint=dq.UnrolledAdjoint()
        )


# --- through Anderson on a float64 transformer DEQ ---------------------------------------------


def _problem(contractive: bool):
    def cell_fn(z, x):
        kw = {}
        if contractive:  # the DEQ-vs-unrolled test cell of test_nn_transformer_trellis
            kw = dict(
                attn_w_init=dq.initializers.Gaussian(1.0),
                w_init=dq.initializers.Gaussian(1.0),
                inject_w_init=hk.initializers.RandomNormal(1.0),
            )
        return TransformerCell(D, num_heads=2, d_ff=12, **kw)(z, x, is_training=False)

    cell = hk.without_apply_rng(hk.transform(cell_fn))
    key = jax.random.PRNGKey
    mems = jax.random.normal(key(2), (B, M, D), jnp.float64) if contractive else None
    x = TransformerInput(jax.random.normal(key(1), (B, T, DX), jnp.float64), mems)
    z0 = jnp.zeros((B, T, D), jnp.float64)
    params = jax.jit(cell.init)(key(0), z0, x)
    direction = jax.tree_util.tree_map(
        lambda a: jax.random.normal(key(7), a.shape, a.dtype), params
    )
    weights = jax.random.normal(key(9), (B, T, D), jnp.float64)

    def f(p, x, z):
        return cell.apply(p, z, x)

    def directional(adjoint, solver):
        def loss(p):
            z, sol = dq.fixed_point(f, p, x, z0, solver=solver, adjoint=adjoint)
            return jnp.sum(z * weights), sol

        grads, sol = jax.jit(jax.grad(loss, has_aux=True))(params)
        leaves = zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(direction))
        return float(sum(jnp.vdot(g, d) for g, d in leaves)), sol

    def finite_difference(solver, eps=1e-5):
        def value(p):
            return float(jnp.sum(dq.fixed_point(f, p, x, z0, solver=solver)[0] * weights))

        shifted = [
            jax.tree_util.tree_map(lambda a, d, s=s: a + s * eps * d, params, direction)
            for s in (1.0, -1.0)
        ]
        return (value(shifted[0]) - value(shifted[1])) / (2 * eps)

    return directional, finite_difference


@pytest.mark.slow
def test_unrolled_anderson_matches_finite_differences_on_float64_transformer():
    directional, finite_difference = _problem(contractive=True)
    solver = functools.partial(dq.solvers.anderson, tol=1e-10, max_steps=100)
    unrolled, sol = directional(dq.UnrolledAdjoint(accelerated=True), solver)
    assert int(sol.status) == dq.solvers.CONVERGED
    implicit, _ = directional(dq.ImplicitAdjoint(), solver)
    fd = finite_difference(functools.partial(dq.solvers.anderson, tol=1e-13, max_steps=200))
    assert implicit == pytest.approx(fd, rel=1e-4)
    assert unrolled == pytest.approx(fd, rel=1e-3)


@pytest.mark.slow
def test_unrolled_anderson_gradient_stays_bounded_when_the_solve_struggles():
    # Default transformer init: Anderson does not reach tol in 100 steps (residual ~1e-2). The
    # gradient through the mixing coefficients was -4e17 here (the implicit one is ~1e4).
    directional, _ = _problem(contractive=False)
    solver = functools.partial(dq.solvers.anderson, tol=1e-10, max_steps=100)
    unrolled, sol = directional(dq.UnrolledAdjoint(accelerated=True), solver)
    assert int(sol.status) != dq.solvers.CONVERGED
    implicit, _ = directional(dq.ImplicitAdjoint(), solver)
    assert abs(unrolled) < 100 * abs(implicit)
