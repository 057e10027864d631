"""dq.regularization: the Bernoulli-gated Jacobian penalty (App. A.4) and the adaptive γ."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.test_util import check_grads

import deqjax as dq
from deqjax import jacobian
from deqjax.regularization import AdaptiveGamma, AdaptiveGammaState, JacobianRegularizer

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


# --- JacobianRegularizer ------------------------------------------------------------------------


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


# --- AdaptiveGamma ------------------------------------------------------------------------------


def run_controller(ctrl, signals):
    state = ctrl.init()
    update = jax.jit(ctrl.update)
    gammas = []
    for s in signals:
        state = update(state, s)
        gammas.append(float(state.gamma))
    return state, np.asarray(gammas)


def test_controller_raises_holds_and_lowers():
    ctrl = AdaptiveGamma(
        init_gamma=1.0, target=1e-3, lower_ratio=0.5, increase=1.1, decrease=0.9, smoothing=0.0
    )
    # Above target: raised by exactly x1.1 per step.
    _, g = run_controller(ctrl, [2e-3] * 5)
    np.testing.assert_allclose(g, 1.1 ** np.arange(1, 6), rtol=1e-6)
    # In the dead band [0.5e-3, 1e-3]: unchanged.
    _, g = run_controller(ctrl, [0.7e-3] * 5)
    np.testing.assert_allclose(g, 1.0)
    # Comfortably below: lowered by x0.9 per step.
    _, g = run_controller(ctrl, [1e-4] * 3)
    np.testing.assert_allclose(g, 0.9 ** np.arange(1, 4), rtol=1e-6)


def test_controller_bounds_smoothing_and_nonfinite():
    ctrl = AdaptiveGamma(
        init_gamma=1.0,
        target=5.0,
        increase=2.0,
        decrease=0.5,
        min_gamma=0.25,
        max_gamma=4.0,
        smoothing=0.5,
    )
    state, g = run_controller(ctrl, [10.0] * 5)
    assert g[-1] == 4.0 and g.max() == 4.0  # clipped at max_gamma
    state, g = run_controller(ctrl, [0.1] * 6)
    assert g[-1] == 0.25  # clipped at min_gamma
    # EMA: first update sets it, then beta-mixing.
    state = ctrl.update(ctrl.init(), 4.0)
    state = ctrl.update(state, 8.0)
    np.testing.assert_allclose(state.signal, 6.0)
    assert int(state.count) == 2
    # A single spike after a calm history is smoothed away (EMA 4 -> 0.5*4+0.5*5.8 = 4.9 < 5).
    calm = ctrl.update(ctrl.update(ctrl.init(), 4.0), 4.0)
    spiked = ctrl.update(calm, 5.8)
    assert float(spiked.gamma) == float(calm.gamma)
    # A non-finite signal raises gamma and leaves the EMA and the count alone.
    nan_state = ctrl.update(calm, jnp.nan)
    assert float(nan_state.gamma) == 2 * float(calm.gamma)
    assert float(nan_state.signal) == float(calm.signal) and int(nan_state.count) == 2


def test_controller_on_synthetic_residual_sequence_tracks_target():
    # A toy plant: the solver's residual at its budget falls as gamma grows, r = 4e-3 / gamma,
    # and drifts up over time (the Jacobian "creeps up" under fixed gamma, JR paper App. B.3).
    ctrl = AdaptiveGamma(
        init_gamma=1.0, target=1e-3, lower_ratio=0.5, increase=1.05, decrease=0.98, smoothing=0.8
    )
    state = ctrl.init()
    update = jax.jit(ctrl.update)
    fixed, adaptive = [], []
    for t in range(600):
        drift = 1.0 + t / 200.0
        fixed.append(4e-3 * drift / 1.0)
        r = 4e-3 * drift / float(state.gamma)
        adaptive.append(r)
        state = update(state, jnp.asarray([r, r]))  # an array signal is averaged
    late = np.asarray(adaptive[300:])
    assert np.all(late < 1e-3 * 1.3) and np.all(late > 0.5e-3 * 0.7)
    assert fixed[-1] > 10e-3  # the fixed-gamma residual drifted far above the target
    assert float(state.gamma) > 4.0


def test_controller_state_is_a_pytree_and_bad_arguments():
    state = AdaptiveGamma(init_gamma=1.0, target=6.0).init()
    assert isinstance(state, AdaptiveGammaState)
    assert state.gamma.dtype == jnp.float32 and state.count.dtype == jnp.int32
    assert len(jax.tree_util.tree_leaves(state)) == 3
    for kwargs, match in [
        ({"init_gamma": 0.0, "target": 1.0}, "init_gamma"),
        ({"init_gamma": 1.0, "target": -1.0}, "target"),
        ({"init_gamma": 1.0, "target": 1.0, "increase": 0.9}, "increase"),
        ({"init_gamma": 1.0, "target": 1.0, "decrease": 1.1}, "decrease"),
        ({"init_gamma": 1.0, "target": 1.0, "lower_ratio": 2.0}, "lower_ratio"),
        ({"init_gamma": 10.0, "target": 1.0, "max_gamma": 5.0}, "init_gamma"),
        ({"init_gamma": 1.0, "target": 1.0, "smoothing": 1.0}, "smoothing"),
    ]:
        with pytest.raises(ValueError, match=match):
            AdaptiveGamma(**kwargs)
