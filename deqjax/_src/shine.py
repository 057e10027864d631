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
(:func:`deqjax._src.implicit_diff.solve_adjoint`) replaces it.

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

from deqjax._src import adjoints, checks, implicit_diff, tree
from deqjax._src.normalise import as_solver
from deqjax._src.solvers import base
from deqjax._src.solvers import broyden as broyden_lib
from deqjax._src.solvers.solution import CONVERGED, Solution

PyTree = Any
CellFn = Callable[[PyTree, PyTree, PyTree], PyTree]


def _accepts_return_inverse(solver: Callable[..., Any]) -> bool:
    """Whether ``solver`` takes ``return_inverse=`` (a solver object by its fields, else by its
    signature: ``dq.solvers.broyden`` and ``functools.partial`` objects of it)."""
    return "return_inverse" in as_solver(solver).to_dict(with_name=False)


def _solve_with_inverse(solver: base.Solver, fz: Callable, z0: PyTree) -> Solution:
    sol = as_solver(solver).replace(return_inverse=True)(fz, z0)
    if not isinstance(getattr(sol, "inverse_estimate", None), broyden_lib.BroydenInverse):
        raise ValueError(
            "ShineAdjoint: the forward solver returned no Broyden inverse estimate "
            f"(Solution.inverse_estimate is {type(getattr(sol, 'inverse_estimate', None))}); "
            "use dq.solvers.broyden (or a functools.partial of it)."
        )
    return sol


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _shine_fixed_point(
    f: CellFn,
    solver: base.Solver,
    config: tuple,
    params: PyTree,
    x: PyTree,
    z0: PyTree,
    probe: implicit_diff.BackwardStats | None,
) -> tuple[PyTree, Solution]:
    del config, probe
    sol = _solve_with_inverse(solver, lambda z: f(params, x, z), z0)
    return sol.value, sol._replace(inverse_estimate=None)


def _fwd(f, solver, config, params, x, z0, probe):
    sol = _solve_with_inverse(solver, lambda z: f(params, x, z), z0)
    out = (sol.value, sol._replace(inverse_estimate=None))
    residuals = (params, x, sol.value, z0, sol.inverse_estimate, sol.rel_residual, probe)
    return out, residuals


