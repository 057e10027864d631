"""The one stopping rule of every deqjax solver: residuals, status, the best iterate, the trace.

After each evaluation ``f(x_k)`` (``g_k = f(x_k) - x_k``) a solver judges it with :func:`judge`.

Residuals, by ``stop_mode``:

* ``"abs"``:   ``r_k = ||g_k||``
* ``"rel"``:   ``r_k = ||g_k|| / ||f(x_k)||``
* ``"mixed"``: ``r_k = ||g_k|| / (atol / tol + ||x_k||)``, so ``r_k <= tol`` is optimistix's
  combined rule ``||f(x) - x|| <= atol + tol * ||x||`` (``atol`` defaults to ``tol``: the scale is
  ``1 + ||x||``). It reaches a fixed point at 0, where ``"rel"`` stalls (its denominator vanishes).

Norms are Euclidean and real, also for a complex state (``||g||^2 = sum |g_i|^2``, in
:func:`deqjax._src.tree.reduction_dtype`: float32 for complex64, float64 for complex128).

Status, checked in this order:

1. ``r_k <= tol``                                      -> ``CONVERGED``
2. ``f(x_k)`` or ``r_k`` not finite                      -> ``NONFINITE``
3. ``||g_k|| > divergence_factor * min_{j<k} ||g_j||``  -> ``DIVERGED`` (the "protective break"
   of the DEQ code), judged on the ABSOLUTE residual in every ``stop_mode``: a blowing-up map
   such as ``z -> 2z + 1`` has a relative residual that tends to a constant and would never trip
   a relative test.
4. no new best iterate (see below) in the last ``stall_steps`` evaluations -> ``STALLED``: the
   residual has reached the floor the arithmetic allows (a half-precision state, TF32 products,
   a tolerance below float32's resolution) or the method stagnates; the rest of the budget would
   buy nothing, and the reported residual is that floor. ``stall_steps=None`` turns it off, and
   so does ``tol = 0`` (a request to run the whole budget).
5. no room left in ``max_steps`` for the next step    -> ``MAX_STEPS``

The returned ("best") iterate is the one with the lowest ``r_k`` among those whose absolute
residual is at most twice the lowest absolute residual seen before them (a converged iterate always
qualifies). In ``"abs"`` mode this is simply the lowest-residual iterate. In ``"rel"`` and
``"mixed"`` mode the extra condition keeps a geometrically growing sequence, whose relative
residual shrinks as ``||f(x)||`` grows, from being returned: the returned absolute residual is never
more than twice the lowest one seen, so ``z -> 2z + 1`` from 0 returns ``z = 1`` (absolute residual
2), not an iterate with absolute residual ``1e7``. (Twice, not once: an oscillating iteration's
lowest relative residual often sits a few percent above its lowest absolute residual.)

The Krylov solvers (:mod:`deqjax._src.solvers.krylov`) use the same rule without its divergence
test and its twice-the-lowest condition (:func:`krylov_rule`): their residual is not a
fixed-point iteration's.

Batches (``batch_ndim = n``): the leading ``n`` axes of every leaf index independent problems;
norms, residuals, stopping, the best iterate, ``num_steps``, ``status`` and ``trace`` are per
problem, and a problem that has stopped keeps its fields frozen.
"""

from __future__ import annotations

import warnings
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from deqjax._src import tree
from deqjax._src.solvers.solution import (
    CONVERGED,
    DIVERGED,
    MAX_STEPS,
    NONFINITE,
    RUNNING,
    STALLED,
)

PyTree = Any

STOP_MODES = ("abs", "rel", "mixed")

# In "rel"/"mixed" mode an iterate can become the best only if its absolute residual is at most this
# multiple of the lowest absolute residual seen before it (see the module docstring). In "abs" mode
# the condition is implied by the ranking itself.
_BEST_ABS_SLACK = 2.0

# Denominator guard of the relative residual: ||f(z) - z|| / (||f(z)|| + _REL_EPS).
_REL_EPS = 1e-30

# Columns of Book.scalars: the best iterate's absolute, relative and stop_mode residual, the lowest
# absolute residual seen, the status code, num_steps, and the num_steps at which the best iterate
# was last replaced (for STALLED).
BEST_ABS, BEST_REL, BEST_RES, MIN_ABS, STATUS, NUM_STEPS, BEST_STEP = range(7)
_N_SCALARS = 7


