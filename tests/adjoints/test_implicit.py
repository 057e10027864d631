"""The implicit backward solve, reported and robust (issue 14 item 1), has_aux, z0 errors."""

import functools

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.test_util import check_grads

import deqjax as dq
from deqjax import jacobian

KRYLOV = {
    "gmres": dq.solvers.gmres,
    "bicgstab": dq.solvers.bicgstab,
    "normal_cg": dq.solvers.normal_cg,
}


# --- the problem: z = cos(z) + θ, θ = [0, π/2], fixed-point iteration forward ----------


def cos_cell(theta, x, z):
    del x
    return jnp.cos(z) + theta


THETA = jnp.array([0.0, np.pi / 2])
FPI_4000 = functools.partial(dq.solvers.fixed_point_iteration, max_steps=4000, tol=1e-6)


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
    # dz2/dθ2 = 1 / (1 + sin z2) ≈ 0.50009 (the issue: 0.38820 before the fix).
    np.testing.assert_allclose(got[1, 1], 1.0 / (1.0 + np.sin(float(z[1]))), rtol=rtol)
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=rtol, atol=1e-6)
    assert abs(float(got[1, 1]) - 0.50009) < 1e-4


def test_cos_theta_without_fallback_is_the_old_wrong_gradient_but_counted():
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


def tanh_cell(p, x, z):
    return jnp.tanh(p["W"] @ z + p["b"] + x)


def flip_problem(seed=0, lam=-0.97):
    """W = Q diag(lam, small...) Qᵀ: J = diag(tanh') W has an eigenvalue near lam ≈ −1."""
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.normal(size=(D, D)))
    eig = np.concatenate([[lam], rng.uniform(-0.3, 0.3, size=D - 1)])
    w = (q * eig) @ q.T
    p = {"W": jnp.asarray(w), "b": jnp.asarray(0.05 * rng.normal(size=D))}
    return p, jnp.asarray(0.05 * rng.normal(size=D))


def loss_of_z(z):
    return jnp.sum(jnp.sin(z)) + 0.5 * jnp.sum(z**2)


FWD = functools.partial(dq.solvers.broyden, tol=1e-13, max_steps=200, stop_mode="abs")
SHORT_FPI = functools.partial(
    dq.solvers.fixed_point_iteration, tol=1e-10, max_steps=30, stop_mode="abs"
)


def dense_reference(p, x):
    z = FWD(lambda z: tanh_cell(p, x, z), jnp.zeros(D)).value
    jac = jax.jacobian(lambda z: tanh_cell(p, x, z))(z)
    u = jnp.linalg.solve((jnp.eye(D) - jac).T, jax.grad(loss_of_z)(z))
    _, vjp = jax.vjp(lambda p, x: tanh_cell(p, x, z), p, x)
    return vjp(u)


def rel_err(a, b):
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    num = max(float(jnp.max(jnp.abs(u - v))) for u, v in zip(la, lb))
    return num / max(float(jnp.max(jnp.abs(v))) for v in lb)


def grads(adjoint, p, x):
    def loss(p, x):
        z, _ = dq.fixed_point(tanh_cell, p, x, jnp.zeros(D), solver=FWD, adjoint=adjoint)
        return loss_of_z(z)

    return jax.jit(jax.grad(loss, argnums=(0, 1)))(p, x)


def test_fallback_rescues_a_failing_fixed_point_backward():
    p, x = flip_problem()
    ref = dense_reference(p, x)
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
    assert rel_err(got, dense_reference(p, x)) < 1e-8


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


# --- the Krylov solvers themselves ------------------------------------------------------------


def affine_problem(seed=0, d=12, radius=0.95, batch=None):
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(d, d))
    a *= radius / np.max(np.abs(np.linalg.eigvals(a)))
    shape = (d,) if batch is None else (batch, d)
    return jnp.asarray(a), jnp.asarray(rng.normal(size=shape))


