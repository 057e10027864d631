"""Small fixed-point problems and their exact implicit gradients by dense linear algebra.

The references of the gradient tests (DEQ paper, Theorem 1): ``dℓ/dθ = uᵀ ∂f/∂θ`` with
``(I − J_f(z*))ᵀ u = ∂ℓ/∂z*``, ``J_f`` formed densely in float64.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

import deqjax as dq


def dense_implicit_grad(f, params, x, z_star, loss_of_z):
    """``dℓ/dparams`` at the fixed point ``z* = f(params, x, z*)`` (a vector ``z*``).

    DEQ paper Theorem 1: ``uᵀ ∂f/∂θ`` with ``(I − J_f(z*))ᵀ u = ∂ℓ/∂z*``, ``J_f`` formed densely.
    """
    jac = jax.jacobian(f, argnums=2)(params, x, z_star)
    u = jnp.linalg.solve((jnp.eye(z_star.size) - jac).T, jax.grad(loss_of_z)(z_star))
    _, vjp = jax.vjp(lambda p: f(p, x, z_star), params)
    return vjp(u)[0]


# --- a tanh layer z = tanh(W z + b + x) ---------------------------------------------------------


def tanh_cell(p, x, z):
    return jnp.tanh(p["W"] @ z + p["b"] + x)


def loss_of_z(z):
    return jnp.sum(jnp.sin(z)) + 0.5 * jnp.sum(z**2)


def contractive_problem(seed=0, d=5, radius=0.6):
    """``(params, x)`` with ``W`` of spectral radius ``radius``: every solver converges."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(d, d))
    w *= radius / np.max(np.abs(np.linalg.eigvals(w)))
    p = {"W": jnp.asarray(w), "b": jnp.asarray(rng.normal(size=d))}
    return p, jnp.asarray(rng.normal(size=d))


def flip_problem(seed=0, lam=-0.97, d=6):
    """W = Q diag(lam, small...) Qᵀ: J = diag(tanh') W has an eigenvalue near lam ≈ −1, where
    fixed-point iteration cannot solve the backward."""
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    eig = np.concatenate([[lam], rng.uniform(-0.3, 0.3, size=d - 1)])
    w = (q * eig) @ q.T
    p = {"W": jnp.asarray(w), "b": jnp.asarray(0.05 * rng.normal(size=d))}
    return p, jnp.asarray(0.05 * rng.normal(size=d))


TIGHT_BROYDEN = functools.partial(dq.solvers.broyden, tol=1e-15, max_steps=200)


def dense_reference(p, x, solver=TIGHT_BROYDEN):
    """``(dℓ/dp, dℓ/dx)`` of ``loss_of_z`` from a dense solve of ``(I − J)ᵀ u = g`` at the ``z*``
    that ``solver`` finds from 0 (float64)."""
    z = solver(lambda z: tanh_cell(p, x, z), jnp.zeros_like(x)).value
    jac = jax.jacobian(lambda z: tanh_cell(p, x, z))(z)
    u = jnp.linalg.solve((jnp.eye(z.size) - jac).T, jax.grad(loss_of_z)(z))
    _, vjp = jax.vjp(lambda p, x: tanh_cell(p, x, z), p, x)
    return vjp(u)


def tanh_grad(solver, adjoint):
    """``jit(grad)`` in ``(p, x)`` of ``loss_of_z(z*)`` for the tanh layer, solved from 0."""

    def loss(p, x):
        z, _ = dq.fixed_point(tanh_cell, p, x, jnp.zeros_like(x), solver=solver, adjoint=adjoint)
        return loss_of_z(z)

    return jax.jit(jax.grad(loss, argnums=(0, 1)))


# --- z = cos(z) + θ, θ = [0, π/2]: J has the eigenvalue −sin z₂ ≈ −1 ----------------------------


def cos_cell(theta, x, z):
    del x
    return jnp.cos(z) + theta


THETA = jnp.array([0.0, np.pi / 2])
FPI_4000 = functools.partial(dq.solvers.fixed_point_iteration, max_steps=4000, tol=1e-6)


def rel_err(a, b):
    """Largest absolute difference of two pytrees over the largest entry of ``b``."""
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    num = max(float(jnp.max(jnp.abs(u - v))) for u, v in zip(la, lb))
    return num / max(float(jnp.max(jnp.abs(v))) for v in lb)


def small_cell(p, x, z):
    """``tanh(W z + x)`` on one example: the smallest DEQ cell."""
    return jnp.tanh(p @ z + x)


def small_problem(d=4):
    """``(W, x, z0)`` of :func:`small_cell`: a contraction, a ramp input, a zero start."""
    w = 0.4 * jax.random.normal(jax.random.PRNGKey(1), (d, d)) / np.sqrt(d)
    return w, jnp.linspace(-1.0, 1.0, d), jnp.zeros(d)
