"""The implicit gradient of a fixed point: :class:`ImplicitAdjoint` and its backward solve.

At a fixed point ``z* = f(θ, x, z*)`` the implicit function theorem (DEQ paper, Theorem 1; JR paper,
Eq. 1–2) gives, for a loss ``ℓ(z*)``,

    ∂ℓ/∂θ = uᵀ ∂f/∂θ(z*),   ∂ℓ/∂x = uᵀ ∂f/∂x(z*),   where   uᵀ = uᵀ J_f(z*) + ∂ℓ/∂z*,

i.e. ``u`` solves ``(I − J_f(z*))ᵀ u = g``. That linear system is itself a fixed-point problem
``u = g + J_f(z*)ᵀ u`` (DEQ paper, Eq. 11), solved here with any deqjax solver using only
vector–Jacobian products: the Jacobian is never formed, and nothing but ``(θ, x, z*)`` is kept
from the forward pass, so memory does not depend on the number of forward steps.

deqjax has three ``jax.custom_vjp`` sites, one per backward pass that autodiff of the forward
cannot give: :func:`implicit_fixed_point` here (the backward solve), SHINE's (``shine.py``: the
forward Broyden inverse estimate in place of the solve) and the reversible adjoint's
(``reversible.py``: the solver's steps reversed). ``ImplicitAdjoint(forward_mode=True)`` solves
through a ``jax.custom_jvp`` instead (``forward_mode.py``), whose tangent solve and transposed
solve are :meth:`BackwardConfig.tangent` and :meth:`BackwardConfig.adjoint` below.

The backward solve is reported and robust (:func:`solve_adjoint`, shared with SHINE's fallback and
:func:`deqjax.jacobian.backward_convergence`): a first solve with the configured solver; where it
did not converge, a fallback solve (GMRES by default) warm-started from its best iterate; where that
fails too, an explicit ``on_failure`` policy. Its statistics leave the VJP through the gradient
channel, the cotangent of a :class:`~deqjax.BackwardStats` probe. The backward's settings (its
solver, the fallback, the problems' ``batch_ndim``) are resolved once, from the forward solver's
declared fields, into a static :class:`BackwardConfig`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from deqjax._src import precision as precision_lib
from deqjax._src import tree
from deqjax._src.adjoints import backward_stats as stats_lib
from deqjax._src.adjoints import base as adjoint_base
from deqjax._src.adjoints import forward_mode as forward_mode_lib
from deqjax._src.normalise import as_solver
from deqjax._src.solvers import solution
from deqjax._src.solvers.base import Solver
from deqjax._src.solvers.krylov import GMRES

PyTree = Any
CellFn = Callable[[PyTree, PyTree, PyTree], PyTree]

ON_FAILURE = ("best", "nan", "one_step")
_FALLBACK_MIN_STEPS = 24  # one GMRES cycle of restart 20 plus its bookkeeping evaluations


# --- the backward's configuration, resolved once per forward solver ------------------------------


def default_fallback(backward: Solver) -> GMRES:
    """GMRES with the backward solver's ``tol``/``stop_mode``/``atol``, ``max(2 max_steps, 24)``.

    What ``ImplicitAdjoint(fallback="gmres")`` runs: the same convergence test as the first
    backward solve (its declared fields; GMRES's defaults where a user's solver declares none),
    with a budget of twice the first solve's (at least 24 VJPs): a rescue costs at most about
    twice the backward it replaces (a 100-VJP floor made an 8-step MDEQ backward 20x slower).
    """
    settings = {"tol": backward.tol, "stop_mode": backward.stop_mode, "atol": backward.atol}
    max_steps = 50 if backward.max_steps is None else int(backward.max_steps)
    return GMRES(
        **{k: v for k, v in settings.items() if v is not None},
        max_steps=max(2 * max_steps, _FALLBACK_MIN_STEPS),
    )


@dataclasses.dataclass(frozen=True)
class BackwardConfig:
    """The implicit backward of one forward solve: static and hashable (a ``custom_vjp``
    configuration).

    Attributes:
      solver: the first backward solver, set to the problems' ``batch_ndim``.
      fallback: the solver run where the first did not converge, or ``None``.
      on_failure: ``"best"``, ``"nan"`` or ``"one_step"`` (see :class:`ImplicitAdjoint`).
      fallback_above: a ``MAX_STEPS`` solve whose best residual is at most this skips the
        fallback (0: every solve that did not converge runs it).
      batch_ndim: leading axes of the adjoint that index independent problems in the backward
        solve (0 when the backward solver is not batch-native: it solves the batch as one).
    """

    solver: Solver
    fallback: Solver | None
    on_failure: str = "best"
    fallback_above: float = 0.0
    batch_ndim: int = 0

    def adjoint(
        self,
        f: CellFn,
        params: PyTree,
        x: PyTree,
        z_star: PyTree,
        cotangent: PyTree,
        forward_rel_residual: jax.Array | float = 0.0,
    ) -> AdjointResult:
        """The backward solve ``u = g + J_f(z*)ᵀ u`` at ``(params, x, z*)``
        (:func:`solve_adjoint`), for the forward-mode path's ``transpose_solve``."""
        vjp = linearise(f, params, x, z_star)
        return solve_adjoint(vjp, cotangent, self, forward_rel_residual)

    def tangent(
        self,
        f: CellFn,
        params: PyTree,
        x: PyTree,
        z_star: PyTree,
        rhs: PyTree,
        forward_rel_residual: jax.Array | float = 0.0,
    ) -> PyTree:
        """The forward-mode tangent ``ż = b + J_f(z*) ż``, i.e. ``ż = (I − J_f(z*))⁻¹ b``
        (:func:`tangent_map`), solved as the backward is: this solver, the fallback, the
        failure policy (``"one_step"``: ``ż = b``)."""
        h = tangent_map(f, params, x, z_star, rhs)
        return solve_linear(h, rhs, self, forward_rel_residual).u


