"""Problems with known answers and comparisons of Solutions, shared by the solver tests."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import scipy.optimize

from deqjax import solvers

# The driver's fixed-point solvers (function forms) and the accelerated ones among them.
SOLVERS = {
    "fixed_point_iteration": solvers.fixed_point_iteration,
    "anderson": solvers.anderson,
    "broyden": solvers.broyden,
}
ACCELERATED = ["anderson", "broyden"]
COS_FIXED_POINT = 0.7390851332151607


def tanh_map(a, x):
    return lambda z: jnp.tanh(a @ z + x)


def contractive_matrix(rng: np.random.Generator, d: int, norm: float) -> np.ndarray:
    """A Gaussian matrix rescaled to spectral norm ``norm`` (so tanh(Az + x) is a contraction)."""
    a = rng.normal(size=(d, d))
    return a * (norm / np.linalg.norm(a, 2))


def noncontractive_problem(d: int = 10, seed: int = 0):
    """Symmetric A with eigenvalues evenly in [-1.5, 0.5]; x small, so tanh is nearly linear."""
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    a = q @ np.diag(np.linspace(-1.5, 0.5, d)) @ q.T
    x = 0.5 * rng.normal(size=d)
    return a, x


def scipy_root(a: np.ndarray, x: np.ndarray) -> np.ndarray:
    g = lambda z: np.tanh(a @ z + x) - z  # noqa: E731
    sol = scipy.optimize.root(g, np.zeros_like(x), tol=1e-14)
    # (hybr may report "xtol too small" at this tolerance; what matters is the residual.)
    assert np.linalg.norm(g(sol.x)) < 1e-12, sol.message
    return sol.x


def residuals(f, value):
    """(abs, rel) residual of ``value`` recomputed in float64 numpy."""
    fv = jax.tree_util.tree_leaves(f(value))
    v = jax.tree_util.tree_leaves(value)
    g2 = sum(
        np.sum((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2) for a, b in zip(fv, v)
    )
    f2 = sum(np.sum(np.asarray(a, np.float64) ** 2) for a in fv)
    return np.sqrt(g2), np.sqrt(g2) / (np.sqrt(f2) + 1e-30)


def assert_solutions_equal(a: solvers.Solution, b: solvers.Solution, rtol: float = 1e-12):
    np.testing.assert_array_equal(a.num_steps, b.num_steps)
    np.testing.assert_array_equal(a.status, b.status)
    for u, v in zip(jax.tree_util.tree_leaves(a.value), jax.tree_util.tree_leaves(b.value)):
        np.testing.assert_allclose(u, v, rtol=rtol, atol=rtol)
    np.testing.assert_allclose(a.abs_residual, b.abs_residual, rtol=1e-8, atol=1e-14)
    np.testing.assert_allclose(a.rel_residual, b.rel_residual, rtol=1e-8, atol=1e-14)
    # Equal +inf positions; finite entries close.
    np.testing.assert_array_equal(np.isinf(a.trace), np.isinf(b.trace))
    np.testing.assert_allclose(a.trace, b.trace, rtol=1e-8, atol=1e-14)


@functools.cache
def jitted_tanh_solve(name: str, tol: float, max_steps: int, stop_mode: str = "abs", **kwargs):
    """One compiled solve of tanh(Az + x) per configuration, reused across seeds."""

    def run(a, x):
        return SOLVERS[name](
            tanh_map(a, x),
            jnp.zeros_like(x),
            tol=tol,
            max_steps=max_steps,
            stop_mode=stop_mode,
            **kwargs,
        )

    return jax.jit(run)


# --- a batch of problems of different characters (batch-native solves) --------------------------

D = 6
# Kinds of example: 0 easy contraction, 1 hard contraction, 2 blowing up (2z + 1), 3 NaN from the
# first evaluation on, 4 NaN once the iterate's first entry passes 0.2 (a NaN mid-run).
KINDS = np.asarray([0, 1, 2, 3, 0, 1, 4, 1])
SCALES = np.asarray([0.2, 0.97, 1.0, 0.5, 0.5, 0.9, 0.8, 0.99])


def mixed_batch_problem(seed: int = 0):
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(D, D))
    a = jnp.asarray(a / np.linalg.norm(a, 2))
    xs = jnp.asarray(rng.normal(size=(len(KINDS), D)))
    return a, xs


def mixed_batch_cell(a, kind, scale, x, z):
    """One example's map (kind and scale select the example's character)."""
    contract = jnp.tanh(scale * (a @ z) + x)
    out = jnp.where(kind == 2, 2 * z + 1, contract)
    out = jnp.where(kind == 3, jnp.nan, out)
    return jnp.where((kind == 4) & (z[0] > 0.2), jnp.nan, out)


def mixed_batch_f(a, kinds, scales, xs):
    return lambda z: jax.vmap(functools.partial(mixed_batch_cell, a))(kinds, scales, xs, z)


def assert_same_batch(batch: solvers.Solution, ref: solvers.Solution, rtol: float = 1e-9):
    """A batch-native Solution equals the reference (e.g. the vmap of single solves)."""
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


def dense_broyden(f, z0, steps, memory, dtype=np.float64):
    """Broyden's good method with a dense inverse (numpy, ``dtype`` float64 or complex128):
    ``H <- H + (s - H y) s^H H / (s^H H y)``; the iterates ``x_0 .. x_{steps - 1}`` and the
    inverse after the last update. Every ``memory`` updates the inverse restarts from ``-I`` and
    the pending update is applied to it."""
    x, h = np.asarray(z0, dtype), -np.eye(len(z0), dtype=dtype)
    xs, x_prev, g_prev = [], None, None
    for k in range(steps):
        xs.append(x)
        g = np.asarray(f(x), dtype) - x
        if k > 0:
            if (k - 1) % memory == 0:
                h = -np.eye(len(z0), dtype=dtype)
            dx, dy = x - x_prev, g - g_prev
            h_dy = h @ dy
            denom = np.conj(dx) @ h_dy
            assert abs(denom) > 1e-200  # no update is skipped on these problems
            h = h + np.outer(dx - h_dy, np.conj(dx) @ h) / denom
        x_prev, g_prev = x, g
        x = x - h @ g
    return np.stack(xs), h
