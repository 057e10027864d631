"""Sampled solver iterates (``sample_steps``) and the fixed-point correction loss (DEQ-flow)."""

import functools

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import deqjax as dq

D = 6
STEPS = (0, 2, 5, 9)


def problem(seed=0):
    k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
    params = {"W": 0.6 * jax.random.normal(k1, (D, D), jnp.float64) / np.sqrt(D)}
    x = jax.random.normal(k2, (D,), jnp.float64)
    return params, x


def cell(p, x, z):  # one problem: z [D]; a batch: z [B, D] (rows independent)
    return jnp.tanh(z @ p["W"].T + x)


SOLVERS = {
    "fixed_point_iteration": functools.partial(dq.solvers.fixed_point_iteration, damping=0.7),
    "anderson": dq.solvers.anderson,
    "broyden": dq.solvers.broyden,
}


# The eager python loop (and two compiles per batch test) take 10-30 s for these two on 2 cores.
SOLVER_PARAMS = [
    "fixed_point_iteration",
    pytest.param("anderson", marks=pytest.mark.slow),
    pytest.param("broyden", marks=pytest.mark.slow),
]


def recorded_iterates(solver, f, z0, **kw):
    """Every iterate the solver evaluates, seen by f on the python loop."""
    seen = []

    def f_rec(z):
        if not isinstance(z, jax.core.Tracer):  # the shape check traces f once
            seen.append(np.asarray(z))
        return f(z)

    sol = solver(f_rec, z0, loop="python", **kw)
    return sol, seen


@pytest.mark.parametrize("name", SOLVER_PARAMS)
def test_samples_are_the_iterates_the_solver_evaluated(name):
    params, x = problem()
    f = functools.partial(cell, params, x)
    solver = functools.partial(SOLVERS[name], max_steps=12, tol=1e-15)
    _, seen = recorded_iterates(solver, f, jnp.zeros(D))
    sol = solver(f, jnp.zeros(D), sample_steps=STEPS)
    assert int(sol.num_steps) == len(seen) > max(STEPS)
    assert sol.samples.shape == (len(STEPS), D)
    for i, s in enumerate(STEPS):
        np.testing.assert_allclose(sol.samples[i], seen[s], rtol=1e-12, atol=1e-14)
    # Without the keyword nothing is kept.
    assert solver(f, jnp.zeros(D)).samples is None


@pytest.mark.parametrize("name", SOLVER_PARAMS)
def test_batch_native_samples_equal_vmap_and_unreached_steps_hold_the_value(name):
    params, _ = problem()
    xs = jax.random.normal(jax.random.PRNGKey(3), (3, D), jnp.float64) * jnp.array(
        [[0.1], [1], [3]]
    )
    solver = functools.partial(SOLVERS[name], max_steps=40, tol=1e-8, sample_steps=(1, 4, 39, 40))
    native = solver(lambda z: cell(params, xs, z), jnp.zeros((3, D)), batch_ndim=1)
    per = jax.vmap(lambda x: solver(lambda z: cell(params, x, z), jnp.zeros(D)))(xs)
    assert native.samples.shape == (3, 4, D)
    np.testing.assert_allclose(native.samples, per.samples, rtol=1e-10, atol=1e-12)
    # Steps a problem never evaluated (at least 40 = max_steps) hold its returned value.
    late = np.asarray([39, 40])[None, :] >= np.asarray(native.num_steps)[:, None]
    assert late[:, 1].all()
    for b, i in zip(*np.nonzero(late)):
        np.testing.assert_array_equal(native.samples[b, 2 + i], native.value[b])


def test_sample_steps_are_validated():
    f = jnp.cos
    for bad, match in [
        ((), "non-empty"),
        ((1, 1), "distinct"),
        ((51,), r"\[0, max_steps=50\]"),
        ((1.5,), "int"),
        (3, "sequence"),
    ]:
        with pytest.raises(ValueError, match=match):
            dq.solvers.anderson(f, jnp.zeros(2), sample_steps=bad)
    assert dq.uniform_sample_steps(30, 3) == (10, 20, 30)
    with pytest.raises(ValueError, match="n_states"):
        dq.uniform_sample_steps(3, 4)


