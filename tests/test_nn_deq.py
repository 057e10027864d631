"""dq.nn.DEQ: the Haiku DEQ module (issue 6, part A)."""

import functools

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import deqjax as dq
from deqjax import nn

B, D, DX = 3, 4, 5
MAX_STEPS = 80
SOLVER = functools.partial(dq.solvers.fixed_point_iteration, tol=1e-12, max_steps=MAX_STEPS)
FAST = functools.partial(dq.solvers.fixed_point_iteration, max_steps=3)
RATE = 0.3


class TinyCell(hk.Module):
    """f(z; x) = m ⊙ tanh(z W + U x): W weight-normalised; U x and the mask m once per forward."""

    def __init__(self, record=None, name=None):
        super().__init__(name=name)
        self.record = record

    def __call__(self, z, x, *, is_training=False):
        w = nn.WeightNorm([D, D], w_init=hk.initializers.RandomNormal(0.4 / D**0.5))(z.dtype)
        u = nn.per_forward(
            "inj", lambda: x @ hk.get_parameter("U", [DX, D], z.dtype, init=jnp.ones)
        )
        drop = nn.VariationalDropout(RATE, name="drop")
        if self.record is not None:  # the mask this evaluation uses, seen through a ones probe
            jax.debug.callback(self.record, drop(jnp.ones_like(z), is_training=is_training))
        return drop(jnp.tanh(z @ w + u), is_training=is_training)  # [B, D]


def inputs(seed=0, b=B):
    return jax.random.normal(jax.random.PRNGKey(seed), (b, DX), jnp.float64)


def rel_err(a, b):
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    num = max(float(jnp.max(jnp.abs(u - v))) for u, v in zip(la, lb))
    return num / max(float(jnp.max(jnp.abs(v))) for v in lb)


def zeros_state(x):
    return jnp.zeros((x.shape[0], D), x.dtype)


def make(adjoint=None, per_example=True, **kw):
    def forward(x, is_training=True, z0=None):
        deq = nn.DEQ(
            TinyCell(),
            solver=SOLVER,
            adjoint=adjoint,
            per_example=per_example,
            init_state=zeros_state,
            **kw,
        )
        out = deq.solve(x, z0, is_training=is_training)
        return out.z_star, out.solution, out.cell_fn(out.z_star)

    return hk.transform(forward)


@pytest.fixture(scope="module")
def base():
    t = make()
    x = inputs()
    params = jax.jit(t.init)(jax.random.PRNGKey(0), x)
    apply = jax.jit(t.apply, static_argnames="is_training")
    return x, params, apply


def test_params_live_under_deq_scope(base):
    _, params, _ = base
    assert set(params) == {"deq/lifted/tiny_cell", "deq/lifted/tiny_cell/weight_norm"}
    assert params["deq/lifted/tiny_cell/weight_norm"]["v"].shape == (D, D)
    assert params["deq/lifted/tiny_cell/weight_norm"]["g"].shape == (1, D)
    assert params["deq/lifted/tiny_cell"]["U"].dtype == jnp.float64


def test_apply_shapes_fixed_point_and_per_example_statistics(base):
    x, params, apply = base
    z, sol, fz = apply(params, jax.random.PRNGKey(1), x)
    assert z.shape == (B, D) and z.dtype == jnp.float64
    assert sol.num_steps.shape == (B,) and sol.trace.shape == (B, MAX_STEPS)
    assert np.all(np.asarray(sol.status) == dq.solvers.CONVERGED)
    np.testing.assert_allclose(fz, z, atol=1e-10)  # z* = f(z*) with this forward's mask
    assert np.any(np.asarray(z) == 0.0)  # dropout active: masked coordinates are exactly 0
    z_again, _, _ = apply(params, jax.random.PRNGKey(1), x)
    np.testing.assert_array_equal(z_again, z)  # same rng, same masks
    z_other, _, _ = apply(params, jax.random.PRNGKey(2), x)
    assert not np.array_equal(np.asarray(z_other) == 0, np.asarray(z) == 0)  # fresh masks