def _batched(solver: Solver, batch_ndim: int) -> Solver:
    """``solver`` solving ``batch_ndim > 0`` leading axes as problems. One that is not
    batch-native stays as it is (it solves the batch as one problem), and so does any solver
    for ``batch_ndim = 0`` (it keeps its own ``batch_ndim``)."""
    if batch_ndim and solver.batch_native and solver.batch_ndim != batch_ndim:
        return solver.replace(batch_ndim=batch_ndim)
    return solver


def resolve_backward(
    backward: Solver,
    fallback: Solver | str | None,
    *,
    on_failure: str = "best",
    fallback_factor: float = 10.0,
    batch_ndim: int = 0,
) -> BackwardConfig:
    """The :class:`BackwardConfig` for a backward solver (normalised) on ``batch_ndim`` axes.

    A batch-native ``backward`` solves the ``batch_ndim`` problem axes of the forward (with
    ``batch_ndim = 0``: its own ``batch_ndim``); another solves the batch as one problem.
    ``fallback="gmres"`` becomes :func:`default_fallback` of ``backward``; the fallback solves
    the problems the first solve solves. ``fallback_above`` is ``fallback_factor ×
    backward.tol`` (0 where the solver declares no ``tol``).
    """
    backward = _batched(backward, batch_ndim)
    problem_ndim = backward.batch_ndim or 0
    if isinstance(fallback, str):
        fallback = default_fallback(backward)
    if fallback is not None:
        fallback = _batched(fallback, problem_ndim)
    tol = backward.tol
    above = float(fallback_factor * tol) if tol else 0.0
    return BackwardConfig(backward, fallback, on_failure, above, problem_ndim)


# --- the backward solve: first solve, fallback, failure policy -----------------------------------


