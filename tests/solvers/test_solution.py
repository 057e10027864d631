"""The Solution and its status codes: values, names, repr."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from deqjax import solvers
from tests.helpers.solver_problems import KINDS, SCALES, mixed_batch_f, mixed_batch_problem


def test_status_codes_keep_their_values():
    assert (solvers.CONVERGED, solvers.MAX_STEPS, solvers.DIVERGED, solvers.NONFINITE) == (
        0,
        1,
        2,
        3,
    )


def test_status_name_takes_one_code_and_refuses_an_array():
    assert solvers.status_name(0) == "converged"
    assert solvers.status_name(np.int32(3)) == "nonfinite"
    assert solvers.status_name(jnp.asarray(1)) == "max_steps"
    assert solvers.status_name(7) == "unknown(7)"
    with pytest.raises(ValueError, match="summarize"):
        solvers.status_name(jnp.asarray([0, 3]))
    # An array of names, the way the error message says.
    names = np.vectorize(solvers.status_name)(jnp.asarray([[0, 3]]))
    assert names.tolist() == [["converged", "nonfinite"]]


def test_status_name_and_repr_of_batched_solution():
    scales = jnp.asarray([0.5, 2.0, 0.5])
    sol = jax.vmap(
        lambda s: solvers.fixed_point_iteration(lambda z: s * z + 1, jnp.zeros(2), max_steps=200)
    )(scales)
    names = np.vectorize(solvers.status_name)(sol.status)
    assert names.tolist() == ["converged", "diverged", "converged"]
    assert solvers.status_name(sol.status[0]) == "converged"
    text = repr(sol)
    assert "converged: 2" in text and "diverged: 1" in text and "inf" not in text
    assert len(text) < 300
    single = repr(solvers.anderson(jnp.cos, jnp.array(1.0), tol=1e-8, max_steps=200))
    assert "status=converged" in single and "num_steps=" in single and "inf" not in single
    # Under jit the fields are abstract: the repr still works.
    jax.jit(lambda: (repr(solvers.anderson(jnp.cos, jnp.array(1.0))), 0)[1])()


def test_repr_of_batched_solution_is_a_summary():
    a, xs = mixed_batch_problem()
    f = mixed_batch_f(a, jnp.asarray(KINDS), jnp.asarray(SCALES), xs)
    sol = jax.jit(
        lambda: solvers.anderson(f, jnp.zeros_like(xs), tol=1e-10, max_steps=40, batch_ndim=1)
    )()
    text = repr(sol)
    assert "nonfinite: 2" in text and "batch=(8,)" in text and "max abs_residual=" in text
    assert len(text) < 300  # no trace dump


def test_optional_fields_default_to_none():
    sol = solvers.anderson(jnp.cos, jnp.array(1.0))
    for field in ("samples", "inverse_estimate", "reversible_state", "aux"):
        assert getattr(sol, field) is None, field
