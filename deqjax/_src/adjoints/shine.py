"""SHINE: the backward pass reuses the forward Broyden inverse-Jacobian estimate.

Ramzi, Mannel, Bai, Starck, Ciuciu, Moreau, "SHINE: SHaring the INverse Estimate from the forward
pass for bi-level optimization and implicit models", ICLR 2022.

The implicit gradient (DEQ paper, Theorem 1) needs ``u`` with ``uᵀ = gᵀ (I − J_f(z*))⁻¹``,
``g = ∂ℓ/∂z*``. Broyden's method (:func:`deqjax.solvers.broyden`) solves ``g(z) = f(z) − z = 0``
and keeps a quasi-Newton estimate ``B ≈ J_g⁻¹ = (J_f − I)⁻¹``. Since ``(I − J_f)⁻¹ = −J_g⁻¹``,

    uᵀ = −gᵀ J_g⁻¹ ≈ −gᵀ B,   i.e.   u ≈ −Bᵀ g,

one low-rank transpose product (the SHINE paper's method: the forward quasi-Newton matrix in
place of the inverse Jacobian in the implicit gradient) instead of an iterative backward solve.
``k`` refinement steps of the adjoint fixed-point iteration ``u ← g + J_f(z*)ᵀ u`` (DEQ paper,
Eq. 11) warm-started at it trade one VJP in ``z`` each for accuracy (the paper's "refine"
variant). The estimate is checked (the paper's "fallback" variant): the adjoint residual
``‖g + Jᵀu − u‖ / ‖g + Jᵀu‖`` comes from the same VJP that gives the parameter gradient, and
where it exceeds ``fallback_tol`` (or is not finite) the ordinary implicit backward
(:func:`deqjax._src.adjoints.backward_solve.solve_adjoint`) replaces it.

Not implemented: the paper's "outer-problem awareness" (OPA), which adds Broyden updates in the
direction of the outer gradient ``∂ℓ/∂z`` DURING the forward solve. A DEQ's forward pass does not
know its loss (labels, head and loss come after ``fixed_point`` returns), so that direction is not
available where the updates are made.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp

from deqjax._src import checks, tree, vma
from deqjax._src.adjoints import backward_solve as backward_lib
from deqjax._src.adjoints import backward_stats as stats_lib
from deqjax._src.adjoints import base as adjoint_base
from deqjax._src.adjoints import implicit, primal
from deqjax._src.solvers import broyden as broyden_lib
from deqjax._src.solvers import broyden_inverse, solution

PyTree = Any
CellFn = Callable[[PyTree, PyTree, PyTree], PyTree]


@dataclasses.dataclass(frozen=True)
class _ShineConfig:
    """SHINE's static backward configuration (hashable)."""

    refine_steps: int
    fallback_tol: float
    fallback: backward_lib.BackwardConfig | None  # the implicit backward where estimates are poor
    batch_ndim: int  # the forward solve's problem axes


def _estimate(
    vjp: Callable, g: PyTree, inverse: broyden_inverse.BroydenInverse, refine_steps: int
) -> PyTree:
    """SHINE's adjoint: ``u = −Bᵀ g`` with ``B ≈ J_g⁻¹``, ``g(z) = f(z) − z``, then
    ``refine_steps`` steps of ``u ← g + J_f(z*)ᵀ u`` (DEQ paper, Eq. 11)."""
    u = tree.tree_scale(-1.0, broyden_inverse.inverse_rmatvec(inverse, g))
    if refine_steps:
        h = backward_lib.adjoint_map(vjp, g)
        u = vma.fori_loop(0, refine_steps, lambda _, u: h(u), u)
    return u


def _relative_residual(
    g: PyTree, u: PyTree, jt_u: PyTree, batch_ndim: int, dtype: jnp.dtype
) -> jax.Array:
    """``‖g + Jᵀu − u‖ / ‖g + Jᵀu‖`` per problem, in ``dtype``."""
    h_u = tree.tree_add(g, jt_u)
    diff = tree.tree_sub(h_u, u)
    squares = [tree.tree_sq_norm(diff, batch_ndim), tree.tree_sq_norm(h_u, batch_ndim)]
    norms = jnp.sqrt(jnp.stack(squares).astype(dtype))
    return norms[0] / (norms[1] + jnp.asarray(1e-30, dtype))