@pytest.mark.parametrize("name", list(KRYLOV))
def test_krylov_solution_statistics(name):
    a, g = affine_problem()

    def h(u):
        return g + a.T @ u

    sol = jax.jit(lambda u0: KRYLOV[name](h, u0, tol=1e-10, max_steps=600))(jnp.zeros(12))
    want = np.linalg.solve(np.eye(12) - np.asarray(a).T, np.asarray(g))
    np.testing.assert_allclose(sol.value, want, rtol=1e-6)  # cond(I - A) ~ 1e2
    assert int(sol.status) == dq.solvers.CONVERGED and 2 < int(sol.num_steps) <= 600
    # The residual is the true one, measured after the solve.
    r = h(sol.value) - sol.value
    np.testing.assert_allclose(sol.abs_residual, jnp.linalg.norm(r), rtol=1e-6)
    assert float(sol.rel_residual) <= 1e-10
    np.testing.assert_allclose(sol.f_value, h(sol.value), rtol=1e-12)  # f at the returned iterate
    assert sol.trace.shape == (600,) and bool(jnp.isinf(sol.trace[int(sol.num_steps) :]).all())
    # A budget too small: MAX_STEPS with its best (finite) iterate, never worse than the start.
    short = KRYLOV[name](h, g, tol=1e-14, max_steps=8, stop_mode="abs")
    assert int(short.status) == dq.solvers.MAX_STEPS
    assert float(short.abs_residual) <= float(jnp.linalg.norm(h(g) - g))
    # A start that already solves it costs no Krylov work.
    done = KRYLOV[name](h, jnp.asarray(want), tol=1e-8)
    assert int(done.status) == dq.solvers.CONVERGED and int(done.num_steps) == 2


def test_krylov_nonfinite_status():
    a, g = affine_problem()
    sol = dq.solvers.gmres(lambda u: g * jnp.nan + a.T @ u, jnp.zeros(12))
    assert int(sol.status) == dq.solvers.NONFINITE


@pytest.mark.parametrize("name", list(KRYLOV))
def test_krylov_batch_ndim_has_per_problem_statistics(name):
    a, g = affine_problem(batch=4)
    g = g * jnp.array([1e-3, 1.0, 10.0, 0.0])[:, None]  # the last one is solved by u = 0

    def h(u):
        return g + u @ a

    sol = KRYLOV[name](h, jnp.zeros((4, 12)), tol=1e-9, max_steps=600, batch_ndim=1)
    assert sol.status.shape == (4,) and sol.trace.shape == (4, 600)
    assert bool(jnp.all(sol.status == dq.solvers.CONVERGED))
    want = np.linalg.solve(np.eye(12) - np.asarray(a).T, np.asarray(g).T).T
    np.testing.assert_allclose(sol.value, want, rtol=1e-7, atol=1e-10)
    assert bool(jnp.all(sol.rel_residual[:3] <= 1e-9))


def test_krylov_bad_arguments():
    with pytest.raises(ValueError, match="restart"):
        dq.solvers.gmres(lambda u: u, jnp.zeros(3), restart=0)
    with pytest.raises(ValueError, match="batch_ndim"):
        dq.solvers.bicgstab(lambda u: u, jnp.zeros(3), batch_ndim=2)
    with pytest.raises(ValueError, match="fallback"):
        dq.ImplicitAdjoint(fallback="lu")
    with pytest.raises(ValueError, match="backward_stats"):
        dq.fixed_point(cos_cell, THETA, None, jnp.zeros(2), backward_stats={"count": 0.0})


# --- the gradient channel under vmap, scan and pmap --------------------------------------------


