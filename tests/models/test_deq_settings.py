"""How a model solves its DEQ: solvers normalised once, the regulariser checked, the JR entries."""

import functools

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import deqjax as dq
from deqjax._src.models.deq_settings import JR_KEYS, DEQSettings


def test_solvers_become_objects_once():
    settings = DEQSettings(functools.partial(dq.solvers.anderson, max_steps=6, tol=1e-3))
    assert settings.solver == dq.solvers.Anderson(max_steps=6, tol=1e-3)
    assert settings.eval_solver is None
    assert DEQSettings().solver == dq.solvers.Anderson()
    evals = DEQSettings(eval_solver=dq.solvers.fixed_point_iteration).eval_solver
    assert evals == dq.solvers.FixedPointIteration()


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(solver="anderson"), "solver"),
        (dict(eval_solver=3), "eval_solver"),
        (dict(regularizer=0.5), "regularizer"),
    ],
)
def test_bad_settings_raise(kw, match):
    with pytest.raises(ValueError, match=match):
        DEQSettings(**kw)


def test_solve_gives_the_jr_entries_only_when_training():
    reg = dq.regularization.JacobianRegularizer(2.0, p=1.0)
    settings = DEQSettings(dq.solvers.Anderson(max_steps=20, tol=1e-8), regularizer=reg)

    def forward(x, is_training):
        def cell(z, x):
            return jnp.tanh(0.5 * hk.Linear(4, name="w")(z) + x)

        out, jr = settings.solve(cell, x, is_training=is_training, step=None)
        return out.z_star, jr

    t = hk.transform(forward)
    x = jax.random.normal(jax.random.PRNGKey(0), (3, 4), jnp.float64)
    params = t.init(jax.random.PRNGKey(1), x, True)
    assert set(params) == {"deq/lifted/w"}
    _, jr_train = t.apply(params, jax.random.PRNGKey(2), x, True)
    _, jr_eval = t.apply(params, jax.random.PRNGKey(2), x, False)
    assert tuple(jr_train) == tuple(jr_eval) == JR_KEYS
    assert float(jr_train["jr/applied"]) == 1.0 and float(jr_train["jr/frobenius_sq"]) > 0
    np.testing.assert_allclose(jr_train["jr"], 2.0 * jr_train["jr/frobenius_sq"], rtol=1e-12)
    assert all(float(v) == 0.0 for v in jr_eval.values())