class StoppingRule(NamedTuple):
    """The static settings of the stopping rule (made by :func:`fixed_point_rule` or
    :func:`krylov_rule` from a solver's options).

    Attributes:
      tol: stop when the residual (by ``stop_mode``) is ``<= tol``.
      stop_mode: ``"abs"``, ``"rel"`` or ``"mixed"``.
      scale_floor: ``atol / tol`` in ``"mixed"`` mode, else 0.
      divergence_factor: the DIVERGED threshold, or ``None`` for no divergence test.
      best_abs_slack: the twice-the-lowest condition of the best iterate, or ``None`` (best is
        the lowest residual).
      max_steps: the budget of evaluations of ``f``.
      batch_ndim: leading axes that index independent problems.
    """

    tol: float
    stop_mode: str
    scale_floor: float
    divergence_factor: float | None
    best_abs_slack: float | None
    max_steps: int
    batch_ndim: int
    stall_steps: int | None = None


def check_resolvable(tol: float, stop_mode: str, z0: PyTree) -> None:
    """Warns where a relative ``tol`` is below what the state's dtype can resolve.

    An iterate rounded to a dtype with machine epsilon ``eps`` has a relative residual of about
    ``eps`` at best (bfloat16: 7.8e-3, float16: 9.8e-4, float32: 1.2e-7), whatever precision
    the residual is computed in: such a solve ends ``STALLED`` or at ``max_steps``, never
    ``CONVERGED``. Checked once per trace (static dtypes), so it costs nothing in the loop.
    """
    if stop_mode == "abs" or not tol > 0:
        return
    dtypes = {jnp.result_type(leaf) for leaf in jax.tree_util.tree_leaves(z0)}
    floats = [d for d in dtypes if jnp.issubdtype(d, jnp.inexact)]  # complex: its parts' eps
    if not floats:
        return
    coarse = max(floats, key=lambda d: float(jnp.finfo(d).eps))
    eps = float(jnp.finfo(coarse).eps)
    if tol < eps:
        warnings.warn(
            f"tol={tol:g} (stop_mode={stop_mode!r}) is below the resolution of the state's dtype "
            f"{jnp.dtype(coarse).name} (eps {eps:.1e}): the solve cannot converge and will end "
            f"STALLED or at max_steps. Use tol >= {eps:.0e}, or a wider dtype for the state.",
            stacklevel=2,
        )


def _scale_floor(tol: float, stop_mode: str, atol: float | None) -> float:
    # Mixed mode: ||g|| <= atol + tol ||x||  <=>  ||g|| / (atol / tol + ||x||) <= tol.
    return (tol if atol is None else atol) / tol if stop_mode == "mixed" else 0.0


def _stall_steps(options: Any) -> int | None:
    """The rule's ``stall_steps``: none with ``tol = 0`` (a request to run the whole budget)."""
    return options.stall_steps if options.tol > 0 else None


def fixed_point_rule(options: Any) -> StoppingRule:
    """The full rule for a fixed-point solver's options (``tol``, ``stop_mode``, ``atol``,
    ``divergence_factor``, ``max_steps``, ``batch_ndim``)."""
    o = options
    floor = _scale_floor(o.tol, o.stop_mode, o.atol)
    return StoppingRule(
        o.tol,
        o.stop_mode,
        floor,
        o.divergence_factor,
        _BEST_ABS_SLACK,
        o.max_steps,
        o.batch_ndim,
        _stall_steps(o),
    )


def krylov_rule(options: Any) -> StoppingRule:
    """The rule of a Krylov solve: no divergence test, the best iterate is the lowest residual."""
    o = options
    floor = _scale_floor(o.tol, o.stop_mode, o.atol)
    return StoppingRule(
        o.tol, o.stop_mode, floor, None, None, o.max_steps, o.batch_ndim, _stall_steps(o)
    )


class Book(NamedTuple):
    """The per-problem bookkeeping a solver carries through its loop.

    Every per-problem scalar lives in one array, so that a step updates all of them in one fused
    kernel (at small ``d`` the loop's cost is its number of kernels, not their size). Status
    codes and step counts are stored as floats of the reduction dtype: exact for counts below
    ``2^24`` (float32), far beyond any budget of evaluations.

    Attributes:
      scalars: ``[*batch, 7]``, the columns ``BEST_ABS``, ``BEST_REL``, ``BEST_RES``, ``MIN_ABS``,
        ``STATUS``, ``NUM_STEPS``, ``BEST_STEP`` (see the module's constants).
      trace: ``[*batch, max_steps]``: the residual of each evaluation, ``+inf`` where none.
    """

    scalars: jax.Array
    trace: jax.Array

    @property
    def status(self) -> jax.Array:
        """int32 ``[*batch]``: the status codes."""
        return self.scalars[..., STATUS].astype(jnp.int32)

    @property
    def num_steps(self) -> jax.Array:
        """int32 ``[*batch]``: evaluations of ``f`` charged."""
        return self.scalars[..., NUM_STEPS].astype(jnp.int32)

    @property
    def running(self) -> jax.Array:
        """bool ``[*batch]``: the problems still running."""
        return self.scalars[..., STATUS] == RUNNING

    @property
    def abs_residual(self) -> jax.Array:
        """``[*batch]``: the best iterate's absolute residual."""
        return self.scalars[..., BEST_ABS]

    @property
    def rel_residual(self) -> jax.Array:
        """``[*batch]``: the best iterate's relative residual."""
        return self.scalars[..., BEST_REL]


