"""How a model solves its DEQ: solvers normalised once, the regulariser checked, the JR entries."""

import dataclasses
import functools
import inspect

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
        (dict(adjoint="implicit"), "adjoint"),  # when built, not when a model is traced
        (dict(precision="fastest"), "precision"),
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


@pytest.mark.parametrize("model", [dq.models.MDEQClassifier, dq.models.SequenceBackbone])
def test_models_take_the_settings_as_one_keyword(model):
    """The DEQ keyword block is ``deq=``, a ``DEQSettings``, not repeated in each model."""
    params = inspect.signature(model.__init__).parameters
    assert params["deq"].kind is inspect.Parameter.KEYWORD_ONLY and params["deq"].default is None
    fields = {f.name for f in dataclasses.fields(DEQSettings)}
    assert fields == {"solver", "eval_solver", "adjoint", "regularizer", "precision"}
    assert not fields & set(params)


def test_a_models_deq_settings_reach_its_deq():
    """``SequenceModel(..., deq=DEQSettings(...))``: the backbone's DEQ solves with its solver
    and evaluation solver, and adds its regulariser's terms."""
    deq = DEQSettings(
        dq.solvers.FixedPointIteration(max_steps=3, tol=0.0),
        eval_solver=dq.solvers.FixedPointIteration(max_steps=2, tol=0.0),
        regularizer=dq.regularization.JacobianRegularizer(1.0),
    )

    def forward(tokens, is_training):
        model = dq.models.SequenceModel(11, "deq", d_model=8, num_heads=2, deq=deq)
        return model(tokens, is_training=is_training)[1]

    t = hk.transform(forward)
    tokens = jnp.zeros((2, 3), jnp.int32)
    with jax.numpy_dtype_promotion("standard"):
        params = t.init(jax.random.PRNGKey(0), tokens, True)
        train = t.apply(params, jax.random.PRNGKey(1), tokens, True)
        evaluate = t.apply(params, None, tokens, False)
    assert float(train["nfe"]) == 3 and float(evaluate["nfe"]) == 2
    assert float(train["jr/applied"]) == 1 and float(train["jr"]) > 0
    assert float(evaluate["jr"]) == 0