def _fallback(g, u, vjp_all, fwd_rel_residual, checked, config):
    """The implicit backward where SHINE's estimate is poor, and the gradient and statistics
    with its adjoint there. ``checked``: SHINE's per-problem ``(rel_res, poor, ones)``."""
    rel_res, poor, ones = checked
    result = backward_lib.solve_adjoint(vjp_all, g, config.fallback, fwd_rel_residual)
    g_params, g_x, _ = vjp_all(tree.tree_where(poor, result.u, u, config.batch_ndim))
    sol = result.solution
    steps = ones * float(config.refine_steps) + jnp.where(poor, sol.num_steps, 0).astype(
        jnp.float32
    )
    stats = stats_lib.summed(
        ones,
        steps,
        jnp.where(poor, sol.rel_residual, rel_res),
        poor & (sol.status != solution.CONVERGED),
        poor,
    )
    return g_params, g_x, stats


def _backward(
    f: CellFn, config: _ShineConfig, residuals: primal.Residuals, g: PyTree
) -> tuple[PyTree, PyTree, stats_lib.BackwardStats | None]:
    """SHINE's backward: the estimate, refined and checked; the fallback where it is poor."""
    params, x, z_star = residuals.params, residuals.x, residuals.z_star
    # One VJP in (params, x, z): the refinement steps, the gradient AND J^T u for the check.
    vjp_all = backward_lib.linearise(f, params, x, z_star)
    u = _estimate(vjp_all, g, residuals.inverse, config.refine_steps)
    g_params, g_x, jt_u = vjp_all(u)
    if vjp_all.full is not None:  # the cell runs at reduced precision: check at full precision
        jt_u = vjp_all.full(u)[2]
    rel_res = _relative_residual(g, u, jt_u, config.batch_ndim, tree.reduction_dtype(z_star))
    poor = ~(rel_res <= config.fallback_tol)  # also NaN / inf
    # Ones computed from values (not ones_like, which is unbatched under vmap): an unbatched
    # probe's cotangent must be summed over the examples of a vmap.
    ones = (jnp.isnan(rel_res) | ~jnp.isnan(rel_res)).astype(jnp.float32)
    stats = stats_lib.summed(
        ones, ones * float(config.refine_steps), rel_res, poor, jnp.zeros((), jnp.float32)
    )
    if config.fallback is not None:
        checked = (rel_res, poor, ones)
        run = functools.partial(_fallback, g, u, vjp_all, residuals.rel_residual, checked, config)
        g_params, g_x, stats = vma.cond(
            jnp.any(poor), lambda _: run(), lambda _: (g_params, g_x, stats), None
        )
    return g_params, g_x, stats_lib.probe_cotangent(stats, residuals.probe)


# The forward Broyden solve (return_inverse=True), its inverse estimate kept for the backward.
_shine_fixed_point = primal.reverse_mode_layer(
    _backward, "dq.ShineAdjoint()", inverse_to_backward=True
)