def test_per_example_and_whole_batch_agree_in_eval(base):
    x, params, apply = base
    z_pe, sol_pe, _ = apply(params, None, x, is_training=False)  # eval: no rng needed
    t_b = make(per_example=False)
    z_b, sol_b, _ = jax.jit(t_b.apply, static_argnames="is_training")(
        params, None, x, is_training=False
    )
    np.testing.assert_allclose(z_pe, z_b, atol=1e-10)
    assert sol_b.num_steps.shape == () and sol_pe.num_steps.shape == (B,)
    assert not np.any(np.asarray(z_pe) == 0.0)  # no dropout in eval


def test_warm_start_from_given_z0(base):
    x, params, apply = base
    key = jax.random.PRNGKey(1)
    z, sol, _ = apply(params, key, x)
    z2, sol2, _ = apply(params, key, x, z0=z)
    np.testing.assert_allclose(z2, z, atol=1e-10)
    assert int(jnp.max(sol2.num_steps)) <= 2 < int(jnp.min(sol.num_steps))


def test_eval_solver_used_when_not_training(base):
    x, params, _ = base
    t = make(eval_solver=functools.partial(dq.solvers.fixed_point_iteration, max_steps=3))
    apply = jax.jit(t.apply, static_argnames="is_training")
    _, sol_eval, _ = apply(params, None, x, is_training=False)
    assert sol_eval.trace.shape == (B, 3) and np.all(np.asarray(sol_eval.num_steps) == 3)


def test_gradients_match_unrolled_and_mask_is_fixed_through_backward(base):
    """Implicit vs backprop through every solver step, dropout on (same rng in both): they agree
    only if the mask is the same in every solver step and in the backward pass."""
    x, params, _ = base
    key = jax.random.PRNGKey(3)

    def grads(adjoint):
        t = make(adjoint=adjoint)

        def loss(p, x):
            z, _, _ = t.apply(p, key, x)
            return jnp.sum(jnp.sin(z)) + 0.5 * jnp.sum(z**2)

        return jax.jit(jax.grad(loss, argnums=(0, 1)))(params, x)

    implicit = grads(dq.ImplicitAdjoint())
    unrolled = grads(dq.UnrolledAdjoint())
    assert rel_err(implicit, unrolled) < 1e-8
    # and every parameter gets a gradient (through the per-forward context too)
    assert all(float(jnp.max(jnp.abs(g))) > 0 for g in jax.tree_util.tree_leaves(implicit[0]))


def test_dropout_mask_identical_across_solver_iterations_and_fresh_across_calls():
    seen = []
    x = inputs()

    def forward(x):
        deq = nn.DEQ(
            TinyCell(record=lambda m: seen.append(np.asarray(m))),
            solver=SOLVER,
            per_example=False,
            init_state=zeros_state,
        )
        return deq(x)

    t = hk.transform(forward)
    params = t.init(jax.random.PRNGKey(0), x)
    seen.clear()
    apply = jax.jit(t.apply)
    _, sol = apply(params, jax.random.PRNGKey(1), x)
    jax.effects_barrier()
    first = list(seen)
    # one evaluation per solver step (+ the once-per-forward prepare pass)
    assert len(first) == int(sol.num_steps) + 1 > 5
    for m in first:
        np.testing.assert_array_equal(m, first[0])
    assert set(np.unique(first[0]).tolist()) == {0.0, 1.0 / (1.0 - RATE)}
    seen.clear()
    apply(params, jax.random.PRNGKey(2), x)
    jax.effects_barrier()
    assert not np.array_equal(seen[0], first[0])  # a new forward pass draws a new mask
    for m in seen:
        np.testing.assert_array_equal(m, seen[0])


def test_init_skips_the_solve_by_default_and_can_solve():
    x = inputs()
    outs = {}
    for solve_at_init in (False, True):

        def body(x, s=solve_at_init):  # init's own outputs, captured eagerly
            outs[s] = nn.DEQ(TinyCell(), solver=SOLVER, solve_at_init=s, init_state=zeros_state)(
                x, is_training=False
            )
            return outs[s][0]

        hk.transform(body).init(jax.random.PRNGKey(0), x)
    (z_skip, sol_skip), (z_solved, sol_solved) = outs[False], outs[True]
    assert z_skip.shape == z_solved.shape == (B, D)
    assert np.all(np.asarray(sol_skip.num_steps) == 0)
    assert np.all(np.isinf(np.asarray(sol_skip.rel_residual)))
    assert np.all(np.asarray(sol_skip.status) == dq.solvers.MAX_STEPS)
    assert sol_skip.trace.shape == sol_solved.trace.shape == (B, MAX_STEPS)
    assert np.all(np.asarray(sol_solved.status) == dq.solvers.CONVERGED)
    assert not np.allclose(z_skip, z_solved)


