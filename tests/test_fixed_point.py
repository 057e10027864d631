"""dq.fixed_point, the entry point: its value, its transformations, pytrees, aux and errors.

Each gradient strategy has its own tests in tests/adjoints/.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import deqjax as dq
from tests.helpers.dense_ift import (
    contractive_problem,
    dense_reference,
    flip_problem,
    loss_of_z,
    rel_err,
    small_cell,
    small_problem,
    tanh_cell,
)

D = 5


def test_default_adjoint_is_implicit_and_sol_value_is_z_star():
    p, x = contractive_problem()
    solver = functools.partial(dq.solvers.anderson, tol=1e-12, max_steps=200)
    z, sol = dq.fixed_point(tanh_cell, p, x, jnp.zeros(D), solver=solver)
    np.testing.assert_array_equal(z, sol.value)
    assert int(sol.status) == dq.solvers.CONVERGED
    # A loss on sol.value is differentiated like one on z.
    via_sol = jax.grad(
        lambda p: loss_of_z(dq.fixed_point(tanh_cell, p, x, jnp.zeros(D), solver=solver)[1].value)
    )(p)
    via_z = jax.grad(
        lambda p: loss_of_z(dq.fixed_point(tanh_cell, p, x, jnp.zeros(D), solver=solver)[0])
    )(p)
    assert rel_err(via_sol, via_z) < 1e-12
    assert rel_err(via_z, dense_reference(p, x)[0]) < 1e-7


def test_solver_function_partial_and_object_are_one_solver():
    p, x = contractive_problem(seed=12)
    forms = [
        functools.partial(dq.solvers.anderson, tol=1e-9, max_steps=40),
        dq.solvers.Anderson(tol=1e-9, max_steps=40),
    ]

    def run(solver):
        def loss(p):
            z, sol = dq.fixed_point(tanh_cell, p, x, jnp.zeros(D), solver=solver)
            return loss_of_z(z), sol.num_steps

        return jax.grad(loss, has_aux=True)(p)

    (g_partial, n_partial), (g_object, n_object) = (run(s) for s in forms)
    assert rel_err(g_partial, g_object) == 0.0 and int(n_partial) == int(n_object)
    z_fn, _ = dq.fixed_point(tanh_cell, p, x, jnp.zeros(D), solver=dq.solvers.anderson)
    z_obj, _ = dq.fixed_point(tanh_cell, p, x, jnp.zeros(D), solver=dq.solvers.Anderson())
    np.testing.assert_array_equal(z_fn, z_obj)


def test_jit_vmap_of_grad_equals_loop_with_per_example_statistics():
    p, _ = contractive_problem(seed=2, radius=0.9)
    xs = (
        jnp.asarray(np.random.default_rng(3).normal(size=(4, D)))
        * jnp.array([0.1, 1.0, 3.0, 10.0])[:, None]
    )
    solver = functools.partial(dq.solvers.anderson, tol=1e-12, max_steps=100)

    def loss(p, x):
        z, sol = dq.fixed_point(tanh_cell, p, x, jnp.zeros(D), solver=solver)
        return loss_of_z(z), sol.num_steps

    batched = jax.jit(jax.vmap(jax.grad(loss, has_aux=True), in_axes=(None, 0)))
    (g_batch, steps_batch) = batched(p, xs)
    single = jax.jit(jax.grad(loss, has_aux=True))
    for i in range(xs.shape[0]):
        g_i, steps_i = single(p, xs[i])
        g_batch_i = jax.tree_util.tree_map(lambda a, i=i: a[i], g_batch)
        assert rel_err(g_batch_i, g_i) < 1e-10
        assert int(steps_batch[i]) == int(steps_i)
    assert len(set(np.asarray(steps_batch).tolist())) > 1  # per-example convergence


def test_forward_value_is_the_same_for_every_adjoint():
    p, x = contractive_problem(seed=7)
    solver = functools.partial(dq.solvers.anderson, tol=1e-10, max_steps=100)
    values = [
        dq.fixed_point(tanh_cell, p, x, jnp.zeros(D), solver=solver, adjoint=a)[0]
        for a in (
            dq.ImplicitAdjoint(),
            dq.PhantomAdjoint(),
            dq.OneStepAdjoint(),
            dq.UnrolledAdjoint(accelerated=True),
        )
    ]
    for v in values[1:]:
        np.testing.assert_allclose(v, values[0], atol=1e-12)


def test_pytree_params_input_and_state_and_integer_input_leaves():
    rng = np.random.default_rng(8)
    params = {
        "a": jnp.asarray(rng.normal(size=(3, 3)) * 0.2),
        "b": (jnp.asarray(rng.normal(size=2)),),
    }
    x = {"v": jnp.asarray(rng.normal(size=3)), "idx": jnp.array(1, jnp.int32)}

    def f(p, x, z):
        z1, z2 = z
        return (
            jnp.tanh(p["a"] @ z1 + x["v"] + jnp.sum(z2)),
            0.5 * jnp.sin(z2 * p["b"][0]) + x["v"][x["idx"]],
        )

    z0 = (jnp.zeros(3), jnp.zeros(2))
    solver = functools.partial(dq.solvers.broyden, tol=1e-13, max_steps=100, stop_mode="abs")

    def loss(p, x):
        z, _ = dq.fixed_point(f, p, x, z0, solver=solver)
        return jnp.sum(z[0] ** 2) + jnp.sum(jnp.cos(z[1]))

    g_imp = jax.jit(jax.grad(loss, argnums=(0, 1), allow_int=True))(params, x)
    unrolled = lambda p, x: loss_unrolled(p, x)  # noqa: E731

    def loss_unrolled(p, x):
        z, _ = dq.fixed_point(
            f, p, x, z0, solver=solver, adjoint=dq.UnrolledAdjoint(accelerated=True)
        )
        return jnp.sum(z[0] ** 2) + jnp.sum(jnp.cos(z[1]))

    g_unr = jax.jit(jax.grad(unrolled, argnums=(0, 1), allow_int=True))(params, x)
    assert rel_err(g_imp[0], g_unr[0]) < 1e-8
    assert rel_err(g_imp[1]["v"], g_unr[1]["v"]) < 1e-8


def test_closure_over_traced_value_raises_and_concrete_constant_is_fine():
    p, x = contractive_problem()
    w = p["W"]

    def loss(w):
        f = lambda params, x, z: jnp.tanh(w @ z + x)  # noqa: E731  (closes over a tracer)
        return jnp.sum(dq.fixed_point(f, None, x, jnp.zeros(D))[0])

    with pytest.raises(ValueError, match="closes over traced"):
        jax.grad(loss)(w)
    with pytest.raises(ValueError, match="closes over traced"):
        jax.jit(loss)(w)

    f_const = lambda params, x, z: jnp.tanh(w @ z + x + params)  # noqa: E731  (w is concrete)
    g = jax.grad(lambda b: jnp.sum(dq.fixed_point(f_const, b, x, jnp.zeros(D))[0]))(p["b"])
    assert bool(jnp.all(jnp.isfinite(g)))


def test_bad_arguments_raise():
    p, x = contractive_problem()
    with pytest.raises(ValueError, match="adjoint"):
        dq.fixed_point(tanh_cell, p, x, jnp.zeros(D), adjoint="implicit")
    with pytest.raises(ValueError, match="z0"):
        dq.fixed_point(tanh_cell, p, x, jnp.zeros(D, jnp.int32))
    with pytest.raises(ValueError, match="backward_stats"):
        dq.fixed_point(tanh_cell, p, x, jnp.zeros(D), backward_stats={"count": 0.0})
    with pytest.raises(ValueError, match="solver"):
        dq.fixed_point(tanh_cell, p, x, jnp.zeros(D), solver="anderson")


def test_inside_scan_and_pmap():
    p, x = contractive_problem(seed=9)
    solver = functools.partial(dq.solvers.anderson, tol=1e-12, max_steps=100)
    ref = dense_reference(p, x)

    def loss(p, x):
        return loss_of_z(dq.fixed_point(tanh_cell, p, x, jnp.zeros(D), solver=solver)[0])

    def scanned(p, xs):
        def body(carry, x):
            return carry + loss(p, x), None

        return jax.lax.scan(body, jnp.zeros(()), xs)[0]

    g_scan = jax.jit(jax.grad(scanned))(p, jnp.stack([x, x]))
    assert rel_err(jax.tree_util.tree_map(lambda a: a / 2, g_scan), ref[0]) < 1e-7

    g_pmap = jax.pmap(jax.grad(loss), in_axes=(None, 0))(p, x[None])
    assert rel_err(jax.tree_util.tree_map(lambda a: a[0], g_pmap), ref[0]) < 1e-7


# --- has_aux and the wrong-z0 error ---------------------------------------------------------------

FWD = functools.partial(dq.solvers.broyden, tol=1e-13, max_steps=200, stop_mode="abs")


def test_has_aux_returns_aux_at_the_solution_under_jit_and_grad():
    p, x = flip_problem(seed=7, lam=0.5)

    def f_aux(p, x, z):
        pre = p["W"] @ z + p["b"] + x
        return jnp.tanh(pre), {"pre": pre, "energy": jnp.sum(pre**2)}

    def loss(p, x):
        (z, aux), sol = dq.fixed_point(f_aux, p, x, jnp.zeros(6), solver=FWD, has_aux=True)
        return loss_of_z(z) + aux["energy"], (z, aux, sol)

    (val, (z, aux, sol)), g = jax.jit(jax.value_and_grad(loss, has_aux=True))(p, x)
    np.testing.assert_allclose(aux["pre"], p["W"] @ z + p["b"] + x, rtol=1e-12)
    np.testing.assert_allclose(z, jnp.tanh(aux["pre"]), atol=1e-12)
    assert int(sol.status) == dq.solvers.CONVERGED

    # Against the same loss written without aux: recompute pre from z* by hand.
    def loss_plain(p, x):
        z, _ = dq.fixed_point(tanh_cell, p, x, jnp.zeros(6), solver=FWD)
        return loss_of_z(z) + jnp.sum((p["W"] @ z + p["b"] + x) ** 2)

    g_plain = jax.jit(jax.grad(loss_plain))(p, x)
    assert rel_err(g, g_plain) < 1e-10
    with pytest.raises(ValueError, match="has_aux"):
        dq.fixed_point(tanh_cell, p, x, jnp.zeros(6), has_aux=True)


def test_wrong_z0_shape_names_z0_and_x_shapes():
    p, x = flip_problem()
    with pytest.raises(ValueError, match=r"z0 of shape float64\[4\].*x of shape float64\[6\]") as e:
        dq.fixed_point(tanh_cell, p, x, jnp.zeros(4))
    assert e.value.__cause__ is not None  # the original error is chained
    with pytest.raises(ValueError, match="z0 of shape"):
        jax.jit(lambda p: dq.fixed_point(tanh_cell, p, x, jnp.zeros((2, 4)))[0])(p)
    # f runs but returns another shape: named too.
    with pytest.raises(ValueError, match=r"z0 has shape float64\[1\]"):
        dq.fixed_point(lambda p, x, z: jnp.tanh(p["W"] @ x + z), p, x, jnp.zeros(1))


@pytest.mark.parametrize(
    "obj, fn, adjoint",
    [
        (dq.solvers.Reversible(max_steps=30, tol=1e-8), dq.solvers.reversible, "ReversibleAdjoint"),
        (dq.solvers.Broyden(max_steps=30, tol=1e-8), dq.solvers.broyden, "ShineAdjoint"),
    ],
    ids=["reversible", "shine"],
)
def test_objects_drive_the_adjoints_that_need_their_solver(obj, fn, adjoint):
    w, x, z0 = small_problem()
    adj = getattr(dq, adjoint)()

    def grad(solver):
        loss = lambda p: jnp.sum(
            dq.fixed_point(small_cell, p, x, z0, solver=solver, adjoint=adj)[0]
        )  # noqa: E731
        return jax.grad(loss)(w)

    want = grad(functools.partial(fn, max_steps=30, tol=1e-8))
    np.testing.assert_allclose(grad(obj), want, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize(
    "adjoint", [dq.ImplicitAdjoint(), dq.UnrolledAdjoint(accelerated=True)], ids=repr
)
def test_an_object_solver_gives_the_gradient_of_the_partial(adjoint):
    w, x, z0 = small_problem()

    def grad(solver):
        def loss(p):
            return jnp.sum(dq.fixed_point(small_cell, p, x, z0, solver=solver, adjoint=adjoint)[0])

        return jax.grad(loss)(w)

    obj = grad(dq.solvers.Anderson(tol=1e-10, max_steps=60))
    part = grad(functools.partial(dq.solvers.anderson, tol=1e-10, max_steps=60))
    np.testing.assert_allclose(obj, part, rtol=1e-10, atol=1e-12)
