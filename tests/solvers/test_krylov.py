"""The Krylov solvers (GMRES, BiCGStab, CG on the normal equations) on affine maps: answers,
per-chunk accounting, the function and object forms, and has_aux."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from deqjax import solvers
from tests.helpers.lanes import default_first

KRYLOV = {"gmres": solvers.GMRES, "bicgstab": solvers.BiCGStab, "normal_cg": solvers.NormalCG}
FUNCTIONS = {"gmres": solvers.gmres, "bicgstab": solvers.bicgstab, "normal_cg": solvers.normal_cg}


def affine(seed=0, d=8, radius=0.9, batch=None):
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(d, d))
    a *= radius / np.max(np.abs(np.linalg.eigvals(a)))
    shape = (d,) if batch is None else (batch, d)
    return jnp.asarray(a), jnp.asarray(rng.normal(size=shape))


@pytest.mark.parametrize("name", KRYLOV)
def test_solves_the_linear_system_and_equals_the_function_form(name):
    a, b = affine()

    def f(u):
        return b + u @ a.T

    sol = KRYLOV[name](tol=1e-11, max_steps=400)(f, jnp.zeros(8))
    want = np.linalg.solve(np.eye(8) - np.asarray(a), np.asarray(b))
    assert int(sol.status) == solvers.CONVERGED
    np.testing.assert_allclose(sol.value, want, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(sol.f_value, f(sol.value), rtol=1e-12)
    again = FUNCTIONS[name](f, jnp.zeros(8), tol=1e-11, max_steps=400)
    np.testing.assert_array_equal(again.value, sol.value)
    np.testing.assert_array_equal(again.trace, sol.trace)


def test_gmres_charges_each_cycle_in_full():
    """Two evaluations for f(0) and f(z0), then restart + 3 per cycle, each written in the trace
    with the residual measured after its cycle."""
    a, b = affine(seed=1)
    sol = solvers.gmres(lambda u: b + a @ u, jnp.zeros(8), tol=1e-12, restart=4, max_steps=400)
    n = int(sol.num_steps)
    assert (n - 2) % 7 == 0 and n > 9
    trace = np.asarray(sol.trace)
    assert np.all(np.isfinite(trace[:n])) and np.all(np.isinf(trace[n:]))
    for start in range(2, n, 7):
        assert np.all(trace[start : start + 7] == trace[start])
    assert trace[0] == trace[1] and trace[n - 1] == float(sol.rel_residual)


def test_gmres_cycles_equal_jax_scipy_gmres():
    """Each cycle of the one-loop GMRES is a cycle of jax.scipy's restarted GMRES (one restart,
    ``solve_method="batched"``, started from the previous cycle's iterate): after c cycles the
    iterates agree to float64 rounding (one cycle, and a restart)."""
    import jax.scipy.sparse.linalg as jsla

    a, b = affine(seed=3, d=12, radius=0.95)
    matvec = lambda u: u - a @ u  # noqa: E731  (I - L) u
    u = jnp.zeros(12)
    for cycles in (1, 2):
        u, _ = jsla.gmres(matvec, b, u, tol=0.0, atol=0.0, restart=5, maxiter=1)
        ours = solvers.gmres(
            lambda v: b + a @ v, jnp.zeros(12), tol=0.0, restart=5, max_steps=2 + 8 * cycles
        )
        assert int(ours.num_steps) == 2 + 8 * cycles
        f_u = b + a @ u
        np.testing.assert_allclose(ours.f_value - ours.value, f_u - u, rtol=1e-9, atol=1e-13)


def test_gmres_ends_a_cycle_on_an_invariant_subspace():
    """L with two distinct eigenvalues: the Krylov space of any start has dimension 2, so the
    Arnoldi step after it finds a zero vector; the cycle ends there with the exact answer (no
    division by zero, no NaN)."""
    q, _ = np.linalg.qr(np.random.default_rng(4).normal(size=(10, 10)))
    a = jnp.asarray(q @ np.diag([0.5] * 5 + [-0.3] * 5) @ q.T)
    b = jnp.asarray(np.random.default_rng(5).normal(size=10))
    sol = solvers.gmres(lambda u: b + a @ u, jnp.zeros(10), tol=1e-12, restart=8)
    assert int(sol.status) == solvers.CONVERGED and int(sol.num_steps) == 2 + 11
    want = np.linalg.solve(np.eye(10) - np.asarray(a), np.asarray(b))
    np.testing.assert_allclose(sol.value, want, rtol=1e-10)


def test_gmres_program_has_one_loop_one_evaluation_of_f_and_three_norms():
    """The fallback of every implicit backward must be cheap to compile: GMRES is one while loop
    (no nested restart, Arnoldi or Gram–Schmidt loops; only its cycle's least squares, under a
    cond, runs two short loops of n Givens rotations and substitutions) with f traced once,
    inside it (the start,
    f(z0), is the loop's first step, and b = f(0) is never evaluated), and it reduces the state
    three times per step: the stopping rule's ||f(u) - u|| and ||f(u)|| (which also give the
    step's spread s) and the new basis vector's norm (which with its projections gives ||A v||).
    On XLA:CPU each reduction is a kernel or two, and compile time grows with the kernels."""
    a, b = affine()

    def f(u):
        return b + jnp.sin(a) @ u

    # restart 5: the least squares' reductions over [5] are not the state's over [8]
    solve = lambda u0: solvers.gmres(f, u0, restart=5).value  # noqa: E731
    text = jax.jit(solve).lower(jnp.zeros(8)).as_text()
    assert text.count("stablehlo.while") == 3  # the loop, and the least squares' two
    assert text.count("stablehlo.sine") == 1  # once, in the loop body
    norms = [
        line
        for line in text.splitlines()
        if "stablehlo.reduce" in line and "stablehlo.add" in line and "(tensor<8xf" in line
    ]
    assert len(norms) == 3, norms


@pytest.mark.parametrize("name", default_first(KRYLOV))
def test_has_aux_is_the_aux_at_the_value(name):
    a, bs = affine(seed=2, batch=3)

    def f(b):
        def fn(u):
            out = b + u @ a.T
            return out, {"out": out, "sum": jnp.sum(out, axis=-1)}

        return fn

    solver = KRYLOV[name](tol=1e-10, max_steps=400, has_aux=True)
    single = solver(f(bs[0]), jnp.zeros(8))
    np.testing.assert_allclose(single.aux["out"], single.f_value, rtol=1e-12)
    np.testing.assert_allclose(single.aux["sum"], jnp.sum(single.f_value), rtol=1e-12)
    vmapped = jax.jit(jax.vmap(lambda b: solver(f(b), jnp.zeros(8))))(bs)
    native = jax.jit(lambda: solver.replace(batch_ndim=1)(f(bs), jnp.zeros((3, 8))))()
    for sol in (vmapped, native):
        want = f(bs)(sol.value)[1]
        np.testing.assert_allclose(sol.aux["out"], want["out"], rtol=1e-12)
        np.testing.assert_allclose(sol.aux["sum"], want["sum"], rtol=1e-12)
    assert solver.replace(has_aux=False)(lambda u: f(bs[0])(u)[0], jnp.zeros(8)).aux is None


def affine_problem(seed=0, d=12, radius=0.95, batch=None):
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(d, d))
    a *= radius / np.max(np.abs(np.linalg.eigvals(a)))
    shape = (d,) if batch is None else (batch, d)
    return jnp.asarray(a), jnp.asarray(rng.normal(size=shape))


@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_krylov_solution_statistics(name):
    a, g = affine_problem()

    def h(u):
        return g + a.T @ u

    sol = jax.jit(lambda u0: FUNCTIONS[name](h, u0, tol=1e-10, max_steps=600))(jnp.zeros(12))
    want = np.linalg.solve(np.eye(12) - np.asarray(a).T, np.asarray(g))
    np.testing.assert_allclose(sol.value, want, rtol=1e-6)  # cond(I - A) ~ 1e2
    assert int(sol.status) == solvers.CONVERGED and 2 < int(sol.num_steps) <= 600
    # The residual is the true one, measured after the solve. It is a difference of numbers of
    # the size of u, so two programs (or a GPU's summation order) agree on it to the rounding of
    # a product with A (eps ‖g + |A|ᵀ|u| + u‖, the componentwise bound), not to a relative
    # tolerance of the residual itself (1e-10 of its size).
    r = h(sol.value) - sol.value
    eps = float(jnp.finfo(sol.value.dtype).eps)
    u_abs = jnp.abs(sol.value)
    scale = float(jnp.linalg.norm(g) + jnp.linalg.norm(jnp.abs(a).T @ u_abs + u_abs))
    np.testing.assert_allclose(sol.abs_residual, jnp.linalg.norm(r), rtol=0, atol=8 * eps * scale)
    assert float(sol.rel_residual) <= 1e-10
    np.testing.assert_allclose(sol.f_value, h(sol.value), rtol=1e-12)  # f at the returned iterate
    assert sol.trace.shape == (600,) and bool(jnp.isinf(sol.trace[int(sol.num_steps) :]).all())
    # A budget too small: MAX_STEPS with its best (finite) iterate, never worse than the start.
    short = FUNCTIONS[name](h, g, tol=1e-14, max_steps=8, stop_mode="abs")
    assert int(short.status) == solvers.MAX_STEPS
    assert float(short.abs_residual) <= float(jnp.linalg.norm(h(g) - g))
    # A start that already solves it costs no Krylov work.
    done = FUNCTIONS[name](h, jnp.asarray(want), tol=1e-8)
    assert int(done.status) == solvers.CONVERGED and int(done.num_steps) == 2


def test_krylov_nonfinite_status():
    a, g = affine_problem()
    sol = solvers.gmres(lambda u: g * jnp.nan + a.T @ u, jnp.zeros(12))
    assert int(sol.status) == solvers.NONFINITE


@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_krylov_batch_ndim_has_per_problem_statistics(name):
    a, g = affine_problem(batch=4)
    g = g * jnp.array([1e-3, 1.0, 10.0, 0.0])[:, None]  # the last one is solved by u = 0

    def h(u):
        return g + u @ a

    sol = FUNCTIONS[name](h, jnp.zeros((4, 12)), tol=1e-9, max_steps=600, batch_ndim=1)
    assert sol.status.shape == (4,) and sol.trace.shape == (4, 600)
    assert bool(jnp.all(sol.status == solvers.CONVERGED))
    want = np.linalg.solve(np.eye(12) - np.asarray(a).T, np.asarray(g).T).T
    np.testing.assert_allclose(sol.value, want, rtol=1e-7, atol=1e-10)
    assert bool(jnp.all(sol.rel_residual[:3] <= 1e-9))


def test_krylov_bad_arguments():
    with pytest.raises(ValueError, match="restart"):
        solvers.gmres(lambda u: u, jnp.zeros(3), restart=0)
    with pytest.raises(ValueError, match="batch_ndim"):
        solvers.bicgstab(lambda u: u, jnp.zeros(3), batch_ndim=2)


def test_krylov_mixed_stop_mode():
    a, g = affine_problem(seed=1)
    sol = solvers.gmres(
        lambda u: g + a.T @ u, jnp.zeros(12), stop_mode="mixed", tol=1e-9, atol=1e-10, max_steps=400
    )
    assert int(sol.status) == solvers.CONVERGED
    assert float(sol.abs_residual) <= 1e-10 + 1e-9 * float(jnp.linalg.norm(sol.value))
