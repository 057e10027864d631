"""Broyden's ("good") quasi-Newton method (Broyden 1965) on ``g(z) = f(z) - z``, as in the DEQ
paper (Bai, Kolter & Koltun 2019, Eq. 10).

The inverse Jacobian of ``g`` is kept in low-rank form ``J^{-1} ≈ -I + U V^T`` (so the first step
is a plain fixed-point step) and refreshed after each accepted step by the Sherman–Morrison form of
Broyden's good update:

    J^{-1} <- J^{-1} + (dx - J^{-1} dg) dx^T J^{-1} / (dx^T J^{-1} dg),

i.e. ``u = (dx - J^{-1} dg) / (v^T dg)`` and ``v = J^{-T} dx``. Each step costs one evaluation of
``f`` plus ``O(memory * d)`` work; ``J^{-1} dg`` reuses the previous direction, so only one product
with ``J^{-1}`` and one with ``J^{-T}`` are made per step. An optional backtracking line search
(Armijo on ``||g||^2``) halves the step along the quasi-Newton direction.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from deqjax._src import checks, tree
from deqjax._src.solvers import driver
from deqjax._src.solvers.loop import resolve_check_every
from deqjax._src.solvers.problem import Problem
from deqjax._src.solvers.solution import Solution

PyTree = Any

# Backtracking line search: accept step s when ||g(x + s d)||^2 <= (1 - _ARMIJO_C * s) ||g(x)||^2,
# else halve s, at most _MAX_BACKTRACKS times per direction.
_ARMIJO_C = 1e-4
_MAX_BACKTRACKS = 5

# memory=None (or a memory above 2 blocks) on a while/python loop: the low-rank products read the
# buffers in blocks of this many rows, only up to the last filled row, so a step costs
# O(rows filled) and not O(max_steps).
_BLOCK = 16


class BroydenInverse(NamedTuple):
    """Broyden's final estimate ``J_g^{-1} ≈ -I + sum_{i valid} u_i v_i^T`` of ``g(z) = f(z) - z``.

    Returned in ``Solution.inverse_estimate`` by ``Broyden(return_inverse=True)``. With
    ``g = f - I`` the inverse of the DEQ's ``I - J_f`` is ``-J_g^{-1}``. Apply it with
    :func:`inverse_matvec` / :func:`inverse_rmatvec` (the transpose, what an adjoint needs).

    Attributes:
      us: pytree like ``z0`` with leaves ``[*batch, rows, ...]``: the columns ``u_i``.
      vs: like ``us``: the rows ``v_i^T``.
      valid: bool ``[*batch, rows]``: which rows make up the current estimate (a limited-memory
        restart masks the older rows out).
    """

    us: PyTree
    vs: PyTree
    valid: jax.Array


def _lowrank(
    a_stack: PyTree, b_stack: PyTree, x: PyTree, bn: int, valid: jax.Array, n_rows: Any
) -> PyTree:
    """``sum_{i valid} b_i <a_i, x>`` per problem.

    ``n_rows`` is None (read every row) or a traced int bound on the rows that can be valid; then
    the rows are read block by block up to it (the buffers have a multiple of ``_BLOCK`` rows).
    """
    if n_rows is None:
        coeffs = jnp.where(valid, tree.tree_rows_vdot(a_stack, x, bn), 0)
        return tree.tree_combine_rows(coeffs, b_stack, bn)

    def block(i, acc):
        start = i * _BLOCK
        rows = lambda s: jax.lax.dynamic_slice_in_dim(s, start, _BLOCK, bn)  # noqa: E731
        a_blk = jax.tree_util.tree_map(rows, a_stack)
        b_blk = jax.tree_util.tree_map(rows, b_stack)
        v_blk = jax.lax.dynamic_slice_in_dim(valid, start, _BLOCK, valid.ndim - 1)
        coeffs = jnp.where(v_blk, tree.tree_rows_vdot(a_blk, x, bn), 0)
        return tree.tree_add(acc, tree.tree_combine_rows(coeffs, b_blk, bn))

    n_blocks = (n_rows + _BLOCK - 1) // _BLOCK
    return jax.lax.fori_loop(0, n_blocks, block, tree.tree_zeros_like(x))


def _matvec(us: PyTree, vs: PyTree, x: PyTree, bn: int, valid: jax.Array, n_rows: Any) -> PyTree:
    """``J^{-1} x`` with ``J^{-1} = -I + sum_{i valid} u_i v_i^T`` (per problem)."""
    return tree.tree_sub(_lowrank(vs, us, x, bn, valid, n_rows), x)


def _rmatvec(us: PyTree, vs: PyTree, x: PyTree, bn: int, valid: jax.Array, n_rows: Any) -> PyTree:
    """``J^{-T} x = -x + sum_{i valid} v_i (u_i^T x)`` (per problem)."""
    return tree.tree_sub(_lowrank(us, vs, x, bn, valid, n_rows), x)


def inverse_matvec(inverse: BroydenInverse, x: PyTree) -> PyTree:
    """``J_g^{-1} x`` for the estimate ``inverse`` (per problem; ``x`` batched like it)."""
    bn = inverse.valid.ndim - 1
    return _matvec(inverse.us, inverse.vs, x, bn, inverse.valid, None)


def inverse_rmatvec(inverse: BroydenInverse, x: PyTree) -> PyTree:
    """``J_g^{-T} x`` for the estimate ``inverse`` (per problem; ``x`` batched like it)."""
    bn = inverse.valid.ndim - 1
    return _rmatvec(inverse.us, inverse.vs, x, bn, inverse.valid, None)


class _State(NamedTuple):
    us: PyTree  # [memory, ...] ([*batch, memory, ...]) columns u_i of the low-rank inverse part
    vs: PyTree  # like us: rows v_i^T
    num_updates: jax.Array  # int32 [*batch]: updates made (line search: the row is this % memory)
    x_base: PyTree  # the last accepted iterate
    g_base: PyTree  # g(x_base)
    direction: PyTree  # the quasi-Newton step -J^{-1} g(x_base) from x_base
    step: jax.Array  # [*batch]: line-search step size s of the iterate being evaluated
    backtracks: jax.Array  # int32 [*batch]: halvings made along the current direction


class _Layout(NamedTuple):
    """The static shape of the low-rank memory (and the arrays that index it)."""

    mem: int  # updates kept before a restart
    rows: int  # buffer rows (mem, and the scratch row; rounded up to a whole block when blocked)
    scratch: bool  # row mem takes the batch-native writes of steps after every problem stopped
    blocked: bool  # read only the filled rows, block by block
    line_search: bool
    bn: int  # batch_ndim
    ids: jax.Array  # int32 [rows]
    lead: tuple[int, ...]  # (1,) * bn
    batch_shape: tuple[int, ...]
    rdtype: jnp.dtype


class _Rows(NamedTuple):
    """Which rows hold the current inverse, and where this step's update goes."""

    pos: jax.Array  # the row of this update (shared, or [*batch] with a line search)
    restart: jax.Array  # the memory is full: the inverse restarts from -I
    valid: jax.Array  # bool [*batch, rows] (or lead + (rows,))
    n_rows: Any  # a bound on the filled rows (blocked reads), else None


