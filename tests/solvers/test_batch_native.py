"""Batch-native solvers (issue 15): ``batch_ndim`` solves equal the vmap of single solves."""

from __future__ import annotations

import functools

import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from deqjax import solvers

D = 6
CONFIGS = {
    "fixed_point_iteration": (solvers.fixed_point_iteration, {}),
    "anderson": (solvers.anderson, {}),
    "broyden": (solvers.broyden, {}),
    "broyden_memory3": (solvers.broyden, {"memory": 3}),
    "broyden_line_search": (solvers.broyden, {"line_search": True}),
    "broyden_memory3_line_search": (solvers.broyden, {"memory": 3, "line_search": True}),
}
# Kinds of example: 0 easy contraction, 1 hard contraction, 2 blowing up (2z + 1), 3 NaN from the
# first evaluation on, 4 NaN once the iterate's first entry passes 0.2 (a NaN mid-run).
KINDS = np.asarray([0, 1, 2, 3, 0, 1, 4, 1])
SCALES = np.asarray([0.2, 0.97, 1.0, 0.5, 0.5, 0.9, 0.8, 0.99])


def problem(seed: int = 0):
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(D, D))
    a = jnp.asarray(a / np.linalg.norm(a, 2))
    xs = jnp.asarray(rng.normal(size=(len(KINDS), D)))
    return a, xs


def cell(a, kind, scale, x, z):
    """One example's map (kind and scale select the example's character)."""
    contract = jnp.tanh(scale * (a @ z) + x)
    out = jnp.where(kind == 2, 2 * z + 1, contract)
    out = jnp.where(kind == 3, jnp.nan, out)
    return jnp.where((kind == 4) & (z[0] > 0.2), jnp.nan, out)


def batched_f(a, kinds, scales, xs):
    return lambda z: jax.vmap(functools.partial(cell, a))(kinds, scales, xs, z)


def assert_same(batch: solvers.Solution, ref: solvers.Solution, rtol: float = 1e-9):
    np.testing.assert_array_equal(batch.num_steps, ref.num_steps)
    np.testing.assert_array_equal(batch.status, ref.status)
    for field in ("value", "f_value"):
        for u, v in zip(
            jax.tree_util.tree_leaves(getattr(batch, field)),
            jax.tree_util.tree_leaves(getattr(ref, field)),
        ):
            np.testing.assert_allclose(u, v, rtol=rtol, atol=rtol)
    for field in ("abs_residual", "rel_residual", "trace"):
        u, v = np.asarray(getattr(batch, field)), np.asarray(getattr(ref, field))
        np.testing.assert_array_equal(np.isinf(u), np.isinf(v))
        np.testing.assert_allclose(u, v, rtol=1e-7, atol=1e-12)


@functools.cache
def compiled(config: str, stop_mode: str, max_steps: int, batch_ndim: int):
    solver, kwargs = CONFIGS[config]
    tol = 1e-10

    def run_batch(a, kinds, scales, xs):
        return solver(
            batched_f(a, kinds, scales, xs),
            jnp.zeros_like(xs),
            tol=tol,
            max_steps=max_steps,
            stop_mode=stop_mode,
            batch_ndim=batch_ndim,
            **kwargs,
        )

    def run_one(a, kind, scale, x):
        return solver(
            functools.partial(cell, a, kind, scale, x),
            jnp.zeros_like(x),
            tol=tol,
            max_steps=max_steps,
            stop_mode=stop_mode,
            **kwargs,
        )

    return jax.jit(run_batch), jax.jit(jax.vmap(run_one, in_axes=(None, 0, 0, 0)))


@pytest.mark.parametrize("stop_mode", ["abs", "rel", "mixed"])
@pytest.mark.parametrize("config", CONFIGS)
def test_batch_native_equals_vmap_on_mixed_batch(config, stop_mode):
    a, xs = problem()
    kinds, scales = jnp.asarray(KINDS), jnp.asarray(SCALES)
    run_batch, run_vmap = compiled(config, stop_mode, 40, 1)
    batch = run_batch(a, kinds, scales, xs)
    assert_same(batch, run_vmap(a, kinds, scales, xs))
    status = np.asarray(batch.status)
    # The batch really mixes outcomes, each example its own.
    assert status[3] == solvers.NONFINITE and int(batch.num_steps[3]) == 1
    assert solvers.CONVERGED in status
    assert len(set(np.asarray(batch.num_steps).tolist())) >= 3
    assert batch.trace.shape == (len(KINDS), 40) and batch.status.shape == (len(KINDS),)


