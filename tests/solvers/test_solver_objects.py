"""Solver objects at the entry points: the adjoints and the DEQ take them like the function forms.

(Integration tests of ``dq.fixed_point``, the adjoints and ``dq.nn.DEQ`` with solver objects; they
belong with the tests of those modules.)
"""

import functools

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import deqjax as dq


@pytest.mark.parametrize(
    "obj, fn, adjoint",
    [
        (dq.solvers.Reversible(max_steps=30, tol=1e-8), dq.solvers.reversible, "ReversibleAdjoint"),
        (dq.solvers.Broyden(max_steps=30, tol=1e-8), dq.solvers.broyden, "ShineAdjoint"),
    ],
    ids=["reversible", "shine"],
)
def test_objects_drive_the_adjoints_that_need_their_solver(obj, fn, adjoint):
    w, x, z0 = _problem()
    adj = getattr(dq, adjoint)()

    def grad(solver):
        loss = lambda p: jnp.sum(dq.fixed_point(_cell, p, x, z0, solver=solver, adjoint=adj)[0])  # noqa: E731
        return jax.grad(loss)(w)

    want = grad(functools.partial(fn, max_steps=30, tol=1e-8))
    np.testing.assert_allclose(grad(obj), want, rtol=1e-12, atol=1e-14)


def test_implicit_fallback_reads_the_tolerance_of_a_solver_object():
    config = dq.ImplicitAdjoint().backward_config(dq.solvers.Anderson(tol=1e-7, max_steps=20))
    assert config.fallback.tol == 1e-7 and config.fallback.max_steps == 40


def _cell(p, x, z):
    return jnp.tanh(p @ z + x)


def _problem(d=4):
    w = 0.4 * jax.random.normal(jax.random.PRNGKey(1), (d, d)) / np.sqrt(d)
    return w, jnp.linspace(-1.0, 1.0, d), jnp.zeros(d)


@pytest.mark.parametrize("adjoint", [dq.ImplicitAdjoint(), dq.UnrolledAdjoint()], ids=repr)
def test_an_object_solver_gives_the_gradient_of_the_partial(adjoint):
    w, x, z0 = _problem()

    def grad(solver):
        def loss(p):
            return jnp.sum(dq.fixed_point(_cell, p, x, z0, solver=solver, adjoint=adjoint)[0])

        return jax.grad(loss)(w)

    obj = grad(dq.solvers.Anderson(tol=1e-10, max_steps=60))
    part = grad(functools.partial(dq.solvers.anderson, tol=1e-10, max_steps=60))
    np.testing.assert_allclose(obj, part, rtol=1e-10, atol=1e-12)


def test_unrolled_adjoint_refuses_a_solver_object_without_a_scan_loop():
    w, x, z0 = _problem()
    with pytest.raises(ValueError, match="loop='scan'"):
        dq.fixed_point(_cell, w, x, z0, solver=dq.solvers.GMRES(), adjoint=dq.UnrolledAdjoint())


@pytest.mark.parametrize("adjoint", [dq.PhantomAdjoint(steps=3), dq.OneStepAdjoint()], ids=repr)
def test_forward_solve_runs_once_under_grad(adjoint):
    """No tangent enters the solver loop: f runs num_steps times in the solve plus the strategy's
    own differentiated applications (a loop carrying tangents made grad fail with an effect)."""
    w, x, z0 = _problem()
    calls = []

    def cell(p, x_, z):
        jax.debug.callback(lambda _: calls.append(1), z[0])
        return _cell(p, x_, z)

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


def test_deq_with_a_solver_object_is_batch_native():
    def forward(x):
        deq = dq.nn.DEQ(dq.nn.MLPCell(), solver=dq.solvers.Anderson(tol=1e-8, max_steps=40))
        return deq(x)

    t = hk.transform(forward)
    x = jax.random.normal(jax.random.PRNGKey(0), (3, 6))
    params = t.init(jax.random.PRNGKey(1), x)
    z, sol = t.apply(params, None, x)
    assert z.shape == (3, 6) and sol.status.shape == (3,) and sol.trace.shape == (3, 40)
    assert np.all(np.asarray(sol.status) == dq.solvers.CONVERGED)
