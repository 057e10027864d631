"""dq.jacobian: Hutchinson Frobenius estimate, power-method spectral radius, backward solves."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import deqjax as dq
from deqjax import jacobian
from deqjax._src.adjoints.backward_solve import first_solve
from tests.helpers.dense_ift import FPI_4000, THETA, cos_cell


def random_matrix(seed, d=6):
    return jnp.asarray(np.random.default_rng(seed).normal(size=(d, d)))


def symmetric_with_spectrum(eigs, seed=0):
    d = len(eigs)
    q, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(d, d)))
    return jnp.asarray(q @ np.diag(eigs) @ q.T)


# --- frobenius_sq -------------------------------------------------------------------------------


def test_frobenius_unbiased_over_many_keys():
    a = random_matrix(0)
    exact = float(jnp.sum(a**2) / 6)
    keys = jax.random.split(jax.random.key(1), 4000)
    est = jax.vmap(lambda k: jacobian.frobenius_sq(lambda z: a @ z, jnp.zeros(6), k))(keys)
    mean = float(jnp.mean(est))
    # Relative std of one sample <= sqrt(2); of the mean of 4000: <= 2.2 %. Allow ~2 sigma.
    assert abs(mean - exact) / exact < 0.045
    # And the single-sample estimates do vary (the test would catch a constant).
    assert float(jnp.std(est)) > 0.1 * exact


def test_frobenius_exact_as_num_samples_grows():
    a = random_matrix(2)
    exact = float(jnp.sum(a**2) / 6)
    f = lambda z: a @ z
    errs = [
        abs(float(jacobian.frobenius_sq(f, jnp.zeros(6), jax.random.key(3), num_samples=m)) - exact)
        / exact
        for m in (10, 100_000)
    ]
    assert errs[1] < 0.01
    assert errs[1] < errs[0]


def test_frobenius_pytree_uses_total_size_and_nonlinear_jacobian():
    # f acts on {"a": [2], "b": [3, 1]}: the Jacobian of the flattened map is dense 5 x 5.
    m = random_matrix(4, d=5)

    def f(z):
        flat = jnp.concatenate([z["a"], z["b"].reshape(-1)])
        out = jnp.tanh(m @ flat)
        return {"a": out[:2], "b": out[2:].reshape(3, 1)}

    z = {"a": jnp.array([0.3, -0.2]), "b": jnp.array([[0.1], [0.5], [-0.4]])}
    flat_z = jnp.concatenate([z["a"], z["b"].reshape(-1)])
    dense = jax.jacobian(lambda v: jnp.tanh(m @ v))(flat_z)
    exact = float(jnp.sum(dense**2) / 5)
    got = float(jacobian.frobenius_sq(f, z, jax.random.key(0), num_samples=200_000))
    assert abs(got - exact) / exact < 0.01


def test_frobenius_float32_and_jit():
    a = random_matrix(5).astype(jnp.float32)
    est = jax.jit(lambda k: jacobian.frobenius_sq(lambda z: a @ z, jnp.zeros(6, jnp.float32), k))(
        jax.random.key(0)
    )
    assert est.dtype == jnp.float32 and np.isfinite(float(est)) and float(est) > 0


@pytest.mark.parametrize(
    "kwargs, match",
    [({"num_samples": 0}, "num_samples"), ({"num_samples": 1.5}, "num_samples")],
)
def test_frobenius_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        jacobian.frobenius_sq(lambda z: z, jnp.zeros(3), jax.random.key(0), **kwargs)
    with pytest.raises(ValueError, match="key"):
        jacobian.frobenius_sq(lambda z: z, jnp.zeros(3), 0)
    with pytest.raises(ValueError, match="z"):
        jacobian.frobenius_sq(lambda z: z, jnp.zeros(3, jnp.int32), jax.random.key(0))


# --- spectral_radius ----------------------------------------------------------------------------

SPECTRA = {
    "positive_dominant": [3.0, 2.0, 1.0, -0.5, 0.2, 0.1],
    "negative_dominant": [-3.0, 2.7, 1.0, 0.5, -0.2, 0.1],
    "plus_minus_pair": [2.0, -2.0, 1.0, 0.5, -0.2, 0.1],
    "close_gap": [-1.0, 0.97, 0.5, 0.4, -0.3, 0.1],
}


@pytest.mark.parametrize("name", list(SPECTRA))
def test_spectral_radius_symmetric_known_spectrum(name):
    eigs = SPECTRA[name]
    m = symmetric_with_spectrum(eigs, seed=1)
    est = float(jacobian.spectral_radius(lambda z: m @ z, jnp.zeros(6), jax.random.key(0)))
    rho = max(abs(e) for e in eigs)
    assert abs(est - rho) / rho < 0.01


def test_spectral_radius_complex_dominant_pair():
    # A block-diagonal matrix, rotated: dominant pair r e^{±iθ} with r = 1.5, others <= 0.8.
    r, theta = 1.5, 0.7
    block = r * np.array([[np.cos(theta), -np.sin(theta)], [np.sin(theta), np.cos(theta)]])
    a = np.zeros((6, 6))
    a[:2, :2] = block
    a[2:, 2:] = np.diag([0.8, -0.6, 0.3, 0.1])
    s = np.random.default_rng(0).normal(size=(6, 6)) + 3 * np.eye(6)  # a non-orthogonal basis
    m = jnp.asarray(s @ a @ np.linalg.inv(s))
    assert abs(np.max(np.abs(np.linalg.eigvals(np.asarray(m)))) - r) < 1e-9
    est = float(jacobian.spectral_radius(lambda z: m @ z, jnp.zeros(6), jax.random.key(2)))
    assert abs(est - r) / r < 0.01
    # Plain power iteration (the ratio ||Jv|| after many steps) does not settle on r here.
    v = jnp.ones(6) / np.sqrt(6)
    ratios = []
    for _ in range(60):
        w = m @ v
        ratios.append(float(jnp.linalg.norm(w)))
        v = w / jnp.linalg.norm(w)
    assert max(abs(x - r) for x in ratios[-10:]) > 0.05


def test_spectral_radius_nonlinear_pytree_vmap_and_zero():
    w = random_matrix(7, d=4) * 0.5

    def f(z):
        return {"u": jnp.tanh(w @ z["u"] + 0.1)}

    z = {"u": jnp.array([0.2, -0.1, 0.4, 0.0])}
    dense = jax.jacobian(lambda u: jnp.tanh(w @ u + 0.1))(z["u"])
    rho = np.max(np.abs(np.linalg.eigvals(np.asarray(dense))))
    est = float(
        jax.jit(lambda k: jacobian.spectral_radius(f, z, k, num_steps=200))(jax.random.key(0))
    )
    assert abs(est - rho) / rho < 0.01
    # vmap over per-example points.
    zs = {"u": jnp.stack([z["u"], -z["u"]])}
    ests = jax.vmap(lambda zz: jacobian.spectral_radius(f, zz, jax.random.key(0)))(zs)
    assert ests.shape == (2,) and np.all(np.isfinite(np.asarray(ests)))
    # A zero Jacobian gives 0, not NaN.
    assert float(jacobian.spectral_radius(lambda z: 0.0 * z, jnp.ones(3), jax.random.key(0))) == 0


def test_spectral_radius_bad_num_steps():
    with pytest.raises(ValueError, match="num_steps"):
        jacobian.spectral_radius(lambda z: z, jnp.zeros(3), jax.random.key(0), num_steps=0)


# --- backward_convergence -----------------------------------------------------------------------


def cell(p, x, z):
    return jnp.tanh(p["W"] @ z + x)


def test_backward_convergence_matches_the_first_solve_and_dense_solution():
    d = 5
    w = np.random.default_rng(0).normal(size=(d, d))
    p = {"W": jnp.asarray(0.6 * w / np.max(np.abs(np.linalg.eigvals(w))))}
    x = jnp.asarray(np.random.default_rng(1).normal(size=d))
    z_star = dq.solvers.broyden(lambda z: cell(p, x, z), jnp.zeros(d), tol=1e-13).value
    g = jnp.arange(1.0, d + 1.0)
    solver = dq.solvers.Anderson(max_steps=50, tol=1e-12, stop_mode="abs")
    sol = jax.jit(
        lambda p, x, z, g: jacobian.backward_convergence(cell, p, x, z, g, solver=solver)
    )(p, x, z_star, g)
    ref = first_solve(cell, p, x, z_star, g, solver)
    np.testing.assert_allclose(sol.value, ref.value, rtol=1e-12)
    jac = jax.jacobian(lambda z: cell(p, x, z))(z_star)
    u = jnp.linalg.solve((jnp.eye(d) - jac).T, g)
    np.testing.assert_allclose(sol.value, u, rtol=1e-9)
    assert int(sol.status) == dq.solvers.CONVERGED and int(sol.num_steps) > 1
    # A small budget reports MAX_STEPS and its residual (what a training loop would log).
    short = functools.partial(dq.solvers.fixed_point_iteration, max_steps=3, tol=1e-12)
    sol3 = jacobian.backward_convergence(cell, p, x, z_star, g, solver=short)
    assert int(sol3.status) == dq.solvers.MAX_STEPS and float(sol3.rel_residual) > 1e-6
    # Outside autodiff: differentiating through it gives zero gradients.
    grad = jax.grad(
        lambda p: jacobian.backward_convergence(cell, p, x, z_star, g, solver=solver).rel_residual
    )(p)
    assert float(jnp.max(jnp.abs(grad["W"]))) == 0.0


def test_backward_convergence_monitor_runs_the_same_fallback():
    z = jnp.array([0.7390851, 1.5434252])
    g = jnp.array([0.0, 1.0])
    plain = jacobian.backward_convergence(cos_cell, THETA, None, z, g, solver=FPI_4000)
    assert int(plain.status) == dq.solvers.MAX_STEPS
    sol = jacobian.backward_convergence(
        cos_cell, THETA, None, z, g, solver=FPI_4000, fallback="gmres"
    )
    assert int(sol.status) == dq.solvers.CONVERGED and int(sol.num_steps) > 4000
    np.testing.assert_allclose(sol.value[1], 1.0 / (1.0 + np.sin(1.5434252)), rtol=1e-5)


# --- complex states: C^n seen as R^{2n} -----------------------------------------------------------


N_C = 5


def _complex(rng, *shape):
    return jnp.asarray(rng.normal(size=shape) + 1j * rng.normal(size=shape))


def _complex_maps(seed=0):
    """A point ``z`` in ``C^5``, a holomorphic map and one through ``conj(z)``."""
    rng = np.random.default_rng(seed)
    a, b, z = _complex(rng, N_C, N_C), _complex(rng, N_C, N_C), _complex(rng, N_C)
    holomorphic = lambda z: jnp.tanh(a @ z)  # noqa: E731
    with_conj = lambda z: a @ z + 0.5 * b @ jnp.conj(z)  # noqa: E731
    return z, holomorphic, with_conj


def _real_jacobian(f, z):
    """The dense ``2n × 2n`` Jacobian of ``f`` on ``(Re z, Im z)``."""

    def f_real(r):
        w = f(jax.lax.complex(r[:N_C], r[N_C:]))
        return jnp.concatenate([jnp.real(w), jnp.imag(w)])

    return np.asarray(jax.jacfwd(f_real)(jnp.concatenate([jnp.real(z), jnp.imag(z)])))


def test_frobenius_of_a_complex_state_against_dense_jacobians():
    """``‖J_R‖²_F / (2n)``, and ``‖∂f/∂z‖²_F / n`` for a holomorphic map (the old validator
    refused complex states)."""
    z, holomorphic, with_conj = _complex_maps()
    key = jax.random.key(3)
    for f in (holomorphic, with_conj):
        exact = np.sum(_real_jacobian(f, z) ** 2) / (2 * N_C)
        est = jax.jit(functools.partial(jacobian.frobenius_sq, f, num_samples=20000))(z, key)
        assert est.dtype == jnp.float64 and est.shape == ()
        np.testing.assert_allclose(float(est), exact, rtol=0.05)  # rel. std <= 0.01
    a_hol = np.asarray(jax.jacfwd(holomorphic, holomorphic=True)(z))
    np.testing.assert_allclose(
        np.sum(_real_jacobian(holomorphic, z) ** 2) / (2 * N_C),
        np.sum(np.abs(a_hol) ** 2) / N_C,
        rtol=1e-12,
    )
    # complex64: the estimate in float32.
    z64 = z.astype(jnp.complex64)
    est64 = jacobian.frobenius_sq(lambda z: 0.5 * z, z64, key, num_samples=4000)
    assert est64.dtype == jnp.float32 and abs(float(est64) - 0.25) < 0.02


def test_spectral_radius_of_a_complex_state_against_dense_eigenvalues():
    z, holomorphic, with_conj = _complex_maps(1)
    key = jax.random.key(0)
    for f in (holomorphic, with_conj):
        rho = np.max(np.abs(np.linalg.eigvals(_real_jacobian(f, z))))
        est = float(jacobian.spectral_radius(f, z, key, num_steps=400))
        assert abs(est - rho) / rho < 1e-6
    # A dense complex matrix of known spectrum: its dominant eigenvalue is complex.
    rng = np.random.default_rng(2)
    eigs = np.array([0.9 * np.exp(0.7j), 0.5, -0.4j, 0.3 + 0.2j, 0.1])
    s = np.asarray(_complex(rng, N_C, N_C)) + 3 * np.eye(N_C)  # a non-unitary basis
    m = jnp.asarray(s @ np.diag(eigs) @ np.linalg.inv(s))
    est = jacobian.spectral_radius(lambda v: m @ v, jnp.zeros(N_C, jnp.complex128), key)
    assert est.dtype == jnp.float64
    np.testing.assert_allclose(float(est), 0.9, rtol=1e-6)


def test_backward_convergence_of_a_complex_state_against_a_dense_solve():
    """``u = Aᵀ u + g`` (JAX's VJP convention for a complex state) against ``(I − Aᵀ)⁻¹ g``."""
    rng = np.random.default_rng(4)
    a = np.asarray(_complex(rng, N_C, N_C))
    a = 0.7 * a / np.max(np.abs(np.linalg.eigvals(a)))
    x, g = _complex(rng, N_C), _complex(rng, N_C)

    def affine(p, x, z):
        return p @ z + x

    z_star = jnp.linalg.solve(jnp.eye(N_C, dtype=jnp.complex128) - a, x)
    want = np.linalg.solve(np.eye(N_C) - a.T, np.asarray(g))
    for solver in (dq.solvers.Anderson(max_steps=100, tol=1e-13), dq.solvers.GMRES(tol=1e-13)):
        run = functools.partial(jacobian.backward_convergence, affine, solver=solver)
        sol = jax.jit(run)(jnp.asarray(a), x, z_star, g)
        assert int(sol.status) == dq.solvers.CONVERGED
        np.testing.assert_allclose(np.asarray(sol.value), want, rtol=1e-10)
    # The cotangent must be a state too: a mixed or integer one is refused by name.
    with pytest.raises(ValueError, match="cotangent"):
        jacobian.backward_convergence(affine, jnp.asarray(a), x, z_star, jnp.zeros(N_C, int))