@dataclasses.dataclass(frozen=True)
class Linearisation:
    """The VJP of the cell at ``(params, x, z*)``, called like the function ``jax.vjp`` returns.

    Attributes:
      vjp: ``u ↦ uᵀ ∂f/∂(params, x, z)`` at the cell's matmul precision.
      full: the same at full precision where the cell's is reduced, else ``None``: the backward
        solves check their result with it (:mod:`deqjax._src.solvers.verify`), so that their
        statistics hold at full precision.
      precision: the cell's precision, for messages.
    """

    vjp: Callable
    full: Callable | None = None
    precision: str = "default"

    def __call__(self, u: PyTree) -> tuple[PyTree, PyTree, PyTree]:
        return self.vjp(u)


def linearise(f: CellFn, params: PyTree, x: PyTree, z_star: PyTree) -> Linearisation:
    """The VJP of ``f`` at ``(params, x, z*)`` in all three arguments, linearised once.

    The backward solve needs its ``z`` part (``u ↦ J_f(z*)ᵀ u``, every iteration) and the final
    gradient its ``(params, x)`` part: one linearisation serves both, so the program traces and
    compiles ``f``'s forward at ``z*`` once (in a loop body the unused cotangents are dead code).
    Where ``f`` runs at a reduced matmul precision a second linearisation, at full precision,
    serves the check of the backward solves (one evaluation of its VJP each, after their loops).
    """
    with precision_lib.watching() as watch:
        _, vjp = jax.vjp(f, params, x, z_star)
    full, precision = precision_lib.full_twin(f, watch)
    vjp_full = None if full is None else jax.vjp(full, params, x, z_star)[1]
    return Linearisation(vjp, vjp_full, precision)


def adjoint_map(vjp: Callable, cotangent: PyTree) -> Callable[[PyTree], PyTree]:
    """``u ↦ g + J_f(z*)ᵀ u`` (DEQ paper, Eq. 11), with ``vjp`` from :func:`linearise`; with a
    :class:`Linearisation`, a :class:`~deqjax._src.precision.TwinMap` that carries the map at
    full precision too (``None`` where the cell's products are full precision)."""

    def at(vjp_fn: Callable) -> Callable[[PyTree], PyTree]:
        return lambda u: tree.tree_add(cotangent, vjp_fn(u)[2])

    if not isinstance(vjp, Linearisation):
        return at(vjp)
    full = None if vjp.full is None else at(vjp.full)
    return precision_lib.TwinMap(at(vjp.vjp), full, vjp.precision)


def tangent_map(
    f: CellFn, params: PyTree, x: PyTree, z_star: PyTree, rhs: PyTree
) -> Callable[[PyTree], PyTree]:
    """``v ↦ b + J_f(z*) v``: the forward-mode twin of :func:`adjoint_map`, with JVPs.

    Its fixed point is the tangent of the implicit function theorem, ``ż = (I − J_f(z*))⁻¹ b``
    with ``b = ∂f/∂θ θ̇ + ∂f/∂x ẋ``. ``f`` is linearised in ``z`` once (``jax.linearize``), so a
    solver's loop evaluates the linear map alone. Where ``f`` runs at a reduced matmul precision
    the map is a :class:`~deqjax._src.precision.TwinMap` that carries the same map at full
    precision, for the check of the solve (as :func:`adjoint_map` does).
    """

    def at(cell: CellFn) -> Callable[[PyTree], PyTree]:
        jvp = jax.linearize(lambda z: cell(params, x, z), z_star)[1]
        return lambda v: tree.tree_add(rhs, jvp(v))

    with precision_lib.watching() as watch:
        h = at(f)
    full, precision = precision_lib.full_twin(f, watch)
    return precision_lib.TwinMap(h, None if full is None else at(full), precision)


