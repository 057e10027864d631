"""The batching modes of dq.nn.DEQ: batch-native per-example stopping, the vmap of single-problem
solves for a solver that is not batch-native, and the whole-batch solve."""

import functools

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import deqjax as dq
from deqjax import nn
from deqjax._src.deq import batch_modes
from deqjax._src.normalise import as_solver
from tests.helpers.deq_cells import (
    MAX_STEPS,
    RATE,
    SOLVER,
    TinyCell,
    inputs,
    rel_err,
    spread_inputs,
    zeros_state,
)
from tests.helpers.lanes import default_first

SOLVERS = {
    "fixed_point": SOLVER,
    "anderson": functools.partial(dq.solvers.anderson, tol=1e-11, max_steps=MAX_STEPS),
    "broyden": functools.partial(dq.solvers.broyden, tol=1e-11, max_steps=MAX_STEPS, memory=10),
}


def not_batch_native(solver):
    """A user's callable around ``solver``: it declares no ``batch_ndim``, so per-example solves
    run as a vmap of single-problem solves."""
    return lambda f, z0: solver(f, z0)


class ShapeRecordingCell(TinyCell):
    """TinyCell that records the batch size of every (traced) evaluation."""

    def __init__(self, batches, name=None):
        super().__init__(name=name)
        self.batches = batches

    def __call__(self, z, x, *, is_training=False):
        self.batches.append(z.shape[0])
        return super().__call__(z, x, is_training=is_training)


def make_mode(per_example, solver, batches=None, adjoint=None):
    def forward(x):
        cell = TinyCell() if batches is None else ShapeRecordingCell(batches, name="tiny_cell")
        deq = nn.DEQ(
            cell,
            solver=solver,
            adjoint=adjoint,
            per_example=per_example,
            init_state=zeros_state,
        )
        out = deq.solve(x, is_training=False)
        return out.z_star, out.solution

    return hk.transform(forward)


@pytest.fixture(scope="module")
def params():
    return jax.jit(make_mode(True, SOLVER).init)(jax.random.PRNGKey(0), inputs())


def test_the_mode_follows_the_solvers_declared_capability():
    native, user = as_solver(SOLVERS["anderson"]), as_solver(not_batch_native(SOLVER))
    assert batch_modes.mode_of(True, native) is batch_modes.Mode.BATCH_NATIVE
    assert batch_modes.mode_of(True, user) is batch_modes.Mode.VMAP
    assert batch_modes.mode_of(False, native) is batch_modes.Mode.WHOLE_BATCH
    assert batch_modes.mode_of(False, user) is batch_modes.Mode.WHOLE_BATCH
    assert batch_modes.mode_solver(batch_modes.Mode.BATCH_NATIVE, native).batch_ndim == 1
    assert batch_modes.mode_solver(batch_modes.Mode.VMAP, user).batch_ndim == 0


