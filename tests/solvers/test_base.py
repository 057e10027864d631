"""Solver objects: frozen, hashable, compared by value, printable, replaced field by field, with
declared capabilities, called as ``solver(f, z0)``."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import deqjax as dq
from deqjax import solvers

DRIVER = [solvers.FixedPointIteration, solvers.Anderson, solvers.Broyden, solvers.Reversible]
KRYLOV = [solvers.GMRES, solvers.BiCGStab, solvers.NormalCG]


def test_objects_are_frozen_hashable_and_printable():
    s = dq.solvers.Anderson(m=3, tol=1e-6, max_steps=20)
    assert s == dq.solvers.Anderson(m=3, tol=1e-6, max_steps=20) != dq.solvers.Anderson(m=4)
    assert hash(s) == hash(dq.solvers.Anderson(m=3, tol=1e-6, max_steps=20))
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.m = 4
    assert repr(s).startswith("Anderson(max_steps=20, tol=1e-06") and "m=3" in repr(s)
    assert s.replace(tol=1e-3).tol == 1e-3 and s.tol == 1e-6
    with pytest.raises(TypeError):
        dq.solvers.Anderson(20)  # keyword-only fields


def test_replace_names_unknown_fields():
    f, z0 = (lambda z: 0.5 * z + 1.0), jnp.zeros(5)
    s = dq.solvers.Anderson(tol=1e-9)
    batched = s.replace(batch_ndim=1)(lambda z: 0.5 * z + 1.0, jnp.zeros((3, 5)))
    assert batched.status.shape == (3,)
    assert s.replace(loop="scan")(f, z0).value.shape == (5,)
    with pytest.raises(ValueError, match="unknown field"):
        s.replace(restart=3)
    with pytest.raises(ValueError, match="unknown field"):
        dq.solvers.GMRES().replace(loop="scan")
    with pytest.raises(TypeError):
        s(f, z0, batch_ndim=1)  # a call takes (f, z0) only: variants are made with replace


def test_capabilities_are_declared():
    for cls in DRIVER:
        assert cls.loop_kinds == ("while", "scan", "python") and cls.batch_native
        assert cls().loop_kinds == cls.loop_kinds
    for cls in KRYLOV:
        assert cls.loop_kinds == () and cls.batch_native
        assert "loop" not in cls().to_dict()
    anderson, gmres = dq.solvers.as_solver(dq.solvers.anderson), dq.solvers.GMRES()
    assert "scan" in anderson.loop_kinds and "scan" not in gmres.loop_kinds
    assert "scan" in dq.solvers.as_solver(functools.partial(anderson, tol=1e-3)).loop_kinds
    assert dq.solvers.as_solver(functools.partial(dq.solvers.gmres, tol=1e-3)).batch_native

    def mine(f, z0):  # a user's solver declares nothing
        return dq.solvers.anderson(f, z0)

    custom = dq.solvers.as_solver(mine)
    assert custom.loop_kinds == () and not custom.batch_native


def test_settings_are_read_from_any_form():
    """What `describe` did: the settings a solver runs with, through as_solver."""
    assert dq.solvers.as_solver(dq.solvers.Broyden(memory=4)).to_dict()["memory"] == 4
    d = dq.solvers.as_solver(functools.partial(dq.solvers.anderson, tol=1e-3)).to_dict()
    assert d["solver"] == "Anderson" and d["tol"] == 1e-3 and d["m"] == 5
    d = dq.solvers.as_solver(functools.partial(dq.solvers.Anderson(m=2), batch_ndim=1)).to_dict()
    assert d["solver"] == "Anderson" and d["m"] == 2 and d["batch_ndim"] == 1
    assert dq.solvers.as_solver(lambda f, z0: None).to_dict() == {"solver": "<lambda>"}


def test_jit_keys_on_the_object_by_value():
    traces = []

    @functools.partial(jax.jit, static_argnums=0)
    def run(solver, z0):
        traces.append(solver)
        return solver(jnp.cos, z0).value

    run(dq.solvers.Anderson(tol=1e-6), jnp.array(1.0))
    z = run(dq.solvers.Anderson(tol=1e-6), jnp.array(1.0))  # an equal object: no retrace
    assert len(traces) == 1
    np.testing.assert_allclose(z, 0.7390851332, rtol=1e-5)
    run(dq.solvers.Anderson(tol=1e-8), jnp.array(1.0))
    assert len(traces) == 2
