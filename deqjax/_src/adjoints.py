"""Gradient strategies for :func:`deqjax.fixed_point`: how ``∂ℓ/∂θ`` reaches through ``z*``.

Every strategy returns the forward solver's fixed point unchanged; only the gradient differs.

* :class:`ImplicitAdjoint` — the exact implicit-function-theorem gradient (DEQ paper, Thm. 1).
* :class:`PhantomAdjoint` — differentiate a few damped steps from ``z*`` (Geng et al. 2021).
* :class:`OneStepAdjoint` — Jacobian-free backprop: differentiate one ``f`` at ``z*`` (Fung et al.).
* :class:`UnrolledAdjoint` — backprop through every solver step (reference, O(steps) memory).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax

from deqjax._src import implicit_diff, tree
from deqjax._src.solvers import base

PyTree = Any
CellFn = Callable[[PyTree, PyTree, PyTree], PyTree]


def _stop_statistics(sol: base.Solution, z_star: PyTree) -> base.Solution:
    """The Solution returned to users: value = z_star (differentiable), statistics detached."""
    stats = jax.lax.stop_gradient(sol._replace(value=()))
    return stats._replace(value=z_star)


def _straight_through(z_star: PyTree, z_grad: PyTree) -> PyTree:
    """Value of ``z_star``, gradient of ``z_grad``: ``z_star + z_grad - stop_gradient(z_grad)``."""
    return jax.tree_util.tree_map(lambda a, b: a + (b - jax.lax.stop_gradient(b)), z_star, z_grad)


class Adjoint:
    """Base class of gradient strategies. Subclasses implement :meth:`solve`."""

    def solve(
        self, f: CellFn, solver: base.SolverFn, params: PyTree, x: PyTree, z0: PyTree
    ) -> tuple[PyTree, base.Solution]:
        """Runs the forward solve and attaches this strategy's gradient to its result."""
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class ImplicitAdjoint(Adjoint):
    """Implicit-function-theorem gradient: solve ``uᵀ = uᵀ J_f(z*) + ∂ℓ/∂z*`` with VJPs only.

    Implements the DEQ paper's Theorem 1 with the backward fixed-point solve of Eq. 11.

    Args:
      solver: backward solver for ``u = g + J_f(z*)ᵀ u``, any ``(h, u0) -> Solution`` (e.g.
        ``functools.partial(dq.solvers.broyden, max_steps=20)``). ``None``: the forward solver.
      on_failure: what a DIVERGED or NONFINITE backward solve gives (the gradient is never
        silently zeroed):
        ``"best"`` (default) the lowest-residual iterate ``u`` (the solve starts at ``u0 = g``, so
        at worst this is the Jacobian-free gradient); ``"nan"`` NaN gradients, making the failure
        visible (pair with ``optax.apply_if_finite`` to skip such steps); ``"one_step"`` the
        Jacobian-free gradient ``u = g``. A backward solve that merely hits its step budget
        (``MAX_STEPS``) always uses its lowest-residual iterate. Divergence of this linear solve
        is detected reliably only with ``stop_mode="abs"``: a geometrically growing ``u`` keeps a
        constant relative residual.

    The backward solve is not itself differentiable (no gradients of gradients).

    Example:
      >>> z, sol = dq.fixed_point(f, params, x, z0, adjoint=dq.ImplicitAdjoint(
      ...     solver=functools.partial(dq.solvers.anderson, max_steps=30, tol=1e-6)))
    """

    solver: base.SolverFn | None = None
    on_failure: str = "best"

    def __post_init__(self):
        if self.solver is not None and not callable(self.solver):
            raise ValueError(f"solver must be callable or None, got {self.solver!r}.")
        if self.on_failure not in implicit_diff.ON_FAILURE:
            raise ValueError(
                f"on_failure must be one of {implicit_diff.ON_FAILURE}, got {self.on_failure!r}."
            )

    def solve(self, f, solver, params, x, z0):
        backward = solver if self.solver is None else self.solver
        z_star, sol = implicit_diff.implicit_fixed_point(
            f, solver, backward, self.on_failure, params, x, z0
        )
        return z_star, _stop_statistics(sol, z_star)


@dataclasses.dataclass(frozen=True)
class PhantomAdjoint(Adjoint):
    """Phantom gradient (Geng et al. 2021): differentiate damped steps started at ``z*``.

    The gradient is that of ``steps`` iterations ``z ← (1 − tau) z + tau f(θ, x, z)`` from
    ``stop_gradient(z*)``; the returned value is ``z*`` itself. As ``steps`` grows (with
    ``tau`` in (0, 1]) the gradient approaches the implicit one for a contractive ``f``.

    Args:
      steps: number of differentiated damped steps (``>= 1``).
      tau: damping in ``(0, 1]``.
    """

    steps: int = 5
    tau: float = 0.5

    def __post_init__(self):
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f"steps must be an int >= 1, got {self.steps!r}.")
        if not 0.0 < self.tau <= 1.0:
            raise ValueError(f"tau must be in (0, 1], got {self.tau}.")

    def solve(self, f, solver, params, x, z0):
        sol = solver(lambda z: f(params, x, z), jax.lax.stop_gradient(z0))
        z_star = jax.lax.stop_gradient(sol.value)

        def damped_step(z, _):
            return tree.tree_axpy(self.tau, tree.tree_sub(f(params, x, z), z), z), None

        z_phantom, _ = jax.lax.scan(damped_step, z_star, None, length=self.steps)
        z_out = _straight_through(z_star, z_phantom)
        return z_out, _stop_statistics(sol, z_out)


@dataclasses.dataclass(frozen=True)
class OneStepAdjoint(Adjoint):
    """Jacobian-free backprop (Fung et al. 2022): the gradient of ``f(θ, x, stop_gradient(z*))``.

    Equivalent to the implicit gradient with ``J_f(z*)`` replaced by 0 (``u = ∂ℓ/∂z*``); the
    returned value is ``z*``.
    """

    def solve(self, f, solver, params, x, z0):
        sol = solver(lambda z: f(params, x, z), jax.lax.stop_gradient(z0))
        z_star = jax.lax.stop_gradient(sol.value)
        z_out = _straight_through(z_star, f(params, x, z_star))
        return z_out, _stop_statistics(sol, z_out)


@dataclasses.dataclass(frozen=True)
class UnrolledAdjoint(Adjoint):
    """Backprop through every step of the forward solver (the reference; O(steps) memory).

    Runs the solver on the scan-based loop (``loop="scan"``), so the library's solvers, including
    ``functools.partial`` objects of them, work; a solver without a ``loop`` keyword is refused.
    Gradients also flow to ``z0``.
    """

    def solve(self, f, solver, params, x, z0):
        if not base.accepts_loop_kind(solver):
            raise ValueError(
                "UnrolledAdjoint needs a solver that accepts loop='scan' (the deqjax solvers and "
                f"functools.partial objects of them do); got {solver!r}."
            )
        sol = solver(lambda z: f(params, x, z), z0, loop="scan")
        return sol.value, _stop_statistics(sol, sol.value)
