"""``check_every=k``: the loop reads its stopping rule every k steps, and nothing a user sees
changes: the iterate, NFE, status, residuals, trace and statistics are bit for bit those of
k = 1."""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import deqjax as dq
from deqjax._src.solvers import loop as loop_lib
from tests.helpers.lanes import default_first

D, B = 6, 5


def _problem(seed=0):
    """A batch of tanh layers whose examples need different numbers of steps (x scaled from
    0.1 to 3), the last one hard (W scaled by 8)."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(D, D))
    w *= 0.9 / np.max(np.abs(np.linalg.eigvals(w)))
    x = rng.normal(size=(B, D)) * np.linspace(0.1, 3.0, B)[:, None]
    scale = np.ones((B, 1))
    scale[-1] = 8.0  # an expanding map: the iteration wanders (solvers may or may not converge)
    return jnp.asarray(w), jnp.asarray(x), jnp.asarray(scale)


def _batch_f(w, x, scale):
    return lambda z: jnp.tanh(scale * (z @ w.T) + x)


SOLVERS = {
    "FixedPointIteration": dq.solvers.FixedPointIteration(max_steps=37, tol=1e-9),
    "Anderson": dq.solvers.Anderson(max_steps=37, tol=1e-9, m=4),
    "Broyden": dq.solvers.Broyden(max_steps=37, tol=1e-9, memory=5, return_inverse=True),
    "Broyden line search": dq.solvers.Broyden(max_steps=37, tol=1e-9, line_search=True),
    "Reversible": dq.solvers.Reversible(max_steps=37, tol=1e-9, return_state=True),
    "sampled": dq.solvers.FixedPointIteration(max_steps=37, tol=1e-9, sample_steps=(0, 3, 30)),
}


def _assert_same(a, b):
    """Every field equal, bit for bit (floats included: each of the k bodies between two checks
    computes what the body of a k = 1 loop computes)."""
    leaves_a, tree_a = jax.tree_util.tree_flatten(a)
    leaves_b, tree_b = jax.tree_util.tree_flatten(b)
    assert tree_a == tree_b
    for x, y in zip(leaves_a, leaves_b):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), strict=True)


MODES = ["batch-native", "one problem", "vmap"]


@functools.cache
def _solve(name, mode, k):
    w, x, scale = _problem()
    solver = SOLVERS[name].replace(check_every=k)
    if mode == "batch-native":
        return jax.jit(lambda: solver.replace(batch_ndim=1)(_batch_f(w, x, scale), x * 0))()
    one = lambda xi, si: solver(lambda z: jnp.tanh(si * (w @ z) + xi), xi * 0)  # noqa: E731
    if mode == "vmap":
        return jax.jit(jax.vmap(one))(x, scale[:, 0])
    return jax.jit(one)(x[0], scale[0, 0])


# 37 steps: partial last chunks (k = 4: one step, then three past the budget; the GPU's "auto").
# "auto" is 1 here (a CPU). k = 4 in the default suite, the others in the slow lane.
@pytest.mark.parametrize("k", default_first([4, 2, 3, 7, "auto"]))
@pytest.mark.parametrize("name", list(SOLVERS))
@pytest.mark.parametrize("mode", MODES)
def test_every_field_equals_checking_every_step(name, mode, k):
    want = _solve(name, mode, 1)
    status = np.asarray(want.status)
    if mode != "one problem":  # some converge, at different steps
        assert len(set(np.asarray(want.num_steps).tolist())) > 1
        assert (status == dq.solvers.CONVERGED).any()
    _assert_same(_solve(name, mode, k), want)


def test_gradient_and_backward_statistics_equal_checking_every_step():
    w, x, scale = _problem()
    g = jnp.asarray(np.random.default_rng(3).normal(size=(B, D)))

    def loss(w, probe, k):
        solver = dq.solvers.Anderson(max_steps=40, tol=1e-8, batch_ndim=1, check_every=k)
        z, _ = dq.fixed_point(
            lambda w, x, z: _batch_f(w, x, scale)(z),
            w,
            x,
            x * 0,
            solver=solver,
            backward_stats=probe,
        )
        return jnp.sum(z * g)

    grad = jax.jit(jax.grad(loss, argnums=(0, 1)), static_argnums=2)
    want = grad(w, dq.BackwardStats.zeros(), 1)
    assert float(want[1].count) == B and float(want[1].num_steps) > 0
    _assert_same(grad(w, dq.BackwardStats.zeros(), 4), want)
    _assert_same(grad(w, dq.BackwardStats.zeros(), "auto"), want)  # "auto" under grad: 1 here


def _lowered(solver, platform):
    """The StableHLO of a batch-native solve with ``solver``, lowered for ``platform`` (a CPU
    lowers for any platform; nothing runs)."""
    w, x, scale = _problem()
    solve = jax.jit(lambda: solver.replace(batch_ndim=1)(_batch_f(w, x, scale), x * 0).value)
    return solve.trace().lower(lowering_platforms=(platform,)).as_text()


def _bodies(solver, platform):
    """Evaluations of f in the program lowered for ``platform`` (one tanh each)."""
    return _lowered(solver, platform).count("stablehlo.tanh")


def test_the_loop_body_runs_k_steps_between_checks():
    """On an accelerator the k bodies are unrolled, with an optimization barrier between two; on
    a CPU they are a loop of static trip count k (XLA:CPU drops the barriers before fusing)."""
    one = dq.solvers.FixedPointIteration(max_steps=20, check_every=1)
    four = one.replace(check_every=4)
    assert _bodies(four, "cuda") - _bodies(one, "cuda") == 3  # three more evaluations of f
    assert _lowered(four, "cuda").count("stablehlo.optimization_barrier") == 3
    assert _bodies(four, "cpu") == _bodies(one, "cpu")
    w, x, scale = _problem()
    solve = jax.jit(lambda: four.replace(batch_ndim=1)(_batch_f(w, x, scale), x * 0).value)
    assert '"known_trip_count":{"n":"4"}' in solve.lower().compile().as_text()


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "every", None, np.float64(2.0)])
def test_check_every_is_validated(bad):
    with pytest.raises(ValueError, match="check_every"):
        dq.solvers.Anderson(check_every=bad)


@pytest.mark.parametrize("k", [np.int64(4), np.int32(4), np.uint8(4)])
def test_any_integer_type_is_a_check_every(k):
    solver = dq.solvers.Anderson(check_every=k)
    assert solver.check_every == 4 and type(solver.check_every) is int
    assert solver == dq.solvers.Anderson(check_every=4)


def test_auto_is_one_on_cpu_four_on_accelerators():
    assert dq.solvers.Anderson().check_every == "auto"
    assert loop_lib.steps_per_check("auto", 50) == (1, 4)
    assert loop_lib.resolve_check_every("auto", "cpu") == 1
    assert loop_lib.resolve_check_every("auto", "gpu") == 4
    assert loop_lib.resolve_check_every("auto", "tpu") == 4
    assert loop_lib.resolve_check_every(8, "gpu") == 8


@pytest.mark.parametrize("platform, bodies", [("cpu", 1), ("cuda", 4), ("rocm", 4), ("tpu", 4)])
def test_auto_comes_from_the_platform_the_solve_is_compiled_for(platform, bodies):
    """Not from ``jax.default_backend()`` (a CPU here): a solve lowered for a GPU or a TPU runs
    4 bodies between two checks, whatever the host's default backend."""
    auto = dq.solvers.FixedPointIteration(max_steps=20)
    assert _bodies(auto, platform) == bodies


