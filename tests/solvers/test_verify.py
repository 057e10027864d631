"""Honest numbers at any matmul precision: a solve's status and residuals hold at full precision.

The cell of ``tests/helpers/tf32.py`` rounds its products as an NVIDIA GPU does at JAX's default
precision (TF32), so these tests reproduce the GPU's numbers on a CPU: at tol 1e-4 every solver
"meets" the tolerance in the rounded arithmetic while the relative residual recomputed in float64
is about 4e-4. They run at the precision a user has (JAX's default, ``None``), not at the
suite's pin.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import deqjax as dq
from deqjax._src.solvers import verify
from tests.helpers import tf32

pytestmark = pytest.mark.usefixtures("users_default_precision")

TOL = 1e-4
SOLVERS = {
    "FixedPointIteration": dq.solvers.FixedPointIteration,
    "Anderson": dq.solvers.Anderson,
    "Broyden": lambda **kw: dq.solvers.Broyden(memory=10, **kw),
}


def _solve(name, precision, *, batch_ndim=1, d=32, batch=8):
    p, x = tf32.tanh_layer(d, batch, radius=1.0)
    solver = SOLVERS[name](max_steps=100, tol=TOL, batch_ndim=batch_ndim)
    run = jax.jit(
        lambda p, x: dq.fixed_point(
            tf32.tf32_cell, p, x, jnp.zeros_like(x), solver=solver, precision=precision
        )
    )
    z, sol = run(p, x)
    return sol, tf32.rel_residual_f64(p, x, z)


@pytest.mark.parametrize("name", list(SOLVERS))
def test_no_solve_reports_converged_above_tol_at_the_default_precision(name):
    sol, true = _solve(name, None)
    status, reported = np.asarray(sol.status), np.asarray(sol.rel_residual)
    assert true.min() > TOL  # the rounded products floor every example above tol
    assert not np.any((status == dq.solvers.CONVERGED) & (true > TOL))
    np.testing.assert_array_less(0.9 * true, reported)  # reported: the full-precision residual
    # The loop met tol in the rounded arithmetic: those solves say where they stopped.
    assert np.any(status == dq.solvers.PRECISION_FLOOR)
    assert set(np.unique(status)) <= {dq.solvers.PRECISION_FLOOR, dq.solvers.STALLED}


@pytest.mark.parametrize("name", list(SOLVERS))
def test_at_full_precision_the_same_solves_converge(name):
    sol, true = _solve(name, "highest")
    assert np.all(np.asarray(sol.status) == dq.solvers.CONVERGED)
    assert np.all(true <= 1.01 * TOL)  # float32 rounding of the recomputation


def test_one_problem_and_vmap_are_checked_per_problem():
    p, x = tf32.tanh_layer(32, 4, radius=1.0)
    solver = dq.solvers.Anderson(max_steps=100, tol=TOL)

    def one(x_i):
        sol = solver(lambda z: tf32.tf32_cell(p, x_i[None], z[None])[0], jnp.zeros_like(x_i))
        return sol.value, sol.status, sol.rel_residual

    z, status, reported = jax.jit(jax.vmap(one))(x)
    true = tf32.rel_residual_f64(p, x, z)
    assert np.all(np.asarray(status) == dq.solvers.PRECISION_FLOOR)
    np.testing.assert_array_less(0.9 * true, np.asarray(reported))
    _, status1, _ = jax.jit(one)(x[0])  # one problem, no vmap
    assert int(status1) == dq.solvers.PRECISION_FLOOR


def _affine(batch=4, d=24):
    """``u ↦ g + u A`` with TF32-rounded products; ``A`` of spectral radius 0.9."""
    rng = np.random.default_rng(1)
    a = rng.normal(size=(d, d))
    a *= 0.9 / np.max(np.abs(np.linalg.eigvals(a)))
    g = rng.normal(size=(batch, d))
    a32, g32 = jnp.asarray(a, jnp.float32), jnp.asarray(g, jnp.float32)

    def h(u):
        return g32 + tf32.tf32(u) @ tf32.tf32(a32)

    def true_rel(u):
        u = np.asarray(u, np.float64)
        hu = g + u @ a
        return np.linalg.norm(hu - u, axis=-1) / np.linalg.norm(hu, axis=-1)

    return h, true_rel, jnp.zeros((batch, d), jnp.float32)


@pytest.mark.parametrize("name", ["GMRES", "BiCGStab", "NormalCG"])
def test_krylov_solves_are_checked(name):
    h, true_rel, u0 = _affine()
    solver = getattr(dq.solvers, name)(tol=1e-6, max_steps=200, batch_ndim=1)
    sol = jax.jit(lambda u0: solver(h, u0))(u0)
    true = true_rel(sol.value)
    status = np.asarray(sol.status)
    assert not np.any((status == dq.solvers.CONVERGED) & (true > 1e-6))
    np.testing.assert_array_less(0.9 * true, np.asarray(sol.rel_residual))


def test_backward_solves_and_their_statistics_are_checked():
    p, x = tf32.tanh_layer(32, 8, radius=1.0)
    solver = dq.solvers.Anderson(max_steps=100, tol=TOL, batch_ndim=1)
    z, _ = jax.jit(
        lambda p, x: dq.fixed_point(
            tf32.tf32_cell, p, x, jnp.zeros_like(x), solver=solver, precision="highest"
        )
    )(p, x)
    g = jnp.asarray(np.random.default_rng(2).normal(size=z.shape), jnp.float32)
    backward = jax.jit(
        lambda p, x, z, g: dq.jacobian.backward_convergence(
            tf32.tf32_cell, p, x, z, g, solver=solver, batch_ndim=1
        )
    )
    sol = backward(p, x, z, g)
    # The adjoint residual ‖g + Jᵀu − u‖ / ‖g + Jᵀu‖ in float64, J from the cell at z*.
    q = {k: np.asarray(v, np.float64) for k, v in p.items()}
    z64, u = np.asarray(z, np.float64), np.asarray(sol.value, np.float64)
    pre = z64 @ q["W"].T + np.asarray(x, np.float64) @ q["U"].T + q["b"]
    hu = np.asarray(g, np.float64) + ((1 - np.tanh(pre) ** 2) * u) @ q["W"]
    true = np.linalg.norm(hu - u, axis=-1) / np.linalg.norm(hu, axis=-1)
    status = np.asarray(sol.status)
    assert true.min() > TOL
    assert not np.any((status == dq.solvers.CONVERGED) & (true > TOL))
    np.testing.assert_array_less(0.9 * true, np.asarray(sol.rel_residual))

    # The gradient channel counts those solves as failures, with their full-precision residual.
    def loss(p, probe, precision):
        z, _ = dq.fixed_point(
            tf32.tf32_cell,
            p,
            x,
            jnp.zeros_like(x),
            solver=solver,
            backward_stats=probe,
            precision=precision,
            adjoint=dq.ImplicitAdjoint(fallback=None),
        )
        return jnp.sum(z * g)

    grad = jax.jit(jax.grad(loss, argnums=1), static_argnums=2)
    stats = grad(p, dq.BackwardStats.zeros(), None).metrics()
    assert float(stats["bwd_failure_rate"]) == 1.0
    assert float(stats["bwd_rel_residual"]) > 0.9 * float(true.mean())
    full = grad(p, dq.BackwardStats.zeros(), "highest").metrics()
    assert float(full["bwd_failure_rate"]) == 0.0 and float(full["bwd_rel_residual"]) <= TOL


def test_the_check_is_one_evaluation_and_only_at_reduced_precision():
    """One more evaluation of the cell (a tanh) in the forward program at the default
    precision, none at full precision; the loop's own statistics are untouched."""
    p, x = tf32.tanh_layer(16, 4, radius=1.0)
    solver = dq.solvers.FixedPointIteration(max_steps=50, tol=TOL, batch_ndim=1)

    def solve(p, x):
        return dq.fixed_point(tf32.tf32_cell, p, x, jnp.zeros_like(x), solver=solver)[1]

    def tanhs(ambient):
        with jax.default_matmul_precision(ambient):
            return jax.jit(solve).lower(p, x).as_text().count("stablehlo.tanh")

    assert tanhs("highest") == 1 and tanhs("default") == 2
    with jax.default_matmul_precision("default"):
        sol = jax.jit(solve)(p, x)
    assert int(sol.num_steps.max()) <= 50 and np.isinf(np.asarray(sol.trace)).any()