def test_jacobian_penalty_matches_exact_frobenius_and_has_gradients(base):
    x, params, _ = base

    def forward(x):
        deq = nn.DEQ(TinyCell(), solver=SOLVER, init_state=zeros_state)
        out = deq.solve(x, jacobian_samples=4000, jacobian_key=jax.random.PRNGKey(5))
        jac = jax.jacobian(out.cell_fn)(jax.lax.stop_gradient(out.z_star))  # [B, D, B, D]
        return out.jacobian_frobenius_sq, jnp.sum(jac**2) / (B * D)  # J is block-diagonal

    t = hk.transform(forward)

    def penalty_and_grad(p):
        (est, exact), g = jax.value_and_grad(
            lambda q: t.apply(q, jax.random.PRNGKey(1), x), has_aux=True
        )(p)
        return est, exact, g

    est, exact, g = jax.jit(penalty_and_grad)(params)
    assert float(exact) > 1e-3
    assert abs(float(est) / float(exact) - 1.0) < 0.1  # rel. std <= sqrt(2/4000) ~ 0.02
    g_w = g["deq/lifted/tiny_cell/weight_norm"]
    assert np.all(np.isfinite(np.asarray(g_w["v"]))) and float(jnp.max(jnp.abs(g_w["v"]))) > 0


def test_initial_state_sources_and_plain_function_cells():
    x = inputs()

    def forward(x):
        plain = lambda z, x: jnp.tanh(0.5 * z + hk.Linear(D)(x))  # noqa: E731  no is_training
        z_default, _ = nn.DEQ(plain, solver=FAST, name="a")(x[:, :D])  # z0 = zeros_like(x)
        z_custom, _ = nn.DEQ(plain, solver=FAST, init_state=zeros_state, name="b")(x)
        return z_default, z_custom

    t = hk.transform(forward)
    params = t.init(jax.random.PRNGKey(0), x)
    assert set(params) == {"a/lifted/linear", "b/lifted/linear"}
    z_default, z_custom = t.apply(params, None, x)
    assert z_default.shape == z_custom.shape == (B, D)


def test_per_forward_outside_a_deq_just_computes():
    t = hk.transform(lambda: nn.per_forward("v", lambda: jnp.arange(3.0)))
    np.testing.assert_array_equal(t.apply(t.init(None), None), jnp.arange(3.0))


def test_bad_configuration_raises():
    def build(**kw):
        def f(x):
            args = dict(cell=lambda z, x: z, solver=SOLVER)
            args.update(kw)
            cell = args.pop("cell")
            return nn.DEQ(cell, **args)(x)

        return hk.transform(f).init(None, jnp.zeros((2, 3)))

    with pytest.raises(ValueError, match="cell"):
        build(cell=3)
    with pytest.raises(ValueError, match="solver"):
        build(solver="anderson")
    with pytest.raises(ValueError, match="eval_solver"):
        build(eval_solver=1)
    with pytest.raises(ValueError, match="adjoint"):
        build(adjoint="implicit")
    with pytest.raises(ValueError, match="init_state"):
        build(init_state=0)
    with pytest.raises(ValueError, match="per_example"):
        build(per_example=1)

    def solve(**kw):
        def f(x):
            return nn.DEQ(lambda z, x: z, solver=SOLVER)(x, **kw)

        return hk.transform(f).init(jax.random.PRNGKey(0), jnp.zeros((2, 3)))

    with pytest.raises(ValueError, match="jacobian_samples"):
        solve(jacobian_samples=-1)
    with pytest.raises(ValueError, match="full_output"):
        solve(jacobian_samples=1)
    with pytest.raises(ValueError, match="batch"):
        solve(z0=jnp.zeros((3, 3)))
    with pytest.raises(ValueError, match="z0"):
        solve(z0=jnp.zeros((2, 3), jnp.int32))
