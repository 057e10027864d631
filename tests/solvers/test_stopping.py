"""The one stopping rule: residuals by stop_mode, status codes, the best iterate, the trace."""

from __future__ import annotations

import warnings

import jax.numpy as jnp
import numpy as np
import pytest

from deqjax import solvers
from deqjax._src.solvers import stopping
from tests.helpers.solver_problems import (
    ACCELERATED,
    SOLVERS,
    noncontractive_problem,
    residuals,
    tanh_map,
)


def fpi_iterates(f, z0, n):
    zs = [np.asarray(z0)]
    for _ in range(n - 1):
        zs.append(np.asarray(f(jnp.asarray(zs[-1]))))
    return zs


@pytest.mark.parametrize("stop_mode", ["abs", "rel"])
def test_value_is_lowest_residual_iterate(stop_mode):
    a, x = noncontractive_problem()
    f = tanh_map(jnp.asarray(a), jnp.asarray(x))
    sol = solvers.fixed_point_iteration(
        f, jnp.zeros(10), tol=1e-8, max_steps=40, stop_mode=stop_mode
    )
    trace = np.asarray(sol.trace)
    best = int(np.argmin(trace))
    assert best != int(sol.num_steps) - 1  # the last iterate is not the best: the test bites
    np.testing.assert_allclose(
        sol.value, fpi_iterates(f, jnp.zeros(10), best + 1)[best], atol=1e-12
    )
    abs_res, rel_res = residuals(f, sol.value)
    np.testing.assert_allclose([sol.abs_residual, sol.rel_residual], [abs_res, rel_res], rtol=1e-10)
    np.testing.assert_allclose(trace.min(), abs_res if stop_mode == "abs" else rel_res, rtol=1e-10)


@pytest.mark.parametrize("name", SOLVERS)
def test_value_residual_is_trace_minimum(name):
    """Holds whatever the solver: on a hard problem cut short and on an easy converged one."""
    a, x = noncontractive_problem()
    for scale, max_steps in [(1.0, 7), (0.5, 60)]:
        f = tanh_map(scale * jnp.asarray(a), jnp.asarray(x))
        sol = SOLVERS[name](f, jnp.zeros(10), tol=1e-9, max_steps=max_steps)
        n = int(sol.num_steps)
        trace = np.asarray(sol.trace)
        assert np.all(np.isfinite(trace[:n])) and np.all(np.isinf(trace[n:]))
        abs_res, rel_res = residuals(f, sol.value)
        # The solver and residuals() each round f(z) = tanh(A z + x): an entry of A z + x (a dot
        # product of length d, plus x) is off by up to gamma_{d+1} (|A||z| + |x|), with
        # gamma_n ~ n eps / 2 (Higham 2002, section 3.1), so two roundings by up to twice that,
        # which tanh (slope <= 1) does not grow; tanh adds a few ulp of |f| to each. So the
        # residuals may differ by ~7e-15, 1e-5 of the converged solves' ~1e-9 (JAX 0.12 put them
        # 1e-17 apart, past rtol 1e-9); rtol checks the cut-short solves' (~1e-3).
        z, fz, eps = np.asarray(sol.value), np.asarray(f(sol.value)), np.finfo(np.float64).eps
        dot = (z.size + 1) * eps * (np.abs(scale * a) @ np.abs(z) + np.abs(x))
        entry = dot + 4 * eps * np.abs(fz)
        rounding = np.linalg.norm(entry)
        np.testing.assert_allclose(sol.abs_residual, abs_res, rtol=1e-9, atol=rounding)
        np.testing.assert_allclose(
            sol.rel_residual, rel_res, rtol=1e-9, atol=rounding / np.linalg.norm(fz)
        )
        np.testing.assert_allclose(trace.min(), sol.rel_residual, rtol=1e-12)
        if sol.status == solvers.CONVERGED:
            assert trace[n - 1] == sol.rel_residual <= 1e-9
        else:
            assert sol.status == solvers.MAX_STEPS and n == max_steps


@pytest.mark.parametrize("name", SOLVERS)
def test_status_converged_and_max_steps(name):
    sol = SOLVERS[name](jnp.cos, jnp.array(1.0), tol=1e-8, max_steps=50)
    assert sol.status == solvers.CONVERGED and solvers.status_name(sol.status) == "converged"
    sol = SOLVERS[name](jnp.cos, jnp.array(1.0), tol=1e-14, max_steps=3)
    assert sol.status == solvers.MAX_STEPS and int(sol.num_steps) == 3
    assert solvers.status_name(sol.status) == "max_steps"


