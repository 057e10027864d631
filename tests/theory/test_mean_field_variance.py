"""The mean-field variance of the non-linear DEQ (Theorem 3.1, Eq. 25): closed forms,
self-consistency, divergence, gradients, and Monte-Carlo at n = 400.

A mean of h_i^2 over n * B entries has relative error ~sqrt(2 / (n B)) (1.8% for n = 400, B = 16;
0.9% for the B = 64 used) on top of an O(1/n) matrix-to-matrix fluctuation.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from deqjax import theory

F64 = jnp.float64
RELU = lambda h: jnp.maximum(h, 0.0)  # noqa: E731
LINEAR = lambda h: h  # noqa: E731


def test_mean_field_iteration_matches_closed_forms():
    # The callables go through the iterative path with Gauss–Hermite quadrature, which is exact for
    # h^2 and, with an even number of nodes (none at 0), for relu(h)^2 = h^2 1{h > 0}.
    for s, sx in ((0.5, 1.0), (0.9, 0.7)):
        q_lin = theory.mean_field_variance(s, "gaussian", LINEAR, sigma_x=sx)
        assert float(q_lin) == pytest.approx(sx**2 / (1 - s * s), rel=1e-9)
        assert float(theory.mean_field_variance(s, "goe", "linear", sigma_x=sx)) == pytest.approx(
            sx**2 / (1 - s * s), rel=1e-12
        )
        q_relu = theory.mean_field_variance(s, "orthogonal", RELU, sigma_x=sx)
        assert float(q_relu) == pytest.approx(sx**2 / (1 - s * s / 2), rel=1e-9)


@pytest.mark.parametrize("phi", ["tanh", "hardtanh"])
def test_mean_field_is_self_consistent(phi):
    for s in (0.4, 1.0, 2.5):
        q = float(theory.mean_field_variance(s, "orthogonal", phi, sigma_x=0.8))
        rhs = s * s * float(theory.phi_second_moment(phi, q)) + 0.64
        assert q == pytest.approx(rhs, rel=1e-10)


def test_mean_field_divergence_and_gradient():
    assert np.isinf(theory.mean_field_variance(1.5, "gaussian", "relu"))
    assert np.isinf(theory.mean_field_variance(1.0, "gaussian", "linear"))
    assert np.isinf(theory.mean_field_variance(1.2, "gaussian", LINEAR, max_steps=5000))
    f = lambda s: theory.mean_field_variance(s, "orthogonal", "tanh")  # noqa: E731
    eps = 1e-5
    fd = (float(f(0.8 + eps)) - float(f(0.8 - eps))) / (2 * eps)
    assert float(jax.grad(f)(0.8)) == pytest.approx(fd, rel=1e-6)


def _empirical_q(w, phi, *, batch=64, steps=200, seed=0):
    """Iterates h <- W phi(h) + x for `batch` inputs x ~ N(0, I); mean h^2 over the last third."""
    n = w.shape[0]
    x = np.asarray(jax.random.normal(jax.random.key(seed), (n, batch), F64))
    h = np.zeros_like(x)
    values = []
    for k in range(steps):
        h = w @ phi(h) + x
        if k >= 2 * steps // 3:
            values.append(np.mean(h * h))
    return float(np.mean(values))


@pytest.mark.parametrize("ensemble", ["orthogonal", "gaussian"])
def test_mean_field_vs_monte_carlo(ensemble):
    n = 400
    for s in (0.9, 1.5):
        q_mc = _empirical_q(theory.sample_matrix(jax.random.key(5), n, s, ensemble), np.tanh)
        q_th = float(theory.mean_field_variance(s, ensemble, "tanh"))
        assert q_mc == pytest.approx(q_th, rel=0.04)


def test_goe_variance_exceeds_mean_field_prediction():
    # The init paper's Fig. 2 finding: symmetric W breaks free independence and the empirical q
    # sits ABOVE the prediction (here by ~80% at scale 0.9; far outside any finite-n error).
    q_mc = _empirical_q(theory.sample_matrix(jax.random.key(6), 400, 0.9, "goe"), np.tanh)
    q_th = float(theory.mean_field_variance(0.9, "goe", "tanh"))
    assert q_mc > 1.3 * q_th


def test_mean_field_variance_settles_in_float32():
    # tol=1e-12 is below float32 resolution: the iterates cycled between two adjacent floats and a
    # finite q was reported as inf (radius 0), which also put critical_scale off the grid.
    with jax.enable_x64(False):
        q = theory.mean_field_variance(0.65625, "goe", "hardtanh")
        assert q.dtype == jnp.float32
        q = float(q)
        assert np.isfinite(q)
        rhs = 0.65625**2 * float(theory.phi_second_moment("hardtanh", q)) + 1.0
        assert q == pytest.approx(rhs, rel=1e-6)
        crit = float(theory.critical_scale("goe", "hardtanh"))
        radius = float(theory.predicted_radius(crit, "goe", "hardtanh"))
        assert radius == pytest.approx(1.0, abs=1e-4)


def test_invalid_sigma_x():
    with pytest.raises(ValueError, match="sigma_x"):
        theory.mean_field_variance(0.5, "goe", "tanh", sigma_x=0.0)
