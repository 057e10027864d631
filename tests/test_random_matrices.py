"""Random-matrix samplers: scale convention, Haar-ness, GOE/circular-law spectra, dtypes.

Tolerances are set from the matrix size: an entry-average over n^2 i.i.d. entries has relative
standard error ~sqrt(2)/n (0.3% at n = 500); spectral edges fluctuate by O(n^{-2/3}) for the GOE
(Tracy–Widom, ~1.6% at n = 500) and the Ginibre edge overshoots by ~sqrt(log(n)/(4n)) (~6% at
n = 500).
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from deqjax import initializers as dqi
from tests.helpers.matrices import disk, mean_square

N = 500
F64 = jnp.float64

SAMPLERS = {
    "gaussian": dqi.gaussian,
    "orthogonal": dqi.haar_orthogonal,
    "goe": dqi.goe,
    "antisymmetric": dqi.antisymmetric,
}


@pytest.mark.parametrize("family", [*SAMPLERS, "haar_normal"])
def test_scale_convention_every_family(family):
    scale = 1.3  # samplers are linear in scale (see test_samplers_vmap_over_scale_and_jit)
    key = jax.random.key(1)
    if family == "haar_normal":
        w = dqi.haar_normal(key, (N, N), disk, scale=scale, normalize=False, dtype=F64)
        expected = scale**2 * 0.5  # E|lambda|^2 = 1/2 for the unit disc when not normalised
    else:
        w = SAMPLERS[family](key, (N, N), scale=scale, dtype=F64)
        expected = scale**2
    # 0.3% standard error at n = 500 plus the O(1/n) = 0.2% GOE/antisymmetric offset: 3% is loose
    # enough never to flake and tight enough to catch a factor like 2 or n/(n-1)^... errors.
    assert mean_square(w) == pytest.approx(expected, rel=0.03)


@pytest.mark.parametrize("shape", [(300, 120), (120, 300), (3, 3, 16, 40)])
@pytest.mark.parametrize("family", ["gaussian", "orthogonal"])
def test_scale_convention_non_square_and_kernels(shape, family):
    w = SAMPLERS[family](jax.random.key(2), shape, scale=0.7, dtype=F64)
    assert w.shape == shape
    assert mean_square(w) == pytest.approx(0.49, rel=0.03)
    # Per-unit gain for isotropic inputs: E||x M||^2 / fan_out = scale^2 ||x||^2 / fan_in.
    fan_in, fan_out = dqi.matrix_dims(shape)
    m = np.asarray(w).reshape(fan_in, fan_out)
    x = np.asarray(jax.random.normal(jax.random.key(3), (256, fan_in), F64))
    gain = np.mean(np.sum((x @ m) ** 2, 1) / fan_out) / np.mean(np.sum(x * x, 1) / fan_in)
    assert gain == pytest.approx(0.49, rel=0.05)


@pytest.mark.parametrize("shape", [(N, N), (400, 150), (150, 400), (4, 4, 8, 32)])
def test_orthogonality_float64(shape):
    scale = 1.7
    w = dqi.haar_orthogonal(jax.random.key(4), shape, scale=scale, dtype=F64)
    fan_in, fan_out = dqi.matrix_dims(shape)
    m = np.asarray(w).reshape(fan_in, fan_out)
    if fan_in >= fan_out:
        gram, size = m.T @ m / scale**2, fan_out
    else:  # orthonormal rows, rescaled by sqrt(fan_out / fan_in) to keep the convention
        gram, size = m @ m.T / (scale**2 * fan_out / fan_in), fan_in
    np.testing.assert_allclose(gram, np.eye(size), atol=1e-10)


def test_orthogonal_spectrum_on_circle():
    w = dqi.haar_orthogonal(jax.random.key(5), (200, 200), scale=0.8, dtype=F64)
    np.testing.assert_allclose(np.abs(np.linalg.eigvals(np.asarray(w))), 0.8, atol=1e-9)


def _diagonal_stats(matrices):
    d = np.asarray(jnp.diagonal(matrices, axis1=1, axis2=2))  # [draws, n]
    return d.mean(0), d.var(0)


def test_haar_measure_and_plain_qr_is_not_haar():
    n, draws = 4, 4000
    keys = jax.random.split(jax.random.key(6), draws)
    haar = jax.vmap(lambda k: dqi.haar_orthogonal(k, (n, n), dtype=F64))(keys)
    mean, var = _diagonal_stats(haar)
    se = math.sqrt(1.0 / (n * draws))  # std error of a mean of entries with variance 1/n
    # Haar: every entry has mean 0 and variance exactly 1/n. 4.5 standard errors / ~4 for n*var.
    assert np.all(np.abs(mean) < 4.5 * se), mean
    assert np.all(np.abs(n * var - 1.0) < 0.12), n * var

    # Plain QR (LAPACK sign convention, no sign correction) of the same Gaussian matrices.
    plain = jax.vmap(lambda k: jnp.linalg.qr(jax.random.normal(k, (n, n), F64))[0])(keys)
    mean_p, var_p = _diagonal_stats(plain)
    assert np.max(np.abs(mean_p)) > 20 * se, mean_p  # the diagonal has a sign bias
    assert np.max(np.abs(n * var_p - 1.0)) > 0.3, n * var_p


def test_goe_symmetry_entry_variances_and_semicircle_edge():
    scale = 0.6
    draws = jax.vmap(lambda k: dqi.goe(k, (N, N), scale=scale, dtype=F64))(
        jax.random.split(jax.random.key(7), 4)
    )
    w = np.asarray(draws)
    np.testing.assert_array_equal(w, np.swapaxes(w, 1, 2))
    off = w[:, np.triu_indices(N, 1)[0], np.triu_indices(N, 1)[1]]  # 4 * 124750 entries
    diag = np.diagonal(w, axis1=1, axis2=2)  # 4 * 500 entries
    # Relative std error of a variance estimate from m samples is sqrt(2/m): 0.2% / 3%.
    assert off.var() * N / scale**2 == pytest.approx(1.0, rel=0.02)
    assert diag.var() * N / scale**2 == pytest.approx(2.0, rel=0.12)
    assert abs(off.mean()) < 5 * math.sqrt(scale**2 / N / off.size)
    eigs = np.linalg.eigvalsh(w[0])
    # Semicircle edge 2 * scale; Tracy–Widom fluctuations ~ n^{-2/3} (1.6%) at n = 500.
    assert eigs.max() == pytest.approx(2 * scale, rel=0.03)
    assert eigs.min() == pytest.approx(-2 * scale, rel=0.03)
    # Bulk: semicircle second moment scale^2 and fourth moment 2 scale^4 (Catalan numbers).
    assert np.mean(eigs**2) == pytest.approx(scale**2, rel=0.03)
    assert np.mean(eigs**4) == pytest.approx(2 * scale**4, rel=0.05)


def test_circular_law_edge_and_density():
    scale = 0.9
    w = np.asarray(dqi.gaussian(jax.random.key(8), (N, N), scale=scale, dtype=F64))
    radius = np.abs(np.linalg.eigvals(w))
    # Uniform on the disc of radius `scale`: |lambda|^2 / scale^2 is Uniform(0, 1).
    u = np.sort(radius**2 / scale**2)
    assert np.max(np.abs(u - (np.arange(N) + 0.5) / N)) < 0.05  # KS distance, 5% at n = 500
    # Edge: within the finite-n overshoot of the Ginibre spectral radius (~6% at n = 500).
    assert scale * 0.97 < radius.max() < scale * 1.10


def test_antisymmetric_spectrum():
    scale = 0.5
    w = np.asarray(dqi.antisymmetric(jax.random.key(9), (N, N), scale=scale, dtype=F64))
    np.testing.assert_array_equal(w, -w.T)
    eigs = np.linalg.eigvals(w)
    np.testing.assert_allclose(eigs.real, 0.0, atol=1e-10)
    assert np.abs(eigs.imag).max() == pytest.approx(2 * scale, rel=0.03)


def test_haar_normal_real_and_complex_spectra():
    n = 64
    real = lambda k, m: jnp.linspace(-1.0, 2.0, m, dtype=F64)  # noqa: E731
    w = np.asarray(dqi.haar_normal(jax.random.key(10), (n, n), real, normalize=False, dtype=F64))
    np.testing.assert_allclose(w, w.T, atol=1e-12)
    np.testing.assert_allclose(np.linalg.eigvalsh(w), np.linspace(-1.0, 2.0, n), atol=1e-10)

    for size in (n + 1,):  # an odd size: n // 2 conjugate pairs plus one real eigenvalue
        w = np.asarray(dqi.haar_normal(jax.random.key(11), (size, size), disk, dtype=F64))
        np.testing.assert_allclose(w @ w.T, w.T @ w, atol=1e-10)  # normal
        lam = np.asarray(disk(jax.random.split(jax.random.key(11))[0], size))
        expected = np.concatenate([lam[: size // 2], np.conj(lam[: size // 2])])
        if size % 2:
            expected = np.append(expected, lam[size // 2].real)
        rms = np.sqrt(np.mean(np.abs(expected) ** 2))
        assert mean_square(w) == pytest.approx(1.0, rel=1e-10)  # normalize=True: exact
        got = np.sort_complex(np.round(np.linalg.eigvals(w), 8))
        np.testing.assert_allclose(got, np.sort_complex(np.round(expected / rms, 8)), atol=1e-6)


def test_dtypes():
    for dtype in (jnp.float32, jnp.bfloat16, jnp.float64):
        w = dqi.haar_orthogonal(jax.random.key(0), (8, 8), dtype=dtype)
        assert w.dtype == dtype
    with pytest.raises(ValueError, match="dtype"):
        dqi.gaussian(jax.random.key(0), (8, 8), dtype=jnp.int32)


def test_samplers_vmap_over_scale_and_jit():
    scales = jnp.array([0.5, 1.0, 2.0], F64)
    ws = jax.jit(jax.vmap(lambda s: dqi.haar_orthogonal(jax.random.key(0), (16, 16), scale=s)))(
        scales
    )
    np.testing.assert_allclose(ws[2], 4.0 * ws[0], rtol=1e-12)


def test_invalid_arguments():
    with pytest.raises(ValueError, match="shape"):
        dqi.gaussian(jax.random.key(0), (8,))
    for fn in (dqi.goe, dqi.antisymmetric):
        with pytest.raises(ValueError, match="square"):
            fn(jax.random.key(0), (8, 9))
        with pytest.raises(ValueError, match="square"):
            fn(jax.random.key(0), (3, 3, 4, 4))  # [36, 4] after the reshape
    with pytest.raises(ValueError, match="square"):
        dqi.haar_normal(jax.random.key(0), (4, 5), disk)
    with pytest.raises(ValueError, match="shape"):
        dqi.haar_normal(jax.random.key(0), (4, 4), lambda k, n: jnp.ones((n + 1,)))
