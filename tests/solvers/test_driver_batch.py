"""The driver's batches: ``batch_ndim`` solves equal the vmap of single solves, each problem
stopping on its own."""

from __future__ import annotations

import functools

import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from deqjax import solvers
from tests.helpers.lanes import default_first
from tests.helpers.solver_problems import (
    KINDS,
    SCALES,
    assert_same_batch,
    mixed_batch_cell,
    mixed_batch_f,
    mixed_batch_problem,
)

CONFIGS = {
    "fixed_point_iteration": (solvers.fixed_point_iteration, {}),
    "anderson": (solvers.anderson, {}),
    "broyden": (solvers.broyden, {}),
    "broyden_memory3": (solvers.broyden, {"memory": 3}),
    "broyden_line_search": (solvers.broyden, {"line_search": True}),
    "broyden_memory3_line_search": (solvers.broyden, {"memory": 3, "line_search": True}),
}


@functools.cache
def compiled(config: str, stop_mode: str, max_steps: int, batch_ndim: int):
    solver, kwargs = CONFIGS[config]
    tol = 1e-10

    def run_batch(a, kinds, scales, xs):
        return solver(
            mixed_batch_f(a, kinds, scales, xs),
            jnp.zeros_like(xs),
            tol=tol,
            max_steps=max_steps,
            stop_mode=stop_mode,
            batch_ndim=batch_ndim,
            **kwargs,
        )

    def run_one(a, kind, scale, x):
        return solver(
            functools.partial(mixed_batch_cell, a, kind, scale, x),
            jnp.zeros_like(x),
            tol=tol,
            max_steps=max_steps,
            stop_mode=stop_mode,
            **kwargs,
        )

    return jax.jit(run_batch), jax.jit(jax.vmap(run_one, in_axes=(None, 0, 0, 0)))


@pytest.mark.parametrize("stop_mode", default_first(["mixed", "abs", "rel"]))
@pytest.mark.parametrize("config", CONFIGS)
def test_batch_native_equals_vmap_on_mixed_batch(config, stop_mode):
    a, xs = mixed_batch_problem()
    kinds, scales = jnp.asarray(KINDS), jnp.asarray(SCALES)
    run_batch, run_vmap = compiled(config, stop_mode, 40, 1)
    batch = run_batch(a, kinds, scales, xs)
    assert_same_batch(batch, run_vmap(a, kinds, scales, xs))
    status = np.asarray(batch.status)
    # The batch really mixes outcomes, each example its own.
    assert status[3] == solvers.NONFINITE and int(batch.num_steps[3]) == 1
    assert solvers.CONVERGED in status
    assert len(set(np.asarray(batch.num_steps).tolist())) >= 3
    assert batch.trace.shape == (len(KINDS), 40) and batch.status.shape == (len(KINDS),)


@pytest.mark.parametrize("config", ["fixed_point_iteration", "anderson", "broyden"])
def test_non_finite_example_touches_no_other(config):
    """Replacing example 3 by a NaN-producing one leaves every other example bit-identical."""
    a, xs = mixed_batch_problem()
    run_batch, _ = compiled(config, "rel", 40, 1)
    kinds = jnp.asarray(KINDS)
    clean = run_batch(a, kinds.at[3].set(0).at[6].set(0), jnp.asarray(SCALES), xs)
    dirty = run_batch(a, kinds, jnp.asarray(SCALES), xs)
    keep = np.asarray([i for i in range(len(KINDS)) if i not in (3, 6)])
    for field in ("value", "f_value", "num_steps", "status", "abs_residual", "trace"):
        np.testing.assert_array_equal(
            np.asarray(getattr(clean, field))[keep], np.asarray(getattr(dirty, field))[keep]
        )
    assert np.asarray(dirty.status)[3] == solvers.NONFINITE
    assert np.all(np.isfinite(np.asarray(dirty.value)))


