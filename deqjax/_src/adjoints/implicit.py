"""The implicit gradient of a fixed point: :class:`ImplicitAdjoint` and its ``jax.custom_vjp``.

At ``z* = f(θ, x, z*)`` the implicit function theorem (DEQ paper, Theorem 1) gives
``∂ℓ/∂θ = uᵀ ∂f/∂θ(z*)`` with ``(I − J_f(z*))ᵀ u = ∂ℓ/∂z*``. :func:`implicit_fixed_point` is the
layer whose backward solves for ``u`` (:mod:`~deqjax._src.adjoints.backward_solve`) and takes one
VJP in ``(θ, x)``; nothing but ``(θ, x, z*)`` is kept from the forward pass, so memory does not
depend on the number of forward steps. ``ImplicitAdjoint(forward_mode=True)`` solves through the
``jax.custom_jvp`` of :mod:`~deqjax._src.adjoints.forward_mode` instead, with the same backward.

deqjax has three ``jax.custom_vjp`` sites, one per backward pass that autodiff of the forward
cannot give: this one (the backward solve), SHINE's (``shine.py``: the forward Broyden inverse
estimate in place of the solve) and the reversible adjoint's (``reversible.py``: the solver's
steps reversed).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from deqjax._src.adjoints import backward_solve as backward_lib
from deqjax._src.adjoints import backward_stats as stats_lib
from deqjax._src.adjoints import base as adjoint_base
from deqjax._src.adjoints import forward_mode as forward_mode_lib
from deqjax._src.adjoints import primal, reverse_only
from deqjax._src.normalise import as_solver
from deqjax._src.solvers.base import Solver
from deqjax._src.solvers.solution import Solution

PyTree = Any
CellFn = Callable[[PyTree, PyTree, PyTree], PyTree]
_NAME = "dq.ImplicitAdjoint()"


def _backward(
    f: CellFn, config: backward_lib.BackwardConfig, residuals: primal.Residuals, g: PyTree
) -> tuple[PyTree, PyTree, stats_lib.BackwardStats | None]:
    """The implicit backward: ``u`` from the backward solve, then ONE VJP in ``(params, x)``
    for the whole batch (no per-example parameter cotangents); the statistics to the probe."""
    vjp = backward_lib.linearise(f, residuals.params, residuals.x, residuals.z_star)
    result = backward_lib.solve_adjoint(vjp, g, config, residuals.rel_residual)
    g_params, g_x, _ = vjp(result.u)
    return g_params, g_x, stats_lib.probe_cotangent(result.stats, residuals.probe)


_layer = primal.reverse_mode_layer(_backward, _NAME)


def implicit_fixed_point(
    f: CellFn,
    solver: Solver,
    backward: backward_lib.BackwardConfig,
    params: PyTree,
    x: PyTree,
    z0: PyTree,
    probe: stats_lib.BackwardStats | None,
) -> tuple[PyTree, Solution]:
    """Forward solve of ``z = f(params, x, z)`` with implicit gradients in ``params`` and ``x``.

    ``probe`` (a :class:`~deqjax.BackwardStats` or ``None``) receives the backward solve's
    statistics as its cotangent. With a batch-native forward solve (``solver.batch_ndim = n >
    0``, carried to ``backward.batch_ndim``) the backward solves every problem's adjoint in one
    batched loop and takes the parameter VJP once for the whole batch. Use through
    :class:`deqjax.ImplicitAdjoint` and :func:`deqjax.fixed_point`.
    """
    return _layer(f, solver, backward, params, x, z0, probe)


@dataclasses.dataclass(frozen=True)
class ImplicitAdjoint(adjoint_base.Adjoint):
    """Implicit-function-theorem gradient: solve ``uᵀ = uᵀ J_f(z*) + ∂ℓ/∂z*`` with VJPs only.

    Implements the DEQ paper's Theorem 1 with the backward solve of Eq. 11, ``(I − Jᵀ)u = g``
    written as the fixed point ``u = g + Jᵀu``. The backward runs, in order (the rule of every
    implicit backward and forward-mode tangent solve in deqjax, stated here only):

    1. ``solver`` from ``u0 = g`` (default: the forward solver, same kind and settings);
    2. if that FAILED — diverged, went non-finite, or hit its step cap with its best residual
       still above ``fallback_factor × tol`` (its own ``tol`` and stop mode) AND a relative
       residual above the forward's (per example): ``fallback``, warm-started from the first
       solve's best iterate, and its result is used. A backward that ends just short of ``tol``,
       or no further from its solution than the forward from ``z*`` (e.g. both at their step
       caps early in training), is kept and reported as not converged instead of paying for a
       second solve every training step. The fallback runs under ``lax.cond`` (no cost when no
       solve needs it; under ``jax.vmap`` the cond becomes a select, so the fallback's setup,
       two VJPs, runs for every example and its iterations only while some example needs
       them). The default ``"gmres"`` is
       :class:`deqjax.solvers.GMRES` with the first solver's ``tol`` and ``stop_mode`` and
       ``max(2 max_steps, 24)`` VJPs: a Krylov method converges whenever ``I − Jᵀ`` is
       nonsingular, including where fixed-point iteration cannot (an eigenvalue of ``J`` near
       ``−1``, e.g. ``z = cos z + π/2``);
    3. if the result still did not converge: ``on_failure``.

    A non-converged ``u`` is therefore never used silently: every backward solve's steps,
    residual, fallback and failure are counted in the :class:`~deqjax.BackwardStats` gradient
    channel (``dq.fixed_point(..., backward_stats=probe)``), and ``on_failure`` decides what the
    gradient is.

    The solvers are normalised at construction (a function, a ``functools.partial`` or an object
    become the same solver object), so two adjoints configured alike compare and hash equal and
    can be static arguments of ``jax.jit``. With a batch-native forward solve
    (``batch_ndim = n``) the backward solver and the fallback solve the same ``n`` batch axes; a
    backward solver that is not batch-native solves the batch as one problem.

    Args:
      solver: backward solver for ``u = g + J_f(z*)ᵀ u``, any ``(h, u0) -> Solution``: a
        fixed-point solver (e.g. ``dq.solvers.Broyden(max_steps=20)``) or a Krylov one
        (``dq.solvers.GMRES()``, ``BiCGStab()``, ``NormalCG()``), as an object, a function or a
        ``functools.partial``. ``None``: the forward solver.
      fallback: solver used where the first backward solve did not converge: ``"gmres"``
        (default, see above), any solver ``(h, u0) -> Solution``, or ``None`` (no second attempt).
      fallback_factor: a first solve that hit its step cap runs the fallback only where its
        best residual is above ``fallback_factor × tol`` (``>= 1``; 1: wherever it did not
        converge). Where the solver declares no ``tol``, every non-converged solve falls back.
      on_failure: what a backward solve that did not converge (after the fallback) gives (the
        gradient is never silently zeroed): ``"best"`` (default) its lowest-residual iterate
        ``u`` (never worse than the Jacobian-free ``u = g``, where every solve starts);
        ``"nan"`` NaN gradients, making the failure visible (pair with
        ``optax.apply_if_finite`` to skip such steps); ``"one_step"`` the Jacobian-free gradient
        ``u = g``. Divergence of a fixed-point backward solve is detected reliably only with
        ``stop_mode="abs"``: a geometrically growing ``u`` keeps a constant relative residual.
      forward_mode: ``True``: the ``jax.custom_jvp`` path (forward and reverse mode, any order);
        ``False`` (default): the ``jax.custom_vjp`` path (reverse mode, first order).

    Forward mode (``jax.jvp``, ``jax.jacfwd``, ``jax.linearize``, ``jax.hessian``, and gradients
    of gradients) needs ``forward_mode=True``: the layer is then a ``jax.custom_jvp`` whose
    tangent solves ``(I − ∂f/∂z) ż = ∂f/∂θ θ̇ + ∂f/∂x ẋ`` at ``z*`` with ``solver``, ``fallback``
    and ``on_failure`` as above, through ``jax.lax.custom_linear_solve`` whose transposed solve
    is this backward (``jax.grad`` still works, with the same statistics). The default
    (``False``) is the ``jax.custom_vjp`` of the backward alone: reverse mode only, and its
    gradient is not itself differentiable (a ``jvp`` through it, or any derivative of its
    gradient, jitted or not, raises a ``ValueError`` naming ``forward_mode=True``).
    ``forward_mode=True`` costs a ``grad`` one more linearisation of ``f`` at ``z*`` and the
    tracing of the tangent solve (see ``docs/design.md``, "Forward mode").

    Example:
      >>> adjoint = dq.ImplicitAdjoint(solver=dq.solvers.GMRES(tol=1e-6))
      >>> probe = dq.BackwardStats.zeros()
      >>> def loss(p, probe):
      ...     z, _ = dq.fixed_point(f, p, x, z0, adjoint=adjoint, backward_stats=probe)
      ...     return jnp.sum(z ** 2)
      >>> grads, stats = jax.grad(loss, argnums=(0, 1))(params, probe)
      >>> stats.metrics()  # {"bwd_steps": ..., "bwd_rel_residual": ..., ...}
    """

    solver: Solver | None = None
    fallback: Solver | str | None = "gmres"
    on_failure: str = backward_lib.ON_FAILURE[0]
    fallback_factor: float = backward_lib.FALLBACK_FACTOR
    forward_mode: bool = False

    def __post_init__(self):
        if self.solver is not None:
            if not callable(self.solver):
                raise ValueError(f"solver must be callable or None, got {self.solver!r}.")
            object.__setattr__(self, "solver", as_solver(self.solver, name="solver"))
        object.__setattr__(self, "fallback", backward_lib.normalise_fallback(self.fallback))
        if not self.fallback_factor >= 1.0:
            raise ValueError(f"fallback_factor must be >= 1, got {self.fallback_factor!r}.")
        if self.on_failure not in backward_lib.ON_FAILURE:
            raise ValueError(
                f"on_failure must be one of {backward_lib.ON_FAILURE}, got {self.on_failure!r}."
            )
        if not isinstance(self.forward_mode, bool):
            raise ValueError(f"forward_mode must be a bool, got {self.forward_mode!r}.")

    def check_inputs(self, params: PyTree, x: PyTree) -> None:
        """``ValueError`` naming ``forward_mode=True`` where the default path meets a ``jax.jvp``
        tangent (:func:`~deqjax._src.adjoints.reverse_only.refuse_forward_mode`)."""
        if not self.forward_mode:
            reverse_only.refuse_forward_mode(_NAME, params, x)

    def backward_config(self, forward_solver: Solver) -> backward_lib.BackwardConfig:
        """The resolved backward for a (normalised) forward solver: its ``batch_ndim``, and this
        adjoint's solver (or the forward's, without its forward-only outputs:
        :meth:`~deqjax._src.solvers.base.Solver.for_backward`), fallback and failure
        policy."""
        return backward_lib.resolve_backward(
            forward_solver.for_backward() if self.solver is None else self.solver,
            self.fallback,
            on_failure=self.on_failure,
            fallback_factor=self.fallback_factor,
            batch_ndim=forward_solver.batch_ndim or 0,
        )

    def solve(self, f, solver, params, x, z0, *, backward_stats=None):
        self.check_inputs(params, x)
        layer = (
            forward_mode_lib.forward_mode_fixed_point if self.forward_mode else implicit_fixed_point
        )
        z_star, sol = layer(f, solver, self.backward_config(solver), params, x, z0, backward_stats)
        return z_star, adjoint_base.stop_statistics(sol, z_star)
