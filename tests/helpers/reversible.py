"""Problems shared by the reversible solver's and the reversible adjoint's tests."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

import deqjax as dq

D = 8


def affine_problem(d=D, scale=0.5, seed=0, dtype=jnp.float64):
    """``f(z) = A z + b`` with ``||A||_2 = scale``: the fixed point is ``(I - A)^{-1} b``."""
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(d, d))
    a *= scale / np.linalg.norm(a, 2)
    b = rng.normal(size=d)
    return jnp.asarray(a, dtype), jnp.asarray(b, dtype)


def tanh_params(d=D, scale=0.6, seed=0, dtype=jnp.float64):
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(d, d))
    w *= scale / np.linalg.norm(w, 2)
    return {"W": jnp.asarray(w, dtype), "b": jnp.asarray(0.1 * rng.normal(size=d), dtype)}


def tanh_cell(p, x, z):
    """Works for one example (z: [d]) and a batch (z: [B, d])."""
    return jnp.tanh(z @ p["W"].T + x + jnp.broadcast_to(p["b"], z.shape))


def rel(a, b):
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    num = max(float(jnp.max(jnp.abs(u - v))) for u, v in zip(la, lb))
    return num / max(float(jnp.max(jnp.abs(v))) for v in lb)


def solver(**kw):
    return functools.partial(dq.solvers.reversible, **kw)