def _current_rows(s: _State, k: jax.Array, lay: _Layout) -> _Rows:
    """The rows of the current inverse.

    When the memory is full the inverse restarts from -I (rows are masked out, not cleared): each
    stored pair (u_i, v_i) was derived from the inverse made of the pairs before it, so evicting
    only the oldest (a ring buffer) leaves an inconsistent inverse; on a hard d=512,
    rho(W)=1.5 problem a ring of 10 left 23% of a batch unconverged after 100 steps, restarting
    converges all of it in 80.
    """
    if lay.line_search:
        pos = s.num_updates % lay.mem  # [*batch]: accepted steps differ per problem
        restart = (pos == 0) & (s.num_updates > 0)
        valid = lay.ids.reshape(lay.lead + (lay.rows,)) < pos[..., None]
        return _Rows(pos, restart, valid, jnp.max(pos) if lay.blocked else None)
    # Every step after the first is an accepted step: the position (k - 1) % mem is shared.
    pos = jnp.maximum(k - 1, 0) % lay.mem
    restart = (pos == 0) & (k > 1)
    valid = (lay.ids < pos).reshape(lay.lead + (lay.rows,))
    return _Rows(pos, restart, valid, pos if lay.blocked else None)


def _good_update(s: _State, r: _Rows, k: jax.Array, x: PyTree, gx: PyTree, lay: _Layout):
    """Broyden's good update from ``(x_base, g_base)`` to ``(x, g(x))``: ``(u, v, ok, J^{-1} g)``
    (``u = v = 0`` where the denominator is tiny or not finite: the update is skipped)."""
    bn = lay.bn
    dx = tree.tree_sub(x, s.x_base)
    jinv_g = _matvec(s.us, s.vs, gx, bn, r.valid, r.n_rows)  # J^{-1} g(x) before the update
    # J^{-1}(g - g_base) = J^{-1} g + direction (direction = -J^{-1} g_base), or, right after a
    # restart (J^{-1} = -I), J^{-1} g + g_base.
    jinv_dg = tree.tree_add(jinv_g, tree.tree_where(r.restart, s.g_base, s.direction, bn))
    v = _rmatvec(s.us, s.vs, dx, bn, r.valid, r.n_rows)
    denom = tree.tree_vdot(v, tree.tree_sub(gx, s.g_base), bn)
    tiny = jnp.asarray(jnp.finfo(lay.rdtype).tiny, lay.rdtype)
    ok = (k > 0) & (jnp.abs(denom) > tiny) & jnp.isfinite(denom)
    inv_denom = jnp.where(ok, 1.0 / jnp.where(ok, denom, 1.0), 0.0)
    u = tree.tree_scale(inv_denom, tree.tree_sub(dx, jinv_dg), bn)
    v = tree.tree_where(ok, v, tree.tree_zeros_like(v), bn)
    return u, v, ok, jinv_g


