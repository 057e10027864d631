"""Shared by the random-matrix and initializer tests: an eigenvalue law and the scale convention."""

import jax
import jax.numpy as jnp
import numpy as np

from deqjax import initializers

F64 = jnp.float64


def disk(key, n):
    """Eigenvalues uniform on the unit disc (complex)."""
    k1, k2 = jax.random.split(key)
    r = jnp.sqrt(jax.random.uniform(k1, (n,), F64))
    theta = 2.0 * jnp.pi * jax.random.uniform(k2, (n,), F64)
    return jax.lax.complex(r * jnp.cos(theta), r * jnp.sin(theta))


def mean_square(w):
    """(1/fan_out) tr(M^T M) for the [fan_in, fan_out] matrix M."""
    fan_in, fan_out = initializers.matrix_dims(w.shape)
    m = np.asarray(w, np.float64).reshape(fan_in, fan_out)
    return float(np.sum(m * m) / fan_out)