def test_status_diverged_linear_map():
    """z -> 2z + 1 from 0: the residual |z + 1| doubles each step; stop when > 10 x the best."""
    sol = solvers.fixed_point_iteration(
        lambda z: 2 * z + 1, jnp.array(0.0), stop_mode="abs", divergence_factor=10.0
    )
    assert sol.status == solvers.DIVERGED and solvers.status_name(sol.status) == "diverged"
    # residuals 1, 2, 4, 8, 16: the fifth evaluation exceeds 10 x 1.
    assert int(sol.num_steps) == 5
    np.testing.assert_allclose(sol.trace[:5], [1, 2, 4, 8, 16])
    assert float(sol.value) == 0.0 and float(sol.abs_residual) == 1.0


@pytest.mark.parametrize("name", SOLVERS)
def test_status_diverged_every_solver(name):
    """Every solver's first step is x0 + g(x0) = 1, where g = exp(10 z) is e^10 > 1e4 x g(x0)."""
    sol = SOLVERS[name](lambda z: z + jnp.exp(10 * z), jnp.zeros(2), stop_mode="abs")
    assert sol.status == solvers.DIVERGED
    assert int(sol.num_steps) == 2
    np.testing.assert_array_equal(sol.value, np.zeros(2))


@pytest.mark.parametrize("name", SOLVERS)
def test_status_nonfinite_returns_finite_value(name):
    """f(z) = z/2 + 0.6 (fixed point 1.2) but NaN beyond z > 1: every solver steps past 1."""

    def f(z):
        return jnp.where(z > 1.0, jnp.nan, 0.5 * z + 0.6)

    sol = SOLVERS[name](f, jnp.zeros(1), tol=1e-10, max_steps=50)
    assert sol.status == solvers.NONFINITE and solvers.status_name(sol.status) == "nonfinite"
    n = int(sol.num_steps)
    assert 2 <= n < 50
    assert np.isinf(sol.trace[n - 1]) and np.all(np.isfinite(sol.trace[: n - 1]))
    assert np.all(np.isfinite(sol.value)) and float(sol.value[0]) <= 1.0
    assert np.isfinite(sol.abs_residual)
    np.testing.assert_allclose(sol.abs_residual, residuals(f, sol.value)[0], rtol=1e-12)


def test_status_nonfinite_at_first_evaluation_returns_z0():
    sol = solvers.anderson(lambda z: z * jnp.nan, jnp.ones(3))
    assert sol.status == solvers.NONFINITE and int(sol.num_steps) == 1
    np.testing.assert_array_equal(sol.value, np.ones(3))
    assert np.isinf(sol.abs_residual)


@pytest.mark.parametrize("name", SOLVERS)
@pytest.mark.parametrize("stop_mode", ["abs", "rel", "mixed"])
def test_blowing_up_map_reports_diverged_in_every_stop_mode(name, stop_mode):
    """z -> 2z + 1 from 0: DIVERGED from the absolute residual's growth, and the returned iterate
    is not blown up (its absolute residual is within 2x the lowest seen)."""
    f = lambda z: 2 * z + 1  # noqa: E731
    if name in ACCELERATED:
        # Anderson and Broyden solve this linear problem (z* = -1); Anderson with m = 1 is plain
        # iteration and blows up like it.
        sol = SOLVERS[name](f, jnp.zeros(3), stop_mode=stop_mode, max_steps=200, tol=1e-6)
        assert sol.status == solvers.CONVERGED
        np.testing.assert_allclose(sol.value, -np.ones(3), atol=1e-4)
        if name == "broyden":
            return
        sol = SOLVERS[name](f, jnp.zeros(3), stop_mode=stop_mode, max_steps=200, m=1)
    else:
        sol = SOLVERS[name](f, jnp.zeros(3), stop_mode=stop_mode, max_steps=200)
    assert sol.status == solvers.DIVERGED, solvers.status_name(sol.status)
    assert int(sol.num_steps) < 200
    assert float(sol.abs_residual) <= 2 * np.sqrt(3) + 1e-9
    np.testing.assert_allclose(sol.abs_residual, residuals(f, sol.value)[0], rtol=1e-9)


def test_blowing_up_map_rel_mode_fixed_point_iteration_details():
    """The exact numbers: residuals |z + 1| = 1, 2, 4, ...; DIVERGED at 2^14 > 1e4 x 1."""
    sol = solvers.fixed_point_iteration(lambda z: 2 * z + 1, jnp.array(0.0), max_steps=100)
    assert sol.status == solvers.DIVERGED
    assert int(sol.num_steps) == 15
    assert float(sol.abs_residual) <= 2.0 and float(sol.value) in (0.0, 1.0)