def _store(s: _State, r: _Rows, k, accept, ok, running, u: PyTree, v: PyTree, lay: _Layout):
    """``(us, vs, num_updates)`` with the update ``(u, v)`` stored at row ``r.pos``, for the
    problems still ``running``: a stopped problem's rows are its inverse estimate, left alone
    (with a batch, the shared row is written while any problem runs; see :func:`_inverse`)."""
    if lay.line_search:
        # A per-problem row, written by a masked select; a rejected trial writes to row -1, which
        # tree_set_row ignores. A skipped update (tiny or non-finite denominator) writes zero rows
        # (u = v = 0 adds nothing to J^{-1}).
        write = accept & (k > 0) & running
        us = tree.tree_set_row(s.us, jnp.where(write, r.pos, -1), u, lay.bn)
        vs = tree.tree_set_row(s.vs, jnp.where(write, r.pos, -1), v, lay.bn)
        return us, vs, s.num_updates + write.astype(jnp.int32)
    if lay.bn == 0:  # k is batched under vmap: a masked select (row -1: none)
        row = jnp.where(running, r.pos, -1)
        us, vs = tree.tree_set_row(s.us, row, u), tree.tree_set_row(s.vs, row, v)
    else:
        # The shared row, in place, after every read of the buffers. u is computed from all of
        # them; v is written where u is finite (where it is not, the row records u's non-finite
        # entries: the inverse is broken either way) so that it depends on them too. Without
        # that, XLA may schedule a write before a read, and then copies a buffer every step.
        # With check_every > 1, once no problem runs (the last steps of a chunk) the update goes
        # to the scratch row (index mem, never valid), leaving every problem's rows as they are.
        row = jnp.where(jnp.any(running), r.pos, lay.mem) if lay.scratch else r.pos
        v = tree.tree_where_finite(u, v)
        us = tree.tree_put_row(s.us, row, u, lay.bn)
        vs = tree.tree_put_row(s.vs, row, v, lay.bn)
    return us, vs, s.num_updates + (ok & running).astype(jnp.int32)


def _armijo_accepts(s: _State, k: jax.Array, gx: PyTree, bn: int) -> jax.Array:
    """The line search's decision on the trial ``x`` (always accepted at the first step)."""
    g2, g2_base = tree.tree_vdot(gx, gx, bn), tree.tree_vdot(s.g_base, s.g_base, bn)
    sufficient = g2 <= (1.0 - _ARMIJO_C * s.step) * g2_base
    return (k == 0) | sufficient | (s.backtracks >= _MAX_BACKTRACKS) | ~jnp.isfinite(g2)