@pytest.mark.slow
def test_backward_stats_sum_over_vmap_and_scan_and_match_per_example():
    p, _ = flip_problem(seed=4, lam=-0.9)
    xs = (
        jnp.asarray(np.random.default_rng(5).normal(size=(5, D)))
        * jnp.array([0.01, 0.1, 1.0, 3.0, 10.0])[:, None]
    )
    adjoint = dq.ImplicitAdjoint(solver=SHORT_FPI)

    def loss(p, x, probe):
        z, _ = dq.fixed_point(
            tanh_cell, p, x, jnp.zeros(D), solver=FWD, adjoint=adjoint, backward_stats=probe
        )
        return loss_of_z(z)

    def batch_loss(p, probe):
        return jnp.sum(jax.vmap(loss, in_axes=(None, 0, None))(p, xs, probe))

    probe = dq.BackwardStats.zeros()
    g_b, stats_b = jax.jit(jax.grad(batch_loss, argnums=(0, 1)))(p, probe)
    singles = [jax.jit(jax.grad(loss, argnums=(0, 2)))(p, xs[i], probe) for i in range(5)]
    assert float(stats_b.count) == 5
    for field in dq.BackwardStats._fields:
        total = sum(float(getattr(s, field)) for _, s in singles)
        np.testing.assert_allclose(float(getattr(stats_b, field)), total, rtol=1e-5, atol=1e-9)
    g_sum = jax.tree_util.tree_map(lambda *a: sum(a), *[g for g, _ in singles])
    assert rel_err(g_b, g_sum) < 1e-10

    def scanned(p, probe):
        return jax.lax.scan(lambda c, x: (c + loss(p, x, probe), None), 0.0, xs)[0]

    _, stats_s = jax.jit(jax.grad(scanned, argnums=(0, 1)))(p, probe)
    assert float(stats_s.count) == 5
    np.testing.assert_allclose(float(stats_s.num_steps), float(stats_b.num_steps))

    # Other gradient strategies run no backward solve: zeros.
    def phantom(p, probe):
        z, _ = dq.fixed_point(
            tanh_cell,
            p,
            xs[0],
            jnp.zeros(D),
            solver=FWD,
            adjoint=dq.PhantomAdjoint(),
            backward_stats=probe,
        )
        return loss_of_z(z)

    _, stats_p = jax.grad(phantom, argnums=(0, 1))(p, probe)
    assert all(float(v) == 0.0 for v in stats_p)


def test_backward_stats_do_not_change_the_gradient_and_probe_dtype_is_kept():
    p, x = flip_problem(seed=6)

    def loss(p, probe):
        kw = {} if probe is None else {"backward_stats": probe}
        z, _ = dq.fixed_point(tanh_cell, p, x, jnp.zeros(D), solver=FWD, **kw)
        return loss_of_z(z)

    g0 = jax.grad(loss)(p, None)
    g1, stats = jax.grad(loss, argnums=(0, 1))(p, dq.BackwardStats.zeros(jnp.float64))
    assert rel_err(g1, g0) == 0.0
    assert stats.count.dtype == jnp.float64


def test_deq_module_backward_stats_probe():
    d, dx, b = 4, 3, 5

    def forward(x, probe):
        cell = lambda z, x: jnp.tanh(hk.Linear(d, name="w")(z) + hk.Linear(d, name="u")(x))  # noqa: E731
        deq = dq.nn.DEQ(
            cell,
            solver=functools.partial(dq.solvers.anderson, tol=1e-10),
            init_state=lambda x: jnp.zeros((x.shape[0], d), x.dtype),
        )
        z, _ = deq(x, backward_stats=probe)
        return jnp.sum(z**2)

    t = hk.without_apply_rng(hk.transform(forward))
    x = jax.random.normal(jax.random.PRNGKey(0), (b, dx), jnp.float64)
    probe = dq.BackwardStats.zeros()
    params = t.init(jax.random.PRNGKey(1), x, probe)
    _, stats = jax.jit(jax.grad(t.apply, argnums=(0, 2)))(params, x, probe)
    assert float(stats.count) == b and float(stats.failures) == 0
    assert float(stats.num_steps) >= b


def test_backward_convergence_monitor_runs_the_same_fallback():
    z = jnp.array([0.7390851, 1.5434252])
    g = jnp.array([0.0, 1.0])
    plain = jacobian.backward_convergence(cos_cell, THETA, None, z, g, solver=FPI_4000)
    assert int(plain.status) == dq.solvers.MAX_STEPS
    sol = jacobian.backward_convergence(
        cos_cell, THETA, None, z, g, solver=FPI_4000, fallback="gmres"
    )
    assert int(sol.status) == dq.solvers.CONVERGED and int(sol.num_steps) > 4000
    np.testing.assert_allclose(sol.value[1], 1.0 / (1.0 + np.sin(1.5434252)), rtol=1e-5)


# --- has_aux (issue 14) and the wrong-z0 error (issue 13 item 5) -------------------------------


