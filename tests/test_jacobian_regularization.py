"""JacobianRegularizer: the Bernoulli-gated Jacobian penalty of the JR paper (Eq. 4, App. A.4)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.test_util import check_grads

import deqjax as dq
from deqjax import jacobian
from deqjax.regularization import JacobianRegularizer

D = 4


def cell(p, x, z):
    return jnp.tanh(p["W"] @ z + p["b"] + x)


def problem(seed=0):
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(D, D))
    w *= 0.7 / np.max(np.abs(np.linalg.eigvals(w)))
    return {"W": jnp.asarray(w), "b": jnp.asarray(rng.normal(size=D))}, jnp.asarray(
        rng.normal(size=D)
    )


def test_penalty_equals_gamma_times_estimate_and_metrics():
    p, x = problem()
    z = jnp.asarray(np.random.default_rng(1).normal(size=D))
    key = jax.random.key(0)
    reg = JacobianRegularizer(2.5, p=1.0, num_samples=3)
    term, m = jax.jit(lambda p, k: reg.penalty(lambda zz: cell(p, x, zz), z, k))(p, key)
    _, probe_key = jax.random.split(key)
    est = jacobian.frobenius_sq(lambda zz: cell(p, x, zz), z, probe_key, num_samples=3)
    np.testing.assert_allclose(term, 2.5 * est, rtol=1e-12)
    assert set(m) == {"jr/penalty", "jr/frobenius_sq", "jr/gamma", "jr/applied"}
    assert float(m["jr/applied"]) == 1.0 and float(m["jr/gamma"]) == 2.5
    assert all(v.shape == () for v in m.values())


def test_penalty_gradient_matches_finite_differences_float64():
    p, x = problem(1)
    z = jnp.asarray(np.random.default_rng(2).normal(size=D))
    reg = JacobianRegularizer(1.5, p=1.0, num_samples=2)
    key = jax.random.key(3)

    def loss(w, b):
        return reg.penalty(lambda zz: cell({"W": w, "b": b}, x, zz), z, key)[0]

    check_grads(loss, (p["W"], p["b"]), order=1, modes=["rev"], atol=1e-6, rtol=1e-6)
    g = jax.grad(loss)(p["W"], p["b"])
    assert np.all(np.isfinite(np.asarray(g))) and float(jnp.max(jnp.abs(g))) > 0


def test_penalty_of_a_complex_state_against_the_dense_jacobian_and_its_gradient():
    """A complex ``z*``: the term is ``γ ‖J_R‖²_F / (2d)``, ``γ ‖A‖²_F / d`` for the holomorphic
    ``z ↦ A z + x`` (the old validator refused complex states); its gradient in ``A`` that of
    the dense ``γ ‖A‖²_F / d`` (many probes) and, at fixed probes, finite differences."""
    rng = np.random.default_rng(5)
    a = jnp.asarray(0.3 * (rng.normal(size=(D, D)) + 1j * rng.normal(size=(D, D))))
    x = jnp.asarray(rng.normal(size=D) + 1j * rng.normal(size=D))
    z = jnp.linalg.solve(jnp.eye(D, dtype=jnp.complex128) - a, x)
    key = jax.random.key(4)
    reg = JacobianRegularizer(1.5, p=1.0, num_samples=20000)

    def term(a):
        return reg.penalty(lambda zz: a @ zz + x, z, key)[0]

    def dense(a):
        return 1.5 * jnp.sum(jnp.abs(a) ** 2) / D

    value, grad = jax.jit(jax.value_and_grad(term))(a)
    assert value.dtype == jnp.float64
    np.testing.assert_allclose(float(value), float(dense(a)), rtol=0.05)  # rel. std <= 0.01
    want = jax.grad(dense)(a)
    assert float(jnp.max(jnp.abs(grad - want))) < 0.05 * float(jnp.max(jnp.abs(want)))
    few = JacobianRegularizer(1.5, p=1.0, num_samples=2)
    check_grads(
        lambda a: few.penalty(lambda zz: jnp.tanh(a @ zz) + x, z, key)[0],
        (a,),
        order=1,
        modes=["rev"],
        atol=1e-6,
        rtol=1e-6,
    )


@pytest.mark.slow
def test_penalty_through_fixed_point_and_differentiate_z_star():
    p, x = problem(2)
    key = jax.random.key(0)
    solver = lambda f, z0: dq.solvers.anderson(f, z0, tol=1e-12, max_steps=100)

    def total(p, reg):
        z, _ = dq.fixed_point(cell, p, x, jnp.zeros(D), solver=solver)
        return jnp.sum(z**2) + reg.penalty(lambda zz: cell(p, x, zz), z, key)[0]

    grad = jax.jit(jax.grad(total), static_argnums=1)
    g_fixed = grad(p, JacobianRegularizer(1.0))
    g_full = grad(p, JacobianRegularizer(1.0, differentiate_z_star=True))
    for g in (g_fixed, g_full):
        assert all(np.all(np.isfinite(np.asarray(v))) for v in jax.tree_util.tree_leaves(g))
    # With z* differentiable the gradient gains the implicit path, so it differs.
    assert float(jnp.max(jnp.abs(g_fixed["W"] - g_full["W"]))) > 1e-8
    # And the total-derivative version matches finite differences.
    reg_z = JacobianRegularizer(1.0, differentiate_z_star=True)
    check_grads(
        jax.jit(lambda w: total({"W": w, "b": p["b"]}, reg_z)),
        (p["W"],),
        order=1,
        modes=["rev"],
        atol=1e-5,
        rtol=1e-5,
    )


def test_gate_skips_estimator_when_tau_is_zero():
    p, x = problem()
    z = jnp.ones(D)
    calls = []

    def f_z(zz):
        jax.debug.callback(lambda: calls.append(1))
        return cell(p, x, zz)

    reg = JacobianRegularizer(1.0, p=0.4)
    fn = jax.jit(lambda k: reg.penalty(f_z, z, k))
    applied = []
    for i in range(40):
        calls.clear()
        term, m = fn(jax.random.key(i))
        jax.block_until_ready(term)
        tau = float(m["jr/applied"])
        applied.append(tau)
        if tau == 0.0:
            assert calls == [] and float(term) == 0.0  # the estimator did not run
        else:
            assert len(calls) >= 1 and float(term) > 0.0
    assert 0 < sum(applied) < 40  # both branches were exercised
    # The gradient path is gated as well: no callback from the VJP when τ = 0.
    grad_fn = jax.jit(jax.grad(lambda z, k: reg.penalty(f_z, z, k)[0]))
    for i in range(40):
        calls.clear()
        if float(fn(jax.random.key(i))[1]["jr/applied"]) == 0.0:
            calls.clear()
            jax.block_until_ready(grad_fn(z, jax.random.key(i)))
            assert calls == []
            break
    # The jaxpr has a cond whose branches differ: one contains the VJP, the other does not.
    jaxpr = jax.make_jaxpr(lambda k: reg.penalty(lambda zz: cell(p, x, zz), z, k))(
        jax.random.key(0)
    )
    assert "cond" in str(jaxpr)


def test_gate_frequency_is_p():
    reg = JacobianRegularizer(1.0, p=0.4)
    fn = jax.jit(
        jax.vmap(lambda k: reg.penalty(lambda z: 0.5 * z, jnp.ones(3), k)[1]["jr/applied"])
    )
    rate = float(jnp.mean(fn(jax.random.split(jax.random.key(0), 4000))))
    assert abs(rate - 0.4) < 0.03


def test_static_p_zero_and_one_and_gamma_schedule():
    z = jnp.ones(3)
    term0, m0 = JacobianRegularizer(5.0, p=0.0).penalty(lambda z: 2 * z, z, jax.random.key(0))
    assert float(term0) == 0.0 and float(m0["jr/applied"]) == 0.0
    schedule = optax.linear_schedule(1.6, 2.5, 100)
    reg = JacobianRegularizer(schedule, p=1.0)
    for step, want in [(0, 1.6), (50, 2.05), (100, 2.5)]:
        term, m = jax.jit(lambda s: reg.penalty(lambda z: 2 * z, z, jax.random.key(0), s))(step)
        np.testing.assert_allclose(m["jr/gamma"], want, rtol=1e-6)
        np.testing.assert_allclose(term, want * m["jr/frobenius_sq"], rtol=1e-6)
    # The estimate of J = 2I is exact-ish in expectation: ||2ε||²/d.
    with pytest.raises(ValueError, match="step"):
        reg.penalty(lambda z: 2 * z, z, jax.random.key(0))
    # gamma= overrides (e.g. from the adaptive controller), traced.
    term, m = jax.jit(lambda g: reg.penalty(lambda z: 2 * z, z, jax.random.key(0), gamma=g))(3.0)
    assert float(m["jr/gamma"]) == 3.0


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"gamma": -1.0}, "gamma"),
        ({"gamma": "big"}, "gamma"),
        ({"gamma": 1.0, "p": 1.5}, "p"),
        ({"gamma": 1.0, "num_samples": 0}, "num_samples"),
    ],
)
def test_regularizer_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        JacobianRegularizer(**kwargs)
