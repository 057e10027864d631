"""Guarded arithmetic of the theory: the normal density and CDF at +-inf, 1/sqrt(q) at q = 0."""

import math

import jax
import jax.numpy as jnp
import numpy as np

from deqjax._src.theory import numerics


def test_normal_functions_at_infinity_and_inside():
    x = jnp.asarray([-jnp.inf, -1.0, 0.0, 2.0, jnp.inf])
    cdf = [0.0, 0.5 * math.erfc(1 / math.sqrt(2)), 0.5, 1 - 0.5 * math.erfc(math.sqrt(2)), 1.0]
    np.testing.assert_allclose(numerics.normal_cdf(x), cdf, rtol=1e-14)
    pdf = np.exp(-0.5 * np.asarray([1.0, 0.0, 4.0])) / math.sqrt(2 * math.pi)
    np.testing.assert_allclose(numerics.normal_pdf(x), [0.0, *pdf, 0.0], rtol=1e-14)
    np.testing.assert_allclose(numerics.x_normal_pdf(x), [0.0, -pdf[0], 0.0, 2 * pdf[2], 0.0])


def test_safe_inv_sqrt_and_its_gradient():
    q = jnp.asarray([0.0, 4.0])
    np.testing.assert_array_equal(numerics.safe_inv_sqrt(q), [np.inf, 0.5])
    g = jax.grad(lambda v: numerics.safe_inv_sqrt(v)[1])(q)
    np.testing.assert_allclose(g, [0.0, -0.0625])
    assert numerics.as_float(1).dtype == numerics.default_dtype() == jnp.float64
