"""The one normalisation point: every way of writing a solver becomes one declared object."""

import functools

import jax.numpy as jnp
import numpy as np
import pytest

import deqjax as dq
from deqjax._src.normalise import (
    CustomSolver,
    accepts_keyword,
    as_solver,
)


def test_functions_partials_and_objects_become_equal_objects():
    assert as_solver(dq.solvers.anderson) == dq.solvers.Anderson()
    assert as_solver(functools.partial(dq.solvers.broyden, max_steps=12)) == dq.solvers.Broyden(
        max_steps=12
    )
    obj = dq.solvers.Anderson(m=2)
    assert as_solver(obj) is obj
    assert as_solver(functools.partial(obj, batch_ndim=1)) == obj.replace(batch_ndim=1)
    # Equal settings, equal hash: a configuration written twice is one static argument.
    assert hash(as_solver(functools.partial(dq.solvers.anderson, tol=1e-3))) == hash(
        dq.solvers.Anderson(tol=1e-3)
    )


def test_a_partial_binding_an_unknown_keyword_is_named():
    with pytest.raises(ValueError, match="restart"):
        as_solver(functools.partial(dq.solvers.anderson, restart=3))
    with pytest.raises(ValueError, match="solver"):
        as_solver(3)


def test_a_users_callable_declares_what_its_signature_says_once():
    def plain(f, z0):
        return dq.solvers.anderson(f, z0)

    def batched(f, z0, *, batch_ndim=0, tol=1e-3):
        return dq.solvers.anderson(f, z0, batch_ndim=batch_ndim, tol=tol)

    c = as_solver(plain)
    assert isinstance(c, CustomSolver) and not c.batch_native and c.loop_kinds == ()
    assert c == as_solver(plain) and hash(c) == hash(as_solver(plain))
    assert c.tol is None and c.to_dict() == {"solver": "plain"}
    with pytest.raises(ValueError, match="batch_ndim"):
        c.replace(batch_ndim=1)
    b = as_solver(functools.partial(batched, tol=1e-6))
    assert b.batch_native and b.tol == 1e-6 and b.to_dict() == {"solver": "batched", "tol": 1e-6}
    sol = b.replace(batch_ndim=1)(lambda z: 0.5 * z + 1.0, jnp.zeros((3, 2)))
    assert sol.status.shape == (3,)
    np.testing.assert_allclose(sol.value, 2.0, rtol=1e-5)
    # A partial that binds the batch axes declares them (the backward reads batch_ndim).
    assert as_solver(functools.partial(batched, batch_ndim=1)).batch_ndim == 1


def test_accepts_keyword_sees_named_and_var_keywords():
    assert accepts_keyword(lambda z, x, *, is_training: z, "is_training")
    assert accepts_keyword(lambda z, x, **kw: z, "is_training")
    assert not accepts_keyword(lambda z, x: z, "is_training")
    assert not accepts_keyword(len, "is_training")  # a builtin without a signature


# --- split_callable: a user's function as a cache key and its arrays -----------------------------
