"""SHINE (dq.ShineAdjoint): the backward from Broyden's forward inverse estimate."""

import functools

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import deqjax as dq
from deqjax._src.solvers import broyden_inverse as broyden_lib

D = 12
BROYDEN = functools.partial(dq.solvers.broyden, max_steps=40, tol=1e-12)


def problem(seed=0, radius=0.7):
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(seed), 3)
    w = np.array(jax.random.normal(k1, (D, D), jnp.float64))
    w *= radius / np.max(np.abs(np.linalg.eigvals(w)))
    params = {"W": jnp.asarray(w), "U": jax.random.normal(k2, (D, D), jnp.float64) / np.sqrt(D)}
    x = jax.random.normal(k3, (D,), jnp.float64)
    return params, x


def cell(p, x, z):  # z, x: [D] or a batch [B, D] (rows independent)
    return jnp.tanh(z @ p["W"].T + x @ p["U"].T)


def head(z):
    return jnp.sum(jnp.sin(z) * jnp.linspace(1.0, 2.0, D))


def loss(p, x, adjoint, solver=BROYDEN, probe=None):
    z, _ = dq.fixed_point(
        cell, p, x, jnp.zeros(D), solver=solver, adjoint=adjoint, backward_stats=probe
    )
    return head(z)


def dense_implicit_grad(p, x):
    """The exact implicit gradient in float64: z* to 1e-15, a dense solve with (I - J)^T."""
    z = dq.solvers.broyden(lambda z: cell(p, x, z), jnp.zeros(D), max_steps=100, tol=1e-15).value
    jac = jax.jacobian(lambda z: cell(p, x, z))(z)
    u = jnp.linalg.solve((jnp.eye(D) - jac).T, jax.grad(head)(z))
    _, vjp = jax.vjp(lambda p, x: cell(p, x, z), p, x)
    return vjp(u)


def rel_err(a, b):
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    num = sum(float(jnp.sum((u - v) ** 2)) for u, v in zip(la, lb))
    return float(np.sqrt(num / sum(float(jnp.sum(v**2)) for v in lb)))


def shine_grad(p, x, k, **kw):
    adjoint = dq.ShineAdjoint(refine_steps=k, **kw)
    return jax.jit(jax.grad(loss, argnums=(0, 1)), static_argnums=2)(p, x, adjoint)


def test_gradient_error_decreases_with_refinement_steps_to_the_dense_implicit_gradient():
    params, x = problem()
    exact = dense_implicit_grad(params, x)
    errors = {k: rel_err(shine_grad(params, x, k, fallback=None), exact) for k in (0, 2, 8, 60)}
    print("SHINE relative gradient error vs refinement steps:", errors)
    assert errors[0] > 1e-3  # the plain estimate is an approximation (else nothing is tested)
    assert errors[0] > errors[2] > errors[8] > errors[60]
    assert errors[60] < 1e-9  # k large: the implicit gradient


def test_plain_shine_is_minus_the_transposed_broyden_inverse_applied_to_the_cotangent():
    params, x = problem(seed=1)
    sol = BROYDEN(lambda z: cell(params, x, z), jnp.zeros(D), return_inverse=True)
    assert isinstance(sol.inverse_estimate, dq.solvers.BroydenInverse)
    # Dense B ≈ J_g^{-1} (g = f - I) from its matvec; the adjoint is u = -B^T ∂ℓ/∂z*.
    b = jnp.stack([broyden_lib.inverse_matvec(sol.inverse_estimate, e) for e in jnp.eye(D)], 1)
    bt_e = jnp.stack([broyden_lib.inverse_rmatvec(sol.inverse_estimate, e) for e in jnp.eye(D)])
    np.testing.assert_allclose(bt_e, b, rtol=1e-12, atol=1e-12)  # rmatvec is the transpose
    u = -b.T @ jax.grad(head)(sol.value)
    _, vjp = jax.vjp(lambda p, x: cell(p, x, sol.value), params, x)
    want = vjp(u)
    got = shine_grad(params, x, 0, fallback=None)
    assert rel_err(got, want) < 1e-10
    flipped = vjp(-u)
    assert rel_err(got, flipped) > 1.0


def test_fallback_runs_where_the_estimate_is_poor_and_gives_the_implicit_gradient():
    params, x = problem(seed=2, radius=0.9)
    tight = dq.ImplicitAdjoint(
        solver=functools.partial(dq.solvers.broyden, max_steps=80, tol=1e-13)
    )
    probe = dq.BackwardStats.zeros(jnp.float64)
    grad = jax.jit(jax.grad(loss, argnums=(0, 4)), static_argnums=(2, 3))
    # Three forward steps: the estimate is -I plus two rank-one terms, its residual large.
    short = functools.partial(dq.solvers.broyden, max_steps=3, tol=0.0)
    g_shine, stats = grad(params, x, dq.ShineAdjoint(fallback=tight), short, probe)
    assert float(stats.fallbacks) == 1.0 and float(stats.count) == 1.0
    g_implicit = grad(params, x, tight, short, probe)[0]
    assert rel_err(g_shine, g_implicit) < 1e-9
    g_raw, raw_stats = grad(params, x, dq.ShineAdjoint(fallback=None), short, probe)
    assert rel_err(g_raw, g_implicit) > 0.05  # what the fallback replaced was poor
    assert float(raw_stats.failures) == 1.0 and float(raw_stats.fallbacks) == 0.0
    assert float(raw_stats.rel_residual) > 0.1  # the default fallback_tol


