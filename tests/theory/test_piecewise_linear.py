"""Piecewise-linear callables (``phi'`` piecewise constant): recognised, and their moments and
radii exact, equal to the closed forms of the named activations."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from deqjax import theory

F64 = jnp.float64


def test_callable_hard_tanh_goe_radius_matches_closed_form():
    # Gauss–Hermite quadrature of a step-function phi' gave 0.9785 here.
    s, q = 0.6, 1.5
    closed = 2 * s * math.sqrt(math.erf(1 / math.sqrt(2 * q)))  # 2 sigma sqrt(P(|h| < 1))
    assert closed == pytest.approx(0.9184, abs=1e-4)
    got = float(theory.spectral_radius(s, "goe", q, jax.nn.hard_tanh))
    assert got == pytest.approx(closed, abs=1e-5)


@pytest.mark.parametrize("name, fn", [("hardtanh", jax.nn.hard_tanh), ("relu", jax.nn.relu)])
@pytest.mark.parametrize("ensemble", ["gaussian", "orthogonal", "goe"])
def test_piecewise_linear_callables_match_their_closed_forms(name, fn, ensemble):
    for q in (0.4, 1.5, 5.0):
        for moment in (theory.phi_second_moment, theory.phi_prime_second_moment):
            assert float(moment(fn, q)) == pytest.approx(float(moment(name, q)), rel=1e-5)
        assert float(theory.spectral_radius(0.7, ensemble, q, fn)) == pytest.approx(
            float(theory.spectral_radius(0.7, ensemble, q, name)), rel=1e-5
        )
    for s in (0.3, 0.6, 0.9):
        assert float(theory.predicted_radius(s, ensemble, fn)) == pytest.approx(
            float(theory.predicted_radius(s, ensemble, name)), rel=1e-3
        )


def test_piecewise_linear_recognition():
    pieces = theory.piecewise_linear(jax.nn.hard_tanh)
    assert pieces is not None
    np.testing.assert_allclose(pieces.breaks, [-1.0, 1.0], atol=1e-6)
    assert pieces.slopes == (0.0, 1.0, 0.0)
    assert theory.piecewise_linear(jnp.tanh) is None  # smooth: quadrature path
    assert theory.piecewise_linear(jax.nn.softplus) is None
    # A non-Bernoulli phi' (leaky relu, slopes a and 1): exact moments of the two-point law ...
    a = 0.2
    leaky = lambda h: jnp.where(h > 0, h, a * h)  # noqa: E731
    q = 1.7
    assert float(theory.phi_prime_second_moment(leaky, q)) == pytest.approx(
        (1 + a * a) / 2, rel=1e-6
    )
    assert float(theory.phi_second_moment(leaky, q)) == pytest.approx(q * (1 + a * a) / 2, rel=1e-6)
    # ... and its GOE radius against the eigenvalues of D^{1/2} W D^{1/2}, D = diag(phi'(h)).
    n, s = 1000, 0.8
    w = theory.sample_matrix(jax.random.key(11), n, s, "goe")
    h = math.sqrt(q) * np.asarray(jax.random.normal(jax.random.key(12), (n,), F64))
    root = np.sqrt(np.where(h > 0, 1.0, a))
    radius = np.abs(np.linalg.eigvalsh(root[:, None] * w * root[None, :])).max()
    predicted = float(theory.spectral_radius(s, "goe", q, leaky))
    assert radius / predicted == pytest.approx(1.0, abs=0.03)
