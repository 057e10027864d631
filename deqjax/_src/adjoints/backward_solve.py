"""The robust implicit backward solve: ``(I − J_f(z*))ᵀ u = g`` with VJPs only, reported.

At a fixed point ``z* = f(θ, x, z*)`` the implicit function theorem (DEQ paper, Theorem 1; JR
paper, Eq. 1–2) gives the gradient of a loss ``ℓ(z*)`` as ``∂ℓ/∂θ = uᵀ ∂f/∂θ(z*)`` where ``u``
solves ``(I − J_f(z*))ᵀ u = g``, ``g = ∂ℓ/∂z*``: the fixed point ``u = g + J_f(z*)ᵀ u`` (DEQ
paper, Eq. 11), solved here with any deqjax solver and vector–Jacobian products only (the
Jacobian is never formed). Its forward-mode twin, ``ż = b + J_f(z*) ż``, is solved the same way.

Every such solve (:func:`solve_linear`) runs the first solve, the fallback where it FAILED and
the failure policy, by the rule :class:`~deqjax.ImplicitAdjoint` documents (its steps 1–3, the
one statement of it); its statistics leave the VJP as a :class:`~deqjax.BackwardStats`. The
settings are resolved once, from the forward solver's declared fields, into a static
:class:`BackwardConfig`. Used by the reverse-mode layer (``implicit.py``), the forward-mode
layer (``forward_mode.py``), SHINE's fallback (``shine.py``) and
:func:`deqjax.jacobian.backward_convergence`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from deqjax._src import precision as precision_lib
from deqjax._src import tree, vma
from deqjax._src.adjoints import backward_stats as stats_lib
from deqjax._src.normalise import as_solver
from deqjax._src.solvers import solution
from deqjax._src.solvers.base import Solver
from deqjax._src.solvers.krylov import GMRES
from deqjax._src.solvers.options import Options

PyTree = Any
CellFn = Callable[[PyTree, PyTree, PyTree], PyTree]

ON_FAILURE = ("best", "nan", "one_step")  # the first is the default
FALLBACK_FACTOR = 10.0  # the default of ImplicitAdjoint(fallback_factor=...)
_FALLBACK_MIN_STEPS = 24  # one GMRES cycle of restart 20 plus its bookkeeping evaluations


# --- the backward's configuration, resolved once per forward solver ------------------------------


def normalise_fallback(fallback: Any) -> Solver | str | None:
    """``fallback`` as :class:`BackwardConfig` takes it: ``"gmres"``, ``None`` or a solver object
    (a function or ``functools.partial`` normalised).

    Raises:
      ValueError: naming ``fallback`` if it is none of these.
    """
    if not (fallback is None or fallback == "gmres" or callable(fallback)):
        raise ValueError(f'fallback must be "gmres", a solver callable or None, got {fallback!r}.')
    return as_solver(fallback, name="fallback") if callable(fallback) else fallback


def default_fallback(backward: Solver) -> GMRES:
    """GMRES with the backward solver's ``tol``/``stop_mode``/``atol``, ``max(2 max_steps, 24)``.

    What ``ImplicitAdjoint(fallback="gmres")`` runs: the same convergence test as the first
    backward solve (its declared fields; GMRES's defaults where a user's solver declares none),
    with a budget of twice the first solve's (at least 24 VJPs; a solver that declares no
    ``max_steps`` counts as the solvers' default one): a rescue costs at most about twice the
    backward it replaces (a 100-VJP floor made an 8-step MDEQ backward 20x slower).
    """
    settings = {"tol": backward.tol, "stop_mode": backward.stop_mode, "atol": backward.atol}
    max_steps = Options.max_steps if backward.max_steps is None else int(backward.max_steps)
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
      on_failure: one of :data:`ON_FAILURE` (see :class:`~deqjax.ImplicitAdjoint`).
      fallback_above: a ``MAX_STEPS`` solve whose best residual is at most this skips the
        fallback (0: every solve that did not converge runs it).
      batch_ndim: leading axes of the adjoint that index independent problems in the backward
        solve (0 when the backward solver is not batch-native: it solves the batch as one).
    """

    solver: Solver
    fallback: Solver | None
    on_failure: str = ON_FAILURE[0]
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
        (:func:`tangent_map`), solved as the backward is (:func:`solve_linear`)."""
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
    on_failure: str = ON_FAILURE[0],
    fallback_factor: float = FALLBACK_FACTOR,
    batch_ndim: int = 0,
) -> BackwardConfig:
    """The :class:`BackwardConfig` for a backward solver (normalised) on ``batch_ndim`` axes.

    A batch-native ``backward`` solves the ``batch_ndim`` problem axes of the forward (with
    ``batch_ndim = 0``: its own ``batch_ndim``); another solves the batch as one problem.
    ``fallback`` (from :func:`normalise_fallback`): ``"gmres"`` becomes :func:`default_fallback`
    of ``backward``; the fallback solves the problems the first solve solves.
    ``fallback_above`` is ``fallback_factor × backward.tol`` (0 where the solver declares no
    ``tol``).
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


