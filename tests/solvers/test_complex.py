"""Complex states through every solver: fixed points of complex maps against dense solves.

A complex state is a vector of ``C^n`` with the Hermitian inner product ``<a, b> = sum conj(a) b``
(``deqjax._src.tree``). Each solver's fixed point of a complex contraction ``z = A z + b`` equals
the dense ``(I - A)^{-1} b``; a non-holomorphic nonlinear map (through ``conj(z)``) with a known
fixed point is solved by the fixed-point solvers; Broyden's iterates and inverse estimate are those
of a dense complex good-Broyden reference; the residuals reported hold when recomputed; batches
(``batch_ndim=1``), ``vmap`` and ``jit`` agree. An unconjugated inner product anywhere in these
solvers makes these tests fail (a Gram matrix that is not Hermitian, a Givens rotation that is not
unitary, a Broyden update with ``s^T`` in place of ``s^H``).
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from deqjax import solvers
from deqjax._src import tree
from deqjax._src.solvers import broyden_inverse
from tests.helpers.lanes import default_first
from tests.helpers.solver_problems import dense_broyden

N = 6

FIXED_POINT = {
    "FixedPointIteration": lambda **kw: solvers.FixedPointIteration(max_steps=400, **kw),
    "FixedPointIteration(damping)": lambda **kw: solvers.FixedPointIteration(
        max_steps=400, damping=0.7, **kw
    ),
    "Anderson": lambda **kw: solvers.Anderson(max_steps=100, **kw),
    "Anderson(m=3, beta=0.8)": lambda **kw: solvers.Anderson(max_steps=100, m=3, beta=0.8, **kw),
    "Broyden": lambda **kw: solvers.Broyden(max_steps=100, **kw),
    "Broyden(memory=3)": lambda **kw: solvers.Broyden(max_steps=100, memory=3, **kw),
    "Broyden(line_search)": lambda **kw: solvers.Broyden(max_steps=100, line_search=True, **kw),
    "Broyden(memory=3, line_search)": lambda **kw: solvers.Broyden(
        max_steps=100, memory=3, line_search=True, **kw
    ),
}
KRYLOV = {
    "GMRES": lambda **kw: solvers.GMRES(**kw),
    "GMRES(restart=3)": lambda **kw: solvers.GMRES(restart=3, max_steps=200, **kw),
    "BiCGStab": lambda **kw: solvers.BiCGStab(**kw),
    "NormalCG": lambda **kw: solvers.NormalCG(**kw),
}
ALL = {**FIXED_POINT, **KRYLOV}
KINDS = ["FixedPointIteration", "Anderson", "Broyden", "GMRES"]  # one solver of each kind


def kinds_first(names: dict) -> list:
    """``names`` with one solver of each kind in the default suite, the other variants slow."""
    first = [n for n in KINDS if n in names]
    return default_first(first + [n for n in names if n not in first], keep=len(first))


def complex_problem(n=N, batch=None, radius=0.8, seed=0, dtype=np.complex128):
    """A complex ``A`` of spectral radius ``radius`` (non-normal, eigenvalues off the real axis)
    and a complex ``b`` (``[batch, n]`` with ``batch``); numpy arrays."""
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(n, n)) + 1j * rng.normal(size=(n, n))
    a = radius * a / np.max(np.abs(np.linalg.eigvals(a)))
    shape = (n,) if batch is None else (batch, n)
    b = rng.normal(size=shape) + 1j * rng.normal(size=shape)
    return a.astype(dtype), b.astype(dtype)


def dense_fixed_point(a, b):
    """``(I - A)^{-1} b`` (rows of ``b`` for a batch), complex128."""
    a, b = np.asarray(a, np.complex128), np.asarray(b, np.complex128)
    return np.linalg.solve(np.eye(len(a)) - a, b.T).T


def recomputed_residual(f, z):
    """``||f(z) - z||`` in numpy complex128, per row for a batch."""
    z = np.asarray(z, np.complex128)
    g = np.asarray(f(jnp.asarray(z)), np.complex128) - z
    return np.sqrt(np.sum(np.abs(g) ** 2, axis=-1))


@pytest.mark.parametrize("name", kinds_first(ALL))
def test_affine_fixed_point_equals_dense_solve(name):
    a, b = complex_problem()
    aj, bj = jnp.asarray(a), jnp.asarray(b)

    def f(z):
        return aj @ z + bj

    sol = ALL[name](tol=1e-12, stop_mode="abs")(f, jnp.zeros(N, jnp.complex128))
    assert int(sol.status) == solvers.CONVERGED
    assert sol.value.dtype == jnp.complex128
    assert sol.abs_residual.dtype == jnp.float64 and sol.trace.dtype == jnp.float64
    np.testing.assert_allclose(sol.value, dense_fixed_point(a, b), rtol=0, atol=1e-10)
    # The residual reported is that of the value returned.
    np.testing.assert_allclose(sol.abs_residual, recomputed_residual(f, sol.value), rtol=1e-6)
    np.testing.assert_allclose(sol.f_value, f(sol.value), atol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(ALL))
def test_batch_native_equals_vmap_and_dense(name):
    a, b = complex_problem(batch=3, seed=1)
    aj, bj = jnp.asarray(a), jnp.asarray(b)
    want = dense_fixed_point(a, b)
    batched = ALL[name](tol=1e-11, batch_ndim=1)
    sol = jax.jit(lambda bj: batched(lambda z: z @ aj.T + bj, jnp.zeros_like(bj)))(bj)
    np.testing.assert_array_equal(sol.status, solvers.CONVERGED)
    np.testing.assert_allclose(sol.value, want, atol=1e-9)
    np.testing.assert_allclose(
        sol.abs_residual, recomputed_residual(lambda z: z @ aj.T + bj, sol.value), rtol=1e-6
    )
    single = ALL[name](tol=1e-11)
    per = jax.vmap(lambda bi: single(lambda z: aj @ z + bi, jnp.zeros_like(bi)))(bj)
    np.testing.assert_array_equal(per.status, solvers.CONVERGED)
    np.testing.assert_allclose(per.value, sol.value, atol=1e-9)


def _nonholomorphic(z_star, a, theta=0.9):
    """``f(z) = z* + A (z - z*) + 0.4 e^{i theta} |z - z*|^2 / (1 + |z - z*|^2)`` (elementwise
    modulus): not holomorphic (it depends on ``conj(z)``), a contraction near its fixed point
    ``z*``."""

    def f(z):
        d = z - z_star
        m = d * jnp.conj(d)
        return z_star + a @ d + 0.4 * jnp.exp(1j * theta) * m / (1 + m)

    return f


@pytest.mark.parametrize("name", kinds_first(FIXED_POINT))
def test_nonlinear_nonholomorphic_map_reaches_its_known_fixed_point(name):
    a, b = complex_problem(radius=0.5, seed=2)
    z_star = jnp.asarray(b)
    f = _nonholomorphic(z_star, jnp.asarray(a))
    sol = FIXED_POINT[name](tol=1e-11, stop_mode="abs")(f, jnp.zeros(N, jnp.complex128))
    assert int(sol.status) == solvers.CONVERGED
    np.testing.assert_allclose(sol.value, z_star, atol=1e-9)
    np.testing.assert_allclose(sol.abs_residual, recomputed_residual(f, sol.value), rtol=1e-6)


def _conj_affine(norm=0.8, seed=4):
    """``f(z) = A conj(z) + b`` (``||A||_2 = norm``: a contraction), whose Jacobian is only
    real-linear, and its fixed point from the dense real system on ``(Re z, Im z)``:
    ``x = Ar x + Ai y + br``, ``y = Ai x - Ar y + bi``."""
    a, b = complex_problem(seed=seed)
    a = norm * a / np.linalg.norm(a, 2)
    big = np.block([[a.real, a.imag], [a.imag, -a.real]])
    xy = np.linalg.solve(np.eye(2 * N) - big, np.concatenate([b.real, b.imag]))
    aj, bj = jnp.asarray(a), jnp.asarray(b)
    return (lambda z: aj @ jnp.conj(z) + bj), xy[:N] + 1j * xy[N:]


@pytest.mark.parametrize("name", ["FixedPointIteration", "FixedPointIteration(damping)"])
def test_a_cell_linear_in_conj_z_is_solved_by_fixed_point_iteration(name):
    """The solver the Anderson and Broyden docstrings name for a cell that is not holomorphic:
    it assumes nothing of the Jacobian and reaches the dense fixed point."""
    f, z_star = _conj_affine()
    sol = FIXED_POINT[name](tol=1e-11, stop_mode="abs")(f, jnp.zeros(N, jnp.complex128))
    assert int(sol.status) == solvers.CONVERGED
    np.testing.assert_allclose(sol.value, z_star, atol=1e-9)


@pytest.mark.parametrize("name", ["Anderson", "Broyden", "Broyden(line_search)"])
def test_anderson_and_broyden_solve_such_a_cell_on_its_real_and_imaginary_parts(name):
    """The other way their docstrings give: the state as the pair ``(Re z, Im z)`` of real
    arrays, on which their models are those of ``R^{2n}``."""
    f, z_star = _conj_affine()

    def on_parts(xy):
        out = f(jax.lax.complex(xy[0], xy[1]))
        return jnp.stack([out.real, out.imag])

    sol = FIXED_POINT[name](tol=1e-11, stop_mode="abs")(on_parts, jnp.zeros((2, N)))
    assert int(sol.status) == solvers.CONVERGED
    value = np.asarray(sol.value)
    np.testing.assert_allclose(value[0] + 1j * value[1], z_star, atol=1e-9)


@pytest.mark.parametrize("name", kinds_first(FIXED_POINT))
def test_holomorphic_nonlinear_map(name):
    """``z = z* + A (z - z*) + 0.3 (z - z*)^2``: holomorphic, fixed point ``z*``."""
    a, b = complex_problem(radius=0.6, seed=3)
    z_star, aj = jnp.asarray(0.5 * b), jnp.asarray(a)

    def f(z):
        return z_star + aj @ (z - z_star) + 0.3 * (z - z_star) ** 2

    sol = FIXED_POINT[name](tol=1e-11, stop_mode="abs")(f, jnp.zeros(N, jnp.complex128))
    assert int(sol.status) == solvers.CONVERGED
    np.testing.assert_allclose(sol.value, z_star, atol=1e-9)


def test_pytree_state_of_complex_leaves_of_two_widths():
    """A pytree state: complex64 and complex128 leaves (reductions in float64)."""
    a, b = complex_problem(n=4, seed=4)
    a64, b64 = jnp.asarray(a), jnp.asarray(b)

    def f(z):
        first = jnp.asarray(0.5 * z["b"][:2], jnp.complex64) + jnp.asarray(b64[:2], jnp.complex64)
        return {"a": first, "b": a64 @ z["b"] + b64}

    z0 = {"a": jnp.zeros(2, jnp.complex64), "b": jnp.zeros(4, jnp.complex128)}
    want_b = dense_fixed_point(a, b)
    for name in ("Anderson", "Broyden", "FixedPointIteration"):
        sol = FIXED_POINT[name](tol=1e-6)(f, z0)
        assert int(sol.status) == solvers.CONVERGED, name
        assert sol.value["a"].dtype == jnp.complex64 and sol.abs_residual.dtype == jnp.float64
        np.testing.assert_allclose(sol.value["b"], want_b, atol=1e-5)


@pytest.mark.parametrize("name", kinds_first(ALL))
def test_complex64_smoke(name):
    a, b = complex_problem(dtype=np.complex64, seed=5)
    aj, bj = jnp.asarray(a), jnp.asarray(b)
    sol = jax.jit(lambda: ALL[name](tol=1e-5)(lambda z: aj @ z + bj, jnp.zeros(N, jnp.complex64)))()
    assert int(sol.status) == solvers.CONVERGED
    assert sol.value.dtype == jnp.complex64 and sol.rel_residual.dtype == jnp.float32
    np.testing.assert_allclose(sol.value, dense_fixed_point(a, b), atol=1e-4)


@pytest.mark.parametrize("memory", [3, None])
@pytest.mark.parametrize("batch_ndim", [0, 1])
def test_broyden_iterates_and_inverse_equal_dense_complex_broyden(memory, batch_ndim):
    """The steps-only form (Kelley's) on a complex holomorphic map: its iterates and final inverse
    estimate are those of the dense complex good-Broyden update, restarts included; the
    transpose applied by ``inverse_rmatvec`` is the plain one (JAX's cotangent convention)."""
    a, b = complex_problem(radius=1.2, seed=6)
    aj, bj = jnp.asarray(a), jnp.asarray(b)
    steps = 10

    def fn(z):
        return jnp.tanh(aj @ z + bj) if batch_ndim == 0 else jnp.tanh(z @ aj.T + bj[None])

    solver = solvers.Broyden(
        tol=0.0,
        max_steps=steps,
        memory=memory,
        return_inverse=True,
        sample_steps=tuple(range(steps)),
        batch_ndim=batch_ndim,
    )
    z0 = jnp.zeros((1, N) if batch_ndim else (N,), jnp.complex128)
    sol = jax.jit(lambda: solver(fn, z0))()
    pick = (lambda t: t[0]) if batch_ndim else (lambda t: t)
    want_xs, want_h = dense_broyden(
        lambda z: np.tanh(a @ z + b), np.zeros(N), steps, memory or steps, np.complex128
    )
    np.testing.assert_allclose(pick(sol.samples), want_xs, rtol=1e-10, atol=1e-12)
    estimate = jax.tree_util.tree_map(pick, sol.inverse_estimate)
    eye = jnp.eye(N, dtype=jnp.complex128)
    got_h = np.stack([broyden_inverse.inverse_matvec(estimate, e) for e in eye], 1)
    np.testing.assert_allclose(got_h, want_h, rtol=1e-9, atol=1e-11)
    got_ht = np.stack([broyden_inverse.inverse_rmatvec(estimate, e) for e in eye], 1)
    np.testing.assert_allclose(got_ht, want_h.T, rtol=1e-9, atol=1e-11)
    assert np.max(np.abs(want_h + np.eye(N))) > 1e-2  # the estimate is not just -I


def test_broyden_line_search_inverse_equals_dense_complex_broyden():
    """The two-buffer form (line search on) where every trial is accepted: the dense complex
    good-Broyden iterates and inverse."""
    a, b = complex_problem(radius=0.5, seed=7)
    aj, bj = jnp.asarray(a), jnp.asarray(b)
    steps = 8
    solver = solvers.Broyden(
        tol=0.0,
        max_steps=steps,
        line_search=True,
        return_inverse=True,
        sample_steps=tuple(range(steps)),
    )
    sol = jax.jit(lambda: solver(lambda z: jnp.tanh(aj @ z + bj), jnp.zeros(N, jnp.complex128)))()
    want_xs, want_h = dense_broyden(
        lambda z: np.tanh(a @ z + b), np.zeros(N), steps, steps, np.complex128
    )
    np.testing.assert_allclose(sol.samples, want_xs, rtol=1e-9, atol=1e-12)
    eye = jnp.eye(N, dtype=jnp.complex128)
    got_h = np.stack([broyden_inverse.inverse_matvec(sol.inverse_estimate, e) for e in eye], 1)
    np.testing.assert_allclose(got_h, want_h, rtol=1e-8, atol=1e-10)


def _dense_complex_anderson(f, z0, steps, m, beta, lam):
    """Anderson acceleration on ``C^n`` (complex128 numpy): over the last ``m`` iterates,
    ``alpha = H^{-1} 1 / (1^T H^{-1} 1)`` with ``H = G^H G / mean(diag) + lam I`` and
    ``x_+ = sum_i alpha_i (x_i + beta G_i)``; the iterates ``x_0 .. x_{steps - 1}``."""
    x = np.asarray(z0, np.complex128)
    xs, hist_x, hist_g = [], [], []
    for _ in range(steps):
        xs.append(x)
        g = np.asarray(f(x), np.complex128) - x
        hist_x, hist_g = (hist_x + [x])[-m:], (hist_g + [g])[-m:]
        gmat = np.stack(hist_g, 1)  # [n, k]
        gram = np.conj(gmat.T) @ gmat
        h = gram / np.mean(np.real(np.diag(gram))) + lam * np.eye(len(hist_g))
        y = np.linalg.solve(h, np.ones(len(hist_g)))
        alpha = y / np.sum(y)
        x = sum(a * (xi + beta * gi) for a, xi, gi in zip(alpha, hist_x, hist_g))
    return np.stack(xs)


@pytest.mark.parametrize("batch_ndim", [0, 1])
def test_anderson_iterates_equal_dense_complex_anderson(batch_ndim):
    a, b = complex_problem(radius=0.9, seed=10)
    aj, bj = jnp.asarray(a), jnp.asarray(b)
    steps, m, beta, lam = 12, 3, 0.9, 1e-4
    solver = solvers.Anderson(
        tol=0.0, max_steps=steps, m=m, beta=beta, lam=lam, sample_steps=tuple(range(steps))
    )
    if batch_ndim:
        solver = solver.replace(batch_ndim=1)
        sol = jax.jit(
            lambda: solver(
                lambda z: jnp.tanh(z @ aj.T + bj[None]), jnp.zeros((1, N), jnp.complex128)
            )
        )()
        got = sol.samples[0]
    else:
        sol = jax.jit(
            lambda: solver(lambda z: jnp.tanh(aj @ z + bj), jnp.zeros(N, jnp.complex128))
        )()
        got = sol.samples
    want = _dense_complex_anderson(lambda z: np.tanh(a @ z + b), np.zeros(N), steps, m, beta, lam)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


def test_anderson_gram_matrix_is_hermitian_and_mixing_sums_to_one():
    """One Anderson step's own arithmetic: the Gram matrix ``[<G_i, G_j>]`` is Hermitian and the
    complex mixing coefficients satisfy ``sum alpha = 1`` and minimise ``||sum alpha_i G_i||``."""
    from deqjax._src.solvers import anderson

    rng = np.random.default_rng(8)
    m = 4
    gs = jnp.asarray(rng.normal(size=(m, N)) + 1j * rng.normal(size=(m, N)))
    gram = jnp.zeros((m, m), jnp.complex128)
    ids = jnp.arange(m)
    for i in range(m):
        gram = anderson._gram_with_row(gram, gs, gs[i], tree.tree_sq_norm(gs[i]), ids == i, 0)
    dense = np.conj(np.asarray(gs)) @ np.asarray(gs).T
    np.testing.assert_allclose(gram, dense, atol=1e-12)
    eye = jnp.eye(m, dtype=jnp.complex128)
    alpha = anderson._mixing_weights(gram, jnp.ones(m, bool), 0.0, eye, ())
    np.testing.assert_allclose(jnp.sum(alpha), 1.0, atol=1e-12)
    # The constrained least-squares solution, densely: minimise ||G^T alpha|| s.t. sum alpha = 1.
    y = np.linalg.solve(dense, np.ones(m))
    np.testing.assert_allclose(alpha, y / np.sum(y), atol=1e-9)


def test_check_resolvable_warns_for_complex64_below_its_eps():
    a, b = complex_problem(dtype=np.complex64)
    with pytest.warns(UserWarning, match="complex64"):
        solvers.Anderson(tol=1e-9, max_steps=5)(
            lambda z: jnp.asarray(a) @ z + jnp.asarray(b), jnp.zeros(N, jnp.complex64)
        )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        solvers.Anderson(tol=1e-9, max_steps=5)(
            lambda z: jnp.asarray(a, jnp.complex128) @ z + jnp.asarray(b, jnp.complex128),
            jnp.zeros(N, jnp.complex128),
        )


def test_validation_refuses_integers_and_mixed_real_complex_states():
    def f(z):
        return z

    with pytest.raises(ValueError, match="floating-point or complex"):
        solvers.Anderson()(f, jnp.zeros(3, jnp.int32))
    with pytest.raises(ValueError, match="floating-point or complex"):
        solvers.GMRES()(f, jnp.zeros(3, bool))
    with pytest.raises(ValueError, match="mixes real and complex"):
        solvers.Anderson()(f, {"a": jnp.zeros(3), "b": jnp.zeros(3, jnp.complex64)})
    # f must keep the state complex (a map to real values changes the dtype).
    with pytest.raises(ValueError, match="dtype"):
        solvers.Anderson()(jnp.real, jnp.zeros(3, jnp.complex128))


def test_divergence_is_detected_for_a_complex_state():
    a, b = complex_problem(radius=1.5, seed=9)
    sol = solvers.FixedPointIteration(max_steps=100, tol=1e-10)(
        lambda z: jnp.asarray(a) @ z + jnp.asarray(b), jnp.zeros(N, jnp.complex128)
    )
    assert int(sol.status) == solvers.DIVERGED


def _dense_complex_bicgstab(a, b, iters):
    """``iters`` BiCGStab iterations (van der Vorst 1992) on ``A x = b`` from 0, complex128
    numpy, with Hermitian inner products (``np.vdot`` conjugates its first argument)."""
    x = np.zeros_like(b)
    r = b - a @ x
    r0, p, v = r.copy(), np.zeros_like(b), np.zeros_like(b)
    rho, alpha, omega = 1.0 + 0j, 1.0 + 0j, 1.0 + 0j
    for _ in range(iters):
        rho_new = np.vdot(r0, r)
        p = r + (rho_new / rho) * (alpha / omega) * (p - omega * v)
        v = a @ p
        alpha = rho_new / np.vdot(r0, v)
        s = r - alpha * v
        t = a @ s
        omega = np.vdot(t, s) / np.vdot(t, t)
        x = x + alpha * p + omega * s
        r = s - omega * t
        rho = rho_new
    return x


def test_bicgstab_iterates_equal_dense_complex_bicgstab():
    """Three BiCGStab iterations (one chunk) on a complex system: those of the dense reference
    with Hermitian inner products (``omega = <t, s> / <t, t>`` minimises ``||s - omega t||``)."""
    from deqjax._src.solvers import krylov_chunks

    a, b = complex_problem(n=8, radius=0.9, seed=11)
    m = np.eye(8) - a
    mj = jnp.asarray(m)
    target = jnp.asarray(0.0)
    for iters in (1, 3):
        got = krylov_chunks.bicgstab(
            lambda u: mj @ u, jnp.asarray(b), jnp.zeros(8, jnp.complex128), target, iters, 0
        )
        np.testing.assert_allclose(got, _dense_complex_bicgstab(m, b, iters), rtol=1e-10)


@pytest.mark.parametrize("cls", [solvers.Anderson, solvers.Broyden])
def test_anderson_and_broyden_name_the_solver_for_a_cell_through_conj_z(cls):
    """Their complex models assume a holomorphic cell: the caveat stands in their docstrings,
    with the solver that works (the tests above) and the real and imaginary parts."""
    doc = " ".join(cls.__doc__.split())
    assert "conj(z)" in doc and "holomorphic" in doc
    assert "FixedPointIteration" in doc and "(Re z, Im z)" in doc
    assert "FixedPointIteration" in " ".join(solvers.__doc__.split())
