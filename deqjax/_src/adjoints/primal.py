"""The primal of the custom-derivative layers, written once: the forward solve and its residuals.

Every layer with its own derivative rule (the implicit ``jax.custom_vjp``, SHINE's, the
forward-mode ``jax.custom_jvp``) runs the same forward solve, :func:`forward_solve`, and only
its rule differs. :func:`reverse_mode_layer` builds a ``custom_vjp`` layer from a backward rule
alone: the forward keeps :class:`Residuals` (never the solver's iterates, so memory does not
depend on the forward's steps), the backward receives the cotangent of ``z*``
(:func:`z_star_cotangent`) and gives ``z0`` a zero cotangent (the fixed point does not depend
on where the solve starts); forward mode through the layer, or through its rules, is refused by
:mod:`~deqjax._src.adjoints.reverse_only`.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from deqjax._src import tree
from deqjax._src.adjoints import reverse_only
from deqjax._src.solvers import solution

if TYPE_CHECKING:
    from deqjax._src.adjoints.backward_stats import BackwardStats
    from deqjax._src.solvers.base import Solver

PyTree = Any
CellFn = Callable[[PyTree, PyTree, PyTree], PyTree]


def forward_solve(
    f: CellFn, solver: Solver, params: PyTree, x: PyTree, z0: PyTree
) -> tuple[PyTree, solution.Solution]:
    """The forward solve of ``z = f(params, x, z)`` from ``z0``: ``(z*, its Solution)``."""
    sol = solver(lambda z: f(params, x, z), z0)
    return sol.value, sol


class Residuals(NamedTuple):
    """What a reverse-mode layer's backward rule receives from its forward solve."""

    params: PyTree
    x: PyTree
    z_star: PyTree
    z0: PyTree  # for its (zero) cotangent
    rel_residual: jax.Array  # the forward solve's, per problem
    inverse: Any  # the solver's inverse estimate where the backward reads it, else None
    probe: BackwardStats | None  # the BackwardStats probe, or None


# backward(f, config, residuals, g) -> (g_params, g_x, g_probe), g the cotangent of z*.
BackwardRule = Callable[[CellFn, Any, Residuals, PyTree], tuple[PyTree, PyTree, Any]]


def z_star_cotangent(cotangents: tuple[PyTree, solution.Solution]) -> PyTree:
    """The cotangent of ``z*`` from those of ``(z_star, sol)``: the Solution's value is ``z*``, so
    a cotangent reaching it counts like one on ``z*``. Its statistics (steps, residuals, trace,
    status) are not differentiable and their cotangents are dropped."""
    g_z, g_sol = cotangents
    return jax.tree_util.tree_map(jnp.add, g_z, g_sol.value)


def reverse_mode_layer(
    backward: BackwardRule, adjoint: str, *, inverse_to_backward: bool = False
) -> Callable[..., tuple[PyTree, solution.Solution]]:
    """The ``jax.custom_vjp`` layer ``(f, solver, config, params, x, z0, probe) -> (z*, sol)``
    whose backward is ``backward`` (``f``, ``solver`` and the static ``config`` are not
    differentiated).

    Args:
      backward: the rule ``(f, config, residuals, g) -> (g_params, g_x, g_probe)``.
      adjoint: the strategy, for the message refusing forward mode (``"dq.ImplicitAdjoint()"``).
      inverse_to_backward: the solver's inverse estimate goes to the backward
        (:attr:`Residuals.inverse`) and not to the caller.
    """

    def solve(f, solver, params, x, z0):
        z_star, sol = forward_solve(f, solver, params, x, z0)
        if inverse_to_backward:
            return z_star, sol._replace(inverse_estimate=None), sol.inverse_estimate
        return z_star, sol, None

    @functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
    def layer(f, solver, config, params, x, z0, probe):
        del config, probe
        return solve(f, solver, params, x, z0)[:2]

    def fwd(f, solver, config, params, x, z0, probe):
        del config
        params, x, z0 = reverse_only.refuse_derivatives(adjoint, (params, x, z0))
        z_star, sol, inverse = solve(f, solver, params, x, z0)
        return (z_star, sol), Residuals(params, x, z_star, z0, sol.rel_residual, inverse, probe)

    def bwd(f, solver, config, residuals, cotangents):
        del solver
        # The values the backward computes with (not the probe's, of which it reads the dtypes).
        solved = (residuals.params, residuals.x, residuals.z_star, residuals.inverse)
        *solved, g = reverse_only.refuse_derivatives(
            adjoint, (*solved, z_star_cotangent(cotangents))
        )
        residuals = residuals._replace(**dict(zip(("params", "x", "z_star", "inverse"), solved)))
        g_params, g_x, g_probe = backward(f, config, residuals, g)
        return g_params, g_x, tree.tree_zeros_like(residuals.z0), g_probe

    layer.defvjp(fwd, bwd)

    def guarded(f, solver, config, params, x, z0, probe):
        params, x, z0, probe = reverse_only.refuse_jvp(adjoint, (params, x, z0, probe))
        return layer(f, solver, config, params, x, z0, probe)

    return guarded
