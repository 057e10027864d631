"""Given the Haiku DEQ's weights, ``deqjax.nnx.DEQ`` and ``deqjax.equinox.DEQ`` give its
equilibrium, ``Solution``, parameter gradients and backward statistics (float64, to 1e-10), for the
MLP cell and the DEQ-Transformer cell (with a memory), in the batch-native and the per-example
vmap modes."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import deqjax as dq
from tests.helpers import frontends as ref
from tests.helpers.lanes import default_first

ATOL = 1e-10


def nnx_deq(kind, solver, nested):
    rngs = nnx.Rngs(0)
    if kind == "mlp":
        cell = dq.nnx.MLPCell(ref.DX, ref.D, weight_norm=True, param_dtype=jnp.float64, rngs=rngs)
    else:
        cell = dq.nnx.TransformerCell(
            ref.DX, ref.D, num_heads=ref.HEADS, d_ff=6, param_dtype=jnp.float64, rngs=rngs
        )
    nnx.update(cell, {"params": nested})
    return dq.nnx.DEQ(cell, solver=solver, adjoint=ref.BACKWARD)


def equinox_deq(kind, solver, nested):
    key = jax.random.key(0)
    if kind == "mlp":
        cell = dq.equinox.MLPCell(ref.DX, ref.D, weight_norm=True, dtype=jnp.float64, key=key)
    else:
        cell = dq.equinox.TransformerCell(
            ref.DX, ref.D, num_heads=ref.HEADS, d_ff=6, dtype=jnp.float64, key=key
        )
    cell = eqx.tree_at(lambda c: c.params, cell, nested)
    return dq.equinox.DEQ(cell, solver=solver, adjoint=ref.BACKWARD)


def nnx_run(deq, x):
    """Output, Solution, parameter gradients (a nested dict) and backward statistics."""
    z_star, sol = nnx.jit(lambda m, x: m(x))(deq, x)

    def loss(m, probe):
        return ref.loss_of(m(x, backward_stats=probe)[0])

    grads, stats = nnx.jit(nnx.grad(loss, argnums=(0, 1)))(deq, dq.BackwardStats.zeros())
    return z_star, sol, nnx.to_pure_dict(grads["cell"]["params"]), stats


def equinox_run(deq, x):
    z_star, sol = eqx.filter_jit(lambda m, x: m(x))(deq, x)

    params, static = eqx.partition(deq, eqx.is_inexact_array)

    def loss(params, probe):
        return ref.loss_of(eqx.combine(params, static)(x, backward_stats=probe)[0])

    grad = eqx.filter_jit(jax.grad(loss, argnums=(0, 1)))
    grads, stats = grad(params, dq.BackwardStats.zeros())
    return z_star, sol, grads.cell.params, stats


FRAMEWORKS = {"nnx": (nnx_deq, nnx_run), "equinox": (equinox_deq, equinox_run)}


def assert_trees_close(got, want, atol=ATOL):
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(g, w, rtol=0, atol=atol)


# The MLP cell batch-native in the default suite; the Transformer cell and the vmap mode (the
# longest compiles) in the slow lane.
CASES = default_first(
    [(kind, "batch_native") for kind in ref.CELLS] + [(kind, "vmap") for kind in ref.CELLS]
)


@pytest.mark.parametrize("kind, mode", CASES)
@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
def test_outputs_gradients_and_backward_statistics_equal_haikus(framework, kind, mode):
    _, nested, z_want, sol_want, grads_want, stats_want = ref.haiku_reference(kind, mode)
    make, run = FRAMEWORKS[framework]
    deq = make(kind, ref.MODES[mode], nested)
    z_star, sol, grads, stats = run(deq, ref.inputs(kind))
    assert np.all(np.asarray(sol_want.status) == dq.solvers.CONVERGED)
    assert sol.num_steps.shape == (ref.B,)  # per-example statistics in both modes
    np.testing.assert_allclose(z_star, z_want, rtol=0, atol=ATOL)
    np.testing.assert_array_equal(sol.num_steps, sol_want.num_steps)
    np.testing.assert_array_equal(sol.status, sol_want.status)
    assert_trees_close(grads, grads_want)
    assert float(stats_want.num_steps) > 0
    assert_trees_close(stats, stats_want)
