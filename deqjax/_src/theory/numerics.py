"""Float conventions shared by the theory modules: JAX's default float and guarded arithmetic."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.scipy.special import erf


def default_dtype() -> jnp.dtype:
    """JAX's default float: float64 under ``jax_enable_x64``, else float32."""
    return jnp.dtype(jnp.result_type(float))


def as_float(x) -> jax.Array:
    """``x`` as an array of :func:`default_dtype`."""
    return jnp.asarray(x, default_dtype())


def safe_inv_sqrt(q: jax.Array) -> jax.Array:
    """``1 / sqrt(q)``, ``inf`` at ``q <= 0`` (no NaN in either branch's gradient)."""
    return jnp.where(q > 0, 1.0 / jnp.sqrt(jnp.where(q > 0, q, 1.0)), jnp.inf)


def normal_cdf(x: jax.Array) -> jax.Array:
    """The standard normal CDF, exact at ``x = ±inf``."""
    return 0.5 * (1.0 + erf(x / math.sqrt(2.0)))


def normal_pdf(x: jax.Array) -> jax.Array:
    """The standard normal density, ``0`` at ``x = ±inf``."""
    finite = jnp.isfinite(x)
    return jnp.where(finite, jnp.exp(-0.5 * jnp.where(finite, x, 0.0) ** 2), 0.0) / math.sqrt(
        2.0 * math.pi
    )


def x_normal_pdf(x: jax.Array) -> jax.Array:
    """``x`` times the standard normal density, ``0`` at ``x = ±inf``."""
    return jnp.where(jnp.isfinite(x), x, 0.0) * normal_pdf(x)
