"""The linear DEQ's second moment (init paper Eq. 8-11): closed forms and Monte-Carlo at n = 400.

Normalised traces of resolvents of n x n random matrices fluctuate by O(1/n) (orthogonal:
self-averaging, ~0.5% at n = 400; Gaussian and GOE a few times more).
"""

import math

import jax
import numpy as np
import pytest
from scipy import integrate

from deqjax import theory


def test_linear_second_moment_closed_forms():
    for s in (0.0, 0.3, 0.7, 0.95):
        for ens in ("gaussian", "orthogonal"):
            assert float(theory.linear_second_moment(s, ens)) == pytest.approx(1 / (1 - s * s))
    for s in (0.1, 0.3, 0.45):
        # GOE: integral of the semicircle density (radius 2s) against 1 / (1 - lambda)^2 ...
        def density(lam, s=s):
            return np.sqrt(max(4 * s * s - lam * lam, 0.0)) / (2 * np.pi * s * s) / (1 - lam) ** 2

        integral, _ = integrate.quad(density, -2 * s, 2 * s, epsabs=1e-13, epsrel=1e-12)
        # ... and the paper's form (1/sqrt(1 - 4 s^2) - 1) / (2 s^2).
        paper = (1 / math.sqrt(1 - 4 * s * s) - 1) / (2 * s * s)
        got = float(theory.linear_second_moment(s, "goe"))
        assert got == pytest.approx(integral, rel=1e-8)
        assert got == pytest.approx(paper, rel=1e-12)
    # Catalan power series sum_k (2k + 1) C_k s^{2k} (only even moments of the semicircle).
    s = 0.2
    series = sum((2 * k + 1) * math.comb(2 * k, k) / (k + 1) * s ** (2 * k) for k in range(60))
    assert float(theory.linear_second_moment(s, "goe")) == pytest.approx(series, rel=1e-12)
    assert float(theory.linear_second_moment(0.0, "goe")) == 1.0
    # Beyond the spectral edge the forward iteration diverges: inf.
    assert np.isinf(theory.linear_second_moment(1.0, "gaussian"))
    assert np.isinf(theory.linear_second_moment(1.5, "orthogonal"))
    assert np.isinf(theory.linear_second_moment(0.5, "goe"))


@pytest.mark.parametrize(
    "ensemble, scale, rel",
    [("orthogonal", 0.6, 0.02), ("gaussian", 0.6, 0.04), ("goe", 0.3, 0.04)],
)
def test_linear_second_moment_monte_carlo(ensemble, scale, rel):
    n = 400
    w = theory.sample_matrix(jax.random.key(3), n, scale, ensemble)
    resolvent = np.linalg.inv(np.eye(n) - w)
    empirical = np.sum(resolvent**2) / n  # (1/n) tr((I - W)^{-1} (I - W)^{-T}) = (1/n) E||z*||^2
    assert empirical == pytest.approx(float(theory.linear_second_moment(scale, ensemble)), rel=rel)