def backward_solve(
    f: CellFn, params: PyTree, x: PyTree, z_star: PyTree, cotangent: PyTree, solver: Solver
) -> solution.Solution:
    """One solve of ``u = g + J_f(z*)ᵀ u`` for the adjoint ``u`` (DEQ paper, Eq. 11), VJPs only.

    Started from ``u0 = g``, so its lowest-residual iterate is never worse than the Jacobian-free
    estimate ``u = g``. :func:`solve_adjoint` adds the fallback and the failure policy.

    Args:
      f: the cell ``f(params, x, z)``.
      params: its parameters.
      x: its input.
      z_star: the fixed point.
      cotangent: ``g = ∂ℓ/∂z*``, a pytree like ``z_star``.
      solver: a normalised solver (fixed-point or Krylov), set to the problems' ``batch_ndim``.

    Returns:
      The backward solver's :class:`~deqjax.solvers.Solution` for ``u``.
    """
    return solver(adjoint_map(linearise(f, params, x, z_star), cotangent), cotangent)


class _Outcome(NamedTuple):
    """Where a backward solve ended (per problem): the Solution fields the fallback replaces."""

    value: PyTree
    num_steps: jax.Array
    abs_residual: jax.Array
    rel_residual: jax.Array
    status: jax.Array

    @classmethod
    def of(cls, sol: solution.Solution) -> _Outcome:
        return cls(sol.value, sol.num_steps, sol.abs_residual, sol.rel_residual, sol.status)


def needs_fallback(
    first: solution.Solution, fallback_above: float, forward_rel_residual: jax.Array | float
) -> jax.Array:
    """Where the first backward solve FAILED (per problem).

    ``DIVERGED`` or ``NONFINITE``, or ``MAX_STEPS`` or ``STALLED`` with a best residual (in the
    solver's own stop mode, from its trace) above ``fallback_above`` AND a relative residual
    above the forward solve's: a backward that ends as close to its solution as the forward did
    to ``z*`` is not the weak link of the gradient, and redoing it would not make the gradient
    exact.
    """
    best_res = jnp.min(first.trace, axis=-1)  # the solver's own residual measure
    broken = (first.status == solution.DIVERGED) | (first.status == solution.NONFINITE)
    short = ~(best_res <= fallback_above) & ~(first.rel_residual <= forward_rel_residual)
    stopped = (first.status == solution.MAX_STEPS) | (first.status == solution.STALLED)
    return broken | (stopped & short)


def _run_fallback(
    fallback: Solver,
    h: Callable[[PyTree], PyTree],
    first: solution.Solution,
    need: jax.Array,
    batch_ndim: int,
) -> _Outcome:
    """The fallback solve on ``h``, warm-started from the first solve's best iterate, used where
    ``need``. Under ``lax.cond`` (skipped when no problem needs it); with ``batch_ndim > 0`` a
    per-problem select (the fallback's loop does no work for problems already converged)."""
    kept = _Outcome.of(first)

    def run(start: PyTree) -> _Outcome:
        sol = fallback(h, start)

        def like(a, ref):  # a fallback that is not batch-native reports whole-batch scalars
            return jnp.broadcast_to(a, ref.shape).astype(ref.dtype)

        return _Outcome(
            sol.value,
            first.num_steps + like(sol.num_steps, first.num_steps),
            like(sol.abs_residual, first.abs_residual),
            like(sol.rel_residual, first.rel_residual),
            like(sol.status, first.status),
        )

    if batch_ndim == 0:
        return jax.lax.cond(need, run, lambda _: kept, first.value)
    fb = jax.lax.cond(jnp.any(need), run, lambda _: kept, first.value)
    return _Outcome(
        tree.tree_where(need, fb.value, kept.value, batch_ndim),
        *(jnp.where(need, a, b) for a, b in zip(fb[1:], kept[1:])),
    )


def apply_failure_policy(
    on_failure: str, value: PyTree, failed: jax.Array, cotangent: PyTree, batch_ndim: int
) -> PyTree:
    """The adjoint used where the backward did not converge: ``"best"`` its lowest-residual
    iterate, ``"nan"`` NaN, ``"one_step"`` the Jacobian-free ``u = g``."""
    if on_failure == "best":
        return value
    if on_failure == "nan":
        nan = jax.tree_util.tree_map(lambda v: jnp.full_like(v, jnp.nan), value)
        return tree.tree_where(failed, nan, value, batch_ndim)
    return tree.tree_where(failed, cotangent, value, batch_ndim)  # "one_step"