@pytest.mark.slow
def test_batch_ndim_2_and_pytree_state():
    """Two batch axes, and a state with several leaves (mixed dtypes) sharing them."""
    rng = np.random.default_rng(2)
    wa = jnp.asarray(0.5 * rng.normal(size=(3, 3)) / 3, jnp.float32)
    wb = jnp.asarray(0.5 * rng.normal(size=(4, 4)) / 4)
    xa = jnp.asarray(rng.normal(size=(2, 3, 3)), jnp.float32)

    def one(z, xa):
        a, b = z["a"], z["b"]
        new_a = jnp.tanh(wa @ a + xa + 0.1 * jnp.mean(b).astype(jnp.float32))
        new_b = 0.5 * jnp.cos(b @ wb) + 0.1 * jnp.sum(a).astype(jnp.float64)
        return {"a": new_a, "b": new_b}

    def f(z):
        return jax.vmap(jax.vmap(one))(z, xa)

    z0 = {"a": jnp.zeros((2, 3, 3), jnp.float32), "b": jnp.zeros((2, 3, 2, 4))}
    for name in ("fixed_point_iteration", "anderson", "broyden"):
        solver = functools.partial(getattr(solvers, name), tol=1e-6, max_steps=50)
        sol = solver(f, z0, batch_ndim=2)
        assert sol.status.shape == (2, 3) and sol.trace.shape == (2, 3, 50)
        assert sol.value["a"].dtype == jnp.float32 and sol.abs_residual.dtype == jnp.float64
        assert np.all(np.asarray(sol.status) == solvers.CONVERGED)
        solve_one = lambda z, x, solver=solver: solver(lambda u: one(u, x), z)  # noqa: E731
        ref = jax.vmap(jax.vmap(solve_one))(z0, xa)
        assert_same_batch(sol, ref, rtol=1e-5)
        assert solvers.status_name(sol.status[1, 2]) == "converged"


@pytest.mark.parametrize("name", ["fixed_point_iteration", "anderson", "broyden"])
def test_grad_through_scan_loop_equals_vmap(name):
    solver = getattr(solvers, name)
    rng = np.random.default_rng(5)
    a = jnp.asarray(0.5 * rng.normal(size=(4, 4)) / 4)
    xs = jnp.asarray(rng.normal(size=(3, 4)))
    w = jnp.asarray(rng.normal(size=(3, 4)))

    def loss_batch(xs):
        f = lambda z: jnp.tanh(z @ a.T + xs)  # noqa: E731
        sol = solver(f, jnp.zeros_like(xs), tol=1e-12, max_steps=25, loop="scan", batch_ndim=1)
        return jnp.sum(w * sol.value)

    def loss_vmap(xs):
        def one(x):
            return solver(
                lambda z: jnp.tanh(a @ z + x), jnp.zeros(4), tol=1e-12, max_steps=25, loop="scan"
            ).value

        return jnp.sum(w * jax.vmap(one)(xs))

    g_batch = jax.jit(jax.grad(loss_batch))(xs)
    np.testing.assert_allclose(g_batch, jax.jit(jax.grad(loss_vmap))(xs), rtol=1e-8, atol=1e-10)
    assert np.all(np.isfinite(g_batch))


@functools.cache
def property_solvers(name: str):
    solver = getattr(solvers, name)

    def batch(a, xs):
        f = lambda z: jnp.tanh(jnp.einsum("bij,bj->bi", a, z) + xs)  # noqa: E731
        return solver(f, jnp.zeros_like(xs), tol=1e-9, max_steps=100, batch_ndim=1)

    def one(a, x):
        return solver(lambda z: jnp.tanh(a @ z + x), jnp.zeros_like(x), tol=1e-9, max_steps=100)

    return jax.jit(batch), jax.jit(jax.vmap(one))


@hypothesis.settings(max_examples=15, deadline=None, derandomize=True)
@hypothesis.given(
    seed=st.integers(0, 2**31 - 1),
    name=st.sampled_from(["fixed_point_iteration", "anderson", "broyden"]),
    norms=st.lists(st.floats(0.05, 0.9), min_size=4, max_size=4),
)
def test_property_random_contractive_maps_batch_equals_vmap(seed, name, norms):
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(4, 5, 5))
    a *= (np.asarray(norms) / np.linalg.norm(a, 2, axis=(1, 2)))[:, None, None]
    xs = rng.normal(size=(4, 5))
    batch, vmapped = property_solvers(name)
    sol = batch(jnp.asarray(a), jnp.asarray(xs))
    assert np.all(np.asarray(sol.status) == solvers.CONVERGED)
    assert_same_batch(sol, vmapped(jnp.asarray(a), jnp.asarray(xs)), rtol=1e-8)
