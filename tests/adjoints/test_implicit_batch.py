"""Batch-native implicit backward: one batched adjoint loop, one parameter VJP."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import deqjax as dq
from deqjax import jacobian
from tests.helpers.lanes import default_first

B, D = 6, 8


def batch_cell(p, x, z):
    """Rows of z, x are independent problems: z, x of shape [B, d]."""
    return jnp.tanh(z @ p["W"].T + x @ p["U"].T + p["b"][None])


def one_cell(p, x, z):
    return jnp.tanh(p["W"] @ z + p["U"] @ x + p["b"])


def problem(seed=0, radius=0.9, dtype=jnp.float64, b=B, d=D):
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(d, d))
    w *= radius / np.max(np.abs(np.linalg.eigvals(w)))
    p = {
        "W": jnp.asarray(w, dtype),
        "U": jnp.asarray(rng.normal(size=(d, d)) / np.sqrt(d), dtype),
        "b": jnp.asarray(0.1 * rng.normal(size=d), dtype),
    }
    # Inputs of very different scales: the examples converge in different numbers of steps.
    scales = np.geomspace(0.01, 10.0, b)[:, None]
    return p, jnp.asarray(rng.normal(size=(b, d)) * scales, dtype)


def weights(x):
    return jnp.asarray(np.random.default_rng(7).normal(size=x.shape), x.dtype)


def fwd(batch_ndim, **kw):
    return functools.partial(
        dq.solvers.anderson, tol=1e-12, max_steps=200, stop_mode="abs", batch_ndim=batch_ndim, **kw
    )


def batch_native_grad(adjoint, p, x):
    c = weights(x)

    def loss(p, x, probe):
        z, sol = dq.fixed_point(
            batch_cell,
            p,
            x,
            jnp.zeros_like(x),
            solver=fwd(1),
            adjoint=adjoint,
            backward_stats=probe,
        )
        return jnp.sum(c * z), sol

    return jax.jit(jax.grad(loss, argnums=(0, 1, 2), has_aux=True))(p, x, dq.BackwardStats.zeros())


def vmap_grad(adjoint, p, x):
    c = weights(x)

    def loss(p, x):
        def one(xi, ci):
            z, _ = dq.fixed_point(
                one_cell, p, xi, jnp.zeros_like(xi), solver=fwd(0), adjoint=adjoint
            )
            return jnp.sum(ci * z)

        return jnp.sum(jax.vmap(one)(x, c))

    return jax.jit(jax.grad(loss, argnums=(0, 1)))(p, x)


def dense_grad(p, x):
    c = weights(x)
    z = fwd(1)(lambda z: batch_cell(p, x, z), jnp.zeros_like(x)).value

    def u_of(zi, xi, ci):
        jac = jax.jacobian(lambda v: one_cell(p, xi, v))(zi)
        return jnp.linalg.solve((jnp.eye(D) - jac).T, ci)

    u = jax.vmap(u_of)(z, x, c)
    _, vjp = jax.vjp(lambda p, x: batch_cell(p, x, z), p, x)
    return vjp(u)


def rel_err(a, b):
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    num = max(float(jnp.max(jnp.abs(u - v))) for u, v in zip(la, lb))
    return num / max(float(jnp.max(jnp.abs(v))) for v in lb)


@pytest.mark.parametrize(
    "bwd",
    [
        None,
        functools.partial(dq.solvers.broyden, tol=1e-12, max_steps=200, stop_mode="abs"),
        functools.partial(dq.solvers.gmres, tol=1e-12, max_steps=400, stop_mode="abs"),
    ],
    ids=["forward-anderson", "broyden", "gmres"],
)
@pytest.mark.slow
def test_batch_native_implicit_gradient_equals_vmap_and_dense(bwd):
    p, x = problem()
    adjoint = dq.ImplicitAdjoint(solver=bwd)
    (g_p, g_x, stats), sol = batch_native_grad(adjoint, p, x)
    assert sol.status.shape == (B,) and bool(jnp.all(sol.status == dq.solvers.CONVERGED))
    assert len(set(np.asarray(sol.num_steps).tolist())) > 1  # per-example forward stopping
    ref = dense_grad(p, x)
    assert rel_err((g_p, g_x), ref) < 1e-9
    assert rel_err((g_p, g_x), vmap_grad(adjoint, p, x)) < 1e-9
    # One backward problem per example, all converged, none needed the fallback.
    assert float(stats.count) == B and float(stats.failures) == 0 and float(stats.fallbacks) == 0


def test_batch_native_backward_stops_per_example():
    p, x = problem(seed=1)
    z = fwd(1)(lambda z: batch_cell(p, x, z), jnp.zeros_like(x)).value
    g = weights(x)
    bwd = functools.partial(dq.solvers.anderson, tol=1e-12, max_steps=200, stop_mode="abs")
    sol = jacobian.backward_convergence(batch_cell, p, x, z, g, solver=bwd, batch_ndim=1)
    assert sol.num_steps.shape == (B,) and bool(jnp.all(sol.status == dq.solvers.CONVERGED))
    assert len(set(np.asarray(sol.num_steps).tolist())) > 1
    per_example = jax.vmap(
        lambda zi, xi, gi: jacobian.backward_convergence(one_cell, p, xi, zi, gi, solver=bwd)
    )(z, x, g)
    np.testing.assert_allclose(sol.value, per_example.value, rtol=1e-9, atol=1e-12)


def test_batch_native_fallback_is_per_example():
    # One example's backward needs the GMRES fallback (a short fixed-point budget), others do not.
    p, x = problem(seed=2)
    short = functools.partial(
        dq.solvers.fixed_point_iteration, tol=1e-10, max_steps=25, stop_mode="abs"
    )
    adjoint = dq.ImplicitAdjoint(solver=short)
    (g_p, g_x, stats), _ = batch_native_grad(adjoint, p, x)
    assert 0 < float(stats.fallbacks) < B and float(stats.failures) == 0
    assert rel_err((g_p, g_x), dense_grad(p, x)) < 1e-8


@pytest.mark.parametrize(
    "adjoint",
    default_first(
        [dq.PhantomAdjoint(steps=8), dq.OneStepAdjoint(), dq.UnrolledAdjoint(accelerated=True)]
    ),
    ids=["phantom", "one-step", "unrolled"],
)
def test_other_adjoints_batch_native_equal_vmap(adjoint):
    p, x = problem(seed=3)
    (g_p, g_x, stats), _ = batch_native_grad(adjoint, p, x)
    assert rel_err((g_p, g_x), vmap_grad(adjoint, p, x)) < 1e-8
    assert all(float(v) == 0.0 for v in stats)


@pytest.mark.slow
def test_batch_native_memory_is_close_to_the_whole_batch_solve():
    b, d = 64, 64
    p, x = problem(seed=4, dtype=jnp.float32, b=b, d=d)

    def temp_bytes(loss):
        return jax.jit(jax.grad(loss)).lower(p).compile().memory_analysis().temp_size_in_bytes

    def make(batch_ndim):
        solver = functools.partial(
            dq.solvers.anderson, tol=1e-4, max_steps=30, batch_ndim=batch_ndim
        )

        def loss(p):
            z, _ = dq.fixed_point(batch_cell, p, x, jnp.zeros_like(x), solver=solver)
            return jnp.sum(z**2)

        return loss

    def per_example_vmap(p):
        solver = functools.partial(dq.solvers.anderson, tol=1e-4, max_steps=30)

        def one(xi):
            return jnp.sum(
                dq.fixed_point(one_cell, p, xi, jnp.zeros_like(xi), solver=solver)[0] ** 2
            )

        return jnp.sum(jax.vmap(one)(x))

    native, whole, vmapped = temp_bytes(make(1)), temp_bytes(make(0)), temp_bytes(per_example_vmap)
    assert native <= 2 * whole, (native, whole)
    # vmap materialises a [B, d, d] parameter cotangent; the batch-native path does not.
    assert vmapped > native + b * d * d * 4 // 2, (vmapped, native)