def initial_book(batch_shape: tuple[int, ...], max_steps: int, rdtype: jnp.dtype) -> Book:
    """Nothing seen (residuals +inf), every problem running with 0 evaluations, an all-+inf
    trace."""
    first = jnp.asarray([jnp.inf] * 4 + [RUNNING, 0, 0], rdtype)
    return Book(
        scalars=jnp.broadcast_to(first, batch_shape + (_N_SCALARS,)),
        trace=jnp.full(batch_shape + (max_steps,), jnp.inf, rdtype),
    )


def _squared_norms(trees: list[PyTree], batch_ndim: int, dtype: jnp.dtype) -> jax.Array:
    """``[||t||^2 for t in trees]`` per problem, ``[len(trees), *batch]`` (real: a complex
    entry contributes ``|t_i|^2``).

    One reduction per tree and leaf, each reading its operands where they are: stacking the
    trees first would copy them into a new buffer (a full extra pass over the state per step).
    """
    return jnp.stack([tree.tree_sq_norm(t, batch_ndim) for t in trees])


class Residuals(NamedTuple):
    """The residuals of one evaluation ``fx = f(x)``, per problem (``[*batch]`` each)."""

    abs: jax.Array  # ||f(x) - x||
    abs_sq: jax.Array  # ||f(x) - x||^2, as reduced (a rule that needs it reads it here)
    fx_norm: jax.Array  # ||f(x)||
    rel: jax.Array  # ||f(x) - x|| / (||f(x)|| + _REL_EPS)
    res: jax.Array  # by stop_mode
    scale: jax.Array  # the denominator of res: 1, ||f(x)|| or atol / tol + ||x||
    finite: jax.Array  # f(x) and the residuals are finite


def residuals(
    x: PyTree, fx: PyTree, gx: PyTree, rule: StoppingRule, rdtype: jnp.dtype
) -> Residuals:
    """The residuals of ``fx = f(x)`` (``gx = fx - x``) by the rule's ``stop_mode``.

    Residuals steer the loop but are not differentiated (sqrt has no derivative at 0).
    """
    trees = [gx, fx, x] if rule.stop_mode == "mixed" else [gx, fx]
    squares = jax.lax.stop_gradient(_squared_norms(trees, rule.batch_ndim, rdtype))
    norms = jnp.sqrt(squares)
    abs_res, fx_norm = norms[0], norms[1]
    rel_res = abs_res / (fx_norm + jnp.asarray(_REL_EPS, rdtype))
    if rule.stop_mode == "rel":
        res, scale = rel_res, fx_norm
    elif rule.stop_mode == "mixed":
        scale = jnp.asarray(rule.scale_floor, rdtype) + norms[2]
        res = abs_res / scale
    else:
        res, scale = abs_res, jnp.ones_like(abs_res)
    # A NaN or inf entry of f(x) propagates into ||f(x)||, so checking the two norms replaces a
    # separate pass over f(x) (a norm that overflows also counts as non-finite). CONVERGED
    # requires finiteness too: an overflowing ||f(x)|| would otherwise give rel_res = 0.
    finite = jnp.isfinite(abs_res) & jnp.isfinite(fx_norm) & jnp.isfinite(res)
    return Residuals(abs_res, squares[0], fx_norm, rel_res, res, scale, finite)


class StepUpdate(NamedTuple):
    """What one evaluation ``f(x)`` does to the per-problem bookkeeping (:func:`judge`)."""

    running: jax.Array  # bool [*batch]: problems this step belongs to
    still: jax.Array  # bool [*batch]: problems still running after it
    improved: jax.Array  # bool [*batch]: x becomes the returned ("best") iterate
    take_fx: jax.Array  # bool [*batch]: f(x) becomes f_value (improved, or the first evaluation)
    book: Book  # the new bookkeeping
    residuals: Residuals  # of this evaluation


def _status(
    r: Residuals,
    min_abs: jax.Array,
    out_of_steps: jax.Array,
    stalled: jax.Array | bool,
    rule: StoppingRule,
) -> jax.Array:
    """CONVERGED / NONFINITE / DIVERGED / STALLED / MAX_STEPS / RUNNING, in this order of
    precedence."""
    status = jnp.where(stalled, STALLED, jnp.where(out_of_steps, MAX_STEPS, RUNNING))
    if rule.divergence_factor is not None:
        # Divergence is judged on the absolute residual in every stop_mode.
        status = jnp.where(r.abs > rule.divergence_factor * min_abs, DIVERGED, status)
    converged = r.finite & (r.res <= rule.tol)
    return jnp.where(converged, CONVERGED, jnp.where(~r.finite, NONFINITE, status)).astype(
        jnp.int32
    )


