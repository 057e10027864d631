"""Implicit differentiation of a fixed point: the project's one ``jax.custom_vjp`` site.

At a fixed point ``z* = f(θ, x, z*)`` the implicit function theorem (DEQ paper, Theorem 1; JR paper,
Eq. 1–2) gives, for a loss ``ℓ(z*)``,

    ∂ℓ/∂θ = uᵀ ∂f/∂θ(z*),   ∂ℓ/∂x = uᵀ ∂f/∂x(z*),   where   uᵀ = uᵀ J_f(z*) + ∂ℓ/∂z*,

i.e. ``u`` solves ``(I − J_f(z*))ᵀ u = g``. That linear system is itself a fixed-point problem
``u = g + J_f(z*)ᵀ u`` (DEQ paper, Eq. 11), solved here with any deqjax solver using only
vector–Jacobian products: the Jacobian is never formed, and nothing but ``(θ, x, z*)`` is kept
from the forward pass, so memory does not depend on the number of forward steps.

The backward solve is reported and robust (:func:`solve_adjoint`, shared with
:func:`deqjax.jacobian.backward_convergence`): a first solve with the configured solver; where it
did not converge, a fallback solve (GMRES by default) warm-started from its best iterate; where that
fails too, an explicit ``on_failure`` policy. Its statistics leave the VJP through a *gradient
channel*: the cotangent of a :class:`BackwardStats` probe passed to :func:`deqjax.fixed_point`.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from deqjax._src import tree
from deqjax._src.normalise import as_solver
from deqjax._src.solvers import base
from deqjax._src.solvers.solution import CONVERGED, DIVERGED, MAX_STEPS, NONFINITE, Solution

PyTree = Any
CellFn = Callable[[PyTree, PyTree, PyTree], PyTree]

ON_FAILURE = ("best", "nan", "one_step")


class BackwardStats(NamedTuple):
    """Statistics of implicit backward solves, summed: the gradient channel of ``fixed_point``.

    Pass ``probe = dq.BackwardStats.zeros()`` as ``dq.fixed_point(..., backward_stats=probe)``
    (or ``dq.nn.DEQ(..., backward_stats=True)``) and differentiate the loss with respect to the
    probe too: the implicit VJP returns this backward solve's statistics as the probe's
    "gradient". ``jax.grad(loss, argnums=(0, k))`` then gives ``(param_grads, stats)`` under
    ``jit``, ``vmap`` and ``pmap`` with no host synchronisation. The probe does not change the
    forward value or any other gradient.

    Every field is a float sum, so statistics add up the way cotangents do: over several
    ``fixed_point`` calls that share a probe (layers, time steps of a scan), over the examples of
    a ``vmap`` with an unbatched probe, and over the problems of a batch-native solve
    (``batch_ndim > 0``: one count per problem). Divide by ``count`` for means
    (:meth:`metrics`). :class:`~deqjax.ShineAdjoint` reports its refinement steps, checked
    adjoint residual and fallbacks, :class:`~deqjax.ReversibleAdjoint` its reversal (see their
    docstrings); the phantom, one-step and unrolled strategies run no backward solve and leave
    every field 0.

    Attributes:
      count: number of backward solves (problems).
      num_steps: evaluations of the adjoint map used, first solve and fallback together.
      rel_residual: final relative residual ``‖g + Jᵀu − u‖ / ‖g + Jᵀu‖`` of the ``u`` used.
      failures: solves whose final status (after any fallback) is not ``CONVERGED``; these used
        the ``on_failure`` policy.
      fallbacks: solves whose first attempt did not converge and that ran the fallback solver.
    """

    count: jax.Array
    num_steps: jax.Array
    rel_residual: jax.Array
    failures: jax.Array
    fallbacks: jax.Array

    @classmethod
    def zeros(cls, dtype: jnp.dtype = jnp.float32) -> BackwardStats:
        """The probe: every field a scalar 0 of ``dtype`` (a float dtype)."""
        if not jnp.issubdtype(dtype, jnp.floating):
            raise ValueError(f"dtype must be a float dtype, got {dtype}.")
        zero = jnp.zeros((), dtype)
        return cls(zero, zero, zero, zero, zero)

    def metrics(self, prefix: str = "bwd_") -> dict[str, jax.Array]:
        """Scalars to log: mean steps and residual per solve, failure and fallback fractions.

        Means are ``sum / max(count, 1)``; with no backward solve every entry is 0. Names carry
        no reduction suffix, so :func:`deqjax.training.reduce_metrics` averages them across
        devices (equal per-device counts make that the global mean).
        """
        count = jnp.maximum(self.count, 1.0)
        return {
            f"{prefix}steps": self.num_steps / count,
            f"{prefix}rel_residual": self.rel_residual / count,
            f"{prefix}failure_rate": self.failures / count,
            f"{prefix}fallback_rate": self.fallbacks / count,
        }


def call_solver(solver: base.Solver, h: Callable, u0: PyTree, batch_ndim: int) -> Solution:
    """``solver(h, u0)``, with ``batch_ndim=`` passed when it is nonzero and the solver takes it.

    A solver without the keyword solves a batched ``u0`` as one problem (whole-batch stopping).
    """
    solver = as_solver(solver)
    if batch_ndim and solver.batch_native:
        return solver.replace(batch_ndim=batch_ndim)(h, u0)
    return solver(h, u0)


def backward_solve(
    f: CellFn,
    params: PyTree,
    x: PyTree,
    z_star: PyTree,
    cotangent: PyTree,
    solver: base.Solver,
    *,
    batch_ndim: int = 0,
) -> Solution:
    """Solves ``u = g + J_f(z*)ᵀ u`` for the adjoint ``u`` (DEQ paper, Eq. 11), VJPs only.

    One solve with ``solver``, started from ``u0 = g``, so its lowest-residual iterate is never
    worse than the Jacobian-free estimate ``u = g``. :func:`solve_adjoint` adds the fallback and
    the failure policy.

    Args:
      f: the cell ``f(params, x, z)``.
      params: its parameters.
      x: its input.
      z_star: the fixed point.
      cotangent: ``g = ∂ℓ/∂z*``, a pytree like ``z_star``.
      solver: any solver ``(h, u0) -> Solution`` (fixed-point or Krylov).
      batch_ndim: leading axes of ``z_star`` that index independent problems.

    Returns:
      The backward solver's :class:`~deqjax.solvers.Solution` for ``u``.
    """
    return call_solver(solver, _adjoint_map(f, params, x, z_star, cotangent), cotangent, batch_ndim)


def _adjoint_map(f, params, x, z_star, cotangent):
    _, vjp_z = jax.vjp(lambda z: f(params, x, z), z_star)

    def adjoint_map(u):
        (jt_u,) = vjp_z(u)
        return tree.tree_add(cotangent, jt_u)

    return adjoint_map


class AdjointResult(NamedTuple):
    """What :func:`solve_adjoint` returns."""

    u: PyTree  # the adjoint used for the gradient (after the failure policy)
    solution: Solution  # combined statistics (see solve_adjoint)
    stats: BackwardStats  # summed over problems, in float32


def solve_adjoint(
    f: CellFn,
    params: PyTree,
    x: PyTree,
    z_star: PyTree,
    cotangent: PyTree,
    *,
    solver: base.Solver,
    fallback: base.Solver | None,
    on_failure: str,
    batch_ndim: int = 0,
    fallback_above: float = 0.0,
    forward_rel_residual: jax.Array | float = 0.0,
) -> AdjointResult:
    """The implicit backward: first solve, fallback where it did not converge, failure policy.

    1. ``solver`` on ``u = g + Jᵀu`` from ``u0 = g``.
    2. Where it FAILED and ``fallback`` is given: ``fallback`` on the same map, warm-started
       from the first solve's lowest-residual iterate, its result used instead. Failed means
       ``DIVERGED`` or ``NONFINITE``, or ``MAX_STEPS`` with a best residual (in the solver's own
       stop mode, from its trace) above ``fallback_above`` (0: every solve that did not converge)
       AND a relative residual above the forward solve's ``forward_rel_residual`` (per problem):
       a backward that ends as close to its solution as the forward did to ``z*`` is not the
       weak link of the gradient, and redoing it would not make the gradient exact.
       Under ``lax.cond`` (for a single problem; skipped when not needed) or a per-problem select
       (``batch_ndim > 0``; the fallback's loop does no work for problems already converged).
    3. Where the final status is still not ``CONVERGED``: ``on_failure`` — ``"best"`` the
       lowest-residual iterate, ``"nan"`` NaN, ``"one_step"`` the Jacobian-free ``u = g``.

    Returns:
      An :class:`AdjointResult`: ``u``; a Solution whose ``value`` is ``u`` before the policy,
      ``num_steps`` counts both solves, residuals and ``status`` are final, and ``trace`` is the
      first solve's; and the summed :class:`BackwardStats`.
    """
    h = _adjoint_map(f, params, x, z_star, cotangent)
    first = call_solver(solver, h, cotangent, batch_ndim)
    best_res = jnp.min(first.trace, axis=-1)  # the solver's own residual measure
    need = (first.status == DIVERGED) | (first.status == NONFINITE)
    stalled = ~(best_res <= fallback_above) & ~(first.rel_residual <= forward_rel_residual)
    need = need | ((first.status == MAX_STEPS) & stalled)
    summary = (first.value, first.num_steps, first.abs_residual, first.rel_residual, first.status)
    if fallback is not None:

        def run_fallback(start):
            sol = call_solver(fallback, h, start, batch_ndim)

            def like(a, ref):  # a fallback without batch_ndim reports whole-batch scalars
                return jnp.broadcast_to(a, ref.shape).astype(ref.dtype)

            return (
                sol.value,
                first.num_steps + like(sol.num_steps, first.num_steps),
                like(sol.abs_residual, first.abs_residual),
                like(sol.rel_residual, first.rel_residual),
                like(sol.status, first.status),
            )

        if batch_ndim == 0:
            summary = jax.lax.cond(need, run_fallback, lambda _: summary, first.value)
        else:
            fb = jax.lax.cond(jnp.any(need), run_fallback, lambda _: summary, first.value)
            summary = (tree.tree_where(need, fb[0], summary[0], batch_ndim),) + tuple(
                jnp.where(need, a, b) for a, b in zip(fb[1:], summary[1:])
            )
    value, num_steps, abs_res, rel_res, status = summary
    failed = status != CONVERGED
    if on_failure == "best":
        u = value
    elif on_failure == "nan":
        nan = jax.tree_util.tree_map(lambda v: jnp.full_like(v, jnp.nan), value)
        u = tree.tree_where(failed, nan, value, batch_ndim)
    else:  # "one_step"
        u = tree.tree_where(failed, cotangent, value, batch_ndim)
    solution = first._replace(
        value=value, num_steps=num_steps, abs_residual=abs_res, rel_residual=rel_res, status=status
    )
    f32 = jnp.float32
    stats = BackwardStats(
        # Computed from the status values (not its static size): under vmap the cotangent must be
        # batched so that JAX sums it over the examples for an unbatched probe.
        count=jnp.sum((status >= 0).astype(f32)),
        num_steps=jnp.sum(num_steps.astype(f32)),
        rel_residual=jnp.sum(rel_res.astype(f32)),
        failures=jnp.sum(failed.astype(f32)),
        fallbacks=jnp.sum((need if fallback is not None else jnp.zeros_like(need)).astype(f32)),
    )
    return AdjointResult(u, solution, stats)


class BackwardConfig(NamedTuple):
    """The static configuration of the implicit backward (hashable)."""

    solver: base.Solver
    fallback: base.Solver | None
    on_failure: str
    fallback_above: float = 0.0  # MAX_STEPS solves whose residual is at most this skip the fallback


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def implicit_fixed_point(
    f: CellFn,
    solver: base.Solver,
    backward: BackwardConfig,
    params: PyTree,
    x: PyTree,
    z0: PyTree,
    probe: BackwardStats | None,
) -> tuple[PyTree, Solution]:
    """Forward solve of ``z = f(params, x, z)`` with implicit gradients in ``params`` and ``x``.

    ``z0`` receives a zero gradient (the fixed point does not depend on where the solve starts);
    ``probe`` (a :class:`BackwardStats` or ``None``) receives the backward solve's statistics as
    its cotangent. With a batch-native forward solve (``sol.status.ndim = n > 0``) the backward
    solves every problem's adjoint in one batched loop (``batch_ndim=n`` passed to the backward
    solver) and takes the parameter VJP once for the whole batch. Use through
    :class:`deqjax.ImplicitAdjoint` and :func:`deqjax.fixed_point`.
    """
    del backward, probe
    sol = solver(lambda z: f(params, x, z), z0)
    return sol.value, sol


def _fwd(f, solver, backward, params, x, z0, probe):
    sol = solver(lambda z: f(params, x, z), z0)
    return (sol.value, sol), (params, x, sol.value, z0, sol.status, sol.rel_residual, probe)


def _bwd(f, solver, backward, residuals, cotangents):
    del solver
    params, x, z_star, z0, fwd_status, fwd_rel_residual, probe = residuals
    g_z, g_sol = cotangents
    # The Solution's value is z*: a cotangent reaching it counts like one on z*. Its statistics
    # (steps, residuals, trace, status) are not differentiable and their cotangents are dropped.
    g = jax.tree_util.tree_map(jnp.add, g_z, g_sol.value)
    result = solve_adjoint(
        f,
        params,
        x,
        z_star,
        g,
        solver=backward.solver,
        fallback=backward.fallback,
        on_failure=backward.on_failure,
        batch_ndim=fwd_status.ndim,
        fallback_above=backward.fallback_above,
        forward_rel_residual=fwd_rel_residual,
    )
    # One VJP in (params, x) for the whole batch: no per-example parameter cotangents.
    _, vjp_px = jax.vjp(lambda p, xx: f(p, xx, z_star), params, x)
    g_params, g_x = vjp_px(result.u)
    g_probe = None
    if probe is not None:
        g_probe = jax.tree_util.tree_map(lambda s, p: s.astype(p.dtype), result.stats, probe)
    return g_params, g_x, tree.tree_zeros_like(z0), g_probe


implicit_fixed_point.defvjp(_fwd, _bwd)
