"""Gaussian moments ``E[phi(h)^2]`` and ``E[phi'(h)^2]``: closed forms against quadrature."""

import math

import jax.numpy as jnp
import pytest
from scipy import integrate

from deqjax import theory

HARDTANH = lambda h: jnp.clip(h, -1.0, 1.0)  # noqa: E731


def test_hardtanh_moments_closed_form():
    # hardtanh: erf closed form vs adaptive quadrature split at the kinks; the callable is
    # recognised as piecewise linear, so its moment is exact too (Gauss–Hermite was ~1e-2 off).
    for q in (0.3, 1.0, 4.0):
        closed = float(theory.phi_second_moment("hardtanh", q))

        def integrand(h, q=q):
            return min(h * h, 1.0) * math.exp(-h * h / (2 * q)) / math.sqrt(2 * math.pi * q)

        exact = sum(
            integrate.quad(integrand, a, b, epsabs=1e-13)[0]
            for a, b in [(-60, -1), (-1, 1), (1, 60)]
        )
        assert closed == pytest.approx(exact, rel=1e-9)
        quad = float(theory.phi_second_moment(HARDTANH, q, num_points=256))
        assert closed == pytest.approx(quad, rel=1e-6)
        assert float(theory.phi_prime_second_moment("hardtanh", q)) == pytest.approx(
            math.erf(1 / math.sqrt(2 * q)), rel=1e-12
        )


def test_gaussian_expectation_polynomials_and_num_points():
    # Gauss–Hermite with k nodes is exact for polynomials of degree < 2k: E[h^4] = 3 q^2.
    assert float(theory.gaussian_expectation(lambda h: h**4, 2.0, num_points=4)) == pytest.approx(
        12.0, rel=1e-12
    )
    with pytest.raises(ValueError, match="num_points"):
        theory.gaussian_expectation(jnp.tanh, 1.0, num_points=1000)