# --- the linear maps at z*: u ↦ g + J_f(z*)ᵀ u, v ↦ b + J_f(z*) v ---------------------------------


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


# --- the solve: first solve, fallback, failure policy --------------------------------------------


def first_solve(
    f: CellFn, params: PyTree, x: PyTree, z_star: PyTree, cotangent: PyTree, solver: Solver
) -> solution.Solution:
    """The first solve of ``u = g + J_f(z*)ᵀ u`` alone (no fallback, no failure policy), from
    ``u0 = g``: its lowest-residual iterate is never worse than the Jacobian-free ``u = g``.

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
    """Where the first backward solve FAILED (per problem), by step 2 of the rule that
    :class:`~deqjax.ImplicitAdjoint` states: ``DIVERGED`` or ``NONFINITE``, or stopped
    (``MAX_STEPS``, ``STALLED``) with its best residual (its own stop mode, from its trace)
    above ``fallback_above`` and its relative residual above the forward's."""
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
        return vma.cond(need, run, lambda _: kept, first.value)
    fb = vma.cond(jnp.any(need), run, lambda _: kept, first.value)
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
    """What :func:`solve_linear` and :func:`solve_adjoint` return."""

    u: PyTree  # the adjoint used for the gradient (after the failure policy)
    solution: solution.Solution  # combined statistics (see solve_adjoint)
    stats: stats_lib.BackwardStats  # summed over problems, in float32


def solve_adjoint(
    vjp: Callable,
    cotangent: PyTree,
    config: BackwardConfig,
    forward_rel_residual: jax.Array | float = 0.0,
) -> AdjointResult:
    """The implicit backward, :func:`solve_linear` on ``u = g + J_f(z*)ᵀ u``.

    ``vjp`` is the cell's VJP at the fixed point (:func:`linearise`); ``cotangent`` is
    ``g = ∂ℓ/∂z*``.
    """
    return solve_linear(adjoint_map(vjp, cotangent), cotangent, config, forward_rel_residual)


def solve_linear(
    h: Callable[[PyTree], PyTree],
    rhs: PyTree,
    config: BackwardConfig,
    forward_rel_residual: jax.Array | float = 0.0,
) -> AdjointResult:
    """The fixed point of the affine map ``h(v) = rhs + A v`` by the rule of
    :class:`~deqjax.ImplicitAdjoint` (steps 1–3): ``config.solver`` from ``v0 = rhs``, the
    fallback where it failed (:func:`needs_fallback`), warm-started from its lowest-residual
    iterate, then ``config.on_failure`` (``"one_step"`` gives ``v = rhs``).

    ``A = J_f(z*)ᵀ`` for the adjoint (:func:`adjoint_map`), ``A = J_f(z*)`` for the forward-mode
    tangent (:func:`tangent_map`).

    Returns:
      An :class:`AdjointResult`: ``u``; a Solution whose ``value`` is ``u`` before the policy,
      ``num_steps`` counts both solves, residuals and ``status`` are final, and ``trace`` is the
      first solve's; and the summed :class:`~deqjax.BackwardStats`.
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
