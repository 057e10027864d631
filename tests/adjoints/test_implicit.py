"""ImplicitAdjoint: the implicit gradient (DEQ paper, Thm. 1), its backward solve, fallback and
failure policy, and the normalisation of its solvers."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import deqjax as dq
from deqjax._src.adjoints import backward_solve
from tests.helpers.dense_ift import (
    FPI_4000,
    THETA,
    contractive_problem,
    cos_cell,
    dense_reference,
    flip_problem,
    loss_of_z,
    rel_err,
    tanh_cell,
    tanh_grad,
)

SOLVERS = {
    "fpi": dq.solvers.fixed_point_iteration,
    "anderson": dq.solvers.anderson,
    "broyden": dq.solvers.broyden,
}
KRYLOV = {
    "gmres": dq.solvers.gmres,
    "bicgstab": dq.solvers.bicgstab,
    "normal_cg": dq.solvers.normal_cg,
}


# --- the exact gradient on a contractive tanh layer ---------------------------------------------


@pytest.mark.parametrize("fwd", list(SOLVERS))
@pytest.mark.parametrize("bwd", list(SOLVERS))
def test_implicit_gradient_matches_dense_solve(fwd, bwd):
    p, x = contractive_problem()
    solver = functools.partial(SOLVERS[fwd], tol=1e-13, max_steps=300, stop_mode="abs")
    backward = functools.partial(SOLVERS[bwd], tol=1e-13, max_steps=300, stop_mode="abs")
    got = tanh_grad(solver, dq.ImplicitAdjoint(solver=backward))(p, x)
    assert rel_err(got, dense_reference(p, x)) <= 1e-7


def test_check_grads_reverse_mode():
    p, x = contractive_problem(seed=1)
    solver = functools.partial(dq.solvers.anderson, tol=1e-13, max_steps=200, stop_mode="abs")

    def f(w, b, x):
        z, _ = dq.fixed_point(tanh_cell, {"W": w, "b": b}, x, jnp.zeros(5), solver=solver)
        return loss_of_z(z)

    check_grads(f, (p["W"], p["b"], x), order=1, modes=["rev"], atol=1e-6, rtol=1e-6)


# --- z = cos(z) + θ, θ = [0, π/2], fixed-point iteration forward: FPI cannot solve the backward ---


def cos_jacobian(adjoint, dtype=jnp.float64):
    theta = THETA.astype(dtype)

    def z_of(t):
        return dq.fixed_point(
            cos_cell, t, None, jnp.zeros(2, dtype), solver=FPI_4000, adjoint=adjoint
        )[0]

    z = jax.jit(z_of)(theta)
    return jax.jit(jax.jacobian(z_of))(theta), z


def dense_cos_jacobian(z):
    """dz*/dθ = (I − J)⁻¹ ∂f/∂θ = (I + diag(sin z))⁻¹ at the returned z (float64 dense solve)."""
    jac = jax.jacobian(lambda z: cos_cell(THETA, None, z))(z.astype(jnp.float64))
    return jnp.linalg.solve(jnp.eye(2) - jac, jnp.eye(2))


@pytest.mark.parametrize("dtype,rtol", [(jnp.float64, 1e-6), (jnp.float32, 2e-4)])
def test_cos_theta_default_adjoint_gives_the_implicit_gradient(dtype, rtol):
    got, z = cos_jacobian(dq.ImplicitAdjoint(), dtype)
    want = dense_cos_jacobian(z)
    # dz2/dθ2 = 1 / (1 + sin z2) ≈ 0.50009 (0.38820 without a fallback).
    np.testing.assert_allclose(got[1, 1], 1.0 / (1.0 + np.sin(float(z[1]))), rtol=rtol)
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=rtol, atol=1e-6)
    assert abs(float(got[1, 1]) - 0.50009) < 1e-4


def test_cos_theta_without_fallback_is_the_wrong_gradient_but_counted():
    got, _ = cos_jacobian(dq.ImplicitAdjoint(fallback=None))
    assert abs(float(got[1, 1]) - 0.50009) > 0.05  # fixed-point iteration cannot solve it

    def loss(theta, probe):
        z, _ = dq.fixed_point(
            cos_cell,
            theta,
            None,
            jnp.zeros(2),
            solver=FPI_4000,
            adjoint=dq.ImplicitAdjoint(fallback=None),
            backward_stats=probe,
        )
        return z[1]

    _, stats = jax.jit(jax.grad(loss, argnums=(0, 1)))(THETA, dq.BackwardStats.zeros())
    assert float(stats.count) == 1 and float(stats.failures) == 1 and float(stats.fallbacks) == 0
    assert float(stats.rel_residual) > 0.1 and float(stats.num_steps) == 4000


def test_backward_stats_report_the_fallback_under_jit():
    def loss(theta, probe):
        z, _ = dq.fixed_point(
            cos_cell, theta, None, jnp.zeros(2), solver=FPI_4000, backward_stats=probe
        )
        return z[1]

    g, stats = jax.jit(jax.grad(loss, argnums=(0, 1)))(THETA, dq.BackwardStats.zeros())
    assert float(stats.count) == 1
    assert float(stats.fallbacks) == 1 and float(stats.failures) == 0
    assert float(stats.num_steps) > 4000  # the failed first solve plus GMRES
    assert float(stats.rel_residual) <= 1e-6
    metrics = stats.metrics()
    assert set(metrics) == {
        "bwd_steps",
        "bwd_rel_residual",
        "bwd_failure_rate",
        "bwd_fallback_rate",
    }
    assert float(metrics["bwd_fallback_rate"]) == 1.0
    np.testing.assert_allclose(g[1], 1.0 / (1.0 + np.sin(1.5434252)), rtol=1e-4)


# --- a tanh layer whose Jacobian has an eigenvalue near −1 -----------------------------------

D = 6
FWD = functools.partial(dq.solvers.broyden, tol=1e-13, max_steps=200, stop_mode="abs")
SHORT_FPI = functools.partial(
    dq.solvers.fixed_point_iteration, tol=1e-10, max_steps=30, stop_mode="abs"
)


def grads(adjoint, p, x):
    def loss(p, x):
        z, _ = dq.fixed_point(tanh_cell, p, x, jnp.zeros(D), solver=FWD, adjoint=adjoint)
        return loss_of_z(z)

    return jax.jit(jax.grad(loss, argnums=(0, 1)))(p, x)


def test_fallback_rescues_a_failing_fixed_point_backward():
    p, x = flip_problem()
    ref = dense_reference(p, x, FWD)
    assert rel_err(grads(dq.ImplicitAdjoint(solver=SHORT_FPI, fallback=None), p, x), ref) > 1e-2
    assert rel_err(grads(dq.ImplicitAdjoint(solver=SHORT_FPI), p, x), ref) < 1e-8


@pytest.mark.slow
def test_fallback_gradient_passes_check_grads():
    p, x = flip_problem(seed=1)

    def f(w, b, x):
        adjoint = dq.ImplicitAdjoint(solver=SHORT_FPI)
        z, _ = dq.fixed_point(
            tanh_cell, {"W": w, "b": b}, x, jnp.zeros(D), solver=FWD, adjoint=adjoint
        )
        return loss_of_z(z)

    check_grads(f, (p["W"], p["b"], x), order=1, modes=["rev"], atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("name", list(KRYLOV))
def test_krylov_backward_solvers_match_the_dense_implicit_gradient(name):
    p, x = flip_problem(seed=2)
    bwd = functools.partial(KRYLOV[name], tol=1e-12, max_steps=400, stop_mode="abs")
    got = grads(dq.ImplicitAdjoint(solver=bwd, fallback=None), p, x)
    assert rel_err(got, dense_reference(p, x, FWD)) < 1e-8


def test_on_failure_applies_when_the_fallback_fails_too():
    p, x = flip_problem(seed=3)
    tiny = functools.partial(dq.solvers.gmres, max_steps=5, tol=1e-12, restart=1)

    def run(on_failure):
        adjoint = dq.ImplicitAdjoint(solver=SHORT_FPI, fallback=tiny, on_failure=on_failure)

        def loss(p, probe):
            z, _ = dq.fixed_point(
                tanh_cell, p, x, jnp.zeros(D), solver=FWD, adjoint=adjoint, backward_stats=probe
            )
            return loss_of_z(z)

        return jax.jit(jax.grad(loss, argnums=(0, 1)))(p, dq.BackwardStats.zeros())

    (g_best, stats), (g_nan, _) = run("best"), run("nan")
    assert float(stats.failures) == 1 and float(stats.fallbacks) == 1
    assert bool(jnp.all(jnp.isfinite(g_best["W"]))) and bool(jnp.all(jnp.isnan(g_nan["W"])))


# --- on_failure without a fallback: a backward that diverges ------------------------------------


def _unstable_backward(dtype, gain, d=5):
    """z* = 0 is an exact fixed point of tanh(A z) but J = A has spectral radius `gain`."""
    q, _ = np.linalg.qr(np.random.default_rng(10).normal(size=(d, d)))
    params = jnp.asarray(gain * q, dtype)
    f = lambda a, x, z: jnp.tanh(a @ z + x)  # noqa: E731
    x = jnp.zeros(d, dtype)
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
    bwd = dq.solvers.FixedPointIteration(tol=1e-8, max_steps=200, stop_mode="abs", **bwd_kwargs)
    z0 = jnp.zeros(5, dtype)
    g = jnp.arange(1.0, 6.0).astype(dtype)
    # The diagnostics path confirms the backward solve fails in the way we intend.
    z_star = jax.jit(lambda z0: fwd(lambda z: f(a, x, z), z0).value)(z0)
    diag = jax.jit(lambda z: backward_solve.first_solve(f, a, x, z, g, bwd).status)
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


# --- when the fallback runs -------------------------------------------------------------------


def test_fallback_skips_a_solve_that_ends_just_short_of_tol():
    # u = g + 0.9 u by fixed-point iteration: after 30 steps the relative residual is ~4e-3, above
    # tol = 1e-3 but within fallback_factor = 10 of it. Such a solve is kept (counted as not
    # converged); with fallback_factor = 1 GMRES redoes it. A stalled solve (8 steps, ~4e-2) falls
    # back under the default factor too.
    def cell(p, x, z):
        return p * z + x

    x = jnp.ones(6, jnp.float64)

    def stats_for(max_steps, factor):
        backward = functools.partial(
            dq.solvers.fixed_point_iteration, max_steps=max_steps, tol=1e-3
        )
        adjoint = dq.ImplicitAdjoint(solver=backward, fallback_factor=factor)

        def loss(p, probe):
            z, _ = dq.fixed_point(
                cell,
                p,
                x,
                jnp.zeros(6, jnp.float64),
                solver=functools.partial(dq.solvers.anderson, tol=1e-10, max_steps=50),
                adjoint=adjoint,
                backward_stats=probe,
            )
            return jnp.sum(z)

        g, stats = jax.grad(loss, argnums=(0, 1))(jnp.float64(0.9), dq.BackwardStats.zeros())
        return float(g), stats

    exact = 6.0 / (1 - 0.9) ** 2  # d/dp of sum(x / (1 - p))
    g, stats = stats_for(30, 10.0)
    assert float(stats.fallbacks) == 0 and float(stats.failures) == 1
    assert 1e-3 < float(stats.rel_residual) <= 1e-2
    assert g == pytest.approx(exact, rel=0.1)  # within the residual's reach
    g, stats = stats_for(30, 1.0)
    assert float(stats.fallbacks) == 1 and float(stats.failures) == 0
    assert g == pytest.approx(exact, rel=1e-2)
    _, stats = stats_for(8, 10.0)
    assert float(stats.fallbacks) == 1 and float(stats.failures) == 0
    with pytest.raises(ValueError, match="fallback_factor"):
        dq.ImplicitAdjoint(fallback_factor=0.5)


def test_fallback_skips_a_backward_no_worse_than_an_unconverged_forward():
    # Forward stopped at its cap (rel. residual ~3e-2): a backward at its cap that ends closer to
    # its solution (~1e-2) is not the weak link and is kept; the same backward after a converged
    # forward falls back.
    def cell(p, x, z):
        return p * z + x

    x = jnp.ones(6, jnp.float64)
    backward = functools.partial(dq.solvers.fixed_point_iteration, max_steps=40, tol=1e-6)

    def stats_for(forward_steps):
        def loss(p, probe):
            z, sol = dq.fixed_point(
                cell,
                p,
                x,
                jnp.zeros(6, jnp.float64),
                solver=functools.partial(
                    dq.solvers.fixed_point_iteration, max_steps=forward_steps, tol=1e-12
                ),
                adjoint=dq.ImplicitAdjoint(solver=backward),
                backward_stats=probe,
            )
            return jnp.sum(z), sol

        (_, stats), sol = jax.grad(loss, argnums=(0, 1), has_aux=True)(
            jnp.float64(0.9), dq.BackwardStats.zeros()
        )
        return sol, stats

    sol, stats = stats_for(30)
    assert int(sol.status) == dq.solvers.MAX_STEPS
    assert float(stats.rel_residual) < float(sol.rel_residual)
    assert float(stats.rel_residual) > 10 * 1e-6
    assert float(stats.fallbacks) == 0
    sol, stats = stats_for(400)
    assert int(sol.status) == dq.solvers.CONVERGED
    assert float(stats.fallbacks) == 1 and float(stats.failures) == 0


def test_default_fallback_inherits_the_backward_tolerance():
    bwd = functools.partial(
        dq.solvers.fixed_point_iteration, stop_mode="mixed", tol=1e-9, atol=1e-11, max_steps=7
    )
    fb = dq.ImplicitAdjoint(solver=bwd).backward_config(dq.solvers.Broyden()).fallback
    assert fb == dq.solvers.GMRES(tol=1e-9, stop_mode="mixed", atol=1e-11, max_steps=24)
    config = dq.ImplicitAdjoint().backward_config(dq.solvers.Anderson(tol=1e-7, max_steps=20))
    assert config.fallback == dq.solvers.GMRES(tol=1e-7, max_steps=40)
    assert config.fallback_above == pytest.approx(1e-6)


# --- configuration: normalised solvers, explicit batch axes, errors -----------------------------


def test_solvers_are_normalised_so_equal_configurations_compare_and_hash_equal():
    as_partial = dq.ImplicitAdjoint(solver=functools.partial(dq.solvers.gmres, tol=1e-6))
    as_object = dq.ImplicitAdjoint(solver=dq.solvers.GMRES(tol=1e-6))
    assert as_partial == as_object and hash(as_partial) == hash(as_object)
    assert as_partial.solver == dq.solvers.GMRES(tol=1e-6)
    fb = dq.ImplicitAdjoint(fallback=functools.partial(dq.solvers.bicgstab, tol=1e-3))
    assert fb == dq.ImplicitAdjoint(fallback=dq.solvers.BiCGStab(tol=1e-3))
    assert dq.ImplicitAdjoint(fallback="gmres").fallback == "gmres"
    assert dq.ImplicitAdjoint() != dq.ImplicitAdjoint(on_failure="nan")


def test_backward_config_carries_the_forward_batch_axes():
    forward = dq.solvers.Anderson(batch_ndim=1, tol=1e-6)
    config = dq.ImplicitAdjoint(solver=dq.solvers.Broyden(max_steps=9)).backward_config(forward)
    assert config.batch_ndim == 1 and config.solver == dq.solvers.Broyden(max_steps=9, batch_ndim=1)
    assert config.fallback == dq.solvers.GMRES(max_steps=24, batch_ndim=1)
    # A backward solver that is not batch-native solves the batch as one problem.
    own = dq.ImplicitAdjoint(solver=lambda f, u0: dq.solvers.anderson(f, u0))
    assert own.backward_config(forward).batch_ndim == 0
    assert own.backward_config(forward).fallback.batch_ndim == 0
    assert own.backward_config(forward).fallback_above == 0.0  # no declared tol


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="on_failure"):
        dq.ImplicitAdjoint(on_failure="zero")
    with pytest.raises(ValueError, match="fallback"):
        dq.ImplicitAdjoint(fallback="lu")
    with pytest.raises(ValueError, match="solver"):
        dq.ImplicitAdjoint(solver=3)


def test_bad_fallback_and_probe_arguments():
    with pytest.raises(ValueError, match="fallback"):
        dq.ImplicitAdjoint(fallback="lu")
    with pytest.raises(ValueError, match="backward_stats"):
        dq.fixed_point(cos_cell, THETA, None, jnp.zeros(2), backward_stats={"count": 0.0})


# --- memory ---------------------------------------------------------------------------------------


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
    unr = [temp_bytes(dq.UnrolledAdjoint(accelerated=True), s) for s in (10, 160)]
    # Only the [batch, max_steps] float32 residual trace grows (4 bytes a step and example; x2
    # for a copy): no state is kept per step.
    assert imp[1] - imp[0] <= 2 * 150 * batch * 4, imp
    # Unrolled grows roughly linearly: 16x the steps costs at least 8x the memory.
    assert unr[1] >= 8 * unr[0], unr
    assert unr[1] > 10 * imp[1]
