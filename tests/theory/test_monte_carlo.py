"""Measurements on one random matrix: the sampler, the linear trace, forward iteration and the
Jacobian's spectral radius, against direct numpy computations and the theory at n = 300."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from deqjax import initializers, theory

F64 = jnp.float64


def test_sample_matrix_is_the_initializers_sampler():
    key = jax.random.key(0)
    samplers = {
        "gaussian": initializers.gaussian,
        "orthogonal": initializers.haar_orthogonal,
        "goe": initializers.goe,
    }
    for ensemble, sampler in samplers.items():
        w = theory.sample_matrix(key, 12, 0.7, ensemble)
        assert isinstance(w, np.ndarray) and w.shape == (12, 12) and w.dtype == np.float64
        np.testing.assert_array_equal(w, sampler(key, (12, 12), scale=0.7, dtype=F64))


def test_linear_trace_is_the_resolvent_trace():
    w = theory.sample_matrix(jax.random.key(1), 50, 0.5, "gaussian")
    x = np.linalg.solve(np.eye(50) - w, np.eye(50))  # z* for each basis input: (I - W)^{-1}
    assert theory.linear_trace(w) == pytest.approx(np.sum(x * x) / 50, rel=1e-12)


def test_forward_iteration_converges_to_the_fixed_point():
    n, batch = 300, 4
    w = theory.sample_matrix(jax.random.key(2), n, 0.5, "orthogonal")
    x = np.asarray(jax.random.normal(jax.random.key(3), (n, batch), F64))
    q, residual, h = theory.forward_iteration(w, x, "tanh", steps=200)
    assert h.shape == (n, batch)
    np.testing.assert_allclose(h, w @ np.tanh(h) + x, atol=1e-10)  # a fixed point
    assert residual < 1e-10
    assert q == pytest.approx(np.mean(h * h), rel=1e-10)  # settled: every tail step is h*
    assert q == pytest.approx(
        float(theory.mean_field_variance(0.5, "orthogonal", "tanh")), rel=0.05
    )


def test_forward_iteration_diverges_beyond_the_critical_scale():
    w = theory.sample_matrix(jax.random.key(4), 100, 3.0, "gaussian")
    x = np.asarray(jax.random.normal(jax.random.key(5), (100, 2), F64))
    _, residual, _ = theory.forward_iteration(w, x, "tanh", steps=100)
    assert residual > 1e-2


@pytest.mark.parametrize("ensemble", theory.ENSEMBLES)
def test_jacobian_radius_is_the_eigenvalue_radius(ensemble):
    n = 60
    w = theory.sample_matrix(jax.random.key(6), n, 0.9, ensemble)
    h = np.asarray(jax.random.normal(jax.random.key(7), (n,), F64))
    direct = np.abs(np.linalg.eigvals((1 - np.tanh(h) ** 2)[:, None] * w)).max()
    got = theory.jacobian_radius(w, ensemble, h, "tanh")
    assert got == pytest.approx(direct, rel=1e-9)


def test_jacobian_radius_checks_its_arguments():
    w = np.eye(3)
    with pytest.raises(ValueError, match="ensemble"):
        theory.jacobian_radius(w, np.zeros(3), "tanh", "goe")  # the order before 0.2
    with pytest.raises(ValueError, match="phi"):
        theory.jacobian_radius(w, "goe", np.zeros(3), "sigmoid")
