"""Theorem 3.2's spectral radius (and the GOE's free-probability edge) against closed forms and
the eigenvalues of sampled matrices.

Spectral edges of non-normal n x n matrices overshoot their limit by ~sqrt(log n / 4n) (~6% at
n = 400; measured ratios 0.97-1.07); semicircle-type edges have Tracy–Widom fluctuations ~n^{-2/3}.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from deqjax import theory

F64 = jnp.float64
RELU = lambda h: jnp.maximum(h, 0.0)  # noqa: E731
LINEAR = lambda h: h  # noqa: E731


def test_spectral_radius_closed_forms():
    s = 0.8
    for ens in ("gaussian", "orthogonal"):
        assert float(theory.spectral_radius(s, ens, 1.3, "linear")) == pytest.approx(s)
        assert float(theory.spectral_radius(s, ens, 1.3, "relu")) == pytest.approx(s / math.sqrt(2))
        p = math.erf(1 / math.sqrt(2 * 1.3))
        assert float(theory.spectral_radius(s, ens, 1.3, "hardtanh")) == pytest.approx(
            s * math.sqrt(p)
        )
    # GOE: 2 s sqrt(P(phi' = 1)) for Bernoulli phi' (§3.2) ...
    assert float(theory.spectral_radius(s, "goe", 1.3, "linear")) == pytest.approx(2 * s)
    assert float(theory.spectral_radius(s, "goe", 1.3, "relu")) == pytest.approx(math.sqrt(2) * s)
    p = math.erf(1 / math.sqrt(2 * 1.3))
    assert float(theory.spectral_radius(s, "goe", 1.3, "hardtanh")) == pytest.approx(
        2 * s * math.sqrt(p), rel=1e-12
    )
    # ... which the numerical free-probability path (used for callables) must reproduce: with an
    # even node count, relu' is exactly Bernoulli(1/2) on the nodes.
    assert float(theory.spectral_radius(s, "goe", 1.3, LINEAR)) == pytest.approx(2 * s, rel=1e-6)
    assert float(theory.spectral_radius(s, "goe", 1.3, RELU)) == pytest.approx(
        math.sqrt(2) * s, rel=1e-6
    )
    assert float(theory.spectral_radius(s, "goe", 0.7, jnp.tanh)) == pytest.approx(
        float(theory.spectral_radius(s, "goe", 0.7, "tanh")), rel=1e-10
    )


@pytest.mark.parametrize("ensemble, q", [("gaussian", 0.5), ("orthogonal", 2.0)])
def test_theorem_3_2_against_eigenvalues(ensemble, q):
    n, s = 400, 1.2
    w = theory.sample_matrix(jax.random.key(7), n, s, ensemble)
    h = math.sqrt(q) * np.asarray(jax.random.normal(jax.random.key(8), (n,), F64))
    radius = np.abs(np.linalg.eigvals((1 - np.tanh(h) ** 2)[:, None] * w)).max()
    predicted = float(theory.spectral_radius(s, ensemble, q, "tanh"))
    assert 0.93 < radius / predicted < 1.12  # finite-n edge overshoot, see module docstring
    # The prediction must be sharp enough to tell q apart: q -> 4q changes it by > 15%.
    assert abs(float(theory.spectral_radius(s, ensemble, 4 * q, "tanh")) / predicted - 1) > 0.15


@pytest.mark.parametrize(
    "phi, numpy_phi_prime",
    [
        ("tanh", lambda h: 1 - np.tanh(h) ** 2),
        ("hardtanh", lambda h: (np.abs(h) < 1).astype(np.float64)),
    ],
)
def test_goe_spectral_radius_against_eigenvalues(phi, numpy_phi_prime):
    n, s, q = 1000, 0.9, 1.0
    w = theory.sample_matrix(jax.random.key(9), n, s, "goe")
    h = math.sqrt(q) * np.asarray(jax.random.normal(jax.random.key(10), (n,), F64))
    root = np.sqrt(numpy_phi_prime(h))
    # diag(d) W has the spectrum of the symmetric D^{1/2} W D^{1/2} (d >= 0).
    radius = np.abs(np.linalg.eigvalsh(root[:, None] * w * root[None, :])).max()
    # Semicircle-type edge: Tracy–Widom fluctuations ~n^{-2/3} = 1% at n = 1000.
    assert radius == pytest.approx(float(theory.spectral_radius(s, "goe", q, phi)), rel=0.03)


def test_predicted_radius_jit_and_vmap_over_scale():
    scales = jnp.linspace(0.1, 1.4, 5, dtype=F64)
    batched = jax.jit(jax.vmap(lambda s: theory.predicted_radius(s, "goe", "tanh")))(scales)
    looped = [float(theory.predicted_radius(float(s), "goe", "tanh")) for s in scales]
    np.testing.assert_allclose(batched, looped, rtol=1e-10)
    assert np.all(np.diff(np.asarray(batched)) > 0)


def test_predicted_radius_is_spectral_radius_at_the_mean_field_variance():
    for ens in theory.ENSEMBLES:
        q = theory.mean_field_variance(0.7, ens, "tanh", sigma_x=0.5)
        assert float(theory.predicted_radius(0.7, ens, "tanh", sigma_x=0.5)) == float(
            theory.spectral_radius(0.7, ens, q, "tanh")
        )