def _propose(lay: _Layout, s: _State, k: jax.Array, x: PyTree, gx: PyTree, running: jax.Array):
    """One Broyden step: the next iterate and state (a rejected line-search trial halves the step
    from ``x_base`` instead)."""
    bn = lay.bn
    accept = _armijo_accepts(s, k, gx, bn) if lay.line_search else jnp.asarray(True)
    r = _current_rows(s, k, lay)
    u, v, ok, jinv_g = _good_update(s, r, k, x, gx, lay)
    us, vs, num_updates = _store(s, r, k, accept, ok, running, u, v, lay)
    # New direction -J_new^{-1} g with J_new^{-1} g = J^{-1} g + u (v^T g).
    direction = tree.tree_scale(-1.0, tree.tree_axpy(tree.tree_vdot(v, gx, bn), u, jinv_g, bn), bn)
    if not lay.line_search:
        # Every step is accepted (step stays 1, backtracks 0).
        accepted = s._replace(
            us=us,
            vs=vs,
            num_updates=num_updates,
            x_base=x,
            g_base=gx,
            direction=direction,
        )
        return tree.tree_add(x, direction), accepted
    half = s.step / 2
    # Only the small per-problem fields are selected; us/vs were written (or not) above.
    pick = lambda a, b: tree.tree_where(accept, a, b, bn)  # noqa: E731
    new_state = s._replace(
        us=us,
        vs=vs,
        num_updates=num_updates,
        x_base=pick(x, s.x_base),
        g_base=pick(gx, s.g_base),
        direction=pick(direction, s.direction),
        step=jnp.where(accept, jnp.ones(lay.batch_shape, lay.rdtype), half),
        backtracks=jnp.where(accept, 0, s.backtracks + 1).astype(jnp.int32),
    )
    next_x = pick(tree.tree_add(x, direction), tree.tree_axpy(half, s.direction, s.x_base, bn))
    return next_x, new_state