@pytest.mark.parametrize(
    "fallback_tol", [float("inf"), pytest.param(1e-30, marks=pytest.mark.slow)]
)
@pytest.mark.slow
def test_batch_native_equals_vmap(fallback_tol):
    params, _ = problem(seed=3)
    xs = jax.random.normal(jax.random.PRNGKey(4), (3, D), jnp.float64) * jnp.array(
        [[0.3], [1], [2]]
    )
    adjoint = dq.ShineAdjoint(refine_steps=2, fallback_tol=fallback_tol)
    native_solver = functools.partial(BROYDEN, batch_ndim=1)

    def native(p, probe):
        z, _ = dq.fixed_point(
            cell,
            p,
            xs,
            jnp.zeros((3, D)),
            solver=native_solver,
            adjoint=adjoint,
            backward_stats=probe,
        )
        return jax.vmap(head)(z).sum()

    def per_example(p, probe):
        return jax.vmap(lambda x: loss(p, x, adjoint, probe=probe))(xs).sum()

    probe = dq.BackwardStats.zeros(jnp.float64)
    g_native, s_native = jax.jit(jax.grad(native, argnums=(0, 1)))(params, probe)
    g_vmap, s_vmap = jax.jit(jax.grad(per_example, argnums=(0, 1)))(params, probe)
    assert rel_err(g_native, g_vmap) < 1e-9
    assert float(s_native.count) == float(s_vmap.count) == 3.0
    want_fallbacks = 0.0 if fallback_tol == float("inf") else 3.0
    assert float(s_native.fallbacks) == float(s_vmap.fallbacks) == want_fallbacks
    np.testing.assert_allclose(s_native.num_steps, s_vmap.num_steps)


def test_jit_and_grad_in_x_and_solver_objects():
    params, x = problem(seed=5)
    adjoint = dq.ShineAdjoint(refine_steps=60, fallback=None)
    eager = jax.grad(loss, argnums=(0, 1))(params, x, adjoint)
    jitted = jax.jit(jax.grad(loss, argnums=(0, 1)), static_argnums=2)(params, x, adjoint)
    assert rel_err(jitted, eager) < 1e-12
    exact = dense_implicit_grad(params, x)
    assert rel_err(eager[1], exact[1]) < 1e-9  # the input gradient too
    obj = dq.solvers.Broyden(max_steps=40, tol=1e-12)
    g_obj = jax.grad(loss, argnums=(0, 1))(params, x, adjoint, obj)
    assert rel_err(g_obj, eager) < 1e-12


def test_non_broyden_solver_and_bad_arguments_raise():
    params, x = problem()
    with pytest.raises(ValueError, match="broyden"):
        loss(params, x, dq.ShineAdjoint(), dq.solvers.anderson)
    with pytest.raises(ValueError, match="broyden"):
        loss(params, x, dq.ShineAdjoint(), dq.solvers.Anderson())
    for kw, match in [
        ({"refine_steps": -1}, "refine_steps"),
        ({"refine_steps": 1.0}, "refine_steps"),
        ({"fallback_tol": 0.0}, "fallback_tol"),
        ({"fallback": "gmres"}, "fallback"),
    ]:
        with pytest.raises(ValueError, match=match):
            dq.ShineAdjoint(**kw)


class _Cell(hk.Module):
    def __call__(self, z, x):
        w = hk.get_parameter("w", [D, D], z.dtype, init=hk.initializers.RandomNormal(0.15))
        return jnp.tanh(z @ w + x)


@pytest.mark.parametrize("per_example", [True, pytest.param("vmap", marks=pytest.mark.slow)])
def test_deq_with_shine_matches_the_implicit_gradient_with_many_refinement_steps(per_example):
    x = jax.random.normal(jax.random.PRNGKey(1), (3, D), jnp.float64)

    def make(adjoint):
        def forward(x):
            deq = dq.nn.DEQ(_Cell(), solver=BROYDEN, adjoint=adjoint)
            if per_example == "vmap":  # one example at a time, each its own solve
                z = hk.vmap(lambda xi: deq(xi[None])[0][0], split_rng=False)(x)
            else:
                z, _ = deq(x)
            return jnp.sum(jnp.sin(z))

        return hk.transform(forward)

    t_shine = make(dq.ShineAdjoint(refine_steps=60, fallback=None))
    t_implicit = make(dq.ImplicitAdjoint())
    params = t_shine.init(jax.random.PRNGKey(0), x)
    g_shine = jax.jit(jax.grad(lambda p: t_shine.apply(p, None, x)))(params)
    g_implicit = jax.jit(jax.grad(lambda p: t_implicit.apply(p, None, x)))(params)
    assert rel_err(g_shine, g_implicit) < 1e-9


