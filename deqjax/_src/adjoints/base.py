"""What every gradient strategy shares: the :class:`Adjoint` interface and three small tools.

A strategy returns the forward solver's fixed point unchanged and decides only how ``∂ℓ/∂θ``
reaches through it. The tools: :func:`stop_statistics` (the returned Solution carries no gradient
but through its value), :func:`solve_without_gradient` (the forward solve for strategies whose
gradient comes from elsewhere) and :func:`straight_through` (the value of one pytree with the
gradient of another).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import jax
import jax.numpy as jnp

from deqjax._src.solvers import solution

if TYPE_CHECKING:
    from deqjax._src.adjoints.backward_stats import BackwardStats
    from deqjax._src.solvers.base import Solver

PyTree = Any
CellFn = Callable[[PyTree, PyTree, PyTree], PyTree]


class Adjoint:
    """Base class of the gradient strategies of :func:`deqjax.fixed_point`.

    A subclass is a frozen dataclass (it compares and hashes by value, so it can be a static
    argument of ``jax.jit``) and implements :meth:`solve`.
    """

    def check_inputs(self, params: PyTree, x: PyTree) -> None:
        """Raises ``ValueError`` for inputs this strategy cannot differentiate (e.g. ``jax.jvp``
        tangents on a reverse-mode-only path), before any tracing; by default accepts all.

        :func:`deqjax.fixed_point` calls it where the caller's tracers are still visible (an
        eager call runs the solve inside a program of its own, where they are not)."""
        del params, x

    def solve(
        self,
        f: CellFn,
        solver: Solver,
        params: PyTree,
        x: PyTree,
        z0: PyTree,
        *,
        backward_stats: BackwardStats | None = None,
    ) -> tuple[PyTree, solution.Solution]:
        """Runs the forward solve and attaches this strategy's gradient to its result.

        Args:
          f: the cell ``f(params, x, z)``.
          solver: the forward solver, already normalised (``deqjax._src.normalise.as_solver``).
          params: the cell's parameters.
          x: its input.
          z0: the initial state.
          backward_stats: the :class:`~deqjax.BackwardStats` probe; strategies without a
            backward solve leave its cotangent 0.

        Returns:
          ``(z_star, sol)``: the fixed point carrying this strategy's gradient, and the forward
          Solution with its statistics detached (:func:`stop_statistics`).
        """
        raise NotImplementedError


def strategies() -> list[str]:
    """The names of the gradient strategies: the subclasses of :class:`Adjoint` (at any depth,
    in the order they were defined; none whose name starts with ``_``), for messages that list
    them. A new strategy joins by subclassing."""
    found, todo = [], list(Adjoint.__subclasses__())
    while todo:
        cls = todo.pop(0)
        if cls.__name__ not in found and not cls.__name__.startswith("_"):
            found.append(cls.__name__)
        todo.extend(cls.__subclasses__())
    return found


def require_solver(solver: Solver, kind: type, adjoint: str, why: str, otherwise: str) -> None:
    """``ValueError`` unless the forward solver is a ``kind`` (e.g. ``dq.solvers.Broyden``),
    naming the forms that are (object, function, partial) and the alternatives."""
    if not isinstance(solver, kind):
        name = kind.__name__
        raise ValueError(
            f"{adjoint} needs the forward solver dq.solvers.{name}(...) (or "
            f"dq.solvers.{name.lower()}, or a functools.partial of it): {why}; got {solver!r}. "
            f"With another solver use {otherwise}."
        )


def stop_statistics(sol: solution.Solution, z_star: PyTree) -> solution.Solution:
    """The Solution returned to users: value = z_star (differentiable), statistics detached."""
    stats = jax.lax.stop_gradient(sol._replace(value=()))
    return stats._replace(value=z_star)


def no_gradient(t: PyTree) -> PyTree:
    """``t`` with ``stop_gradient`` on its float array leaves; other leaves (ints, PRNG keys,
    Python values, constants) as they are."""

    def stop(leaf: Any) -> Any:
        if isinstance(leaf, jax.Array) and jnp.issubdtype(leaf.dtype, jnp.inexact):
            return jax.lax.stop_gradient(leaf)
        return leaf

    return jax.tree_util.tree_map(stop, t)


def solve_without_gradient(
    f: CellFn, solver: Solver, params: PyTree, x: PyTree, z0: PyTree
) -> solution.Solution:
    """The forward solve on gradient-free inputs, for strategies whose gradient comes from
    elsewhere.

    No tangent enters the solver loop, so it runs once under ``grad`` (a loop carrying tangents is
    linearised and can be re-run in the backward pass; with an effect in ``f``, e.g.
    ``jax.debug.print``, ``grad`` then fails on the ``while_loop``).
    """
    params, x, z0 = no_gradient((params, x, z0))
    return solver(lambda z: f(params, x, z), z0)


def straight_through(z_star: PyTree, z_grad: PyTree) -> PyTree:
    """Value of ``z_star``, gradient of ``z_grad``: ``z_star + z_grad - stop_gradient(z_grad)``."""
    return jax.tree_util.tree_map(lambda a, b: a + (b - jax.lax.stop_gradient(b)), z_star, z_grad)