@pytest.mark.parametrize("config", ["fixed_point_iteration", "anderson", "broyden"])
def test_non_finite_example_touches_no_other(config):
    """Replacing example 3 by a NaN-producing one leaves every other example bit-identical."""
    a, xs = problem()
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


def test_broyden_unlimited_memory_blocked_reads_equal_full_reads():
    """memory=None reads only the filled rows (blocks) on a while loop; scan reads all rows."""
    a, xs = problem(1)
    f = batched_f(a, jnp.zeros(len(KINDS), jnp.int32), jnp.asarray(SCALES), xs)
    kwargs = dict(tol=1e-12, max_steps=60, stop_mode="abs", batch_ndim=1)
    blocked = jax.jit(lambda: solvers.broyden(f, jnp.zeros_like(xs), **kwargs))()
    full = jax.jit(lambda: solvers.broyden(f, jnp.zeros_like(xs), loop="scan", **kwargs))()
    assert_same(blocked, full)
    assert np.all(np.asarray(blocked.status) == solvers.CONVERGED)


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
        assert_same(sol, ref, rtol=1e-5)
        assert solvers.status_name(sol.status)[1][2] == "converged"


def test_validation_names_leaf_shape_and_batch_ndim():
    f = lambda z: z  # noqa: E731
    with pytest.raises(ValueError, match=r"batch_ndim=2.*shape \[3\]"):
        solvers.anderson(f, jnp.zeros(3), batch_ndim=2)
    with pytest.raises(ValueError, match=r"share the leading batch axes \[4\].*\[5, 2\]"):
        solvers.broyden(f, {"a": jnp.zeros((4, 2)), "b": jnp.zeros((5, 2))}, batch_ndim=1)
    with pytest.raises(ValueError, match="batch_ndim"):
        solvers.fixed_point_iteration(f, jnp.zeros((2, 3)), batch_ndim=-1)
    with pytest.raises(ValueError, match="batch_ndim"):
        solvers.fixed_point_iteration(f, jnp.zeros((2, 3)), batch_ndim=True)


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


def test_hard_case_broyden_memory_10_converges_within_100_steps():
    """Issue 15: f = tanh(Wz + Ux + b), rho(W) = 1.5, d = 512, batch 128, float32, tol 1e-4 (rel).
    A ring buffer of 10 updates left 23% of the batch unconverged after 100 steps."""
    rng = np.random.default_rng(0)
    d, batch = 512, 128
    w = rng.normal(size=(d, d))
    w *= 1.5 / np.max(np.abs(np.linalg.eigvals(w)))
    u = rng.normal(size=(d, d)) / np.sqrt(d)
    b = 0.1 * rng.normal(size=d)
    x = rng.normal(size=(batch, d))
    inj = jnp.asarray(x @ u.T + b, jnp.float32)
    w = jnp.asarray(w, jnp.float32)
    sol = jax.jit(
        lambda: solvers.broyden(
            lambda z: jnp.tanh(z @ w.T + inj),
            jnp.zeros_like(inj),
            memory=10,
            max_steps=100,
            tol=1e-4,
            batch_ndim=1,
        )
    )()
    assert np.all(np.asarray(sol.status) == solvers.CONVERGED), solvers.status_name(sol.status)
    assert int(np.max(sol.num_steps)) < 100
    assert float(np.max(sol.rel_residual)) <= 1e-4


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
    assert_same(sol, vmapped(jnp.asarray(a), jnp.asarray(xs)), rtol=1e-8)


def test_repr_of_batched_solution_is_a_summary():
    a, xs = problem()
    run_batch, _ = compiled("anderson", "rel", 40, 1)
    text = repr(run_batch(a, jnp.asarray(KINDS), jnp.asarray(SCALES), xs))
    assert "nonfinite: 2" in text and "batch=(8,)" in text and "max abs_residual=" in text
    assert len(text) < 300  # no trace dump
