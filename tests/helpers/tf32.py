"""A cell whose products behave like an NVIDIA GPU's at JAX's default precision, on any backend.

At JAX's default matmul precision a GPU multiplies float32 in TF32: each operand is rounded to
10 mantissa bits. :func:`tf32_cell` does that rounding itself (``jax.lax.reduce_precision``)
unless the matmul precision in force while it is traced is a full one, so the CPU reproduces the
GPU's numbers (the H200's relative residual floor of 3.6e-4 for a tanh layer at tol 1e-4) and the
tests of honest convergence run without a GPU. It reads the precision the way a GPU's products
do: ``precision="highest"`` on ``dq.fixed_point`` (or the ambient setting) makes it exact.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from deqjax._src import precision as precision_lib


def tf32(a: jax.Array) -> jax.Array:
    """``a`` rounded as a TF32 product rounds its operands, unless the precision is full."""
    if precision_lib.is_full(precision_lib.ambient()):
        return a
    return jax.lax.reduce_precision(a, exponent_bits=8, mantissa_bits=10)


def tf32_cell(p, x, z):
    """``tanh(z Wᵀ + x Uᵀ + b)`` on a batch ``[B, d]``, its products TF32-rounded."""
    pre = tf32(z) @ tf32(p["W"]).T + tf32(x) @ tf32(p["U"]).T
    return jnp.tanh(pre + p["b"][None])


def tanh_layer(d: int, batch: int, radius: float = 1.0, seed: int = 0):
    """float32 parameters and inputs of the tanh layer, ``W`` of spectral radius ``radius``
    (the loop-cost benchmark's problem)."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(d, d))
    w *= radius / np.max(np.abs(np.linalg.eigvals(w)))
    params = {
        "W": jnp.asarray(w, jnp.float32),
        "U": jnp.asarray(rng.normal(size=(d, d)) / np.sqrt(d), jnp.float32),
        "b": jnp.asarray(0.1 * rng.normal(size=d), jnp.float32),
    }
    return params, jnp.asarray(rng.normal(size=(batch, d)), jnp.float32)


def rel_residual_f64(p, x, z) -> np.ndarray:
    """``‖f(z) − z‖ / ‖f(z)‖`` per example, recomputed in float64 numpy."""
    q = {k: np.asarray(v, np.float64) for k, v in p.items()}
    x, z = np.asarray(x, np.float64), np.asarray(z, np.float64)
    fz = np.tanh(z @ q["W"].T + x @ q["U"].T + q["b"])
    return np.linalg.norm(fz - z, axis=-1) / np.linalg.norm(fz, axis=-1)
