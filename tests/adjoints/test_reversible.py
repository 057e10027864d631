"""The reversible solver and its exact reversal adjoint (McCallum, Arora, Foster 2025)."""

import functools

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import deqjax as dq
from deqjax._src.solvers import reversible as reversible_lib
from tests.helpers.reversible import D, rel, solver, tanh_cell, tanh_params


def test_adjoint_refuses_other_solvers():
    def run(s):
        return dq.fixed_point(
            tanh_cell,
            tanh_params(),
            jnp.zeros(D),
            jnp.zeros(D),
            solver=s,
            adjoint=dq.ReversibleAdjoint(),
        )

    others = [
        dq.solvers.anderson,
        dq.solvers.broyden,
        functools.partial(dq.solvers.fixed_point_iteration, damping=0.8),
        lambda f, z0: dq.solvers.reversible(f, z0),  # no return_state: cannot be reversed
    ]
    for other in others:
        with pytest.raises(ValueError, match="reversible"):
            run(other)
    run(solver(beta=0.6))  # accepted


# --- gradients -------------------------------------------------------------------------------


def _grads(adjoint, s, p, x, z0, batch_ndim=0):
    c = jnp.asarray(np.random.default_rng(7).normal(size=z0.shape), z0.dtype)

    def loss(p, x, z0):
        z, _ = dq.fixed_point(tanh_cell, p, x, z0, solver=s, adjoint=adjoint)
        return jnp.sum(c * z) + jnp.sum(jnp.sin(z))

    return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(p, x, z0)


@pytest.mark.parametrize("beta", [0.5, 0.8])
def test_gradient_equals_unrolled_backprop_float64(beta):
    p = tanh_params()
    x = jnp.asarray(np.random.default_rng(2).normal(size=D))
    z0 = jnp.full((D,), 0.3)
    s = solver(beta=beta, tol=1e-4, max_steps=60)
    g_rev = _grads(dq.ReversibleAdjoint(), s, p, x, z0)
    g_unr = _grads(dq.UnrolledAdjoint(), s, p, x, z0)
    for a, b in zip(g_rev, g_unr):
        assert rel(a, b) <= 1e-10
    assert rel(g_rev[2], g_unr[2]) <= 1e-10  # z0 too


@pytest.mark.slow
def test_gradient_batch_native_masks_each_problem_steps():
    """Problems reverse their own step counts: native == vmap == per-problem unrolled."""
    p = tanh_params(scale=0.8)
    x = jnp.asarray(np.random.default_rng(3).normal(size=(4, D))) * jnp.array(
        [[0.01], [0.3], [1.0], [2.0]]
    )
    z0 = jnp.zeros((4, D))
    s = solver(tol=1e-3, max_steps=60)
    steps = jax.vmap(lambda xi: s(lambda z: tanh_cell(p, xi, z), jnp.zeros(D)).num_steps)(x)
    assert len(set(np.asarray(steps).tolist())) > 1
    native = _grads(dq.ReversibleAdjoint(), solver(tol=1e-3, max_steps=60, batch_ndim=1), p, x, z0)

    def vmap_grads(adjoint):
        def loss(p, x, z0):
            c = jnp.asarray(np.random.default_rng(7).normal(size=z0.shape), z0.dtype)
            z, _ = jax.vmap(
                lambda xi, zi: dq.fixed_point(tanh_cell, p, xi, zi, solver=s, adjoint=adjoint)
            )(x, z0)
            return jnp.sum(c * z) + jnp.sum(jnp.sin(z))

        return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(p, x, z0)

    vm = vmap_grads(dq.ReversibleAdjoint())
    unrolled = vmap_grads(dq.UnrolledAdjoint())
    for a, b, c in zip(native, vm, unrolled):
        assert rel(a, b) <= 1e-12 and rel(a, c) <= 1e-10