def geometric_decay(z):
    """jaxopt's geometric-decay problem: the fixed point is exactly 0."""
    return jnp.asarray([0.9, 0.99, 0.999], z.dtype) * z


GEOMETRIC_Z0 = np.asarray([1.0, 0.4, -0.2])


@pytest.mark.parametrize("name", SOLVERS)
def test_mixed_stop_mode_reaches_zero_fixed_point(name):
    """rel mode cannot converge to a fixed point at 0 (its residual stays near 1e-3 for plain
    iteration, >= 1 for Broyden); the combined rule ||g|| <= atol + tol ||z|| does."""
    z0 = jnp.asarray(GEOMETRIC_Z0)
    max_steps = 8000 if name == "fixed_point_iteration" else 100
    rel = SOLVERS[name](geometric_decay, z0, tol=1e-5, stop_mode="rel", max_steps=max_steps)
    # rel mode can only "converge" once the iterate underflows below its 1e-30 denominator guard
    # (the relative residual of r * z is >= 1e-3 for every z != 0).
    assert rel.status != solvers.CONVERGED or float(rel.abs_residual) < 1e-30
    mixed = SOLVERS[name](geometric_decay, z0, tol=1e-5, stop_mode="mixed", max_steps=max_steps)
    assert mixed.status == solvers.CONVERGED
    assert float(mixed.abs_residual) <= 1e-5 * (1 + np.linalg.norm(mixed.value))
    assert np.linalg.norm(mixed.value) < 2e-2  # jaxopt: "forced to take high tol" (0.999)
    n = int(mixed.num_steps)
    assert mixed.trace[n - 1] <= 1e-5
    # An explicit atol: ||g|| <= atol + tol ||z||.
    tight = SOLVERS[name](
        geometric_decay, z0, tol=1e-5, atol=1e-7, stop_mode="mixed", max_steps=max_steps
    )
    assert tight.status == solvers.CONVERGED
    assert float(tight.abs_residual) <= 1e-7 + 1e-5 * np.linalg.norm(tight.value)
    assert int(tight.num_steps) >= n


# --- the rule itself, as the Krylov solvers use it -------------------------------------------


def _rule(divergence_factor, slack, max_steps=10, stop_mode="abs"):
    return stopping.StoppingRule(1e-6, stop_mode, 0.0, divergence_factor, slack, max_steps, 0)


def _judge(rule, book, value, fvalue, **kw):
    x, fx = jnp.asarray([value]), jnp.asarray([fvalue])
    return stopping.judge(x, fx, fx - x, book, rule, **kw)


def test_judge_charges_a_chunk_and_writes_its_columns():
    """A step charged 3 evaluations writes its residual at 3 columns and counts 3 steps; the
    budget is judged against the next step's cost."""
    book = stopping.initial_book((), 10, jnp.float64)
    step = _judge(_rule(None, None), book, 0.0, 1.0, start=jnp.asarray(2), count=3, next_count=6)
    np.testing.assert_array_equal(step.book.trace[:5], [np.inf, np.inf, 1.0, 1.0, 1.0])
    assert np.all(np.isinf(step.book.trace[5:]))
    assert int(step.book.num_steps) == 3
    assert int(step.book.status) == solvers.MAX_STEPS  # 5 used + 6 next > 10
    step = _judge(_rule(None, None), book, 0.0, 1.0, start=jnp.asarray(2), count=3, next_count=5)
    assert bool(step.still)  # 5 used + 5 next <= 10


def test_judge_without_divergence_test_and_slack():
    """The Krylov rule: a residual 1e6 x the lowest is no divergence, and a finite residual below
    the best is taken even when its absolute residual is far above the lowest seen."""
    rule = _rule(None, None, stop_mode="rel")
    book = stopping.initial_book((), 10, jnp.float64)
    first = _judge(rule, book, 0.0, 1.0, start=jnp.asarray(0))  # abs 1, rel 1
    second = _judge(rule, first.book, 1.0, 1e7, start=jnp.asarray(1))  # abs ~1e7, rel ~1
    assert bool(second.still) and bool(second.improved)
    full = _rule(1e4, 2.0, stop_mode="rel")
    first = _judge(full, book, 0.0, 1.0, start=jnp.asarray(0))
    second = _judge(full, first.book, 1.0, 1e7, start=jnp.asarray(1))
    assert int(second.book.status) == solvers.DIVERGED and not bool(second.improved)


