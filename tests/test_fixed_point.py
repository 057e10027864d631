"""dq.fixed_point and the gradient strategies (issue 3)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import deqjax as dq
from deqjax._src.implicit_diff import backward_solve

D = 5
SOLVERS = {
    "fpi": dq.solvers.fixed_point_iteration,
    "anderson": dq.solvers.anderson,
    "broyden": dq.solvers.broyden,
}


def cell(p, x, z):
    return jnp.tanh(p["W"] @ z + p["b"] + x)


def problem(seed=0, d=D, radius=0.6):
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(d, d))
    w *= radius / np.max(np.abs(np.linalg.eigvals(w)))
    p = {"W": jnp.asarray(w), "b": jnp.asarray(rng.normal(size=d))}
    return p, jnp.asarray(rng.normal(size=d))


def loss_of_z(z):
    return jnp.sum(jnp.sin(z)) + 0.5 * jnp.sum(z**2)


def dense_reference(p, x):
    """Gradients from a float64 dense solve of (I - J)^T u = g at a tightly solved z*."""
    sol = dq.solvers.broyden(lambda z: cell(p, x, z), jnp.zeros(D), tol=1e-15, max_steps=200)
    z = sol.value
    jac = jax.jacobian(lambda z: cell(p, x, z))(z)
    g = jax.grad(loss_of_z)(z)
    u = jnp.linalg.solve((jnp.eye(D) - jac).T, g)
    _, vjp = jax.vjp(lambda p, x: cell(p, x, z), p, x)
    return vjp(u)


def rel_err(a, b):
    leaves_a, leaves_b = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    num = max(float(jnp.max(jnp.abs(u - v))) for u, v in zip(leaves_a, leaves_b))
    den = max(float(jnp.max(jnp.abs(v))) for v in leaves_b)
    return num / den


def grad_fn(solver, adjoint):
    def loss(p, x):
        z, _ = dq.fixed_point(cell, p, x, jnp.zeros(D), solver=solver, adjoint=adjoint)
        return loss_of_z(z)

    return jax.jit(jax.grad(loss, argnums=(0, 1)))


@pytest.mark.parametrize("fwd", list(SOLVERS))
@pytest.mark.parametrize("bwd", list(SOLVERS))
def test_implicit_gradient_matches_dense_solve(fwd, bwd):
    p, x = problem()
    solver = functools.partial(SOLVERS[fwd], tol=1e-13, max_steps=300, stop_mode="abs")
    backward = functools.partial(SOLVERS[bwd], tol=1e-13, max_steps=300, stop_mode="abs")
    got = grad_fn(solver, dq.ImplicitAdjoint(solver=backward))(p, x)
    assert rel_err(got, dense_reference(p, x)) <= 1e-7


def test_check_grads_reverse_mode():
    p, x = problem(seed=1)
    solver = functools.partial(dq.solvers.anderson, tol=1e-13, max_steps=200, stop_mode="abs")

    def f(w, b, x):
        z, _ = dq.fixed_point(cell, {"W": w, "b": b}, x, jnp.zeros(D), solver=solver)
        return loss_of_z(z)

    check_grads(f, (p["W"], p["b"], x), order=1, modes=["rev"], atol=1e-6, rtol=1e-6)


def test_default_adjoint_is_implicit_and_sol_value_is_z_star():
    p, x = problem()
    solver = functools.partial(dq.solvers.anderson, tol=1e-12, max_steps=200)
    z, sol = dq.fixed_point(cell, p, x, jnp.zeros(D), solver=solver)
    np.testing.assert_array_equal(z, sol.value)
    assert int(sol.status) == dq.solvers.CONVERGED
    # A loss on sol.value is differentiated like one on z.
    via_sol = jax.grad(
        lambda p: loss_of_z(dq.fixed_point(cell, p, x, jnp.zeros(D), solver=solver)[1].value)
    )(p)
    via_z = jax.grad(
        lambda p: loss_of_z(dq.fixed_point(cell, p, x, jnp.zeros(D), solver=solver)[0])
    )(p)
    assert rel_err(via_sol, via_z) < 1e-12
    assert rel_err(via_z, dense_reference(p, x)[0]) < 1e-7


def test_jit_vmap_of_grad_equals_loop_with_per_example_statistics():
    p, _ = problem(seed=2, radius=0.9)
    xs = (
        jnp.asarray(np.random.default_rng(3).normal(size=(4, D)))
        * jnp.array([0.1, 1.0, 3.0, 10.0])[:, None]
    )
    solver = functools.partial(dq.solvers.anderson, tol=1e-12, max_steps=100)

    def loss(p, x):
        z, sol = dq.fixed_point(cell, p, x, jnp.zeros(D), solver=solver)
        return loss_of_z(z), sol.num_steps

    batched = jax.jit(jax.vmap(jax.grad(loss, has_aux=True), in_axes=(None, 0)))
    (g_batch, steps_batch) = batched(p, xs)
    single = jax.jit(jax.grad(loss, has_aux=True))
    for i in range(xs.shape[0]):
        g_i, steps_i = single(p, xs[i])
        g_batch_i = jax.tree_util.tree_map(lambda a, i=i: a[i], g_batch)
        assert rel_err(g_batch_i, g_i) < 1e-10
        assert int(steps_batch[i]) == int(steps_i)
    assert len(set(np.asarray(steps_batch).tolist())) > 1  # per-example convergence


@pytest.mark.parametrize("name,bound", [("fpi", 1e-8), ("anderson", 1e-4)])
def test_unrolled_agrees_with_implicit_when_converged(name, bound):
    # Unrolled fixed-point iteration converges to the implicit gradient; unrolled Anderson holds
    # its mixing coefficients constant (stop_gradient), so it only approximates it.
    p, x = problem(seed=4)
    solver = functools.partial(SOLVERS[name], tol=1e-12, max_steps=300)
    implicit = grad_fn(solver, dq.ImplicitAdjoint())(p, x)
    unrolled = grad_fn(solver, dq.UnrolledAdjoint())(p, x)
    assert rel_err(unrolled, implicit) < bound


def test_unrolled_refuses_solver_without_loop_keyword():
    p, x = problem()

    def my_solver(f, z0):
        return dq.solvers.anderson(f, z0)

    with pytest.raises(ValueError, match="loop"):
        dq.fixed_point(cell, p, x, jnp.zeros(D), solver=my_solver, adjoint=dq.UnrolledAdjoint())


def test_one_step_equals_gradient_of_f_at_detached_fixed_point():
    p, x = problem(seed=5)
    solver = functools.partial(dq.solvers.broyden, tol=1e-12, max_steps=100)
    got = grad_fn(solver, dq.OneStepAdjoint())(p, x)
    z_star = solver(lambda z: cell(p, x, z), jnp.zeros(D)).value
    want = jax.grad(lambda p, x: loss_of_z(cell(p, x, z_star)), argnums=(0, 1))(p, x)
    assert rel_err(got, want) < 1e-10
    assert rel_err(got, dense_reference(p, x)) > 1e-3  # and it is not the implicit gradient


def test_phantom_approaches_implicit_as_steps_grow():
    p, x = problem(seed=6)
    solver = functools.partial(dq.solvers.anderson, tol=1e-12, max_steps=100)
    ref = dense_reference(p, x)
    errors = [
        rel_err(grad_fn(solver, dq.PhantomAdjoint(steps=s, tau=0.5))(p, x), ref)
        for s in (1, 4, 16, 64)
    ]
    assert all(a > b for a, b in zip(errors, errors[1:])), errors
    assert errors[-1] < 1e-8 and errors[0] > 1e-2


def test_forward_value_is_the_same_for_every_adjoint():
    p, x = problem(seed=7)
    solver = functools.partial(dq.solvers.anderson, tol=1e-10, max_steps=100)
    values = [
        dq.fixed_point(cell, p, x, jnp.zeros(D), solver=solver, adjoint=a)[0]
        for a in (
            dq.ImplicitAdjoint(),
            dq.PhantomAdjoint(),
            dq.OneStepAdjoint(),
            dq.UnrolledAdjoint(),
        )
    ]
    for v in values[1:]:
        np.testing.assert_allclose(v, values[0], atol=1e-12)


def test_pytree_params_input_and_state_and_integer_input_leaves():
    rng = np.random.default_rng(8)
    params = {
        "a": jnp.asarray(rng.normal(size=(3, 3)) * 0.2),
        "b": (jnp.asarray(rng.normal(size=2)),),
    }
    x = {"v": jnp.asarray(rng.normal(size=3)), "idx": jnp.array(1, jnp.int32)}

    def f(p, x, z):
        z1, z2 = z
        return (
            jnp.tanh(p["a"] @ z1 + x["v"] + jnp.sum(z2)),
            0.5 * jnp.sin(z2 * p["b"][0]) + x["v"][x["idx"]],
        )

    z0 = (jnp.zeros(3), jnp.zeros(2))
    solver = functools.partial(dq.solvers.broyden, tol=1e-13, max_steps=100, stop_mode="abs")

    def loss(p, x):
        z, _ = dq.fixed_point(f, p, x, z0, solver=solver)
        return jnp.sum(z[0] ** 2) + jnp.sum(jnp.cos(z[1]))

    g_imp = jax.jit(jax.grad(loss, argnums=(0, 1), allow_int=True))(params, x)
    unrolled = lambda p, x: loss_unrolled(p, x)  # noqa: E731

    def loss_unrolled(p, x):
        z, _ = dq.fixed_point(f, p, x, z0, solver=solver, adjoint=dq.UnrolledAdjoint())
        return jnp.sum(z[0] ** 2) + jnp.sum(jnp.cos(z[1]))

    g_unr = jax.jit(jax.grad(unrolled, argnums=(0, 1), allow_int=True))(params, x)
    assert rel_err(g_imp[0], g_unr[0]) < 1e-8
    assert rel_err(g_imp[1]["v"], g_unr[1]["v"]) < 1e-8


def test_closure_over_traced_value_raises_and_concrete_constant_is_fine():
    p, x = problem()
    w = p["W"]

    def loss(w):
        f = lambda params, x, z: jnp.tanh(w @ z + x)  # noqa: E731  (closes over a tracer)
        return jnp.sum(dq.fixed_point(f, None, x, jnp.zeros(D))[0])

    with pytest.raises(ValueError, match="closes over traced"):
        jax.grad(loss)(w)
    with pytest.raises(ValueError, match="closes over traced"):
        jax.jit(loss)(w)

    f_const = lambda params, x, z: jnp.tanh(w @ z + x + params)  # noqa: E731  (w is concrete)
    g = jax.grad(lambda b: jnp.sum(dq.fixed_point(f_const, b, x, jnp.zeros(D))[0]))(p["b"])
    assert bool(jnp.all(jnp.isfinite(g)))


def test_bad_arguments_raise():
    p, x = problem()
    with pytest.raises(ValueError, match="adjoint"):
        dq.fixed_point(cell, p, x, jnp.zeros(D), adjoint="implicit")
    with pytest.raises(ValueError, match="z0"):
        dq.fixed_point(cell, p, x, jnp.zeros(D, jnp.int32))
    with pytest.raises(ValueError, match="steps"):
        dq.PhantomAdjoint(steps=0)
    with pytest.raises(ValueError, match="tau"):
        dq.PhantomAdjoint(tau=1.5)
    with pytest.raises(ValueError, match="on_failure"):
        dq.ImplicitAdjoint(on_failure="zero")


def test_inside_scan_and_pmap():
    p, x = problem(seed=9)
    solver = functools.partial(dq.solvers.anderson, tol=1e-12, max_steps=100)
    ref = dense_reference(p, x)

    def loss(p, x):
        return loss_of_z(dq.fixed_point(cell, p, x, jnp.zeros(D), solver=solver)[0])

    def scanned(p, xs):
        def body(carry, x):
            return carry + loss(p, x), None

        return jax.lax.scan(body, jnp.zeros(()), xs)[0]

    g_scan = jax.jit(jax.grad(scanned))(p, jnp.stack([x, x]))
    assert rel_err(jax.tree_util.tree_map(lambda a: a / 2, g_scan), ref[0]) < 1e-7

    g_pmap = jax.pmap(jax.grad(loss), in_axes=(None, 0))(p, x[None])
    assert rel_err(jax.tree_util.tree_map(lambda a: a[0], g_pmap), ref[0]) < 1e-7


def _unstable_backward(dtype, gain):
    """z* = 0 is an exact fixed point of tanh(A z) but J = A has spectral radius `gain`."""
    q, _ = np.linalg.qr(np.random.default_rng(10).normal(size=(D, D)))
    params = jnp.asarray(gain * q, dtype)
    f = lambda a, x, z: jnp.tanh(a @ z + x)  # noqa: E731
    x = jnp.zeros(D, dtype)
    fwd = functools.partial(dq.solvers.anderson, tol=1e-6, max_steps=10)
    return f, params, x, fwd


@pytest.mark.parametrize(
    "dtype,gain,bwd_kwargs,status",
    [
        (jnp.float64, 3.0, {}, dq.solvers.DIVERGED),
        (jnp.float32, 50.0, {"divergence_factor": 1e30}, dq.solvers.NONFINITE),
    ],
)
def test_backward_failure_never_silently_zeroes_the_gradient(dtype, gain, bwd_kwargs, status):
    f, a, x, fwd = _unstable_backward(dtype, gain)
    # abs mode: a geometrically growing linear solve keeps a constant *relative* residual, so
    # divergence is only visible in absolute terms.
    bwd = functools.partial(
        dq.solvers.fixed_point_iteration, tol=1e-8, max_steps=200, stop_mode="abs", **bwd_kwargs
    )
    z0 = jnp.zeros(D, dtype)
    g = jnp.arange(1.0, D + 1.0).astype(dtype)
    # The diagnostics path confirms the backward solve fails in the way we intend.
    z_star = jax.jit(lambda z0: fwd(lambda z: f(a, x, z), z0).value)(z0)
    diag = jax.jit(lambda z: backward_solve(f, a, x, z, g, bwd).status)
    assert int(diag(z_star)) == status

    def grad_x(on_failure):
        # No fallback: the policy itself is under test (a GMRES fallback would solve it).
        adj = dq.ImplicitAdjoint(solver=bwd, fallback=None, on_failure=on_failure)
        loss = lambda x: jnp.vdot(g, dq.fixed_point(f, a, x, z0, solver=fwd, adjoint=adj)[0])  # noqa: E731
        return jax.jit(jax.grad(loss))(x)

    best, nan, one_step = grad_x("best"), grad_x("nan"), grad_x("one_step")
    assert bool(jnp.all(jnp.isfinite(best))) and float(jnp.linalg.norm(best)) > 0
    assert bool(jnp.all(jnp.isnan(nan)))
    # tanh'(0) = 1, so the Jacobian-free gradient wrt x is g itself.
    np.testing.assert_allclose(one_step, g, rtol=1e-6)


@pytest.mark.slow
def test_implicit_backward_memory_does_not_grow_with_forward_steps():
    d, batch = 32, 8
    rng = np.random.default_rng(11)
    p = {"W": jnp.asarray(rng.normal(size=(d, d)) * 0.3 / np.sqrt(d), jnp.float32)}
    x = jnp.asarray(rng.normal(size=(batch, d)), jnp.float32)
    f = lambda p, x, z: jnp.tanh(z @ p["W"].T + x)  # noqa: E731

    def temp_bytes(adjoint, steps):
        solver = functools.partial(dq.solvers.anderson, max_steps=steps, tol=0.0)

        def loss(p):
            z0 = jnp.zeros((batch, d), jnp.float32)
            return jnp.sum(dq.fixed_point(f, p, x, z0, solver=solver, adjoint=adjoint)[0] ** 2)

        compiled = jax.jit(jax.grad(loss)).lower(p).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    imp = [temp_bytes(dq.ImplicitAdjoint(), s) for s in (10, 160)]
    unr = [temp_bytes(dq.UnrolledAdjoint(), s) for s in (10, 160)]
    assert imp[1] <= imp[0] * 1.05, imp
    # Unrolled grows roughly linearly: 16x the steps costs at least 8x the memory.
    assert unr[1] >= 8 * unr[0], unr
    assert unr[1] > 10 * imp[1]