@pytest.mark.slow
def test_gradient_close_to_implicit_when_converged():
    p = tanh_params()
    x = jnp.asarray(np.random.default_rng(4).normal(size=D))
    z0 = jnp.zeros(D)
    g_rev = _grads(
        dq.ReversibleAdjoint(), solver(tol=1e-9, stop_mode="abs", max_steps=200), p, x, z0
    )
    g_imp = _grads(
        dq.ImplicitAdjoint(),
        functools.partial(dq.solvers.anderson, tol=1e-12, max_steps=100),
        p,
        x,
        z0,
    )
    assert rel(g_rev[0], g_imp[0]) < 1e-5 and rel(g_rev[1], g_imp[1]) < 1e-5


def test_check_grads_fixed_steps():
    p = tanh_params()
    x = jnp.asarray(np.random.default_rng(5).normal(size=D))
    s = solver(tol=0.0, stop_mode="abs", max_steps=9)

    def out(w, x, z0):
        z, _ = dq.fixed_point(
            tanh_cell, {"W": w, "b": p["b"]}, x, z0, solver=s, adjoint=dq.ReversibleAdjoint()
        )
        return z

    check_grads(out, (p["W"], x, jnp.full((D,), 0.2)), order=1, modes=["rev"], atol=1e-6, rtol=1e-6)


@pytest.mark.slow
def test_non_float_input_leaves_keys_and_pytree_state():
    p = tanh_params()

    def cell(p, x, z):
        feats, idx, key = x
        a, b = z
        noise = 0.1 * jax.random.normal(key, (D,), a.dtype)
        h = jnp.tanh(a @ p["W"].T + feats[idx] + p["b"] + noise)
        return h, 0.5 * jnp.tanh(b + h[:2])

    x = (jnp.linspace(-1.0, 1.0, D), jnp.arange(D)[::-1], jax.random.key(3))
    z0 = (jnp.zeros(D), jnp.zeros(2))

    def loss(p, feats, adjoint):
        z, _ = dq.fixed_point(
            cell, p, (feats, *x[1:]), z0, solver=solver(tol=1e-4), adjoint=adjoint
        )
        return jnp.sum(z[0] ** 2) + jnp.sum(z[1])

    g1 = jax.grad(loss, (0, 1))(p, x[0], dq.ReversibleAdjoint())
    g2 = jax.grad(loss, (0, 1))(p, x[0], dq.UnrolledAdjoint())
    assert rel(g1, g2) <= 1e-10


def _first(out):
    """The DEQ's ``(z, solution)`` of a batch of one, without the batch axis."""
    return jax.tree_util.tree_map(lambda a: a[0], out)


@pytest.mark.slow
def test_deq_module_native_and_vmap_modes():
    d, b = 6, 5
    w_init = hk.initializers.VarianceScaling(0.3)

    def forward(x, per_example, adjoint):
        cell = lambda z, x: jnp.tanh(hk.Linear(d, w_init=w_init, name="w")(z) + x)  # noqa: E731
        deq = dq.nn.DEQ(cell, solver=solver(tol=1e-3, max_steps=60), adjoint=adjoint)
        if per_example == "vmap":  # the reference: one example at a time, each its own solve
            z, sol = hk.vmap(lambda xi: _first(deq(xi[None])), split_rng=False)(x)
        else:
            z, sol = deq(x)
        return jnp.sum(jnp.sin(z)), sol

    x = (
        jax.random.normal(jax.random.PRNGKey(0), (b, d), jnp.float64)
        * jnp.arange(1.0, b + 1)[:, None]
    )
    grads, steps = {}, {}
    for mode, adjoint in [
        (True, dq.ReversibleAdjoint()),
        ("vmap", dq.ReversibleAdjoint()),
        (True, dq.UnrolledAdjoint()),
    ]:
        t = hk.without_apply_rng(
            hk.transform(functools.partial(forward, per_example=mode, adjoint=adjoint))
        )
        params = t.init(jax.random.PRNGKey(1), x)
        g, sol = jax.jit(jax.grad(t.apply, has_aux=True))(params, x)
        key = (mode, type(adjoint).__name__)
        grads[key], steps[key] = g, np.asarray(sol.num_steps)
    ref = grads[True, "UnrolledAdjoint"]
    assert len(set(steps[True, "ReversibleAdjoint"].tolist())) > 1  # per-example stopping
    np.testing.assert_array_equal(
        steps[True, "ReversibleAdjoint"], steps["vmap", "ReversibleAdjoint"]
    )
    assert rel(grads[True, "ReversibleAdjoint"], ref) <= 1e-10
    assert rel(grads["vmap", "ReversibleAdjoint"], ref) <= 1e-10


