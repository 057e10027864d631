"""Implicit differentiation of a fixed point: the project's one ``jax.custom_vjp`` site.

At a fixed point ``z* = f(θ, x, z*)`` the implicit function theorem (DEQ paper, Theorem 1; JR paper,
Eq. 1–2) gives, for a loss ``ℓ(z*)``,

    ∂ℓ/∂θ = uᵀ ∂f/∂θ(z*),   ∂ℓ/∂x = uᵀ ∂f/∂x(z*),   where   uᵀ = uᵀ J_f(z*) + ∂ℓ/∂z*,

i.e. ``u`` solves ``(I − J_f(z*))ᵀ u = g``. That linear system is itself a fixed-point problem
``u = g + J_f(z*)ᵀ u`` (DEQ paper, Eq. 11), solved here with any forward solver using only
vector–Jacobian products: the Jacobian is never formed, and nothing but ``(θ, x, z*)`` is kept
from the forward pass, so memory does not depend on the number of forward steps.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp

from deqjax._src import tree
from deqjax._src.solvers import base

PyTree = Any
CellFn = Callable[[PyTree, PyTree, PyTree], PyTree]

ON_FAILURE = ("best", "nan", "one_step")


def backward_solve(
    f: CellFn,
    params: PyTree,
    x: PyTree,
    z_star: PyTree,
    cotangent: PyTree,
    solver: base.SolverFn,
) -> base.Solution:
    """Solves ``u = g + J_f(z*)ᵀ u`` for the adjoint ``u`` (DEQ paper, Eq. 11), VJPs only.

    The solve starts from ``u0 = g``, so its lowest-residual iterate is never worse than the
    Jacobian-free estimate ``u = g``.

    Args:
      f: the cell ``f(params, x, z)``.
      params: its parameters.
      x: its input.
      z_star: the fixed point.
      cotangent: ``g = ∂ℓ/∂z*``, a pytree like ``z_star``.
      solver: any forward solver ``(h, u0) -> Solution``.

    Returns:
      The backward solver's :class:`~deqjax.solvers.Solution` for ``u``.
    """
    _, vjp_z = jax.vjp(lambda z: f(params, x, z), z_star)

    def adjoint_map(u):
        (jt_u,) = vjp_z(u)
        return tree.tree_add(cotangent, jt_u)

    return solver(adjoint_map, cotangent)


def _apply_failure_policy(sol: base.Solution, cotangent: PyTree, on_failure: str) -> PyTree:
    failed = (sol.status == base.DIVERGED) | (sol.status == base.NONFINITE)
    if on_failure == "best":
        return sol.value
    if on_failure == "nan":
        nan = jax.tree_util.tree_map(lambda u: jnp.full_like(u, jnp.nan), sol.value)
        return tree.tree_where(failed, nan, sol.value)
    return tree.tree_where(failed, cotangent, sol.value)  # "one_step"


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3))
def implicit_fixed_point(
    f: CellFn,
    solver: base.SolverFn,
    backward_solver: base.SolverFn,
    on_failure: str,
    params: PyTree,
    x: PyTree,
    z0: PyTree,
) -> tuple[PyTree, base.Solution]:
    """Forward solve of ``z = f(params, x, z)`` with implicit gradients in ``params`` and ``x``.

    ``z0`` receives a zero gradient (the fixed point does not depend on where the solve starts).
    Use through :class:`deqjax.ImplicitAdjoint` and :func:`deqjax.fixed_point`.
    """
    sol = solver(lambda z: f(params, x, z), z0)
    return sol.value, sol


def _fwd(f, solver, backward_solver, on_failure, params, x, z0):
    sol = solver(lambda z: f(params, x, z), z0)
    return (sol.value, sol), (params, x, sol.value, z0)


def _bwd(f, solver, backward_solver, on_failure, residuals, cotangents):
    del solver
    params, x, z_star, z0 = residuals
    g_z, g_sol = cotangents
    # The Solution's value is z*: a cotangent reaching it counts like one on z*. Its statistics
    # (steps, residuals, trace, status) are not differentiable and their cotangents are dropped.
    g = jax.tree_util.tree_map(jnp.add, g_z, g_sol.value)
    sol_u = backward_solve(f, params, x, z_star, g, backward_solver)
    u = _apply_failure_policy(sol_u, g, on_failure)
    _, vjp_px = jax.vjp(lambda p, xx: f(p, xx, z_star), params, x)
    g_params, g_x = vjp_px(u)
    return g_params, g_x, tree.tree_zeros_like(z0)


implicit_fixed_point.defvjp(_fwd, _bwd)
