"""dq.nn.DEQ: parameters, the forward pass of ``__call__`` and ``solve``, masks, init, eval,
gradients and configuration errors."""

import functools

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import deqjax as dq
from deqjax import nn
from tests.helpers.deq_cells import (
    MAX_STEPS,
    RATE,
    SOLVER,
    B,
    D,
    TinyCell,
    inputs,
    rel_err,
    spread_inputs,
    zeros_state,
)
from tests.helpers.lanes import default_first

FAST = functools.partial(dq.solvers.fixed_point_iteration, max_steps=3)


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


@pytest.mark.slow
def test_f_star_is_f_of_z_star_with_the_implicit_gradient_of_the_cell_fn_readout(base):
    """f_star = f(z*) without another cell evaluation, and (implicit adjoint) the same gradient
    as differentiating one more application cell_fn(z*) — even with a loose forward solve."""
    _, params, _ = base
    x = spread_inputs()
    loose = functools.partial(dq.solvers.anderson, tol=1e-3, max_steps=MAX_STEPS)
    tight = functools.partial(dq.solvers.anderson, tol=1e-12, max_steps=MAX_STEPS)
    tight_bwd = dq.ImplicitAdjoint(solver=tight)

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


def test_call_and_solve_create_the_same_parameters_and_values():
    """One forward pass behind both methods: the same parameter names and initial values, and
    the same equilibrium and statistics, whichever method creates the parameters."""
    x = inputs()

    def forward(x, method):
        deq = nn.DEQ(TinyCell(), solver=SOLVER, init_state=zeros_state)
        if method == "call":
            return deq(x, is_training=False)
        out = deq.solve(x, is_training=False)
        return out.z_star, out.solution

    by_call = hk.transform(functools.partial(forward, method="call"))
    by_solve = hk.transform(functools.partial(forward, method="solve"))
    p_call = by_call.init(jax.random.PRNGKey(0), x)
    p_solve = by_solve.init(jax.random.PRNGKey(0), x)
    assert (
        set(p_call) == set(p_solve) == {"deq/lifted/tiny_cell", "deq/lifted/tiny_cell/weight_norm"}
    )
    for a, b in zip(jax.tree_util.tree_leaves(p_call), jax.tree_util.tree_leaves(p_solve)):
        np.testing.assert_array_equal(a, b)
    (z_c, sol_c), (z_s, sol_s) = by_call.apply(p_call, None, x), by_solve.apply(p_call, None, x)
    np.testing.assert_array_equal(z_c, z_s)
    np.testing.assert_array_equal(sol_c.num_steps, sol_s.num_steps)
    np.testing.assert_array_equal(sol_c.rel_residual, sol_s.rel_residual)


def test_per_example_is_a_bool():
    def f(x):
        return nn.DEQ(lambda z, x: z, solver=SOLVER, per_example="vmap")(x)

    with pytest.raises(ValueError, match="per_example must be a bool"):
        hk.transform(f).init(None, jnp.zeros((2, 3)))


def test_deq_with_a_solver_object_is_batch_native():
    def forward(x):
        deq = dq.nn.DEQ(dq.nn.MLPCell(), solver=dq.solvers.Anderson(tol=1e-8, max_steps=40))
        return deq(x)

    t = hk.transform(forward)
    x = jax.random.normal(jax.random.PRNGKey(0), (3, 6))
    params = t.init(jax.random.PRNGKey(1), x)
    z, sol = t.apply(params, None, x)
    assert z.shape == (3, 6) and sol.status.shape == (3,) and sol.trace.shape == (3, 40)
    assert np.all(np.asarray(sol.status) == dq.solvers.CONVERGED)


# --- complex states -------------------------------------------------------------------------------

N_C = 4


