"""The activation ``phi`` by name or as a callable: resolution to ``(phi, phi')``, validation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from deqjax import theory
from deqjax._src.theory import activations

NUMPY = {
    "tanh": np.tanh,
    "relu": lambda v: np.maximum(v, 0.0),
    "hardtanh": lambda v: np.clip(v, -1.0, 1.0),
    "linear": lambda v: v,
}


@pytest.mark.parametrize("name", theory.PHI_NAMES)
def test_named_activations_and_their_derivatives(name):
    fn, dphi = activations.activation(name)
    h = jnp.linspace(-3.0, 3.0, 13, dtype=jnp.float64) + 0.05  # no point at a kink (0, +-1)
    np.testing.assert_allclose(fn(h), NUMPY[name](np.asarray(h)), rtol=1e-12)
    np.testing.assert_allclose(dphi(h), jax.vmap(jax.grad(fn))(h), rtol=1e-12)


def test_callable_derivative_by_grad():
    fn, dphi = activations.activation(jax.nn.softplus)
    h = jnp.linspace(-2.0, 2.0, 5, dtype=jnp.float64).reshape(5, 1)
    np.testing.assert_allclose(dphi(h), jax.nn.sigmoid(h), rtol=1e-12)
    assert fn is jax.nn.softplus


def test_unknown_phi_raises():
    with pytest.raises(ValueError, match="phi"):
        theory.mean_field_variance(0.5, "goe", "sigmoid")
    with pytest.raises(ValueError, match="phi"):
        theory.spectral_radius(0.5, "goe", 1.0, 3.0)