def _inverse(lay: _Layout, end: driver.LoopEnd) -> dict[str, BroydenInverse]:
    """The estimate after each problem's last step (``num_steps`` evaluations of its own)."""
    s, num_steps = end.state, end.num_steps
    us, vs, mem = s.us, s.vs, lay.mem
    ids = lay.ids.reshape(lay.lead + (lay.rows,))
    if lay.line_search:
        # After u updates the current rows are 0 .. (u - 1) % mem (the last restart on).
        n = jnp.where(s.num_updates > 0, (s.num_updates - 1) % mem + 1, 0)
        return {"inverse_estimate": BroydenInverse(us, vs, ids < n[..., None])}
    # The update of a problem's last step (index num_steps - 1) is in row (num_steps - 2) % mem
    # (row 0 for a single step), and its current rows are 0 .. that row.
    last = jnp.maximum(num_steps - 2, 0) % mem
    if lay.bn > 0:
        # A problem that stopped before the last one of its batch had the shared rows of the
        # steps until then written after its own rows (zero rows: its iterate no longer moves);
        # if they wrapped around onto its rows, its estimate restarts from -I. (Rows are written
        # only while some problem runs, so a loop that checks every k steps writes no more.)
        intact = (jnp.max(num_steps) - num_steps) <= mem - 1 - last
        last = jnp.where(intact, last, -1)
    return {"inverse_estimate": BroydenInverse(us, vs, ids <= last[..., None])}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Broyden(driver.DriverSolver):
    """Broyden's good method on ``g(z) = f(z) - z``, as a solver object.

    Fields: those of :class:`~deqjax._src.solvers.options.Options` and
    :class:`~deqjax._src.solvers.options.DriverOptions` (``max_steps`` counts line-search trials
    too), and

    Attributes:
      memory: ``None`` keeps every update (``max_steps`` slots); an int keeps at most ``memory``
        updates and restarts from ``J^{-1} = -I`` when they are used up (limited-memory Broyden;
        a restart keeps the inverse consistent, where evicting the oldest update does not).
      line_search: backtracking on ``||g||^2`` (Armijo, halving up to 5 times); each trial is an
        evaluation of ``f`` and counts in ``num_steps`` and ``trace``.
      return_inverse: also return the final inverse-Jacobian estimate in
        ``Solution.inverse_estimate`` (a :class:`BroydenInverse`: ``2 * rows`` iterate-sized
        buffers, ``rows`` = ``memory`` or ``max_steps``, and a scratch row in a batch-native
        solve with ``check_every > 1``), for :class:`~deqjax.ShineAdjoint`. It
        is the estimate after the problem's last step. In a batch-native solve with a finite
        ``memory``, a problem that stopped while the batch ran on long enough for the shared
        memory slot to wrap onto its rows loses them (its estimate becomes ``J_g^{-1} ≈ -I``);
        otherwise (always with ``memory=None``, and under ``vmap``) it equals the per-problem
        solve's estimate.

    With ``batch_ndim``, the low-rank inverse updates are batched (one ``[*batch, memory, ...]``
    buffer per factor).
    """

    memory: int | None = None
    line_search: bool = False
    return_inverse: bool = False

    def check(self) -> None:
        super().check()
        checks.check_int(self.memory, "memory", allow_none=True)
        checks.check_bool(self.line_search, "line_search")
        checks.check_bool(self.return_inverse, "return_inverse")

    def _layout(self, problem: Problem) -> _Layout:
        mem = self.max_steps if self.memory is None else self.memory
        # Blocked reads (only the filled rows) for a long memory on a loop that need not be
        # reverse-differentiable (lax.scan needs a static trip count). A batch-native loop that
        # checks its stopping rule every k > 1 steps runs steps after every problem stopped: their
        # updates go to one more row (index mem, never valid), so no problem's estimate changes.
        bn = problem.batch_ndim
        scratch = bn > 0 and self.loop == "while" and resolve_check_every(self.check_every) > 1
        wanted = mem + int(scratch)
        blocked = mem > 2 * _BLOCK and self.loop != "scan"
        rows = -(-wanted // _BLOCK) * _BLOCK if blocked else wanted
        ids = jnp.arange(rows, dtype=jnp.int32)
        return _Layout(
            mem=mem,
            rows=rows,
            scratch=scratch,
            blocked=blocked,
            line_search=self.line_search,
            bn=bn,
            ids=ids,
            lead=(1,) * bn,
            batch_shape=problem.batch_shape,
            rdtype=problem.rdtype,
        )

    def rule(self, problem: Problem) -> driver.ProposalRule:
        lay = self._layout(problem)
        z0, bn = problem.z0, problem.batch_ndim
        zeros = tree.tree_zeros_like(z0)
        state0 = _State(
            us=tree.tree_stack_zeros(z0, lay.rows, bn),
            vs=tree.tree_stack_zeros(z0, lay.rows, bn),
            num_updates=jnp.zeros(lay.batch_shape, jnp.int32),
            x_base=zeros,
            g_base=zeros,
            direction=zeros,
            step=jnp.ones(lay.batch_shape, lay.rdtype),
            backtracks=jnp.zeros(lay.batch_shape, jnp.int32),
        )

        def propose(s, k, x, fx, gx, gx_sq, running):
            del fx, gx_sq
            return _propose(lay, s, k, x, gx, running)

        finish = (lambda end: _inverse(lay, end)) if self.return_inverse else None
        return driver.ProposalRule(propose, state0, finish=finish)


def broyden(f: Callable[[PyTree], PyTree], z0: PyTree, /, **options) -> Solution:
    """Solves ``z = f(z)`` as the root of ``g(z) = f(z) - z`` by Broyden's method:
    ``Broyden(**options)(f, z0)``.

    Args:
      f: the map ``Z -> Z`` over any pytree of float arrays (``(z, aux)`` with ``has_aux``).
      z0: initial iterate.
      **options: the fields of :class:`~deqjax.solvers.Broyden` (``max_steps=50``, ``tol=1e-4``,
        ``stop_mode="rel"``, ``memory=None``, ``line_search=False``, ...).

    Returns:
      A :class:`~deqjax.solvers.Solution` (fields with the leading batch axes under
      ``batch_ndim``); its value is the best iterate and its ``f_value`` is ``f(value)``; with
      ``return_inverse=True`` its ``inverse_estimate`` is a :class:`BroydenInverse`.

    Raises:
      ValueError: for invalid arguments (named in the message).
    """
    return Broyden(**options)(f, z0)
