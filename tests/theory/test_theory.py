"""DEQ-at-initialization theory: closed forms, self-consistency, and Monte-Carlo at finite n.

Monte-Carlo tolerances follow from the size n: normalised traces of resolvents of n x n random
matrices fluctuate by O(1/n) (orthogonal: self-averaging, ~0.5% at n = 400; Gaussian and GOE a few
times more); a mean of h_i^2 over n * B entries has relative error ~sqrt(2 / (n B)) (1.8% for
n = 400, B = 16; 0.9% for the B = 64 used) on top of an O(1/n) matrix-to-matrix fluctuation;
spectral edges of non-normal n x n matrices overshoot their limit by ~sqrt(log n / 4n) (~6% at
n = 400; measured ratios 0.97-1.07).
"""

import ast
import inspect
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate

from deqjax import theory
from deqjax._src import random_matrices as rm
from deqjax._src import theory as theory_src

F64 = jnp.float64
SAMPLERS = {"gaussian": rm.gaussian, "orthogonal": rm.haar_orthogonal, "goe": rm.goe}
HARDTANH = lambda h: jnp.clip(h, -1.0, 1.0)  # noqa: E731
RELU = lambda h: jnp.maximum(h, 0.0)  # noqa: E731
LINEAR = lambda h: h  # noqa: E731


def _sample(ensemble, n, scale, seed):
    return np.asarray(SAMPLERS[ensemble](jax.random.key(seed), (n, n), scale=scale, dtype=F64))


# --- linear DEQ ---------------------------------------------------------------------------------


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
    w = _sample(ensemble, n, scale, seed=3)
    resolvent = np.linalg.inv(np.eye(n) - w)
    empirical = np.sum(resolvent**2) / n  # (1/n) tr((I - W)^{-1} (I - W)^{-T}) = (1/n) E||z*||^2
    assert empirical == pytest.approx(float(theory.linear_second_moment(scale, ensemble)), rel=rel)


# --- non-linear mean-field variance ---------------------------------------------------------------


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
        q_mc = _empirical_q(_sample(ensemble, n, s, seed=5), np.tanh)
        q_th = float(theory.mean_field_variance(s, ensemble, "tanh"))
        assert q_mc == pytest.approx(q_th, rel=0.04)


def test_goe_variance_exceeds_mean_field_prediction():
    # The init paper's Fig. 2 finding: symmetric W breaks free independence and the empirical q
    # sits ABOVE the prediction (here by ~80% at scale 0.9; far outside any finite-n error).
    q_mc = _empirical_q(_sample("goe", 400, 0.9, seed=6), np.tanh)
    q_th = float(theory.mean_field_variance(0.9, "goe", "tanh"))
    assert q_mc > 1.3 * q_th


# --- Theorem 3.2 and the critical scale -----------------------------------------------------------


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
    w = _sample(ensemble, n, s, seed=7)
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
    w = _sample("goe", n, s, seed=9)
    h = math.sqrt(q) * np.asarray(jax.random.normal(jax.random.key(10), (n,), F64))
    root = np.sqrt(numpy_phi_prime(h))
    # diag(d) W has the spectrum of the symmetric D^{1/2} W D^{1/2} (d >= 0).
    radius = np.abs(np.linalg.eigvalsh(root[:, None] * w * root[None, :])).max()
    # Semicircle-type edge: Tracy–Widom fluctuations ~n^{-2/3} = 1% at n = 1000.
    assert radius == pytest.approx(float(theory.spectral_radius(s, "goe", q, phi)), rel=0.03)


def test_critical_scale():
    # Closed forms: linear 1 (GOE 1/2), relu sqrt(2) (GOE 1/sqrt(2)); one of each kind.
    assert float(theory.critical_scale("gaussian", "linear")) == pytest.approx(1.0, rel=1e-9)
    assert float(theory.critical_scale("goe", "relu")) == pytest.approx(math.sqrt(0.5), rel=1e-9)
    for ens in ("orthogonal", "goe"):
        c = float(theory.critical_scale(ens, "tanh"))
        assert float(theory.predicted_radius(c, ens, "tanh")) == pytest.approx(1.0, abs=1e-8)
        assert float(theory.predicted_radius(0.95 * c, ens, "tanh")) < 1.0
    assert float(theory.critical_scale("goe", "tanh")) < float(
        theory.critical_scale("orthogonal", "tanh")
    )
    assert np.isinf(theory.critical_scale("orthogonal", "tanh", max_scale=1.0))


def test_jit_and_vmap_over_scale():
    scales = jnp.linspace(0.1, 1.4, 5, dtype=F64)
    batched = jax.jit(jax.vmap(lambda s: theory.predicted_radius(s, "goe", "tanh")))(scales)
    looped = [float(theory.predicted_radius(float(s), "goe", "tanh")) for s in scales]
    np.testing.assert_allclose(batched, looped, rtol=1e-10)
    assert np.all(np.diff(np.asarray(batched)) > 0)


def test_invalid_arguments():
    with pytest.raises(ValueError, match="ensemble"):
        theory.linear_second_moment(0.5, "wishart")
    with pytest.raises(ValueError, match="ensemble"):
        theory.spectral_radius(0.5, "Gaussian", 1.0, "tanh")
    with pytest.raises(ValueError, match="phi"):
        theory.mean_field_variance(0.5, "goe", "sigmoid")
    with pytest.raises(ValueError, match="phi"):
        theory.spectral_radius(0.5, "goe", 1.0, 3.0)
    with pytest.raises(ValueError, match="sigma_x"):
        theory.mean_field_variance(0.5, "goe", "tanh", sigma_x=0.0)
    with pytest.raises(ValueError, match="num_points"):
        theory.gaussian_expectation(jnp.tanh, 1.0, num_points=1000)
    with pytest.raises(ValueError, match="max_scale"):
        theory.critical_scale("goe", "tanh", max_scale=-1.0)


def test_theory_does_not_import_haiku():
    tree = ast.parse(inspect.getsource(theory_src))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module or "")
            imported.update(f"{node.module}.{alias.name}" for alias in node.names)
    assert not any("haiku" in name or "initializers" in name for name in imported), imported


# --- callables with a piecewise-constant phi' (issue 14, item 5) ----------------------------------


def test_callable_hard_tanh_goe_radius_matches_closed_form():
    # The issue's case: Gauss–Hermite quadrature of a step-function phi' gave 0.9785.
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
    w = _sample("goe", n, s, seed=11)
    h = math.sqrt(q) * np.asarray(jax.random.normal(jax.random.key(12), (n,), F64))
    root = np.sqrt(np.where(h > 0, 1.0, a))
    radius = np.abs(np.linalg.eigvalsh(root[:, None] * w * root[None, :])).max()
    predicted = float(theory.spectral_radius(s, "goe", q, leaky))
    assert radius / predicted == pytest.approx(1.0, abs=0.03)


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
