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
    """The one JR path: JacobianRegularizer.penalty on DEQ.solve's cell map."""
    x, params, _ = base
    reg = dq.regularization.JacobianRegularizer(1.0, num_samples=4000)

    def forward(x):
        deq = nn.DEQ(TinyCell(), solver=SOLVER, init_state=zeros_state)
        out = deq.solve(x)
        est, _ = reg.penalty(out.cell_fn, out.z_star, jax.random.PRNGKey(5))
        jac = jax.jacobian(out.cell_fn)(jax.lax.stop_gradient(out.z_star))  # [B, D, B, D]
        return est, jnp.sum(jac**2) / (B * D)  # J is block-diagonal

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


def test_jacobian_gate_is_drawn_in_the_graph_one_compile(base):
    """p < 1: the Bernoulli gate is a traced coin, so one compiled step applies the penalty on
    some keys and skips it (exactly 0) on others."""
    x, params, _ = base
    reg = dq.regularization.JacobianRegularizer(2.0, p=0.5)
    traces = []

    def forward(x, key):
        traces.append(1)
        out = nn.DEQ(TinyCell(), solver=SOLVER, init_state=zeros_state).solve(x)
        return reg.penalty(out.cell_fn, out.z_star, key)

    apply = jax.jit(hk.transform(forward).apply)
    applied = []
    for i in range(12):
        term, m = apply(params, jax.random.PRNGKey(0), x, jax.random.PRNGKey(i))
        applied.append(float(m["jr/applied"]))
        assert (float(term) > 0) == bool(applied[-1])
    assert 0 < sum(applied) < 12 and len(traces) == 1


def test_call_returns_one_type(base):
    x, params, _ = base

    def forward(x, **kw):
        return nn.DEQ(TinyCell(), solver=SOLVER, init_state=zeros_state)(x, **kw)

    t = hk.transform(forward)
    for kw in ({}, {"is_training": False}):
        out = t.apply(params, jax.random.PRNGKey(0), x, **kw)
        assert isinstance(out, tuple) and len(out) == 2
        assert isinstance(out[1], dq.solvers.Solution)
    for gone in ("full_output", "jacobian_samples"):
        with pytest.raises(TypeError, match=gone):
            t.apply(params, jax.random.PRNGKey(0), x, **{gone: 1})

    def forward_solve(x, **kw):
        return nn.DEQ(TinyCell(), solver=SOLVER, init_state=zeros_state).solve(x, **kw)

    out = hk.transform(forward_solve).apply(params, jax.random.PRNGKey(0), x)
    assert type(out) is nn.DEQOutput and out._fields == ("z_star", "solution", "cell_fn", "f_star")
    with pytest.raises(TypeError, match="jacobian_samples"):  # JR: JacobianRegularizer only
        hk.transform(forward_solve).apply(params, None, x, jacobian_samples=1)


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

    with pytest.raises(ValueError, match="batch"):
        solve(z0=jnp.zeros((3, 3)))
    with pytest.raises(ValueError, match="z0"):
        solve(z0=jnp.zeros((2, 3), jnp.int32))


# --- batch-native per-example mode (issue 15 item 5) ---------------------------------------------

SOLVERS = {
    "fixed_point": SOLVER,
    "anderson": functools.partial(dq.solvers.anderson, tol=1e-11, max_steps=MAX_STEPS),
    "broyden": functools.partial(dq.solvers.broyden, tol=1e-11, max_steps=MAX_STEPS, memory=10),
}


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


def spread_inputs(b=5):
    """Inputs whose examples need different numbers of steps (different saturation)."""
    scale = jnp.array([0.05, 0.5, 1.0, 3.0, 10.0][:b], jnp.float64)[:, None]
    return inputs(seed=7, b=b) * scale


@pytest.mark.parametrize("name", sorted(SOLVERS))
def test_batch_native_equals_vmap_mode_per_example(name, base):
    """z*, per-example num_steps/status/residuals and float64 implicit gradients of the default
    (batch-native) mode equal the vmap mode's; the cell sees the whole batch, never batch 1."""
    _, params, _ = base
    x = spread_inputs()
    solver = SOLVERS[name]
    native_batches, vmap_batches = [], []
    native = make_mode(True, solver, native_batches)
    vmapped = make_mode("vmap", solver, vmap_batches)

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


def test_user_solver_without_batch_ndim_falls_back_to_vmap(base):
    """A solver without the batch_ndim keyword runs per example through vmap (same answer)."""
    _, params, _ = base
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


@pytest.mark.slow
def test_f_star_is_f_of_z_star_with_the_implicit_gradient_of_the_cell_fn_readout(base):
    """f_star = f(z*) without another cell evaluation, and (implicit adjoint) the same gradient
    as differentiating one more application cell_fn(z*) — even with a loose forward solve."""
    _, params, _ = base
    x = spread_inputs()
    loose = functools.partial(dq.solvers.anderson, tol=1e-3, max_steps=MAX_STEPS)
    tight_bwd = dq.ImplicitAdjoint(solver=functools.partial(SOLVERS["anderson"], tol=1e-12))

    def forward(x):
        deq = nn.DEQ(TinyCell(), solver=loose, adjoint=tight_bwd, init_state=zeros_state)
        out = deq.solve(x, is_training=False)
        return out.z_star, out.f_star, out.cell_fn(out.z_star)

    t = hk.transform(forward)
    z, f_star, fz = jax.jit(t.apply)(params, None, x)
    np.testing.assert_allclose(f_star, fz, rtol=1e-12, atol=1e-14)
    assert float(jnp.max(jnp.abs(f_star - z))) > 1e-6  # the solver's f(z*), not z*
    g_f = jax.grad(lambda p: jnp.sum(jnp.sin(t.apply(p, None, x)[1])))(params)
    g_cell = jax.grad(lambda p: jnp.sum(jnp.sin(t.apply(p, None, x)[2])))(params)
    g_z = jax.grad(lambda p: jnp.sum(jnp.sin(t.apply(p, None, x)[0])))(params)
    assert rel_err(g_f, g_cell) < 1e-8
    assert rel_err(g_z, g_cell) > 1e-6  # not trivially equal: z* is not f(z*) here


def test_per_example_mode_names_are_checked():
    def f(x):
        return nn.DEQ(lambda z, x: z, solver=SOLVER, per_example="native")(x)

    with pytest.raises(ValueError, match='per_example must be True, False or "vmap"'):
        hk.transform(f).init(None, jnp.zeros((2, 3)))
