"""dq.nn.per_forward and the two phases (prepare, step) that hold its values fixed in a DEQ."""

import functools
from collections import Counter

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

import deqjax as dq
from deqjax import nn
from deqjax._src.nn import per_forward as per_forward_lib
from deqjax._src.nn.weight_norm import get_weight


def test_per_forward_outside_a_deq_just_computes():
    t = hk.transform(lambda: nn.per_forward("v", lambda: jnp.arange(3.0)))
    np.testing.assert_array_equal(t.apply(t.init(None), None), jnp.arange(3.0))


def test_prepare_records_the_values_and_step_replays_them():
    """The prepare phase computes each per-forward value once (a module asking twice gets the
    first value); the step phase reads it from ``ctx`` and never calls ``compute``."""
    calls = []

    def cell_fn(x, z):
        def compute():
            calls.append(1)
            return x * hk.get_parameter("a", [], x.dtype, init=jnp.ones)

        u = nn.per_forward("u", compute)
        return z * 0.5 + u + 0.0 * nn.per_forward("u", compute)

    cell = per_forward_lib.phased_cell(cell_fn)
    x, z = jnp.arange(3.0), jnp.ones(3)
    params = cell.init(None, x, z)
    calls.clear()
    ctx = cell.prepare(params, None, x, z)
    assert len(calls) == 1
    (u,) = jax.tree_util.tree_leaves(ctx)
    np.testing.assert_array_equal(u, x)
    calls.clear()
    np.testing.assert_array_equal(cell.step((params, ctx), (x, None), z), 0.5 * z + x)
    other = jax.tree_util.tree_map(lambda a: a + 10.0, ctx)  # step uses ctx, not compute()
    np.testing.assert_array_equal(cell.step((params, other), (x, None), z), 0.5 * z + x + 10.0)
    assert not calls
    np.testing.assert_array_equal(cell.apply(params, x, z, None), 0.5 * z + x)


def _primitives(jaxpr, inside=False, found=None):
    """Counts of primitive names inside any while-loop body and outside every loop."""
    found = found if found is not None else {"inside": Counter(), "outside": Counter()}
    for eqn in jaxpr.eqns:
        found["inside" if inside else "outside"][eqn.primitive.name] += 1
        for name, param in eqn.params.items():
            for sub in param if isinstance(param, (tuple, list)) else [param]:
                sub = getattr(sub, "jaxpr", sub)
                if isinstance(sub, jax.extend.core.Jaxpr):
                    in_loop = inside or (eqn.primitive.name == "while" and name == "body_jaxpr")
                    _primitives(sub, in_loop, found)
    return found


def _solver_loop_primitives(weight_norm):
    def cell(z, x, *, is_training):
        w = get_weight("W", [4, 4], z.dtype, w_init=None, weight_norm=weight_norm)
        h = jnp.tanh(z @ w * 0.5 + x)
        return nn.VariationalDropout(0.2)(h, is_training=is_training)

    def forward(x):
        # check_every=1: one body per loop iteration ("auto" traces each platform's chunk).
        solver = functools.partial(dq.solvers.fixed_point_iteration, max_steps=5, check_every=1)
        return nn.DEQ(cell, solver=solver, per_example=False)(x)[0]

    t = hk.transform(forward)
    x = jnp.ones((2, 4), jnp.float64)
    params = t.init(jax.random.PRNGKey(0), x)
    return _primitives(jax.make_jaxpr(t.apply)(params, jax.random.PRNGKey(1), x).jaxpr)


def test_weight_norm_and_mask_are_computed_outside_the_solver_loop():
    """Structural check on the traced program: the solver loop body with a weight-normalised
    weight is exactly the one with a plain weight (the normalisation runs outside the loop), and
    no random bits are drawn inside the loop (the mask is drawn once, outside)."""
    normed, plain = _solver_loop_primitives(True), _solver_loop_primitives(False)
    assert normed["inside"]["tanh"] == 1
    assert normed["inside"] == plain["inside"]
    assert normed["outside"]["sqrt"] > plain["outside"]["sqrt"]  # the norm ‖v‖, outside
    rng = {"random_bits", "threefry2x32", "random_split", "random_wrap"}
    assert any(normed["outside"][p] for p in rng)
    assert not any(normed["inside"][p] for p in rng)
