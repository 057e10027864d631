"""Forward-mode implicit differentiation: the fixed point as a ``jax.custom_jvp``.

``ImplicitAdjoint(forward_mode=True)`` solves through :func:`forward_mode_fixed_point`, whose
tangent is the implicit function theorem (DEQ paper, Theorem 1) in forward mode:

    ż = (I − ∂f/∂z)⁻¹ (∂f/∂θ θ̇ + ∂f/∂x ẋ)   at z* = f(θ, x, z*),

a linear solve written with ``jax.lax.custom_linear_solve``:

* ``matvec``: ``v ↦ v − J_f(z*) v`` (a JVP of ``f`` in ``z``), the operator JAX differentiates
  (second derivatives, ``jax.hessian``) and transposes;
* ``solve``: the fixed point ``v = b + J_f(z*) v`` with the backward's solver, fallback and
  failure policy (:meth:`~deqjax._src.adjoints.backward_solve.BackwardConfig.tangent`);
* ``transpose_solve``: the implicit backward of the reverse-mode path, ``u = g + J_f(z*)ᵀ u``
  (:meth:`~deqjax._src.adjoints.backward_solve.BackwardConfig.adjoint`). ``jax.grad``
  transposes the tangent, so reverse mode runs this backward.

So ``jax.jvp``, ``jax.jacfwd``, ``jax.linearize``, ``jax.hessian`` and ``jax.grad`` (and any
composition: ``jvp`` of ``grad``, ``grad`` of ``jvp``) all work. The :class:`~deqjax.BackwardStats`
gradient channel survives as part of the linear system: with a probe, the unknown is the pair
``(ż, s)`` and the operator is the identity on ``s`` (``b = (…, ṗ)``, the probe's tangent), so the
cotangent of ``ṗ`` is the second output of ``transpose_solve``, the backward's statistics.

The path costs what the reverse-mode path
(:func:`~deqjax._src.adjoints.implicit.implicit_fixed_point`) does not: ``jax.grad`` evaluates
``f``'s linearisation at ``z*`` once more (``b``'s, in the forward pass, besides the
backward's), and ``custom_linear_solve`` traces all four of its functions on every call, the
tangent solve's loops among them even where only ``grad`` runs (traced, never compiled).
``ImplicitAdjoint()`` therefore keeps its ``custom_vjp`` (see ``docs/design.md``, "Forward
mode is ``ImplicitAdjoint(forward_mode=True)``").
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Callable

import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero, zero_from_primal

from deqjax._src import tree
from deqjax._src.adjoints import backward_stats as stats_lib
from deqjax._src.adjoints import primal
from deqjax._src.solvers import solution

if TYPE_CHECKING:
    from deqjax._src.adjoints.backward_solve import BackwardConfig
    from deqjax._src.solvers.base import Solver

PyTree = Any
CellFn = Callable[[PyTree, PyTree, PyTree], PyTree]


# --- the tangent: b = ∂f/∂θ θ̇ + ∂f/∂x ẋ, then ż = (I − J)⁻¹ b --------------------------------


def input_tangent(
    f: CellFn, params: PyTree, x: PyTree, z_star: PyTree, d_params: PyTree, d_x: PyTree
) -> PyTree | None:
    """``b = ∂f/∂θ θ̇ + ∂f/∂x ẋ`` at ``z*``: one JVP of ``f`` in the leaves of ``(params, x)``
    whose tangent is not a symbolic zero (``None`` when none has one). A ``jvp`` in ``x`` alone
    takes no product with ``∂f/∂θ``, and ``grad`` in the parameters none with ``∂f/∂x``."""
    leaves, treedef = jax.tree_util.tree_flatten((params, x))
    tangents = treedef.flatten_up_to((d_params, d_x))
    moving = [not isinstance(t, SymbolicZero) for t in tangents]
    if not any(moving):
        return None

    def cell(*values: Any) -> PyTree:
        it = iter(values)
        p, xx = treedef.unflatten([next(it) if m else v for m, v in zip(moving, leaves)])
        return f(p, xx, z_star)

    primals = tuple(v for m, v in zip(moving, leaves) if m)
    return jax.jvp(cell, primals, tuple(t for m, t in zip(moving, tangents) if m))[1]


def linear_in_tangents(b: PyTree, tangents: PyTree) -> PyTree:
    """``b`` with ``0 · t₀`` added to every leaf, ``t₀`` one entry of a tangent in ``tangents``
    that is not a symbolic zero: the same values, each leaf now computed from the tangents.

    ``jax.grad`` transposes :func:`implicit_tangent`'s ``custom_linear_solve``, whose transpose
    rule requires every leaf of its right-hand side to be linear in the differentiated inputs
    (it asserts so). A leaf computed from none of them is not: a state leaf that ``f`` maps
    without reading the differentiated ``θ`` or ``x`` directly, or the probe's tangent (zeros)
    when only ``θ`` moves, or ``b`` (zeros) when only the probe moves.
    """
    moving = [
        t
        for t in jax.tree_util.tree_leaves(tangents, is_leaf=lambda t: isinstance(t, SymbolicZero))
        if not isinstance(t, SymbolicZero) and jnp.issubdtype(t.dtype, jnp.inexact) and t.size
    ]
    if not moving:
        return b
    zero = 0 * jnp.real(jnp.ravel(moving[0])[0])
    return jax.tree_util.tree_map(lambda leaf: leaf + zero.astype(leaf.dtype), b)


def implicit_tangent(
    f: CellFn,
    backward: BackwardConfig,
    params: PyTree,
    x: PyTree,
    z_star: PyTree,
    rhs: PyTree,
    forward_rel_residual: jax.Array,
    probe: stats_lib.BackwardStats | None = None,
    d_probe: stats_lib.BackwardStats | None = None,
) -> PyTree:
    """``ż = (I − J_f(z*))⁻¹ b`` as a ``custom_linear_solve`` (see the module docstring).

    Args:
      f: the cell ``f(params, x, z)``.
      backward: the resolved backward (solver, fallback, failure policy, ``batch_ndim``).
      params, x: the cell's inputs (primal values).
      z_star: the fixed point.
      rhs: ``b``, a pytree like ``z_star``.
      forward_rel_residual: the forward solve's relative residual (the fallback's threshold).
      probe: the :class:`~deqjax.BackwardStats` probe, or ``None``.
      d_probe: its tangent (zeros where it has none).

    Returns:
      ``ż``, a pytree like ``z_star``.
    """

    def jz(v: PyTree) -> PyTree:
        return jax.jvp(lambda z: f(params, x, z), (z_star,), (v,))[1]

    def tangent(b: PyTree) -> PyTree:
        return backward.tangent(f, params, x, z_star, b, forward_rel_residual)

    def adjoint(g: PyTree) -> tuple[PyTree, stats_lib.BackwardStats]:
        result = backward.adjoint(f, params, x, z_star, g, forward_rel_residual)
        return result.u, result.stats

    if probe is None:
        return jax.lax.custom_linear_solve(
            lambda v: tree.tree_sub(v, jz(v)),
            rhs,
            lambda _, b: tangent(b),
            lambda _, g: adjoint(g)[0],
        )

    # The gradient channel: the unknown (ż, s), the operator the identity on s. The tangent
    # solve passes s = ṗ through; the transposed solve returns the backward's statistics as
    # the cotangent of ṗ, hence of the probe.
    def transpose_solve(_: Any, g: tuple[PyTree, Any]) -> tuple[PyTree, Any]:
        u, stats = adjoint(g[0])
        return u, stats_lib.probe_cotangent(stats, probe)

    dz, _ = jax.lax.custom_linear_solve(
        lambda v: (tree.tree_sub(v[0], jz(v[0])), v[1]),
        (rhs, d_probe),
        lambda _, b: (tangent(b[0]), b[1]),
        transpose_solve,
    )
    return dz


# --- the custom_jvp -----------------------------------------------------------------------------


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1, 2))
def forward_mode_fixed_point(
    f: CellFn,
    solver: Solver,
    backward: BackwardConfig,
    params: PyTree,
    x: PyTree,
    z0: PyTree,
    probe: stats_lib.BackwardStats | None,
) -> tuple[PyTree, solution.Solution]:
    """Forward solve of ``z = f(params, x, z)``, differentiable in ``params`` and ``x`` in both
    modes through the implicit tangent (:func:`implicit_tangent`).

    ``z0`` gets a zero tangent (the fixed point does not depend on where the solve starts); the
    Solution's statistics get none; ``probe`` receives the backward solve's statistics as its
    cotangent under reverse mode. Use through ``dq.ImplicitAdjoint(forward_mode=True)``.
    """
    del backward, probe
    return primal.forward_solve(f, solver, params, x, z0)


def _jvp(
    f: CellFn,
    solver: Solver,
    backward: BackwardConfig,
    primals: tuple[PyTree, PyTree, PyTree, Any],
    tangents: tuple[PyTree, PyTree, PyTree, Any],
) -> tuple[tuple[PyTree, solution.Solution], tuple[PyTree, Any]]:
    params, x, z0, probe = primals
    d_params, d_x, _, d_probe = tangents
    # Through the custom_jvp itself, so that an outer derivative (grad of a jvp) of the primal
    # is this rule again, never the solver's loop.
    z_star, sol = forward_mode_fixed_point(f, solver, backward, params, x, z0, probe)
    rhs = input_tangent(f, params, x, z_star, d_params, d_x)
    probe_moves = probe is not None and not all(
        isinstance(t, SymbolicZero) for t in jax.tree_util.tree_leaves(d_probe)
    )
    if rhs is None and not probe_moves:
        dz = zero_from_primal(z_star, symbolic_zeros=True)
    else:
        rhs = tree.tree_zeros_like(z_star) if rhs is None else rhs
        if probe is not None:
            d_probe = jax.tree_util.tree_map(
                lambda t, p: jnp.zeros_like(p) if isinstance(t, SymbolicZero) else t,
                d_probe,
                probe,
            )
        rhs, d_probe = linear_in_tangents((rhs, d_probe), (d_params, d_x, d_probe))
        dz = implicit_tangent(f, backward, params, x, z_star, rhs, sol.rel_residual, probe, d_probe)
    d_sol = zero_from_primal(sol._replace(value=()), symbolic_zeros=True)._replace(value=dz)
    return (z_star, sol), (dz, d_sol)


forward_mode_fixed_point.defjvp(_jvp, symbolic_zeros=True)
