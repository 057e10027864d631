"""The problem a solver is called on: ``(f, z0)`` checked once per call, errors naming what is
wrong."""

from __future__ import annotations

import jax.numpy as jnp
import pytest

from deqjax import solvers

Z0 = jnp.zeros(3)


def _f(z):
    return 0.5 * z


@pytest.mark.parametrize(
    "call, arg",
    [
        (lambda: solvers.fixed_point_iteration(_f, jnp.zeros(3, jnp.int32)), "z0"),
        (lambda: solvers.broyden(_f, {"a": jnp.zeros(2), "b": jnp.arange(2)}), "z0"),
        (lambda: solvers.anderson(_f, {}), "z0"),
        (lambda: solvers.anderson(lambda z: z[:2], Z0), "f must"),
        (lambda: solvers.broyden(lambda z: z.astype(jnp.float32), Z0), "f must"),
        (lambda: solvers.fixed_point_iteration(lambda z: (z,), Z0), "f must"),
        (lambda: solvers.fixed_point_iteration(None, Z0), "f must"),
        (lambda: solvers.gmres(lambda z: z[:2], Z0), "f must"),
    ],
)
def test_invalid_problems_raise_value_error(call, arg):
    with pytest.raises(ValueError, match=arg):
        call()


def test_validation_names_leaf_shape_and_batch_ndim():
    f = lambda z: z  # noqa: E731
    with pytest.raises(ValueError, match=r"batch_ndim=2.*shape \[3\]"):
        solvers.anderson(f, jnp.zeros(3), batch_ndim=2)
    with pytest.raises(ValueError, match=r"share the leading batch axes \[4\].*\[5, 2\]"):
        solvers.broyden(f, {"a": jnp.zeros((4, 2)), "b": jnp.zeros((5, 2))}, batch_ndim=1)
    with pytest.raises(ValueError, match="batch_ndim"):
        solvers.fixed_point_iteration(f, jnp.zeros((2, 3)), batch_ndim=-1)
    with pytest.raises(ValueError, match="batch_ndim"):
        solvers.fixed_point_iteration(f, jnp.zeros((2, 3)), batch_ndim=True)
    with pytest.raises(ValueError, match="batch_ndim"):
        solvers.bicgstab(f, jnp.zeros(3), batch_ndim=2)


def test_has_aux_needs_a_pair_with_per_problem_leaves():
    with pytest.raises(ValueError, match=r"pair \(z, aux\)"):
        solvers.anderson(_f, Z0, has_aux=True)
    with pytest.raises(ValueError, match="f must return a pytree with the structure of z0"):
        solvers.anderson(lambda z: (z, z.sum()), Z0)  # an aux without has_aux
    with pytest.raises(ValueError, match=r"aux must have the leading batch axes \[2\]"):
        solvers.broyden(
            lambda z: (0.5 * z, jnp.sum(z)), jnp.zeros((2, 3)), has_aux=True, batch_ndim=1
        )
    sol = solvers.broyden(
        lambda z: (0.5 * z, jnp.sum(z, axis=1)), jnp.zeros((2, 3)), has_aux=True, batch_ndim=1
    )
    assert sol.aux.shape == (2,)
