"""Broyden's method: full and limited memory, line search, blocked reads, the inverse estimate."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from deqjax import solvers
from deqjax._src.solvers import broyden_inverse
from tests.helpers.solver_problems import (
    KINDS,
    SCALES,
    assert_same_batch,
    dense_broyden,
    jitted_tanh_solve,
    mixed_batch_f,
    mixed_batch_problem,
    noncontractive_problem,
    scipy_root,
)


def test_broyden_full_and_limited_memory_converge():
    a, x = noncontractive_problem()
    z_star = scipy_root(a, x)
    full = jitted_tanh_solve("broyden", 1e-9, 100)(jnp.asarray(a), jnp.asarray(x))
    limited = jitted_tanh_solve("broyden", 1e-9, 100, memory=3)(jnp.asarray(a), jnp.asarray(x))
    for sol in (full, limited):
        assert sol.status == solvers.CONVERGED
        np.testing.assert_allclose(sol.value, z_star, atol=1e-8)
    # Only 3 of the updates are kept, so the ring buffer wraps and the run differs from full memory.
    assert int(limited.num_steps) > 4 and int(limited.num_steps) != int(full.num_steps)


def test_broyden_line_search_backtracks_and_converges():
    """On z - arctan(z) from far out the full Broyden step overshoots; backtracking changes it."""
    f = lambda z: z - jnp.arctan(z)  # noqa: E731
    z0 = jnp.asarray([5.0, -2.5])
    plain = solvers.broyden(f, z0, tol=1e-10, stop_mode="abs", max_steps=60)
    searched = solvers.broyden(f, z0, tol=1e-10, stop_mode="abs", max_steps=60, line_search=True)
    assert plain.status == searched.status == solvers.CONVERGED
    assert int(searched.num_steps) != int(plain.num_steps)
    np.testing.assert_allclose(searched.value, np.zeros(2), atol=1e-6)
    # A rejected trial is an evaluation like any other: the trace is not monotone there.
    n = int(searched.num_steps)
    assert np.any(np.diff(np.asarray(searched.trace[:n])) > 0)


def test_broyden_unlimited_memory_blocked_reads_equal_full_reads():
    """memory=None reads only the filled rows (blocks) on a while loop; scan reads all rows."""
    a, xs = mixed_batch_problem(1)
    f = mixed_batch_f(a, jnp.zeros(len(KINDS), jnp.int32), jnp.asarray(SCALES), xs)
    kwargs = dict(tol=1e-12, max_steps=60, stop_mode="abs", batch_ndim=1)
    blocked = jax.jit(lambda: solvers.broyden(f, jnp.zeros_like(xs), **kwargs))()
    full = jax.jit(lambda: solvers.broyden(f, jnp.zeros_like(xs), loop="scan", **kwargs))()
    assert_same_batch(blocked, full)
    assert np.all(np.asarray(blocked.status) == solvers.CONVERGED)


def test_hard_case_broyden_memory_10_converges_within_100_steps():
    """f = tanh(Wz + Ux + b), rho(W) = 1.5, d = 512, batch 128, float32, tol 1e-4 (rel). A ring
    buffer of 10 updates (evicting the oldest) left 23% of the batch unconverged after 100 steps;
    the restarting memory converges all of it."""
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
    assert np.all(np.asarray(sol.status) == solvers.CONVERGED), repr(sol)
    assert int(np.max(sol.num_steps)) < 100
    assert float(np.max(sol.rel_residual)) <= 1e-4


def test_return_inverse_puts_the_estimate_in_the_solution():
    """return_inverse puts a BroydenInverse in the Solution: ``memory`` rows, or with
    ``memory=None`` ``max_steps`` rounded up to whole blocks of 16 (read block by block); a
    batch-native solve checked every k > 1 steps has the same rows as one checked every step."""
    a = jnp.asarray([[0.3, 0.1], [-0.2, 0.4]])
    f = lambda z: a @ z + 1.0  # noqa: E731
    sol = solvers.Broyden(tol=1e-12, stop_mode="abs", return_inverse=True)(f, jnp.zeros(2))
    assert isinstance(sol.inverse_estimate, solvers.BroydenInverse)
    assert solvers.Broyden()(f, jnp.zeros(2)).inverse_estimate is None
    assert sol.inverse_estimate.valid.shape == (64,)
    limited = solvers.Broyden(tol=1e-12, memory=5, return_inverse=True)(f, jnp.zeros(2))
    assert limited.inverse_estimate.valid.shape == (5,)
    chunked = solvers.Broyden(tol=1e-12, memory=5, return_inverse=True, batch_ndim=1, check_every=4)
    valid = chunked(lambda z: z @ a.T + 1.0, jnp.zeros((3, 2))).inverse_estimate.valid
    assert valid.shape == (3, 5)


@pytest.mark.parametrize("memory", [3, None])
@pytest.mark.parametrize("batch_ndim", [0, 1])
def test_steps_only_form_equals_dense_broyden(memory, batch_ndim):
    """Without a line search the solver stores only its steps (Kelley's form); its iterates and
    final inverse estimate are those of the dense good-Broyden update, restarts included."""
    a, x = noncontractive_problem(d=6)
    steps = 10
    xs = np.stack([x, -0.5 * x])
    solver = solvers.Broyden(
        tol=0.0,
        max_steps=steps,
        memory=memory,
        return_inverse=True,
        sample_steps=tuple(range(steps)),
        batch_ndim=batch_ndim,
    )
    if batch_ndim:
        sols = [jax.jit(lambda: solver(lambda z: jnp.tanh(z @ a.T + xs), jnp.zeros((2, 6))))()]
    else:
        sols = [
            jax.jit(lambda x=x: solver(lambda z: jnp.tanh(a @ z + x), jnp.zeros(6)))() for x in xs
        ]
    for i, xi in enumerate(xs):
        sol = sols[0] if batch_ndim else sols[i]
        pick = (lambda t, i=i: t[i]) if batch_ndim else (lambda t: t)
        want_xs, want_h = dense_broyden(
            lambda z, xi=xi: np.tanh(a @ z + xi), np.zeros(6), steps, memory or steps
        )
        np.testing.assert_allclose(pick(sol.samples), want_xs, rtol=1e-10, atol=1e-12)
        estimate = jax.tree_util.tree_map(pick, sol.inverse_estimate)
        got_h = np.stack([broyden_inverse.inverse_matvec(estimate, e) for e in jnp.eye(6)], 1)
        np.testing.assert_allclose(got_h, want_h, rtol=1e-9, atol=1e-11)
        # The estimate is not just -I, and the restarts (memory 3) were exercised.
        assert np.max(np.abs(want_h + np.eye(6))) > 1e-2