def _solve_anderson(max_steps, k):
    w, x, scale = _problem()
    solver = dq.solvers.Anderson(max_steps=max_steps, tol=1e-9, batch_ndim=1, check_every=k)
    return jax.jit(lambda: solver(_batch_f(w, x, scale), x * 0))()


@pytest.mark.parametrize("batch_ndim", [0, 1])
def test_a_budget_that_is_not_a_multiple_of_k_keeps_its_last_entries(batch_ndim):
    """tol = 0 runs the whole budget (21 evaluations, W scaled by 3: every example's residual is
    still >= 1e-11 there, far above float64's rounding, so none lands on its fixed point exactly,
    residual 0, as one did by 37 evaluations on JAX 0.8.0): a chunk of 4 runs 3 steps past it,
    which must not touch the trace's last entry or any statistic."""
    w, x, _ = _problem()
    x = x if batch_ndim else x[0]

    def solve(k):
        solver = dq.solvers.Anderson(max_steps=21, tol=0.0, batch_ndim=batch_ndim, check_every=k)
        f = (
            (lambda z: jnp.tanh(3.0 * (z @ w.T) + x))
            if batch_ndim
            else (lambda z: jnp.tanh(3.0 * (w @ z) + x))
        )
        return jax.jit(lambda: solver(f, x * 0))()

    want = solve(1)
    assert np.all(np.asarray(want.num_steps) == 21)
    assert np.all(np.asarray(want.status) == dq.solvers.MAX_STEPS)
    assert np.isfinite(np.asarray(want.trace)[..., -1]).all()
    _assert_same(solve(4), want)


def test_check_every_is_capped_at_max_steps():
    """More bodies between two checks than the budget could only run past it: check_every=400
    with max_steps=5 runs (and compiles) 5 bodies per check, as check_every=5 does."""
    capped = dq.solvers.Anderson(max_steps=5, check_every=400)
    assert loop_lib.steps_per_check(capped.check_every, capped.max_steps) == (5, 5)
    assert loop_lib.steps_per_check("auto", 2) == (1, 2)
    start = time.perf_counter()
    assert _bodies(capped, "cuda") == _bodies(capped.replace(check_every=5), "cuda") == 5
    assert time.perf_counter() - start < 60.0
    _assert_same(_solve_anderson(5, 400), _solve_anderson(5, 1))