@pytest.mark.parametrize("name", default_first(sorted(SOLVERS)))
def test_batch_native_equals_the_vmap_of_single_solves_per_example(name, params):
    """z*, per-example num_steps/status/residuals and float64 implicit gradients of the default
    (batch-native) mode equal the vmap mode's (the same solver behind a user's callable, which is
    not batch-native); the cell sees the whole batch, never batch 1."""
    x = spread_inputs()
    solver = SOLVERS[name]
    native_batches, vmap_batches = [], []
    native = make_mode(True, solver, native_batches)
    vmapped = make_mode(True, not_batch_native(solver), vmap_batches)

    def run(t):
        def loss(p, x):
            z, sol = t.apply(p, None, x)
            return jnp.sum(jnp.sin(z)) + 0.5 * jnp.sum(z**2), (z, sol)

        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(params, x)

    (_, (z_n, sol_n)), g_n = run(native)
    (_, (z_v, sol_v)), g_v = run(vmapped)
    assert set(native_batches) == {x.shape[0]}  # whole batch in every cell evaluation
    assert set(vmap_batches) == {1}
    assert sol_n.num_steps.shape == sol_n.status.shape == (x.shape[0],)
    assert sol_n.trace.shape == (x.shape[0], MAX_STEPS)
    assert len(set(np.asarray(sol_n.num_steps).tolist())) > 1  # examples stop on their own
    np.testing.assert_array_equal(sol_n.num_steps, sol_v.num_steps)
    np.testing.assert_array_equal(sol_n.status, sol_v.status)
    assert np.all(np.asarray(sol_n.status) == dq.solvers.CONVERGED)
    np.testing.assert_allclose(z_n, z_v, rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(sol_n.f_value, sol_v.f_value, rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(sol_n.rel_residual, sol_v.rel_residual, rtol=1e-3, atol=1e-14)
    assert rel_err(g_n, g_v) < 1e-8


def test_user_solver_without_batch_ndim_falls_back_to_vmap(params):
    """A solver without the batch_ndim keyword runs per example through vmap (same answer)."""
    x = spread_inputs()
    batches = []

    def my_solver(f, z0):
        return SOLVER(f, z0)

    z_user, sol_user = jax.jit(make_mode(True, my_solver, batches).apply)(params, None, x)
    z_ref, sol_ref = jax.jit(make_mode(True, SOLVER).apply)(params, None, x)
    assert set(batches) == {1}
    np.testing.assert_allclose(z_user, z_ref, rtol=1e-9, atol=1e-11)
    np.testing.assert_array_equal(sol_user.num_steps, sol_ref.num_steps)


class NoisyDropCell(hk.Module):
    """f(z) = drop(0.5 tanh(z) + x) + 0.1 ε with ε ~ N(0, I) drawn from the cell's own key."""

    def __init__(self, record=None, name=None):
        super().__init__(name=name)
        self.record = record

    def __call__(self, z, x, *, is_training=True):
        eps = jax.random.normal(hk.next_rng_key(), z.shape, z.dtype)
        drop = nn.VariationalDropout(RATE, name="drop")
        if self.record is not None:
            jax.debug.callback(self.record, drop(jnp.ones_like(z), is_training=is_training), eps)
        return drop(0.5 * jnp.tanh(z) + x, is_training=is_training) + 0.1 * eps


def test_batch_native_dropout_masks_and_keys_per_example_and_fixed_across_iterations():
    seen = []
    x = jax.random.normal(jax.random.PRNGKey(0), (6, 64), jnp.float64)

    def forward(x):
        deq = nn.DEQ(
            NoisyDropCell(record=lambda m, e: seen.append((np.asarray(m), np.asarray(e)))),
            solver=SOLVERS["anderson"],
        )
        out = deq.solve(x)
        return out.z_star, out.solution, out.cell_fn(out.z_star)

    t = hk.transform(forward)
    params = t.init(jax.random.PRNGKey(0), x)
    seen.clear()
    z, sol, fz = jax.jit(t.apply)(params, jax.random.PRNGKey(1), x)
    jax.effects_barrier()
    assert np.all(np.asarray(sol.status) == dq.solvers.CONVERGED)
    np.testing.assert_allclose(fz, z, atol=1e-9)  # the same masks and noise in cell_fn
    # prepare pass + one whole-batch evaluation per loop step + cell_fn (prepare + step)
    assert len(seen) == int(jnp.max(sol.num_steps)) + 3
    mask0, eps0 = seen[0]
    assert mask0.shape == eps0.shape == x.shape
    for m, e in seen:  # identical in every solver iteration
        np.testing.assert_array_equal(m, mask0)
        np.testing.assert_array_equal(e, eps0)
    # every example has its own mask and noise (rows independent, not one shared row)
    for i in range(x.shape[0]):
        for j in range(i):
            assert not np.array_equal(mask0[i], mask0[j])
            assert not np.allclose(eps0[i], eps0[j])
    keep = np.mean(mask0 > 0)
    assert 0.55 < keep < 0.85  # rate 0.3
    seen.clear()
    jax.jit(t.apply)(params, jax.random.PRNGKey(2), x)
    jax.effects_barrier()
    assert not np.array_equal(seen[0][0], mask0)  # a new forward pass draws new masks