@dataclasses.dataclass(frozen=True)
class ShineAdjoint(adjoint_base.Adjoint):
    """SHINE (Ramzi et al., ICLR 2022): the backward reuses Broyden's forward inverse estimate.

    With the forward Broyden estimate ``B ≈ J_g⁻¹`` of ``g(z) = f(z) − z`` (so
    ``(I − J_f)⁻¹ ≈ −B``), the adjoint of the implicit gradient is approximated by
    ``u = −Bᵀ ∂ℓ/∂z*`` (the SHINE paper's method; its "refine" and "fallback" variants), refined by
    ``refine_steps`` steps of ``u ← ∂ℓ/∂z* + J_f(z*)ᵀ u`` (DEQ paper, Eq. 11), then checked. The
    backward costs ``refine_steps`` VJPs in ``z`` plus ONE VJP in ``(params, x, z)`` (for a
    batch-native solve: one for the whole batch) that gives both the gradient and the adjoint
    residual ``‖g + Jᵀu − u‖ / ‖g + Jᵀu‖`` (relative, per problem). Where that residual exceeds
    ``fallback_tol`` or is not finite, the ``fallback`` implicit backward (its solver, GMRES
    rescue and ``on_failure``) solves the adjoint from scratch (under ``lax.cond``: no cost when
    no problem needs it; under ``jax.vmap`` it becomes a select and runs for every example, as
    :class:`~deqjax.ImplicitAdjoint`'s fallback does), then a second parameter VJP is taken.

    The forward solver must be Broyden's (:class:`deqjax.solvers.Broyden`, the function
    :func:`deqjax.solvers.broyden` or a ``functools.partial`` of it): it runs with
    ``return_inverse=True``. The estimate's ``2 × rows`` iterate-sized buffers (``rows`` =
    Broyden's ``memory``, or ``max_steps``) are kept for the backward pass: unlike the implicit
    adjoint, memory grows with the forward steps (up to ``memory``).

    Statistics (the :class:`~deqjax.BackwardStats` probe): ``num_steps`` counts refinement VJPs
    plus fallback steps; ``rel_residual`` is the checked residual (the fallback's where it ran);
    ``fallbacks`` the problems whose estimate was poor; ``failures`` those whose final adjoint is
    above ``fallback_tol`` (no fallback) or whose fallback did not converge.

    Not implemented: the paper's outer-problem-aware (OPA) extra updates, which need the loss
    gradient during the forward solve (a DEQ's forward does not know its loss).

    Args:
      refine_steps: fixed-point refinement steps of the adjoint, warm-started from the SHINE
        estimate (``>= 0``; 0: the plain SHINE estimate).
      fallback_tol: largest accepted relative adjoint residual (``> 0``; ``inf`` accepts
        anything finite).
      fallback: the implicit backward run where the estimate is poor, an
        :class:`~deqjax.ImplicitAdjoint` (default: its defaults, i.e. the forward Broyden's
        settings on the adjoint map with a GMRES rescue), or ``None`` (keep the estimate; it is
        counted in ``failures``).

    Example:
      >>> solver = dq.solvers.Broyden(max_steps=30, tol=1e-4)
      >>> z, sol = dq.fixed_point(f, params, x, z0, solver=solver,
      ...                         adjoint=dq.ShineAdjoint(refine_steps=2))
    """

    refine_steps: int = 0
    fallback_tol: float = 0.1
    fallback: implicit.ImplicitAdjoint | None = implicit.ImplicitAdjoint()

    def __post_init__(self):
        checks.check_int(self.refine_steps, "refine_steps", minimum=0)
        if not checks.check_real(self.fallback_tol, "fallback_tol") > 0:
            raise ValueError(f"fallback_tol must be > 0, got {self.fallback_tol!r}.")
        if self.fallback is not None and not isinstance(self.fallback, implicit.ImplicitAdjoint):
            raise ValueError(
                f"fallback must be a dq.ImplicitAdjoint or None, got {self.fallback!r}."
            )

    def solve(self, f, solver, params, x, z0, *, backward_stats=None):
        adjoint_base.require_solver(
            solver,
            broyden_lib.Broyden,
            "ShineAdjoint",
            "it reuses Broyden's inverse-Jacobian estimate (return_inverse=True)",
            "ImplicitAdjoint (the exact backward solve), PhantomAdjoint or OneStepAdjoint",
        )
        config = _ShineConfig(
            refine_steps=self.refine_steps,
            fallback_tol=float(self.fallback_tol),
            fallback=None if self.fallback is None else self.fallback.backward_config(solver),
            batch_ndim=solver.batch_ndim,
        )
        forward = solver.replace(return_inverse=True)
        z_star, sol = _shine_fixed_point(f, forward, config, params, x, z0, backward_stats)
        return z_star, adjoint_base.stop_statistics(sol, z_star)