def _bwd(f, solver, config, residuals, cotangents):
    del solver
    refine_steps, fallback_tol, fallback = config
    params, x, z_star, z0, inverse, fwd_rel_residual, probe = residuals
    g_z, g_sol = cotangents
    g = jax.tree_util.tree_map(jnp.add, g_z, g_sol.value)
    bn = inverse.valid.ndim - 1
    rdtype = tree.reduction_dtype(z_star)

    # SHINE: u = -B^T g with B ≈ J_g^{-1}, g(z) = f(z) - z.
    u = tree.tree_scale(-1.0, broyden_lib.inverse_rmatvec(inverse, g))
    if refine_steps:
        _, vjp_z = jax.vjp(lambda z: f(params, x, z), z_star)

        def refine(_, u):
            return tree.tree_add(g, vjp_z(u)[0])

        u = jax.lax.fori_loop(0, refine_steps, refine, u)

    # One VJP in (params, x, z): the gradient AND J^T u for the residual check.
    _, vjp_all = jax.vjp(lambda p, xx, z: f(p, xx, z), params, x, z_star)
    g_params, g_x, jt_u = vjp_all(u)
    h_u = tree.tree_add(g, jt_u)
    norms = jnp.sqrt(
        jnp.stack(
            [
                tree.tree_vdot(tree.tree_sub(h_u, u), tree.tree_sub(h_u, u), bn),
                tree.tree_vdot(h_u, h_u, bn),
            ]
        ).astype(rdtype)
    )
    rel_res = norms[0] / (norms[1] + jnp.asarray(1e-30, rdtype))
    poor = ~(rel_res <= fallback_tol)  # also NaN / inf
    f32 = jnp.float32
    # Ones computed from values (not ones_like, which is unbatched under vmap): an unbatched
    # probe's cotangent must be summed over the examples of a vmap.
    ones = (jnp.isnan(rel_res) | ~jnp.isnan(rel_res)).astype(f32)
    count = jnp.sum(ones)
    steps = ones * float(refine_steps)
    shine_stats = implicit_diff.BackwardStats(
        count=count,
        num_steps=jnp.sum(steps),
        rel_residual=jnp.sum(rel_res.astype(f32)),
        failures=jnp.sum(poor.astype(f32)),
        fallbacks=jnp.zeros((), f32),
    )

    if fallback is not None:

        def run_fallback(_):
            result = implicit_diff.solve_adjoint(
                f,
                params,
                x,
                z_star,
                g,
                solver=fallback.solver,
                fallback=fallback.fallback,
                on_failure=fallback.on_failure,
                batch_ndim=bn,
                fallback_above=fallback.fallback_above,
                forward_rel_residual=fwd_rel_residual,
            )
            u_new = tree.tree_where(poor, result.u, u, bn)
            gp, gx, _ = vjp_all(u_new)
            sol = result.solution
            stats = implicit_diff.BackwardStats(
                count=count,
                num_steps=jnp.sum(steps + jnp.where(poor, sol.num_steps, 0).astype(f32)),
                rel_residual=jnp.sum(jnp.where(poor, sol.rel_residual, rel_res).astype(f32)),
                failures=jnp.sum((poor & (sol.status != CONVERGED)).astype(f32)),
                fallbacks=jnp.sum(poor.astype(f32)),
            )
            return gp, gx, stats

        g_params, g_x, stats = jax.lax.cond(
            jnp.any(poor), run_fallback, lambda _: (g_params, g_x, shine_stats), None
        )
    else:
        stats = shine_stats

    g_probe = None
    if probe is not None:
        g_probe = jax.tree_util.tree_map(lambda s, p: s.astype(p.dtype), stats, probe)
    return g_params, g_x, tree.tree_zeros_like(z0), g_probe


_shine_fixed_point.defvjp(_fwd, _bwd)


@dataclasses.dataclass(frozen=True)
class ShineAdjoint(adjoints.Adjoint):
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

    The forward solver must be :func:`deqjax.solvers.broyden` (or a ``functools.partial`` of it):
    it is called with ``return_inverse=True``. The estimate's ``2 × rows`` iterate-sized buffers
    (``rows`` = Broyden's ``memory``, or ``max_steps``) are kept for the backward pass: unlike
    the implicit adjoint, memory grows with the forward steps (up to ``memory``).

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
      >>> solver = functools.partial(dq.solvers.broyden, max_steps=30, tol=1e-4)
      >>> z, sol = dq.fixed_point(f, params, x, z0, solver=solver,
      ...                         adjoint=dq.ShineAdjoint(refine_steps=2))
    """

    refine_steps: int = 0
    fallback_tol: float = 0.1
    fallback: adjoints.ImplicitAdjoint | None = adjoints.ImplicitAdjoint()

    def __post_init__(self):
        checks.check_int(self.refine_steps, "refine_steps", minimum=0)
        if not checks.check_real(self.fallback_tol, "fallback_tol") > 0:
            raise ValueError(f"fallback_tol must be > 0, got {self.fallback_tol!r}.")
        if self.fallback is not None and not isinstance(self.fallback, adjoints.ImplicitAdjoint):
            raise ValueError(
                f"fallback must be a dq.ImplicitAdjoint or None, got {self.fallback!r}."
            )

    def solve(self, f, solver, params, x, z0, *, backward_stats=None):
        if not _accepts_return_inverse(solver):
            raise ValueError(
                "ShineAdjoint reuses Broyden's inverse-Jacobian estimate, so the forward solver "
                "must be dq.solvers.broyden (or a functools.partial of it; it is called with "
                f"return_inverse=True); got {solver!r}."
            )
        fallback = None if self.fallback is None else self.fallback.backward_config(solver)
        config = (self.refine_steps, float(self.fallback_tol), fallback)
        z_star, sol = _shine_fixed_point(f, solver, config, params, x, z0, backward_stats)
        return z_star, adjoints._stop_statistics(sol, z_star)