def test_summarize_counts_the_precision_floor():
    sol, _ = _solve("Anderson", None)
    metrics = dq.solvers.summarize(sol)
    assert float(metrics["precision_floor"]) == 1.0 and float(metrics["converged"]) == 0.0
    assert "precision_floor: 8" in repr(sol)


def test_the_warning_on_accelerators_names_tol_precision_and_floor(monkeypatch):
    monkeypatch.setattr(verify, "_warned", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        verify.warn_once(1e-4, "rel", "default", "cpu")  # CPU products are full float32
        verify.warn_once(1e-2, "rel", "default", "gpu")  # above TF32's rounding
        verify.warn_once(1e-4, "abs", "default", "gpu")  # an absolute tol has no scale
        assert not caught
        verify.warn_once(1e-4, "rel", "default", "gpu")
        verify.warn_once(1e-4, "rel", "default", "gpu")  # once
        verify.warn_once(1e-3, "rel", "bfloat16", "gpu")
    assert [w.category for w in caught] == [verify.PrecisionFloorWarning] * 2
    text = str(caught[0].message)
    assert "tol=0.0001" in text and "'default'" in text and "4.9e-04" in text
    assert "PRECISION_FLOOR" in text and "precision='highest'" in text
    assert "3.9e-03" in str(caught[1].message)