class AdjointResult(NamedTuple):
    """What :func:`solve_adjoint` returns."""

    u: PyTree  # the adjoint used for the gradient (after the failure policy)
    solution: solution.Solution  # combined statistics (see solve_adjoint)
    stats: stats_lib.BackwardStats  # summed over problems, in float32


def solve_adjoint(
    vjp: Callable,
    cotangent: PyTree,
    config: BackwardConfig,
    forward_rel_residual: jax.Array | float = 0.0,
) -> AdjointResult:
    """The implicit backward: first solve, fallback where it failed, failure policy.

    ``vjp`` is the cell's VJP at the fixed point (:func:`linearise`); ``cotangent`` is
    ``g = ∂ℓ/∂z*``.

    1. ``config.solver`` on ``u = g + Jᵀu`` from ``u0 = g``.
    2. Where it failed (:func:`needs_fallback`) and ``config.fallback`` is given: the fallback on
       the same map, warm-started from the first solve's lowest-residual iterate, its result used
       instead.
    3. Where the final status is still not ``CONVERGED``: ``config.on_failure``.

    Returns:
      An :class:`AdjointResult`: ``u``; a Solution whose ``value`` is ``u`` before the policy,
      ``num_steps`` counts both solves, residuals and ``status`` are final, and ``trace`` is the
      first solve's; and the summed :class:`~deqjax.BackwardStats`.
    """
    return solve_linear(adjoint_map(vjp, cotangent), cotangent, config, forward_rel_residual)


def solve_linear(
    h: Callable[[PyTree], PyTree],
    rhs: PyTree,
    config: BackwardConfig,
    forward_rel_residual: jax.Array | float = 0.0,
) -> AdjointResult:
    """The fixed point of the affine map ``h(v) = rhs + A v``: first solve from ``v0 = rhs``,
    fallback where it failed, failure policy (``"one_step"`` gives ``v = rhs``).

    The steps of :func:`solve_adjoint`, for any such map: ``A = J_f(z*)ᵀ`` there (the adjoint,
    :func:`adjoint_map`), ``A = J_f(z*)`` for the forward-mode tangent (:func:`tangent_map`).
    """
    first = config.solver(h, rhs)
    need = needs_fallback(first, config.fallback_above, forward_rel_residual)
    if config.fallback is None:
        end, fallbacks = _Outcome.of(first), jnp.zeros_like(need)
    else:
        end = _run_fallback(config.fallback, h, first, need, config.batch_ndim)
        fallbacks = need
    failed = end.status != solution.CONVERGED
    u = apply_failure_policy(config.on_failure, end.value, failed, rhs, config.batch_ndim)
    # The count comes from the status values (not its static size): see stats_lib.summed.
    stats = stats_lib.summed(end.status >= 0, end.num_steps, end.rel_residual, failed, fallbacks)
    return AdjointResult(u, first._replace(**end._asdict()), stats)


# --- the custom_vjp -----------------------------------------------------------------------------


def z_star_cotangent(cotangents: tuple[PyTree, solution.Solution]) -> PyTree:
    """The cotangent of ``z*`` from those of ``(z_star, sol)``: the Solution's value is ``z*``, so
    a cotangent reaching it counts like one on ``z*``. Its statistics (steps, residuals, trace,
    status) are not differentiable and their cotangents are dropped."""
    g_z, g_sol = cotangents
    return jax.tree_util.tree_map(jnp.add, g_z, g_sol.value)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def implicit_fixed_point(
    f: CellFn,
    solver: Solver,
    backward: BackwardConfig,
    params: PyTree,
    x: PyTree,
    z0: PyTree,
    probe: stats_lib.BackwardStats | None,
) -> tuple[PyTree, solution.Solution]:
    """Forward solve of ``z = f(params, x, z)`` with implicit gradients in ``params`` and ``x``.

    ``z0`` receives a zero gradient (the fixed point does not depend on where the solve starts);
    ``probe`` (a :class:`~deqjax.BackwardStats` or ``None``) receives the backward solve's
    statistics as its cotangent. With a batch-native forward solve (``solver.batch_ndim = n > 0``,
    carried to ``backward.batch_ndim``) the backward solves every problem's adjoint in one
    batched loop and takes the parameter VJP once for the whole batch. Use through
    :class:`deqjax.ImplicitAdjoint` and :func:`deqjax.fixed_point`.
    """
    del backward, probe
    sol = solver(lambda z: f(params, x, z), z0)
    return sol.value, sol


