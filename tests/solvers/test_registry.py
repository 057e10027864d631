"""The solvers by name and by function: configs round trip, and a function call is the object's."""

from __future__ import annotations

import dataclasses
import functools
import json
import re

import jax
import numpy as np
import pytest

import deqjax as dq
from deqjax._src.solvers import registry


def _affine(d=5, seed=0):
    a = 0.5 * jax.random.normal(jax.random.PRNGKey(seed), (d, d)) / np.sqrt(d)
    b = np.arange(d, dtype=np.float64) / d
    return lambda z: a @ z + b, np.zeros(d)


@pytest.mark.parametrize("fn", list(registry.BY_FUNCTION), ids=lambda f: f.__name__)
def test_a_function_call_is_the_call_of_its_object(fn):
    cls = registry.BY_FUNCTION[fn]
    assert dq.solvers.as_solver(fn) == cls()
    assert getattr(dq.solvers, cls.__name__) is cls and getattr(dq.solvers, fn.__name__) is fn
    f, z0 = _affine()
    got = cls(max_steps=30, tol=1e-9)(f, z0)
    want = fn(f, z0, max_steps=30, tol=1e-9)
    np.testing.assert_array_equal(got.value, want.value)
    np.testing.assert_array_equal(got.num_steps, want.num_steps)
    np.testing.assert_array_equal(got.trace, want.trace)


@pytest.mark.parametrize("cls", list(registry.BY_NAME.values()), ids=lambda c: c.__name__)
def test_every_solver_round_trips_through_json(cls):
    s = cls().replace(tol=1e-6, max_steps=20)
    assert dq.solvers.from_dict(json.loads(json.dumps(s.to_dict()))) == s


def test_configs_round_trip_through_json():
    s = dq.solvers.Anderson(m=3, tol=1e-6, max_steps=20)
    d = json.loads(json.dumps(s.to_dict()))
    assert d["solver"] == "Anderson" and d["m"] == 3
    assert dq.solvers.from_dict(d) == s
    assert dq.solvers.from_dict(dq.harness.to_python(s)) == s  # a run's config.json entry
    sampled = dq.solvers.Anderson(max_steps=8, sample_steps=(2, 4))
    back = dq.solvers.from_dict(json.loads(json.dumps(sampled.to_dict())))  # tuple -> list -> tuple
    assert back == sampled and hash(back) == hash(sampled)
    with pytest.raises(ValueError, match="config"):
        dq.solvers.from_dict({"solver": "Newton"})
    with pytest.raises(ValueError, match="restart"):
        dq.solvers.from_dict({"solver": "Anderson", "restart": 3})


def test_every_public_solver_is_registered_with_its_function_form():
    classes = {
        name: obj
        for name in dq.solvers.__all__
        if isinstance(obj := getattr(dq.solvers, name), type)
        and issubclass(obj, dq.solvers.Solver)
        and obj is not dq.solvers.Solver
    }
    assert classes and registry.BY_NAME == classes
    assert set(registry.BY_FUNCTION.values()) == set(classes.values())
    for fn in registry.BY_FUNCTION:
        assert getattr(dq.solvers, fn.__name__) is fn


def test_a_solver_registers_itself_where_it_is_defined(monkeypatch):
    """No list to extend: the decorator on its function form puts a new solver in the registry
    (as_solver, from_dict)."""
    monkeypatch.setattr(registry, "BY_FUNCTION", dict(registry.BY_FUNCTION))
    monkeypatch.setattr(registry, "BY_NAME", dict(registry.BY_NAME))

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class HalfStep(dq.solvers.FixedPointIteration):
        damping: float = 0.5

    @registry.function_form(HalfStep)
    def half_step(f, z0, /, **options):
        return HalfStep(**options)(f, z0)

    assert dq.solvers.as_solver(half_step) == HalfStep()
    assert dq.solvers.as_solver(functools.partial(half_step, tol=1e-3)) == HalfStep(tol=1e-3)
    assert dq.solvers.from_dict(HalfStep(max_steps=7).to_dict()) == HalfStep(max_steps=7)


def test_an_unregistered_deqjax_solver_function_is_an_error_not_a_users_callable():
    def newton(f, z0, /, **options):
        return dq.solvers.Anderson(**options)(f, z0)

    newton.__module__ = "deqjax._src.solvers.newton"
    with pytest.raises(ValueError, match="not a registered solver function"):
        dq.solvers.as_solver(newton)


def test_a_solver_class_passed_for_an_instance_is_named():
    with pytest.raises(ValueError, match=re.escape("pass an instance, e.g. dq.solvers.Anderson()")):
        dq.solvers.as_solver(dq.solvers.Anderson)
    f, z0 = _affine()
    with pytest.raises(ValueError, match=re.escape("dq.solvers.Broyden()")):
        dq.fixed_point(lambda p, x, z: f(z), (), (), z0, solver=dq.solvers.Broyden)