@pytest.mark.parametrize("memory", [None, 5, 3])
def test_batch_native_inverse_estimate_equals_vmap_unless_the_memory_wrapped(memory):
    d = 8
    w = jax.random.normal(jax.random.PRNGKey(0), (d, d), jnp.float64) * 0.5 / np.sqrt(d)
    b = jax.random.normal(jax.random.PRNGKey(1), (d,), jnp.float64)
    z0 = jnp.stack([jnp.zeros(d), jnp.full(d, 0.3)])
    solver = functools.partial(
        dq.solvers.broyden, max_steps=30, tol=1e-10, memory=memory, return_inverse=True
    )
    native = solver(lambda z: jnp.tanh(z @ w.T + b[None]), z0, batch_ndim=1)
    per = jax.vmap(lambda z: solver(lambda z: jnp.tanh(w @ z + b), z))(z0)
    v = jax.random.normal(jax.random.PRNGKey(2), (2, d), jnp.float64)
    got = broyden_lib.inverse_rmatvec(native.inverse_estimate, v)
    want = jax.vmap(broyden_lib.inverse_rmatvec)(per.inverse_estimate, v)
    steps = np.asarray(native.num_steps)
    if memory == 3:  # the problem that stopped first lost its rows to the shared slot: -I
        assert steps[1] < steps[0]
        assert not np.any(np.asarray(native.inverse_estimate.valid[1]))
        np.testing.assert_allclose(got[1], -v[1], rtol=1e-12)
        np.testing.assert_allclose(got[0], want[0], rtol=1e-10, atol=1e-12)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    assert np.any(np.abs(np.asarray(want) + np.asarray(v)) > 1e-3)  # not just -I


@pytest.mark.slow
def test_mixed_batch_falls_back_only_where_the_estimate_is_poor():
    params, _ = problem(seed=3)
    scale = jnp.array([[0.3], [1.0], [2.0]])
    xs = jax.random.normal(jax.random.PRNGKey(4), (3, D), jnp.float64) * scale
    short = functools.partial(dq.solvers.broyden, max_steps=6, tol=0.0)
    tight = dq.ImplicitAdjoint(
        solver=functools.partial(dq.solvers.broyden, max_steps=80, tol=1e-13)
    )

    def one(p, x, probe, adjoint):  # per-example loss and statistics (a probe per example)
        return loss(p, x, adjoint, short, probe)

    def residuals(adjoint):
        probes = jax.tree_util.tree_map(
            lambda a: jnp.zeros(3, a.dtype), dq.BackwardStats.zeros(jnp.float64)
        )
        per = jax.vmap(jax.grad(one, argnums=(0, 2)), in_axes=(None, 0, 0, None))
        return per(params, xs, probes, adjoint)

    (_, raw) = residuals(dq.ShineAdjoint(fallback=None))
    res = np.sort(np.asarray(raw.rel_residual))
    assert res[0] < res[2]
    tol = float(0.5 * (res[0] + res[1]))  # examples above it fall back, the lowest does not
    mixed = dq.ShineAdjoint(fallback=tight, fallback_tol=tol)
    g_mixed, stats = residuals(mixed)
    poor = np.asarray(raw.rel_residual) > tol
    np.testing.assert_array_equal(np.asarray(stats.fallbacks), poor.astype(float))
    g_raw, _ = residuals(dq.ShineAdjoint(fallback=None))
    g_impl, _ = residuals(tight)
    for i in range(3):
        want = g_impl if poor[i] else g_raw
        got_i = jax.tree_util.tree_map(lambda a, i=i: a[i], g_mixed)
        want_i = jax.tree_util.tree_map(lambda a, i=i: a[i], want)
        assert rel_err(got_i, want_i) < 1e-9

    # Batch-native: the same per-example choice inside one batched backward.
    def native(p, probe):
        z, _ = dq.fixed_point(
            cell,
            p,
            xs,
            jnp.zeros((3, D)),
            solver=functools.partial(short, batch_ndim=1),
            adjoint=mixed,
            backward_stats=probe,
        )
        return jax.vmap(head)(z).sum()

    g_native, s_native = jax.grad(native, argnums=(0, 1))(
        params, dq.BackwardStats.zeros(jnp.float64)
    )
    assert float(s_native.fallbacks) == float(poor.sum())
    g_sum = jax.tree_util.tree_map(lambda a: a.sum(0), g_mixed)
    assert rel_err(g_native, g_sum) < 1e-9