# --- memory and reversal error ---------------------------------------------------------------


def _temp_bytes(adjoint, max_steps, d=256):
    p = tanh_params(d=d, seed=1)
    x = jnp.ones(d)
    s = solver(tol=0.0, stop_mode="abs", max_steps=max_steps)  # never stops early

    def loss(p):
        z, _ = dq.fixed_point(tanh_cell, p, x, jnp.zeros(d), solver=s, adjoint=adjoint)
        return jnp.sum(z**2)

    compiled = jax.jit(jax.grad(loss)).lower(p).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def test_memory_flat_in_steps_unlike_unrolled():
    rev = {n: _temp_bytes(dq.ReversibleAdjoint(checkpoint_every=None), n) for n in (10, 200)}
    auto = {n: _temp_bytes(dq.ReversibleAdjoint(), n) for n in (10, 200)}
    unr = {n: _temp_bytes(dq.UnrolledAdjoint(), n) for n in (10, 200)}
    # Only the [max_steps] trace grows (8 bytes a step); the states (2 KiB each) do not.
    assert rev[200] - rev[10] <= 190 * 8 * 4, rev
    # The default stores a pair of states every 8 evaluations: O(steps / 8).
    assert auto[200] - auto[10] <= (190 / 8 + 2) * 2 * 256 * 8 + 190 * 8 * 4, auto
    assert unr[200] - unr[10] >= 190 * 256 * 8, unr


def test_backward_stats_report_reverse_steps_and_reversal_error():
    p = tanh_params()
    x = jnp.asarray(np.random.default_rng(10).normal(size=(3, D))) * jnp.array(
        [[0.1], [1.0], [3.0]]
    )
    kw = dict(tol=1e-6, max_steps=80)
    sol = dq.solvers.reversible(
        lambda z: tanh_cell(p, x, z), jnp.zeros((3, D)), batch_ndim=1, return_state=True, **kw
    )
    state = sol.reversible_state
    errors = dq.solvers.reversal_error(
        lambda z: tanh_cell(p, x, z), jnp.zeros((3, D)), batch_ndim=1, **kw
    )

    def loss(p, probe):
        z, _ = dq.fixed_point(
            tanh_cell,
            p,
            x,
            jnp.zeros((3, D)),
            solver=solver(batch_ndim=1, **kw),
            adjoint=dq.ReversibleAdjoint(checkpoint_every=None),  # the reversal measured above
            backward_stats=probe,
        )
        return jnp.sum(z**2)

    _, stats = jax.jit(jax.grad(loss, (0, 1)))(p, dq.BackwardStats.zeros(jnp.float64))
    assert float(stats.count) == 3 and float(stats.failures) == 0 and float(stats.fallbacks) == 0
    assert float(stats.num_steps) == int(jnp.sum(state.steps)) > 0
    np.testing.assert_allclose(float(stats.rel_residual), float(jnp.sum(errors)), rtol=1e-6)
    assert float(stats.rel_residual) > 0


