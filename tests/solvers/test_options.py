"""The shared settings: every field is validated when an object is made (and nothing else runs)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import deqjax as dq
from deqjax import solvers


def _f(z):
    return 0.5 * z


Z0 = jnp.zeros(3)


@pytest.mark.parametrize(
    "call, arg",
    [
        (lambda: solvers.fixed_point_iteration(_f, Z0, stop_mode="max"), "stop_mode"),
        (lambda: solvers.anderson(_f, Z0, stop_mode="l2"), "stop_mode"),
        (lambda: solvers.anderson(_f, Z0, m=0), "m "),
        (lambda: solvers.anderson(_f, Z0, m=2.0), "m "),
        (lambda: solvers.anderson(_f, Z0, beta=0.0), "beta"),
        (lambda: solvers.anderson(_f, Z0, lam=-1.0), "lam"),
        (lambda: solvers.broyden(_f, Z0, max_steps=0), "max_steps"),
        (lambda: solvers.fixed_point_iteration(_f, Z0, max_steps=2.5), "max_steps"),
        (lambda: solvers.anderson(_f, Z0, tol=-1e-3), "tol"),
        (lambda: solvers.broyden(_f, Z0, tol=float("nan")), "tol"),
        (lambda: solvers.broyden(_f, Z0, memory=0), "memory"),
        (lambda: solvers.broyden(_f, Z0, line_search=1), "line_search"),
        (lambda: solvers.fixed_point_iteration(_f, Z0, damping=0.0), "damping"),
        (lambda: solvers.fixed_point_iteration(_f, Z0, damping=1.5), "damping"),
        (lambda: solvers.anderson(_f, Z0, divergence_factor=1.0), "divergence_factor"),
        (lambda: solvers.broyden(_f, Z0, loop="for"), "loop"),
        (lambda: solvers.anderson(_f, Z0, has_aux=1), "has_aux"),
        (lambda: solvers.anderson(_f, Z0, sample_steps=(51,)), "sample_steps"),
        (lambda: solvers.anderson(_f, Z0, sample_steps=(2, 2)), "sample_steps"),
        (lambda: solvers.gmres(_f, Z0, restart=0), "restart"),
        (lambda: solvers.bicgstab(_f, Z0, chunk=0), "chunk"),
    ],
)
def test_invalid_arguments_raise_value_error(call, arg):
    with pytest.raises(ValueError, match=arg):
        call()


def test_mixed_stop_mode_arguments():
    with pytest.raises(ValueError, match="atol"):
        solvers.anderson(_f, Z0, atol=1e-3)  # atol without stop_mode="mixed"
    with pytest.raises(ValueError, match="atol"):
        solvers.broyden(_f, Z0, stop_mode="mixed", atol=-1.0)
    with pytest.raises(ValueError, match="tol > 0"):
        solvers.fixed_point_iteration(_f, Z0, stop_mode="mixed", tol=0.0)


@pytest.mark.parametrize(
    "cls, field, value",
    [
        (dq.solvers.Anderson, "m", 0),
        (dq.solvers.Anderson, "tol", -1.0),
        (dq.solvers.Broyden, "memory", True),
        (dq.solvers.FixedPointIteration, "damping", 2.0),
        (dq.solvers.FixedPointIteration, "loop", "for"),
        (dq.solvers.Anderson, "batch_ndim", -1),
        (dq.solvers.GMRES, "restart", 0),
        (dq.solvers.Reversible, "beta", 1.0),
        (dq.solvers.Reversible, "checkpoint_every", 0),
        (dq.solvers.NormalCG, "has_aux", "yes"),
    ],
)
def test_bad_fields_fail_at_construction_naming_the_field(cls, field, value):
    with pytest.raises(ValueError, match=field):
        cls(**{field: value})
    with pytest.raises(ValueError, match=field):
        cls().replace(**{field: value})


def test_construction_runs_no_jax(monkeypatch):
    """Making or replacing an object validates its fields and traces nothing, so an entry point
    can normalise on every call."""

    def refuse(*args, **kwargs):
        raise AssertionError("a solver object traced something at construction")

    monkeypatch.setattr(jax, "eval_shape", refuse)
    monkeypatch.setattr(jax, "jit", refuse)
    for cls in (
        dq.solvers.FixedPointIteration,
        dq.solvers.Anderson,
        dq.solvers.Broyden,
        dq.solvers.Reversible,
        dq.solvers.GMRES,
        dq.solvers.BiCGStab,
        dq.solvers.NormalCG,
    ):
        cls(max_steps=7)
        cls().replace(tol=1e-3, batch_ndim=1)


def test_sample_steps_are_sorted_once_where_the_object_is_made():
    """Any sequence of distinct steps becomes one sorted tuple at construction (the driver reads
    it as it is): two spellings of the same steps make the same, equally hashed, solver."""
    solver = solvers.FixedPointIteration(max_steps=8, tol=0.0, sample_steps=[4, 0, 2])
    same = solvers.FixedPointIteration(max_steps=8, tol=0.0, sample_steps=(0, 2, 4))
    assert solver.sample_steps == (0, 2, 4)
    assert solver == same and hash(solver) == hash(same)
    sol = solver(_f, jnp.ones(3))
    for i, step in enumerate(solver.sample_steps):
        assert float(sol.samples[i, 0]) == 0.5**step
