"""PhantomAdjoint: the phantom gradient, damped steps differentiated from z* (Geng et al. 2021)."""

import functools

import pytest

import deqjax as dq
from tests.helpers.dense_ift import contractive_problem, dense_reference, rel_err, tanh_grad


def test_phantom_approaches_implicit_as_steps_grow():
    p, x = contractive_problem(seed=6)
    solver = functools.partial(dq.solvers.anderson, tol=1e-12, max_steps=100)
    ref = dense_reference(p, x)
    errors = [
        rel_err(tanh_grad(solver, dq.PhantomAdjoint(steps=s, tau=0.5))(p, x), ref)
        for s in (1, 4, 16, 64)
    ]
    assert all(a > b for a, b in zip(errors, errors[1:])), errors
    assert errors[-1] < 1e-8 and errors[0] > 1e-2


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="steps"):
        dq.PhantomAdjoint(steps=0)
    with pytest.raises(ValueError, match="tau"):
        dq.PhantomAdjoint(tau=1.5)