def _fwd(f, solver, backward, params, x, z0, probe):
    sol = solver(lambda z: f(params, x, z), z0)
    return (sol.value, sol), (params, x, sol.value, z0, sol.rel_residual, probe)


def _bwd(f, solver, backward, residuals, cotangents):
    del solver
    params, x, z_star, z0, fwd_rel_residual, probe = residuals
    g = z_star_cotangent(cotangents)
    vjp = linearise(f, params, x, z_star)
    result = solve_adjoint(vjp, g, backward, fwd_rel_residual)
    # One VJP in (params, x) for the whole batch: no per-example parameter cotangents.
    g_params, g_x, _ = vjp(result.u)
    g_probe = stats_lib.probe_cotangent(result.stats, probe)
    return g_params, g_x, tree.tree_zeros_like(z0), g_probe


implicit_fixed_point.defvjp(_fwd, _bwd)


# --- the strategy ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ImplicitAdjoint(adjoint_base.Adjoint):
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
    (``False``) is the ``jax.custom_vjp`` of the backward alone: reverse mode only (a ``jvp``
    through it raises a ``ValueError`` naming ``forward_mode=True``), and its gradient is not
    itself differentiable. ``forward_mode=True`` costs a ``grad`` one more linearisation of
    ``f`` at ``z*`` and the tracing of the tangent solve (see ``docs/design.md``, "Forward
    mode").

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
    on_failure: str = "best"
    fallback_factor: float = 10.0
    forward_mode: bool = False

    def __post_init__(self):
        if self.solver is not None:
            if not callable(self.solver):
                raise ValueError(f"solver must be callable or None, got {self.solver!r}.")
            object.__setattr__(self, "solver", as_solver(self.solver, name="solver"))
        fallback = self.fallback
        if not (fallback is None or fallback == "gmres" or callable(fallback)):
            raise ValueError(
                f'fallback must be "gmres", a solver callable or None, got {fallback!r}.'
            )
        if callable(fallback):
            object.__setattr__(self, "fallback", as_solver(fallback, name="fallback"))
        if not self.fallback_factor >= 1.0:
            raise ValueError(f"fallback_factor must be >= 1, got {self.fallback_factor!r}.")
        if self.on_failure not in ON_FAILURE:
            raise ValueError(f"on_failure must be one of {ON_FAILURE}, got {self.on_failure!r}.")
        if not isinstance(self.forward_mode, bool):
            raise ValueError(f"forward_mode must be a bool, got {self.forward_mode!r}.")

    def check_inputs(self, params: PyTree, x: PyTree) -> None:
        """``ValueError`` naming ``forward_mode=True`` where the default path meets a ``jax.jvp``
        tangent (see :func:`~deqjax._src.adjoints.forward_mode.refuse_forward_mode`)."""
        if not self.forward_mode:
            forward_mode_lib.refuse_forward_mode("dq.ImplicitAdjoint()", params, x)

    def backward_config(self, forward_solver: Solver) -> BackwardConfig:
        """The resolved backward for a (normalised) forward solver: its ``batch_ndim``, and this
        adjoint's solver (or the forward's, without its forward-only outputs:
        :meth:`~deqjax._src.solvers.base.Solver.for_backward`), fallback and failure
        policy."""
        return resolve_backward(
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
