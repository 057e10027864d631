"""bfloat16 and float16 DEQs: every solver and gradient strategy runs with a half-precision
state, the implicit backward (its GMRES fallback included) does its bookkeeping in float32, and
the gradient agrees with the float64 dense implicit gradient to the state's resolution."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import deqjax as dq
from tests.adjoints.strategies import every_strategy, solver_for
from tests.helpers.dense_ift import contractive_problem, dense_reference, loss_of_z, tanh_cell

HALF = {"bfloat16": jnp.bfloat16, "float16": jnp.float16}
SOLVERS = {
    "anderson": dq.solvers.Anderson(tol=2e-2),
    "broyden": dq.solvers.Broyden(tol=2e-2),
    "fpi": dq.solvers.FixedPointIteration(tol=2e-2, max_steps=100),
}
# A first backward solve of 2 steps fails at this tolerance, so the GMRES fallback runs.
FORCED_FALLBACK = dq.ImplicitAdjoint(
    solver=dq.solvers.FixedPointIteration(max_steps=2, tol=2e-2), fallback_factor=1.0
)


def _half_grad(dtype, solver, adjoint):
    p, x = contractive_problem(d=8)
    cast = lambda t: jax.tree_util.tree_map(lambda a: a.astype(dtype), t)  # noqa: E731
    probe = dq.BackwardStats.zeros()

    def loss(p, x, probe):
        z, _ = dq.fixed_point(
            tanh_cell,
            p,
            x,
            jnp.zeros(8, dtype),
            solver=solver,
            adjoint=adjoint,
            backward_stats=probe,
        )
        return loss_of_z(z.astype(jnp.float32))

    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(cast(p), cast(x), probe)
    return (p, x), grads


def _rel(a, b):
    la = [np.asarray(v, np.float64) for v in jax.tree_util.tree_leaves(a)]
    lb = [np.asarray(v, np.float64) for v in jax.tree_util.tree_leaves(b)]
    return max(np.max(np.abs(u - v)) for u, v in zip(la, lb)) / max(np.max(np.abs(v)) for v in lb)


@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize(
    "dtype",
    ["bfloat16", pytest.param("float16", marks=pytest.mark.slow)],  # f16: the slow lane
)
def test_half_precision_implicit_gradient_through_the_gmres_fallback(dtype, solver):
    (p, x), (g_p, g_x, stats) = _half_grad(HALF[dtype], SOLVERS[solver], FORCED_FALLBACK)
    assert jax.tree_util.tree_leaves(g_p)[0].dtype == HALF[dtype]
    assert float(stats.fallbacks) == 1.0  # the fallback ran, in float32 inside
    want_p, want_x = dense_reference(p, x)
    # bfloat16 keeps 8 bits (eps 3.9e-3), float16 11 (9.8e-4); the forward stops at tol 2e-2.
    assert _rel((g_p, g_x), (want_p, want_x)) < 0.06


# The exact gradients run in the fast lane; the approximate ones and SHINE in the slow lane.
FAST = ("ImplicitAdjoint", "ReversibleAdjoint")


@pytest.mark.parametrize(
    "strategy",
    [
        pytest.param(s, marks=() if s.__name__ in FAST else pytest.mark.slow)
        for s in every_strategy()
    ],
    ids=lambda s: s.__name__,
)
def test_every_gradient_strategy_runs_in_bfloat16(strategy):
    adjoint, name = strategy(), strategy.__name__
    solver = solver_for(
        adjoint,
        [
            SOLVERS["anderson"],
            SOLVERS["fpi"].replace(max_steps=50),
            SOLVERS["broyden"],
            dq.solvers.Reversible(tol=2e-2, max_steps=60),
        ],
    )
    (p, x), (g_p, g_x, _) = _half_grad(jnp.bfloat16, solver, adjoint)
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree_util.tree_leaves((g_p, g_x)))
    want = dense_reference(p, x)
    # Phantom and one-step gradients approximate the implicit one, and so does backprop through
    # fixed-point iteration stopped at tol 2e-2 (its derivative converges more slowly than z).
    bound = 0.06 if name in ("ImplicitAdjoint", "ShineAdjoint") else 0.5
    assert _rel((g_p, g_x), want) < bound


@pytest.mark.slow  # ~11 s: Haiku tracing of two DEQs
def test_deq_trains_under_a_jmp_policy_float32_params_bfloat16_compute():
    """Haiku's mixed precision: the cell's parameters stay float32, it computes in bfloat16; the
    DEQ's state is bfloat16 and its gradients reach the float32 parameters, close to a float32
    run's."""
    hk = pytest.importorskip("haiku")
    jmp = pytest.importorskip("jmp")

    class Cell(hk.Module):
        def __call__(self, z, x):
            return jnp.tanh(hk.Linear(8, name="w")(z) + x)

    def forward(x):
        deq = dq.nn.DEQ(Cell(), solver=dq.solvers.Anderson(tol=2e-2, batch_ndim=1))
        return jnp.sum(jnp.sin(deq(x)[0].astype(jnp.float32)))

    model = hk.transform(forward)
    x32 = jnp.asarray(np.random.default_rng(0).normal(size=(4, 8)), jnp.float32)
    params = model.init(jax.random.PRNGKey(0), x32)
    params = jax.tree_util.tree_map(lambda p: 0.3 * p, params)  # a contraction
    want = jax.jit(jax.grad(model.apply))(params, None, x32)

    policy = jmp.get_policy("params=float32,compute=bfloat16,output=bfloat16")
    hk.mixed_precision.set_policy(Cell, policy)
    try:
        mixed = hk.transform(forward)
        grads = jax.jit(jax.grad(mixed.apply))(params, None, x32.astype(jnp.bfloat16))
    finally:
        hk.mixed_precision.clear_policy(Cell)
    leaves = jax.tree_util.tree_leaves(grads)
    assert all(g.dtype == jnp.float32 for g in leaves)
    assert _rel(grads, want) < 0.06