def _weighted_problem():
    """``(params, x, c)`` in float64: a tanh layer (d = 32, scale 0.9) and a batch of 3."""
    p64 = tanh_params(d=32, scale=0.9, seed=11)
    x64 = jnp.asarray(np.random.default_rng(12).normal(size=(3, 32)))
    c64 = jnp.asarray(np.random.default_rng(13).normal(size=(3, 32)))
    return p64, x64, c64


def _weighted_grad(s, p, x, c, adjoint):
    """``jit(grad)`` in ``params`` of ``sum(c * z*)``, solved by ``s`` from 0 with ``adjoint``."""

    def loss(p):
        z, _ = dq.fixed_point(tanh_cell, p, x, jnp.zeros_like(x), solver=s, adjoint=adjoint)
        return jnp.sum(c * z)

    return jax.jit(jax.grad(loss))(p)


def _float32_grads(s, args64, adjoints):
    """The float32 gradients (as float64) of ``args64`` cast to float32, one per adjoint."""
    with jax.enable_x64(False):
        args32 = [jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float32), t) for t in args64]
        grads = [_weighted_grad(s, *args32, adjoint) for adjoint in adjoints]
    return [jax.tree_util.tree_map(lambda a: a.astype(jnp.float64), g) for g in grads]


def test_checkpoints_bound_the_float32_reversal_error():
    """checkpoint_every=m restarts the reverse pass from stored pairs: float32 gradients of a
    tightly solved problem go from percent-level error (pure reversal) to float32 rounding."""
    args64 = _weighted_problem()
    s = solver(tol=1e-5, max_steps=120, batch_ndim=1)
    ref = _weighted_grad(s, *args64, dq.UnrolledAdjoint())
    ckpt = dq.ReversibleAdjoint(checkpoint_every=8)
    assert rel(_weighted_grad(s, *args64, ckpt), ref) <= 1e-12
    plain = dq.ReversibleAdjoint(checkpoint_every=None)
    err_plain, err_ckpt = (rel(g, ref) for g in _float32_grads(s, args64, [plain, ckpt]))
    assert err_ckpt < 1e-4 and err_ckpt < err_plain / 10, (err_plain, err_ckpt)


@pytest.mark.parametrize("steps", [40, pytest.param(160, marks=pytest.mark.slow)])
def test_default_is_backprop_through_the_steps_at_any_number_of_steps(steps):
    """ReversibleAdjoint() without options: float32 within 1e-4 and float64 within 1e-10 of
    backprop through the same iteration (float64), whether it runs 40 or 160 evaluations."""
    args64 = _weighted_problem()
    s = solver(tol=0.0, stop_mode="abs", max_steps=steps, batch_ndim=1)
    ref = _weighted_grad(s, *args64, dq.UnrolledAdjoint())
    assert rel(_weighted_grad(s, *args64, dq.ReversibleAdjoint()), ref) <= 1e-10
    (g32,) = _float32_grads(s, args64, [dq.ReversibleAdjoint()])
    assert rel(g32, ref) <= 1e-4


def test_checkpoint_arguments():
    for bad in [0, -2, 1.5, True, "sometimes"]:
        with pytest.raises(ValueError, match="checkpoint_every"):
            dq.ReversibleAdjoint(checkpoint_every=bad)
        with pytest.raises(ValueError, match="checkpoint_every"):
            dq.solvers.reversible(jnp.cos, jnp.zeros(2), checkpoint_every=bad)
    f = lambda z: jnp.tanh(0.9 * z[::-1] + 1.0)  # noqa: E731
    state = dq.solvers.reversible(
        f, jnp.zeros(4), tol=1e-12, max_steps=40, return_state=True, checkpoint_every=8
    ).reversible_state
    assert state.checkpoints[0].shape == (5, 4) and state.checkpoint_every == 8
    y0, z0 = reversible_lib.reconstruct(f, state)
    np.testing.assert_allclose(y0, 0.0, atol=1e-12)
    np.testing.assert_allclose(z0, 0.0, atol=1e-12)