@pytest.mark.parametrize("gradient", ["one_step", "phantom"])
def test_correction_states_have_the_iterates_values_and_the_cheap_gradients(gradient):
    params, x = problem()
    solver = functools.partial(dq.solvers.anderson, max_steps=40, tol=1e-10, sample_steps=STEPS)
    steps, tau = 3, 0.6

    def head(z):
        return jnp.sum(jnp.sin(z) * jnp.arange(1.0, D + 1.0))

    def loss(p, xx):
        _, sol = dq.fixed_point(cell, p, xx, jnp.zeros(D), solver=solver)
        states = dq.correction_states(
            lambda z: cell(p, xx, z), sol, gradient=gradient, steps=steps, tau=tau
        )
        return [head(s) for s in states], states, sol

    losses, states, sol = loss(params, x)
    for i in range(len(STEPS)):
        np.testing.assert_array_equal(states[i], sol.samples[i])  # value: the iterate itself

    def by_hand(p, xx, i):  # (∂ℓ/∂z at z_k)ᵀ ∂(strategy's map at z_k)/∂(p, x), z_k constant
        z_k = sol.samples[i]

        def strategy(p, xx):
            if gradient == "one_step":
                return cell(p, xx, z_k)
            z = z_k
            for _ in range(steps):
                z = z + tau * (cell(p, xx, z) - z)
            return z

        _, vjp = jax.vjp(strategy, p, xx)
        return vjp(jax.grad(head)(z_k))

    jac = jax.jit(jax.jacrev(lambda p, xx: jnp.stack(loss(p, xx)[0]), argnums=(0, 1)))
    all_grads = jac(params, x)
    for i in range(len(STEPS)):
        got = jax.tree_util.tree_map(lambda g, i=i: g[i], all_grads)
        want = by_hand(params, x, i)
        for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-13)
        assert max(float(jnp.max(jnp.abs(b))) for b in jax.tree_util.tree_leaves(want)) > 1e-3


def test_correction_loss_uses_deq_flow_weights_and_checks_arguments():
    np.testing.assert_allclose(dq.correction_weights(3), [0.64, 0.8, 1.0])
    losses = [jnp.asarray(2.0), jnp.asarray(3.0), jnp.asarray(5.0)]
    np.testing.assert_allclose(dq.correction_loss(losses), 0.64 * 2 + 0.8 * 3 + 5.0)
    np.testing.assert_allclose(dq.correction_loss(losses, gamma=0.5), 0.25 * 2 + 0.5 * 3 + 5.0)
    with pytest.raises(ValueError, match="scalar"):
        dq.correction_loss([jnp.ones(2)])
    sol = dq.solvers.anderson(jnp.cos, jnp.zeros(2))
    with pytest.raises(ValueError, match="sample_steps"):
        dq.correction_states(jnp.cos, sol)
    with pytest.raises(ValueError, match="gradient"):
        dq.correction_states(jnp.cos, sol, gradient="implicit")


class _Cell(hk.Module):
    def __call__(self, z, x):
        w = hk.get_parameter("w", [D, D], z.dtype, init=hk.initializers.RandomNormal(0.3))
        return jnp.tanh(z @ w + x)


@pytest.mark.parametrize("per_example", [True, "vmap", False])
def test_deq_exposes_samples_and_correction_states(per_example):
    steps = dq.uniform_sample_steps(30, 3)
    solver = functools.partial(dq.solvers.anderson, max_steps=30, tol=1e-10, sample_steps=steps)
    x = jax.random.normal(jax.random.PRNGKey(1), (4, D), jnp.float64)

    # "vmap": a solver that is not batch-native (a user's callable), so the DEQ vmaps
    # single-example solves.
    deq_solver = (lambda f, z0: solver(f, z0)) if per_example == "vmap" else solver

    def forward(x):
        out = dq.nn.DEQ(_Cell(), solver=deq_solver, per_example=bool(per_example)).solve(x)
        states = dq.correction_states(out.cell_fn, out.solution, gradient="one_step")
        loss = dq.correction_loss([jnp.mean(s**2) for s in states])
        return loss, out.solution, states

    t = hk.transform(forward)
    params = t.init(jax.random.PRNGKey(0), x)
    loss, sol, states = t.apply(params, None, x)
    # The sample axis follows the batch axes (init ran without a solve: _unsolved's samples).
    assert sol.samples.shape == ((4, 3, D) if per_example else (3, 4, D))
    axis = 1 if per_example else 0
    for i, s in enumerate(states):
        np.testing.assert_array_equal(s, jnp.take(sol.samples, i, axis=axis))
    # The last sample step (30) is never evaluated: it is the equilibrium.
    np.testing.assert_allclose(states[-1], sol.value, atol=1e-12)
    grads = jax.grad(lambda p: t.apply(p, None, x)[0])(params)
    g = jax.tree_util.tree_leaves(grads)[0]
    assert np.all(np.isfinite(g)) and float(jnp.max(jnp.abs(g))) > 1e-4
    # One-step gradient of the weighted loss, by hand, at the (constant) sampled iterates.
    (w,) = jax.tree_util.tree_leaves(params)
    if True:
        zs = [jax.lax.stop_gradient(s) for s in states]
        weights = dq.correction_weights(3)

        def by_hand(w):  # sum_k w_k (∂ℓ/∂z at z_k)ᵀ f_w(z_k): its gradient is the one-step one
            return sum(
                wk * jnp.sum(jax.grad(lambda z: jnp.mean(z**2))(z) * jnp.tanh(z @ w + x))
                for wk, z in zip(weights, zs)
            )

        np.testing.assert_allclose(g, jax.grad(by_hand)(w), rtol=1e-9, atol=1e-12)