def _write_trace(
    trace: jax.Array,
    column: jax.Array,
    start: jax.Array,
    count: Any,
    batch_ndim: int,
    running: jax.Array,
) -> jax.Array:
    """``trace`` with ``column`` (``[*batch]``) written at evaluations ``start`` to
    ``start + count - 1`` (``count`` a static int or a traced one), for the ``running`` problems
    (the others' entries there are ``+inf`` already)."""
    max_steps = trace.shape[-1]
    ids = jnp.arange(max_steps, dtype=jnp.int32)
    if isinstance(count, int) and count == 1 and batch_ndim > 0:
        # One shared index, written in place. A loop that checks its stopping rule every k steps
        # runs up to k - 1 steps past max_steps, where the index clamps to the last entry: the
        # problems not running write back what is there.
        at = jnp.minimum(start, max_steps - 1)
        kept = jax.lax.dynamic_index_in_dim(trace, at, batch_ndim, keepdims=False)
        return jax.lax.dynamic_update_index_in_dim(
            trace, jnp.where(running, column, kept), at, batch_ndim
        )
    if isinstance(count, int) and count == 1:
        # A masked select, not .at[k].set: under vmap k is batched and a scatter is slow.
        return jnp.where(ids == start, column, trace)
    ids = ids.reshape((1,) * batch_ndim + (max_steps,))
    written = (ids >= start) & (ids < start + count)
    return jnp.where(written, column[..., None], trace)


def judge(
    x: PyTree,
    fx: PyTree,
    gx: PyTree,
    book: Book,
    rule: StoppingRule,
    *,
    start: jax.Array,
    count: int | jax.Array = 1,
    next_count: int = 1,
    active: jax.Array | None = None,
) -> StepUpdate:
    """Judges the evaluation ``fx = f(x)`` (``gx = fx - x``) per problem by the stopping rule.

    Args:
      x, fx, gx: the iterate, ``f(x)`` and ``f(x) - x``.
      book: the bookkeeping before this evaluation.
      rule: the stopping rule.
      start: evaluations made before this one (the loop step of a one-evaluation step).
      count: evaluations this step is charged (1 for a fixed-point step; a traced int where the
        charge varies from step to step).
      next_count: evaluations the next step would cost (static): ``MAX_STEPS`` when they do not
        fit in ``max_steps``.
      active: a scalar bool, or ``None`` (true): whether this evaluation is judged at all. A loop
        whose steps are not all judged (GMRES's Arnoldi steps) passes false on the others; the
        book then comes back unchanged, but for ``+inf`` written at evaluations not yet made.

    Returns:
      The :class:`StepUpdate`. Problems that stopped earlier keep their statistics.
    """
    rdtype = book.trace.dtype
    old = book.scalars
    best_res, min_abs = old[..., BEST_RES], old[..., MIN_ABS]
    running = book.running if active is None else book.running & active
    r = residuals(x, fx, gx, rule, rdtype)
    converged = r.finite & (r.res <= rule.tol)
    # "Best" ranks by stop_mode, but only among iterates whose ABSOLUTE residual is within
    # best_abs_slack of the lowest seen: a geometrically growing sequence has a shrinking
    # relative residual and must not win. A converged iterate is always taken.
    eligible = r.finite & (r.res < best_res)
    if rule.best_abs_slack is not None:
        eligible = eligible & (r.abs <= rule.best_abs_slack * min_abs)
    improved = running & (converged | eligible)
    out_of_steps = start + count > rule.max_steps - next_count
    num_steps = old[..., NUM_STEPS] + jnp.where(running, count, 0).astype(rdtype)
    best_step = jnp.where(improved, num_steps, old[..., BEST_STEP])
    stalled = False if rule.stall_steps is None else num_steps - best_step >= rule.stall_steps
    status = _status(r, min_abs, out_of_steps, stalled, rule).astype(rdtype)
    status = jnp.where(running, status, old[..., STATUS])
    column = jnp.where(running & r.finite, r.res, jnp.asarray(jnp.inf, rdtype))
    trace = _write_trace(book.trace, column, start, count, rule.batch_ndim, running)
    new_min = jnp.where(running & r.finite, jnp.minimum(min_abs, r.abs), min_abs)
    best = [jnp.where(improved, new, old[..., i]) for i, new in enumerate((r.abs, r.rel, r.res))]
    scalars = jnp.stack([*best, new_min, status, num_steps, best_step], axis=-1)
    return StepUpdate(
        running=running,
        still=status == RUNNING,
        improved=improved,
        # f(best_x) is recorded at the first evaluation whatever it is, so f_value = f(value).
        take_fx=improved | (running & (book.num_steps == 0)),
        book=Book(scalars, trace),
        residuals=r,
    )