def test_has_aux_returns_aux_at_the_solution_under_jit_and_grad():
    p, x = flip_problem(seed=7, lam=0.5)

    def f_aux(p, x, z):
        pre = p["W"] @ z + p["b"] + x
        return jnp.tanh(pre), {"pre": pre, "energy": jnp.sum(pre**2)}

    def loss(p, x):
        (z, aux), sol = dq.fixed_point(f_aux, p, x, jnp.zeros(D), solver=FWD, has_aux=True)
        return loss_of_z(z) + aux["energy"], (z, aux, sol)

    (val, (z, aux, sol)), g = jax.jit(jax.value_and_grad(loss, has_aux=True))(p, x)
    np.testing.assert_allclose(aux["pre"], p["W"] @ z + p["b"] + x, rtol=1e-12)
    np.testing.assert_allclose(z, jnp.tanh(aux["pre"]), atol=1e-12)
    assert int(sol.status) == dq.solvers.CONVERGED

    # Against the same loss written without aux: recompute pre from z* by hand.
    def loss_plain(p, x):
        z, _ = dq.fixed_point(tanh_cell, p, x, jnp.zeros(D), solver=FWD)
        return loss_of_z(z) + jnp.sum((p["W"] @ z + p["b"] + x) ** 2)

    g_plain = jax.jit(jax.grad(loss_plain))(p, x)
    assert rel_err(g, g_plain) < 1e-10
    with pytest.raises(ValueError, match="has_aux"):
        dq.fixed_point(tanh_cell, p, x, jnp.zeros(D), has_aux=True)


def test_wrong_z0_shape_names_z0_and_x_shapes():
    p, x = flip_problem()
    with pytest.raises(ValueError, match=r"z0 of shape float64\[4\].*x of shape float64\[6\]") as e:
        dq.fixed_point(tanh_cell, p, x, jnp.zeros(4))
    assert e.value.__cause__ is not None  # the original error is chained
    with pytest.raises(ValueError, match="z0 of shape"):
        jax.jit(lambda p: dq.fixed_point(tanh_cell, p, x, jnp.zeros((2, 4)))[0])(p)
    # f runs but returns another shape: named too.
    with pytest.raises(ValueError, match=r"z0 has shape float64\[1\]"):
        dq.fixed_point(lambda p, x, z: jnp.tanh(p["W"] @ x + z), p, x, jnp.zeros(1))


def test_krylov_mixed_stop_mode_and_inherited_fallback_tolerance():
    a, g = affine_problem(seed=1)
    sol = dq.solvers.gmres(
        lambda u: g + a.T @ u, jnp.zeros(12), stop_mode="mixed", tol=1e-9, atol=1e-10, max_steps=400
    )
    assert int(sol.status) == dq.solvers.CONVERGED
    assert float(sol.abs_residual) <= 1e-10 + 1e-9 * float(jnp.linalg.norm(sol.value))
    bwd = functools.partial(
        dq.solvers.fixed_point_iteration, stop_mode="mixed", tol=1e-9, atol=1e-11, max_steps=7
    )
    fb = dq.ImplicitAdjoint(solver=bwd).backward_config(FWD).fallback
    assert fb.keywords == {"tol": 1e-9, "stop_mode": "mixed", "atol": 1e-11, "max_steps": 24}


def test_train_step_logs_backward_stats():
    from deqjax import training

    p, _ = flip_problem(seed=8)
    xs = jnp.asarray(np.random.default_rng(9).normal(size=(4, D)))
    adjoint = dq.ImplicitAdjoint(solver=SHORT_FPI)

    def loss_fn(params, batch, key, reg_state, step, probe):
        def one(x):
            z, _ = dq.fixed_point(
                tanh_cell,
                params,
                x,
                jnp.zeros(D),
                solver=FWD,
                adjoint=adjoint,
                backward_stats=probe,
            )
            return loss_of_z(z)

        return jnp.mean(jax.vmap(one)(batch)), {}

    opt = optax.sgd(1e-3)
    devices = jax.local_devices()[:1]
    pair = training.train_step(loss_fn, opt, backward_stats=True)
    step_fn = jax.pmap(pair.update, axis_name="batch", devices=devices)
    state = training.replicate(pair.init(p, jax.random.PRNGKey(0)), devices)
    _, metrics = step_fn(state, training.shard(xs, devices))
    m = training.unreplicate(metrics)
    assert {"bwd_steps", "bwd_rel_residual", "bwd_failure_rate", "bwd_fallback_rate"} <= set(m)
    assert float(m["bwd_fallback_rate"]) > 0.0 and float(m["bwd_failure_rate"]) == 0.0
    assert float(m["bwd_steps"]) > 30 and float(m["bwd_rel_residual"]) < 1e-9


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
