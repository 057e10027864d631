"""The implicit gradient of a complex fixed point: real losses against dense solves.

JAX's convention for a real loss ``L`` of a complex ``w``: ``jax.grad`` returns the cotangent
``ct_w`` with ``dL = Re(sum ct_w * dw)`` (no conjugation), i.e. the CONJUGATE of the steepest-
ascent direction ``2 dL/d conj(w)``; ``jax.vjp`` of ``z -> A z`` is ``ct -> A^T ct`` (the plain
transpose). With ``z* = f(theta, x, z*)`` the implicit function theorem then reads
``u = g + J^T u`` (``J^T`` the VJP of ``f`` in ``z``, ``g`` the cotangent of ``z*``) and
``ct_theta = u^T df/dtheta``: exactly the real-state backward, with no conjugation added
(``deqjax._src.adjoints.implicit``). For the affine cell ``f = A z + b e^{i t} + x`` and
``L = sum |z|^2 + Re(<c, z>)``:

    g = 2 conj(z*) + conj(c),  u = (I - A)^{-T} g,
    ct_A = u z*^T,  ct_b = e^{i t} u,  ct_x = u,  ct_t = Re(sum u * i b e^{i t}).

Each gradient is checked against these dense formulas, against ``jax.grad`` through a long
unrolled fixed-point iteration (the reference that needs no convention at all), and by
``jax.test_util.check_grads`` (finite differences) in reverse mode.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import deqjax as dq
from tests.helpers.lanes import default_first

N = 5
TOL = 1e-12


def _problem(seed=0, radius=0.7, batch=None):
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(N, N)) + 1j * rng.normal(size=(N, N))
    a = radius * a / np.max(np.abs(np.linalg.eigvals(a)))
    shape = (N,) if batch is None else (batch, N)
    b = rng.normal(size=N) + 1j * rng.normal(size=N)
    x = rng.normal(size=shape) + 1j * rng.normal(size=shape)
    c = rng.normal(size=shape) + 1j * rng.normal(size=shape)
    params = {"A": jnp.asarray(a), "b": jnp.asarray(b), "t": jnp.asarray(0.3)}
    return params, jnp.asarray(x), jnp.asarray(c)


def _phase(t):
    return jnp.exp(1j * t.astype(jnp.complex128))


def affine(p, x, z):
    """``A z + b e^{i t} + x`` (rows of ``z`` and ``x`` for a batch)."""
    shift = (p["b"] * _phase(p["t"])).reshape((1,) * (z.ndim - 1) + (N,))
    return z @ p["A"].T + shift + x


def holomorphic(p, x, z):
    """A holomorphic nonlinear cell."""
    return 0.8 * jnp.tanh(z @ p["A"].T) + p["b"] * _phase(p["t"]) + 0.5 * x


def nonholomorphic(p, x, z):
    """A cell through ``conj(z)`` (``|z|^2 / (1 + |z|^2)``), as complex-valued networks'
    activations are: its Jacobian is only real-linear."""
    m = z * jnp.conj(z)
    return z @ p["A"].T + 0.5 * _phase(p["t"]) * m / (1 + m) + p["b"] + 0.5 * x


def _loss(z, c):
    return jnp.sum(jnp.abs(z) ** 2) + jnp.real(jnp.vdot(c, z))


def dense_gradient(params, x, c):
    """The implicit-function-theorem gradient of ``_loss`` for :func:`affine`, densely (JAX's
    convention, see the module docstring); ``(ct_params, ct_x)``."""
    a, b = np.asarray(params["A"]), np.asarray(params["b"])
    phase = np.exp(1j * float(params["t"]))
    m = np.eye(N) - a
    z = np.linalg.solve(m, b * phase + np.asarray(x))
    g = 2 * np.conj(z) + np.conj(np.asarray(c))
    u = np.linalg.solve(m.T, g)
    ct_t = np.real(np.sum(u * 1j * b * phase))
    return {"A": np.outer(u, z), "b": phase * u, "t": ct_t}, u


def unrolled_gradient(cell, params, x, c, steps=600):
    """``jax.grad`` through ``steps`` plain iterations from 0 (converged in complex128)."""

    def loss(p, x):
        z = jax.lax.fori_loop(0, steps, lambda _, z: cell(p, x, z), jnp.zeros_like(x))
        return _loss(z, c)

    return jax.grad(loss, argnums=(0, 1))(params, x)


def _assert_trees_close(got, want, atol):
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=0, atol=atol)


FORWARD = {
    "FixedPointIteration": dq.solvers.FixedPointIteration(max_steps=400, tol=TOL),
    "Anderson": dq.solvers.Anderson(max_steps=100, tol=TOL),
    "Broyden": dq.solvers.Broyden(max_steps=100, tol=TOL),
    "Broyden(memory=3, line_search)": dq.solvers.Broyden(
        max_steps=100, tol=TOL, memory=3, line_search=True
    ),
}
BACKWARD = {
    "forward's": None,
    "GMRES": dq.solvers.GMRES(tol=TOL),
    "BiCGStab": dq.solvers.BiCGStab(tol=TOL),
    "NormalCG": dq.solvers.NormalCG(tol=TOL),
}


def _implicit_grad(cell, params, x, c, solver, backward=None, fallback=None):
    adjoint = dq.ImplicitAdjoint(solver=backward, fallback=fallback)
    probe = dq.BackwardStats.zeros(jnp.float64)

    def loss(p, x, probe):
        z, _ = dq.fixed_point(
            cell, p, x, jnp.zeros_like(x), solver=solver, adjoint=adjoint, backward_stats=probe
        )
        return _loss(z, c)

    g_p, g_x, stats = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(params, x, probe)
    assert float(stats.failures) == 0.0 and float(stats.count) == 1.0
    return g_p, g_x


@pytest.mark.parametrize("forward", list(FORWARD))
@pytest.mark.parametrize("backward", default_first(BACKWARD))
def test_affine_gradient_equals_dense_implicit_function_theorem(forward, backward):
    params, x, c = _problem()
    got = _implicit_grad(affine, params, x, c, FORWARD[forward], BACKWARD[backward])
    want_p, want_x = dense_gradient(params, x, c)
    _assert_trees_close(got, (want_p, want_x), atol=1e-9)


def test_dense_formulas_agree_with_unrolled_autodiff():
    """The dense reference itself, against plain autodiff through the iteration."""
    params, x, c = _problem()
    want_p, want_x = dense_gradient(params, x, c)
    _assert_trees_close(unrolled_gradient(affine, params, x, c), (want_p, want_x), atol=1e-9)


@pytest.mark.parametrize("forward", ["Anderson", "Broyden"])
@pytest.mark.parametrize("backward", default_first(BACKWARD))
def test_holomorphic_cell_gradient_equals_unrolled(forward, backward):
    params, x, c = _problem(seed=1)
    got = _implicit_grad(holomorphic, params, x, c, FORWARD[forward], BACKWARD[backward])
    _assert_trees_close(got, unrolled_gradient(holomorphic, params, x, c), atol=1e-9)


# BiCGStab's recurrences and GMRES's Krylov space need a complex-linear adjoint map; a
# non-holomorphic cell's is only real-linear (GMRES is left out: it reaches tol through its
# restarts' true residuals, slowly). NormalCG works with real step sizes and the real inner
# product, and the fixed-point solvers make no linearity assumption.
@pytest.mark.slow
@pytest.mark.parametrize("forward", list(FORWARD))
@pytest.mark.parametrize("backward", ["forward's", "NormalCG"])
def test_nonholomorphic_cell_gradient_equals_unrolled(forward, backward):
    params, x, c = _problem(seed=2, radius=0.5)
    got = _implicit_grad(nonholomorphic, params, x, c, FORWARD[forward], BACKWARD[backward])
    _assert_trees_close(got, unrolled_gradient(nonholomorphic, params, x, c), atol=1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("cell", [affine, nonholomorphic], ids=["affine", "nonholomorphic"])
def test_check_grads_reverse_mode(cell):
    params, x, c = _problem(seed=3, radius=0.5)
    solver = dq.solvers.Anderson(max_steps=100, tol=1e-13, stop_mode="abs")

    def loss(a, b, t, x):
        p = {"A": a, "b": b, "t": t}
        z, _ = dq.fixed_point(cell, p, x, jnp.zeros_like(x), solver=solver)
        return _loss(z, c)

    check_grads(loss, (params["A"], params["b"], params["t"], x), order=1, modes=["rev"], eps=1e-6)


def test_batch_native_gradient_equals_per_example_dense():
    batch = 3
    params, x, c = _problem(seed=4, batch=batch)
    solver = dq.solvers.Anderson(max_steps=100, tol=TOL, batch_ndim=1)

    def loss(p, x):
        z, _ = dq.fixed_point(affine, p, x, jnp.zeros_like(x), solver=solver)
        return _loss(z, c)

    g_p, g_x = jax.jit(jax.grad(loss, argnums=(0, 1)))(params, x)
    wants = [dense_gradient(params, x[i], c[i]) for i in range(batch)]
    np.testing.assert_allclose(g_x, np.stack([w[1] for w in wants]), atol=1e-9)
    for key in ("A", "b", "t"):
        np.testing.assert_allclose(g_p[key], sum(w[0][key] for w in wants), atol=1e-9)


def test_vmap_of_gradient_equals_per_example_dense():
    batch = 3
    params, x, c = _problem(seed=5, batch=batch)
    solver = dq.solvers.Broyden(max_steps=100, tol=TOL)

    def loss(p, xi, ci):
        z, _ = dq.fixed_point(affine, p, xi, jnp.zeros_like(xi), solver=solver)
        return _loss(z, ci)

    g_p, g_x = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1)), in_axes=(None, 0, 0)))(params, x, c)
    for i in range(batch):
        want_p, want_x = dense_gradient(params, x[i], c[i])
        np.testing.assert_allclose(g_x[i], want_x, atol=1e-9)
        np.testing.assert_allclose(g_p["A"][i], want_p["A"], atol=1e-9)


@pytest.mark.slow
def test_complex64_gradient_smoke():
    params, x, c = _problem(seed=6)
    p32 = {"A": params["A"].astype(jnp.complex64), "b": params["b"].astype(jnp.complex64)}
    p32["t"] = params["t"].astype(jnp.float32)

    def cell(p, x, z):
        return z @ p["A"].T + p["b"] * jnp.exp(1j * p["t"].astype(jnp.complex64)) + x

    def loss(p, x):
        z, _ = dq.fixed_point(cell, p, x, jnp.zeros_like(x), solver=dq.solvers.Anderson(tol=1e-6))
        return jnp.sum(jnp.abs(z) ** 2) + jnp.real(jnp.vdot(c.astype(jnp.complex64), z))

    g_p, g_x = jax.grad(loss, argnums=(0, 1))(p32, x.astype(jnp.complex64))
    assert g_x.dtype == jnp.complex64 and g_p["t"].dtype == jnp.float32
    want_p, want_x = dense_gradient(params, x, c)
    scale = np.max(np.abs(want_x))
    np.testing.assert_allclose(g_x, want_x, atol=1e-4 * scale)
    np.testing.assert_allclose(g_p["A"], want_p["A"], atol=1e-4 * np.max(np.abs(want_p["A"])))


@pytest.mark.parametrize(
    "adjoint, solver",
    [
        (dq.UnrolledAdjoint(), dq.solvers.FixedPointIteration(max_steps=300, tol=TOL)),
        (dq.ShineAdjoint(), dq.solvers.Broyden(max_steps=60, tol=TOL)),
    ],
    ids=["unrolled", "shine"],
)
def test_other_adjoints_agree_on_the_affine_cell(adjoint, solver):
    params, x, c = _problem(seed=7)

    def loss(p, x):
        z, _ = dq.fixed_point(affine, p, x, jnp.zeros_like(x), solver=solver, adjoint=adjoint)
        return _loss(z, c)

    got = jax.jit(jax.grad(loss, argnums=(0, 1)))(params, x)
    _assert_trees_close(got, dense_gradient(params, x, c), atol=1e-8)