# --- STALLED: the floor of the arithmetic ------------------------------------------------------


def _floor_problem(dtype):
    """``z = 0.5 cos z + x``: a contraction (rate 0.5) that reaches its dtype's floor in ~25
    steps; past it the residual only jitters."""
    x = jnp.asarray(np.random.default_rng(0).normal(size=16), dtype)
    return lambda z: 0.5 * jnp.cos(z) + x, jnp.zeros(16, dtype)


@pytest.mark.parametrize("name", ["fpi", "anderson", "broyden", "gmres_on_affine"])
def test_a_solve_at_its_floor_stops_stalled_and_reports_the_floor(name):
    """float32, tol 1e-9 (below float32's 1.2e-7): a warning names tol and the dtype; the solve
    stops STALLED after stall_steps evaluations without a new best, long before max_steps, and
    reports the lowest residual it saw (the floor), as it is."""
    f, z0 = _floor_problem(jnp.float32)
    if name == "gmres_on_affine":
        a = jnp.asarray(np.random.default_rng(1).normal(size=(16, 16)) / 8.0, jnp.float32)
        f = lambda u: z0 + 1.0 + a @ u  # noqa: E731
    make = {
        "fpi": solvers.FixedPointIteration,
        "anderson": solvers.Anderson,
        "broyden": solvers.Broyden,
        "gmres_on_affine": solvers.GMRES,
    }[name]
    with pytest.warns(UserWarning, match=r"tol=1e-09.*float32"):
        sol = make(tol=1e-9, max_steps=1000)(f, z0)
    assert int(sol.status) == solvers.STALLED
    assert int(sol.num_steps) < 300
    trace = np.asarray(sol.trace)
    assert float(sol.rel_residual) == pytest.approx(trace.min(), rel=1e-6)
    assert 1e-9 < float(sol.rel_residual) < 1e-5  # the float32 floor, reported as it is
    # No new best in the last stall_steps evaluations, a new best just before them.
    n, best = int(sol.num_steps), int(np.argmin(trace))
    assert n - (best + 1) >= 30 or name == "gmres_on_affine"


def test_stall_steps_none_and_tol_zero_run_the_whole_budget():
    f, z0 = _floor_problem(jnp.float32)
    with pytest.warns(UserWarning):
        off = solvers.FixedPointIteration(tol=1e-9, max_steps=200, stall_steps=None)(f, z0)
    assert int(off.status) == solvers.MAX_STEPS and int(off.num_steps) == 200
    zero = solvers.Anderson(tol=0.0, stop_mode="abs", max_steps=200)(f, z0)
    assert int(zero.num_steps) == 200
    with pytest.raises(ValueError, match="stall_steps"):
        solvers.Anderson(stall_steps=0)


def test_stalled_is_per_problem_in_a_batch():
    """One problem at its floor stalls while another, slowly contracting, keeps improving."""
    x = jnp.asarray(np.random.default_rng(2).normal(size=(2, 16)), jnp.float32)
    rate = jnp.asarray([[0.5], [0.999]], jnp.float32)  # the second improves at every step
    f = lambda z: rate * jnp.cos(z) + x  # noqa: E731
    with pytest.warns(UserWarning):
        fpi = solvers.FixedPointIteration(tol=1e-9, max_steps=150, batch_ndim=1)
        sol = fpi(f, jnp.zeros_like(x))
    status = np.asarray(sol.status)
    assert status[0] == solvers.STALLED and status[1] == solvers.MAX_STEPS
    assert int(sol.num_steps[0]) < int(sol.num_steps[1])


@pytest.mark.parametrize("dtype,eps", [(jnp.bfloat16, 3.9e-3), (jnp.float16, 9.8e-4)])
def test_half_precision_tolerance_warns_and_the_floor_is_reported(dtype, eps):
    f, z0 = _floor_problem(dtype)
    with pytest.warns(UserWarning, match=rf"tol=0.0001.*{jnp.dtype(dtype).name}"):
        sol = solvers.Anderson(tol=1e-4, max_steps=300)(f, z0)
    # At the floor: STALLED long before the budget, or, where f(z) rounds to z exactly in this
    # dtype, CONVERGED with a zero residual; never the whole budget spent.
    assert int(sol.status) in (solvers.STALLED, solvers.CONVERGED) and int(sol.num_steps) < 100
    assert float(sol.rel_residual) < 10 * eps
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a resolvable tolerance does not warn
        ok = solvers.Anderson(tol=5 * eps, max_steps=300)(f, z0)
    assert int(ok.status) == solvers.CONVERGED
