"""dq.models.ScalarDEQ (the JR paper's §5.1 scalar DEQ), its synthetic data and its Fig. 5
metrics."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

import deqjax as dq


def test_batch_native_solve_equals_one_solve_per_example():
    model = dq.models.ScalarDEQ(8)
    params = model.init(jax.random.PRNGKey(0))
    xs = jnp.linspace(-2.0, 2.0, 5, dtype=jnp.float32)
    solver = dq.solvers.Anderson(max_steps=20, tol=1e-5)
    sol = model.solve(params, xs, solver)
    assert sol.num_steps.shape == sol.status.shape == (5,)
    for i in range(5):
        one = solver(lambda z, i=i: model.cell(params, xs[i], z), jnp.zeros((), jnp.float32))
        np.testing.assert_allclose(sol.value[i], one.value, rtol=1e-5, atol=1e-6)
    partial = functools.partial(dq.solvers.anderson, max_steps=20, tol=1e-5)
    np.testing.assert_array_equal(model.solve(params, xs, partial).value, sol.value)


def test_slope_is_the_derivative_of_the_cell():
    model = dq.models.ScalarDEQ(8)
    params = jax.tree_util.tree_map(
        lambda a: a.astype(jnp.float64), model.init(jax.random.PRNGKey(0))
    )
    xs, zs = jnp.array([-1.0, 0.5]), jnp.array([0.3, -0.2])
    eps = 1e-6
    fd = (model.batch_cell(params, xs, zs + eps) - model.batch_cell(params, xs, zs - eps)) / (
        2 * eps
    )
    np.testing.assert_allclose(model.slope(params, xs, zs), fd, rtol=1e-6, atol=1e-9)


def test_fig5_metrics():
    model = dq.models.ScalarDEQ()
    params = model.init(jax.random.PRNGKey(0))
    _, _, xv, yv = dq.models.jr_synthetic_data(0, 4, 16)
    metrics = dq.models.jr_fig5_metrics(
        model,
        params,
        jnp.asarray(xv),
        jnp.asarray(yv),
        forward=dq.solvers.Anderson(max_steps=6, tol=1e-4),
        backward=dq.solvers.Anderson(max_steps=20, tol=1e-6),
        tight=dq.solvers.Broyden(max_steps=40, tol=1e-6),
        eval_fpi=dq.solvers.FixedPointIteration(max_steps=30, tol=1e-4),
        eval_broyden=dq.solvers.Broyden(max_steps=30, tol=1e-4),
    )
    assert set(metrics) == {
        "val_mse",
        "val_mse_tight",
        "mean_abs_slope",
        "max_abs_slope",
        "nfe_fpi",
        "fpi_converged",
        "nfe_broyden",
        "backward_rel_residual",
    }
    assert 1 <= float(metrics["nfe_fpi"]) <= 30 and 0 <= float(metrics["fpi_converged"]) <= 1
    assert float(metrics["max_abs_slope"]) >= float(metrics["mean_abs_slope"]) >= 0
