"""Gradient strategies for :func:`deqjax.fixed_point`: how ``∂ℓ/∂θ`` reaches through ``z*``.

Every strategy returns the forward solver's fixed point unchanged; only the gradient differs.

* :class:`ImplicitAdjoint` — the exact implicit-function-theorem gradient (DEQ paper, Thm. 1).
* :class:`PhantomAdjoint` — differentiate a few damped steps from ``z*`` (Geng et al. 2021).
* :class:`OneStepAdjoint` — Jacobian-free backprop: differentiate one ``f`` at ``z*`` (Fung et al.).
* :class:`UnrolledAdjoint` — backprop through every solver step (baseline, O(steps) memory; what
  is differentiated depends on the solver, see its docstring).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax

from deqjax._src import checks, implicit_diff, tree
from deqjax._src.normalise import as_solver
from deqjax._src.solvers import base, krylov
from deqjax._src.solvers.solution import Solution

PyTree = Any
CellFn = Callable[[PyTree, PyTree, PyTree], PyTree]


def _stop_statistics(sol: Solution, z_star: PyTree) -> Solution:
    """The Solution returned to users: value = z_star (differentiable), statistics detached."""
    stats = jax.lax.stop_gradient(sol._replace(value=()))
    return stats._replace(value=z_star)


def _solve_without_gradient(
    f: CellFn, solver: base.Solver, params: PyTree, x: PyTree, z0: PyTree
) -> Solution:
    """The forward solve on gradient-free inputs, for strategies whose gradient comes from
    elsewhere: no tangent enters the solver loop, so it runs once under ``grad`` (a loop carrying
    tangents is linearised and can be re-run in the backward pass; with an effect in ``f``, e.g.
    ``jax.debug.print``, ``grad`` then fails on the ``while_loop``)."""
    params, x, z0 = jax.tree_util.tree_map(_no_gradient, (params, x, z0))
    return solver(lambda z: f(params, x, z), z0)


def _no_gradient(leaf: Any) -> Any:
    """``stop_gradient`` of a float array leaf; anything else (ints, keys, Python values) as is."""
    if isinstance(leaf, jax.Array) and jax.numpy.issubdtype(leaf.dtype, jax.numpy.inexact):
        return jax.lax.stop_gradient(leaf)
    return leaf


def _straight_through(z_star: PyTree, z_grad: PyTree) -> PyTree:
    """Value of ``z_star``, gradient of ``z_grad``: ``z_star + z_grad - stop_gradient(z_grad)``."""
    return jax.tree_util.tree_map(lambda a, b: a + (b - jax.lax.stop_gradient(b)), z_star, z_grad)


class Adjoint:
    """Base class of gradient strategies. Subclasses implement :meth:`solve`."""

    def solve(
        self,
        f: CellFn,
        solver: base.Solver,
        params: PyTree,
        x: PyTree,
        z0: PyTree,
        *,
        backward_stats: implicit_diff.BackwardStats | None = None,
    ) -> tuple[PyTree, Solution]:
        """Runs the forward solve and attaches this strategy's gradient to its result.

        ``backward_stats``: the :class:`~deqjax.BackwardStats` probe; strategies without a
        backward solve leave its cotangent 0.
        """
        raise NotImplementedError


_FALLBACK_MIN_STEPS = 24  # one GMRES cycle of restart 20 plus its bookkeeping evaluations


def _solver_defaults(solver: base.Solver) -> dict[str, Any]:
    """The ``tol``/``stop_mode``/``atol``/``max_steps`` a solver (object, function or partial)
    runs with."""
    settings = as_solver(solver).to_dict()
    return {k: settings[k] for k in ("tol", "stop_mode", "atol", "max_steps") if k in settings}


def default_fallback(backward_solver: base.Solver) -> base.Solver:
    """GMRES with the backward solver's ``tol``/``stop_mode``/``atol``, ``max(2 max_steps, 24)``.

    What ``ImplicitAdjoint(fallback="gmres")`` runs: the same convergence test as the first
    backward solve (read from its signature or ``functools.partial`` keywords; GMRES's defaults
    where they cannot be read), with a budget of twice the first solve's (at least 24 VJPs): a
    rescue costs at most about twice the backward it replaces (a 100-VJP floor made an 8-step
    MDEQ backward 20x slower).
    """
    kw = _solver_defaults(backward_solver)
    kw["max_steps"] = max(2 * int(kw.get("max_steps", 50)), _FALLBACK_MIN_STEPS)
    return functools.partial(krylov.gmres, **kw)


@dataclasses.dataclass(frozen=True)
class ImplicitAdjoint(Adjoint):
    """Implicit-function-theorem gradient: solve ``uᵀ = uᵀ J_f(z*) + ∂ℓ/∂z*`` with VJPs only.

    Implements the DEQ paper's Theorem 1 with the backward solve of Eq. 11, ``(I − Jᵀ)u = g``
    written as the fixed point ``u = g + Jᵀu``. The backward runs, in order:

    1. ``solver`` from ``u0 = g`` (default: the forward solver, same kind and settings);
    2. if that FAILED — diverged, went non-finite, or hit its step cap with its best residual
       still above ``fallback_factor × tol`` (its own ``tol`` and stop mode) AND a relative
       residual above the forward's (per example): ``fallback``, warm-started from the first
       solve's best iterate, and its result is used. A backward that ends just short of ``tol``,
       or no further from its solution than the forward from ``z*`` (e.g. both at their step
       caps early in training), is kept and reported as not converged instead of paying for a
       second solve every training step. The fallback runs under ``lax.cond`` (no cost when no
       solve needs it; under ``jax.vmap`` the cond
       becomes a select, so the fallback's setup, two VJPs, runs for every example and its
       iterations only while some example needs them). The default ``"gmres"`` is
       :func:`deqjax.solvers.gmres` with the first solver's ``tol`` and ``stop_mode`` and
       ``max(2 max_steps, 24)`` VJPs: a Krylov method converges whenever ``I − Jᵀ`` is
       nonsingular, including where fixed-point iteration cannot (an eigenvalue of ``J`` near
       ``−1``, e.g. ``z = cos z + π/2``);
    3. if the result still did not converge: ``on_failure``.

    A non-converged ``u`` is therefore never used silently: every backward solve's steps,
    residual, fallback and failure are counted in the :class:`~deqjax.BackwardStats` gradient
    channel (``dq.fixed_point(..., backward_stats=probe)``), and ``on_failure`` decides what the
    gradient is.

    Args:
      solver: backward solver for ``u = g + J_f(z*)ᵀ u``, any ``(h, u0) -> Solution``: a
        fixed-point solver (e.g. ``functools.partial(dq.solvers.broyden, max_steps=20)``) or a
        Krylov one (``dq.solvers.gmres``, ``bicgstab``, ``normal_cg``). ``None``: the forward
        solver. With a batch-native forward solve, ``batch_ndim`` is passed on to it.
      fallback: solver used where the first backward solve did not converge: ``"gmres"``
        (default, see above), any solver ``(h, u0) -> Solution``, or ``None`` (no second attempt).
      fallback_factor: a first solve that hit its step cap runs the fallback only where its
        best residual is above ``fallback_factor × tol`` (``>= 1``; 1: wherever it did not
        converge). Where the solver's ``tol`` cannot be read, every non-converged solve falls back.
      on_failure: what a backward solve that did not converge (after the fallback) gives (the
        gradient is never silently zeroed): ``"best"`` (default) its lowest-residual iterate
        ``u`` (never worse than the Jacobian-free ``u = g``, where every solve starts);
        ``"nan"`` NaN gradients, making the failure visible (pair with
        ``optax.apply_if_finite`` to skip such steps); ``"one_step"`` the Jacobian-free gradient
        ``u = g``. Divergence of a fixed-point backward solve is detected reliably only with
        ``stop_mode="abs"``: a geometrically growing ``u`` keeps a constant relative residual.

    The backward solve is not itself differentiable (no gradients of gradients).

    Example:
      >>> adjoint = dq.ImplicitAdjoint(solver=functools.partial(dq.solvers.gmres, tol=1e-6))
      >>> probe = dq.BackwardStats.zeros()
      >>> def loss(p, probe):
      ...     z, _ = dq.fixed_point(f, p, x, z0, adjoint=adjoint, backward_stats=probe)
      ...     return jnp.sum(z ** 2)
      >>> grads, stats = jax.grad(loss, argnums=(0, 1))(params, probe)
      >>> stats.metrics()  # {"bwd_steps": ..., "bwd_rel_residual": ..., ...}
    """

    solver: base.Solver | None = None
    fallback: base.Solver | str | None = "gmres"
    on_failure: str = "best"
    fallback_factor: float = 10.0

    def __post_init__(self):
        if self.solver is not None and not callable(self.solver):
            raise ValueError(f"solver must be callable or None, got {self.solver!r}.")
        if not (self.fallback is None or self.fallback == "gmres" or callable(self.fallback)):
            raise ValueError(
                f'fallback must be "gmres", a solver callable or None, got {self.fallback!r}.'
            )
        if not self.fallback_factor >= 1.0:
            raise ValueError(f"fallback_factor must be >= 1, got {self.fallback_factor!r}.")
        if self.on_failure not in implicit_diff.ON_FAILURE:
            raise ValueError(
                f"on_failure must be one of {implicit_diff.ON_FAILURE}, got {self.on_failure!r}."
            )

    def backward_config(self, forward_solver: base.Solver) -> implicit_diff.BackwardConfig:
        """The resolved backward (solver, fallback, on_failure) for a given forward solver."""
        backward = forward_solver if self.solver is None else self.solver
        fallback = self.fallback
        if isinstance(fallback, str):
            fallback = default_fallback(backward)
        tol = _solver_defaults(backward).get("tol")
        above = float(self.fallback_factor * tol) if tol else 0.0
        return implicit_diff.BackwardConfig(backward, fallback, self.on_failure, above)

    def solve(self, f, solver, params, x, z0, *, backward_stats=None):
        z_star, sol = implicit_diff.implicit_fixed_point(
            f, solver, self.backward_config(solver), params, x, z0, backward_stats
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
        checks.check_positive_int(self.steps, "steps")
        if not 0.0 < self.tau <= 1.0:
            raise ValueError(f"tau must be in (0, 1], got {self.tau}.")

    def solve(self, f, solver, params, x, z0, *, backward_stats=None):
        del backward_stats  # no backward solve
        sol = _solve_without_gradient(f, solver, params, x, z0)
        z_star = sol.value

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

    def solve(self, f, solver, params, x, z0, *, backward_stats=None):
        del backward_stats  # no backward solve
        sol = _solve_without_gradient(f, solver, params, x, z0)
        z_star = sol.value
        z_out = _straight_through(z_star, f(params, x, z_star))
        return z_out, _stop_statistics(sol, z_out)


@dataclasses.dataclass(frozen=True)
class UnrolledAdjoint(Adjoint):
    """Backprop through every step of the forward solver (a baseline; O(steps) memory).

    Runs the solver on the scan-based loop (``loop="scan"``), so the library's solvers, including
    ``functools.partial`` objects of them, work; a solver without a ``loop`` keyword is refused.
    Gradients also flow to ``z0``. What is differentiated, per solver:

    * :func:`~deqjax.solvers.fixed_point_iteration`: every damped step
      ``z ← (1 − damping) z + damping f(z)`` exactly — the derivative of the returned iterate,
      which tends to the implicit gradient as the (contractive) iteration converges.
    * :func:`~deqjax.solvers.anderson`: every evaluation of ``f`` and every mixing step, with the
      mixing coefficients ``α`` held constant (``stop_gradient``), as the literature's "unrolled"
      baselines do. Differentiating through the relative ridge and the tiny least-squares solve
      for ``α`` amplifies rounding by up to ``1/lam`` and gave unusable gradients; with ``α``
      frozen the result is close to, but not exactly, the implicit gradient (about ``1e-5``
      relative on a converged problem).
    * :func:`~deqjax.solvers.broyden`: every evaluation of ``f`` and the low-rank inverse-Jacobian
      updates and line-search decisions as computed (nothing is frozen); the update's divisions
      by ``vᵀdg`` can amplify rounding where that product is tiny.

    Only the lowest-residual iterate carries the gradient (the selection itself is not
    differentiated). Use :class:`ImplicitAdjoint` for the exact gradient at ``z*``; this strategy
    is for comparisons with truncated backpropagation.
    """

    def solve(self, f, solver, params, x, z0, *, backward_stats=None):
        del backward_stats  # no backward solve
        if "scan" not in as_solver(solver).loop_kinds:
            raise ValueError(
                "UnrolledAdjoint needs a solver that accepts loop='scan' (the deqjax solvers and "
                f"functools.partial objects of them do); got {solver!r}."
            )
        sol = as_solver(solver).replace(loop="scan")(lambda z: f(params, x, z), z0)
        return sol.value, _stop_statistics(sol, sol.value)
