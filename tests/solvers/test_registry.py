"""The solvers by name and by function: configs round trip, and a function call is the object's."""

from __future__ import annotations

import json

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