def _complex_problem():
    """``A`` (spectral radius 0.7), an input ``x [B, N]`` and the loss weights ``c``, complex."""
    rng = np.random.default_rng(0)
    a = rng.normal(size=(N_C, N_C)) + 1j * rng.normal(size=(N_C, N_C))
    a = 0.7 * a / np.max(np.abs(np.linalg.eigvals(a)))
    x = rng.normal(size=(B, N_C)) + 1j * rng.normal(size=(B, N_C))
    c = rng.normal(size=(B, N_C)) + 1j * rng.normal(size=(B, N_C))
    return jnp.asarray(a), jnp.asarray(x), jnp.asarray(c)


def _complex_loss(z, c):
    return jnp.sum(jnp.abs(z) ** 2) + jnp.real(jnp.sum(c * z))


@pytest.mark.parametrize(
    "solver, per_example",
    default_first(
        [
            (dq.solvers.Anderson(max_steps=100, tol=1e-13), True),  # batch-native
            (lambda f, z0: dq.solvers.anderson(f, z0, max_steps=100, tol=1e-13), True),  # vmap
            (dq.solvers.Broyden(max_steps=100, tol=1e-13), False),  # whole batch
        ]
    ),
    ids=["batch-native", "vmap", "whole-batch"],
)
def test_complex_input_and_state_against_the_dense_implicit_gradient(solver, per_example):
    """A complex ``x`` (and so ``z0 = zeros_like(x)``) through ``dq.nn.DEQ``: ``z*`` and the
    gradient in the cell's parameters and ``x`` equal the dense answer, autodiff of
    ``z* = (I − A)⁻¹ x`` (the implicit function theorem, densely); the JR penalty of the pass's
    cell map is ``γ ‖A‖²_F / N``. Before, the DEQ refused a complex state and advised casting it
    to float32 (which drops the imaginary part)."""
    a, x, c = _complex_problem()
    reg = dq.regularization.JacobianRegularizer(2.0, num_samples=4000)

    def cell(z, x):
        w = hk.get_parameter("A", (N_C, N_C), jnp.complex128, init=lambda *_: a)
        return z @ w.T + x

    def forward(x):
        out = nn.DEQ(cell, solver=solver, per_example=per_example).solve(x)
        jr, _ = reg.penalty(out.cell_fn, out.z_star, jax.random.key(0))
        return out.z_star, out.solution, jr

    t = hk.transform(forward)
    params = t.init(jax.random.PRNGKey(0), x)
    z, sol, jr = jax.jit(t.apply)(params, None, x)
    assert z.dtype == jnp.complex128
    assert np.all(np.asarray(sol.status) == dq.solvers.CONVERGED)
    dense_z = lambda a, x: jnp.linalg.solve(jnp.eye(N_C, dtype=a.dtype) - a, x.T).T  # noqa: E731
    np.testing.assert_allclose(np.asarray(z), np.asarray(dense_z(a, x)), rtol=1e-10)
    np.testing.assert_allclose(float(jr), 2.0 * float(jnp.sum(jnp.abs(a) ** 2)) / N_C, rtol=0.1)

    grad = jax.jit(jax.grad(lambda p, x: _complex_loss(t.apply(p, None, x)[0], c), (0, 1)))
    (g_params, g_x) = grad(params, x)
    want_a, want_x = jax.grad(lambda a, x: _complex_loss(dense_z(a, x), c), (0, 1))(a, x)
    (g_a,) = [leaf for leaf in jax.tree_util.tree_leaves(g_params)]
    np.testing.assert_allclose(np.asarray(g_a), np.asarray(want_a), rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(np.asarray(g_x), np.asarray(want_x), rtol=1e-8, atol=1e-10)


def test_initial_state_that_is_not_a_state_is_named_with_its_source():
    """An integer ``x`` with no ``z0``: the error names ``zeros_like(x)`` as the state refused,
    and never advises a cast that drops an imaginary part."""

    def forward(x):
        return nn.DEQ(lambda z, x: z, solver=SOLVER)(x)

    with pytest.raises(ValueError, match=r"z0 = zeros_like\(x\) \(no z0 was given\)") as err:
        hk.transform(forward).init(None, jnp.zeros((2, 3), jnp.int32))
    assert "floating-point or complex" in str(err.value)
