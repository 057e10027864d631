"""``check_every=k``: the loop reads its stopping rule every k steps, and nothing a user sees
changes: the iterate, NFE, status, residuals, trace and statistics are exactly those of k = 1."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import deqjax as dq
from deqjax._src.solvers import broyden_inverse
from deqjax._src.solvers import loop as loop_lib

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
    """Counts and codes equal; floats equal up to the rounding a differently fused program may
    give (XLA compiles the unrolled chunk on its own: one multiply-add fused or not)."""
    leaves_a, tree_a = jax.tree_util.tree_flatten(a)
    leaves_b, tree_b = jax.tree_util.tree_flatten(b)
    assert tree_a == tree_b
    for x, y in zip(leaves_a, leaves_b):
        x, y = np.asarray(x), np.asarray(y)
        if np.issubdtype(x.dtype, np.floating):
            np.testing.assert_allclose(x, y, rtol=1e-10, atol=1e-12)
        else:
            np.testing.assert_array_equal(x, y)


MODES = ["batch-native", "one problem", pytest.param("vmap", marks=pytest.mark.slow)]


@pytest.mark.parametrize("name", list(SOLVERS))
@pytest.mark.parametrize("mode", MODES)
def test_every_field_equals_checking_every_step(name, mode):
    w, x, scale = _problem()
    base = SOLVERS[name].replace(check_every=1)

    def solve(k):
        solver = base.replace(check_every=k)
        if mode == "batch-native":
            return jax.jit(lambda: solver.replace(batch_ndim=1)(_batch_f(w, x, scale), x * 0))()
        one = lambda xi, si: solver(lambda z: jnp.tanh(si * (w @ z) + xi), xi * 0)  # noqa: E731
        if mode == "vmap":
            return jax.jit(jax.vmap(one))(x, scale[:, 0])
        return jax.jit(one)(x[0], scale[0, 0])

    def seen(sol):
        """The Solution, Broyden's inverse estimate by what it does (a chunked batch-native
        solve keeps one more, never valid, row)."""
        if sol.inverse_estimate is None:
            return sol
        probe = jnp.ones_like(sol.value)
        action = broyden_inverse.inverse_matvec(sol.inverse_estimate, probe)
        return sol._replace(inverse_estimate=action)

    want = seen(solve(1))
    status = np.asarray(want.status)
    if mode != "one problem":  # some converge, at different steps
        assert len(set(np.asarray(want.num_steps).tolist())) > 1
        assert (status == dq.solvers.CONVERGED).any()
    for k in (4,):  # 37 steps: a partial last chunk (one step, then three past the budget)
        _assert_same(seen(solve(k)), want)


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


def test_the_loop_body_runs_k_steps_between_checks():
    w, x, scale = _problem()

    def tanhs_in_loop(k):
        solver = dq.solvers.FixedPointIteration(max_steps=20, batch_ndim=1, check_every=k)
        text = jax.jit(lambda: solver(_batch_f(w, x, scale), x * 0).value).lower().as_text()
        return text.count("stablehlo.tanh")

    one = tanhs_in_loop(1)
    assert tanhs_in_loop(4) - one == 3  # three more evaluations of f in the body


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "every", None])
def test_check_every_is_validated(bad):
    with pytest.raises(ValueError, match="check_every"):
        dq.solvers.Anderson(check_every=bad)


def test_auto_is_one_on_cpu_four_on_accelerators():
    assert dq.solvers.Anderson().check_every == "auto"
    assert loop_lib.resolve_check_every("auto", "cpu") == 1
    assert loop_lib.resolve_check_every("auto", "gpu") == 4
    assert loop_lib.resolve_check_every("auto", "tpu") == 4
    assert loop_lib.resolve_check_every(8, "gpu") == 8


@pytest.mark.parametrize("batch_ndim", [0, 1])
def test_a_budget_that_is_not_a_multiple_of_k_keeps_its_last_entries(batch_ndim):
    """tol = 0 runs the whole budget (37 evaluations): a chunk of 4 runs 3 steps past it, which
    must not touch the trace's last entry or any statistic."""
    w, x, scale = _problem()
    x = x if batch_ndim else x[0]

    def solve(k):
        solver = dq.solvers.Anderson(max_steps=37, tol=0.0, batch_ndim=batch_ndim, check_every=k)
        f = _batch_f(w, x, scale) if batch_ndim else (lambda z: jnp.tanh(w @ z + x))
        return jax.jit(lambda: solver(f, x * 0))()

    want = solve(1)
    assert np.all(np.asarray(want.num_steps) == 37)
    assert np.all(np.asarray(want.status) == dq.solvers.MAX_STEPS)
    assert np.isfinite(np.asarray(want.trace)[..., -1]).all()
    _assert_same(solve(4), want)
