"""Broyden's method with a line search: the two-buffer form (a form of
:class:`~deqjax.solvers.Broyden`, chosen by ``line_search=True``).

Backtracking, Armijo on ``||g||^2``: a trial ``x_base + s d`` along the quasi-Newton direction
``d = -H g(x_base)`` is accepted when ``||g||^2 <= (1 - c s) ||g(x_base)||^2``, else the step
``s`` is halved (at most 5 times per direction); each trial is an evaluation of ``f``. The steps
are then not ``-H g``, so the inverse is kept as it is: ``H = -I + U V^H`` (two buffers of
``memory`` rows), with Broyden's good update (Broyden 1965; Bai, Kolter & Koltun 2019, Eq. 10)
from ``(x_base, g_base)`` to each accepted ``(x, g(x))``: ``u = (dx - H dg) / (v^H dg)``,
``v = H^H dx``. ``H dg`` reuses the previous direction, so one product with ``H`` and one with
``H^H`` are made per step (:mod:`deqjax._src.solvers.broyden_inverse`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from deqjax._src import tree
from deqjax._src.solvers import broyden_inverse, driver
from deqjax._src.solvers.broyden_inverse import BroydenInverse
from deqjax._src.solvers.problem import Problem

PyTree = Any

# Backtracking line search: accept step s when ||g(x + s d)||^2 <= (1 - _ARMIJO_C * s) ||g(x)||^2,
# else halve s, at most _MAX_BACKTRACKS times per direction.
_ARMIJO_C = 1e-4
_MAX_BACKTRACKS = 5


class _State(NamedTuple):
    us: PyTree  # [memory, ...] ([*batch, memory, ...]) columns u_i of the low-rank inverse part
    vs: PyTree  # like us: rows v_i^T
    num_updates: jax.Array  # int32 [*batch]: accepted updates made (the row is this % memory)
    x_base: PyTree  # the last accepted iterate
    g_base: PyTree  # g(x_base)
    direction: PyTree  # the quasi-Newton step -J^{-1} g(x_base) from x_base
    step: jax.Array  # [*batch]: line-search step size s of the iterate being evaluated
    backtracks: jax.Array  # int32 [*batch]: halvings made along the current direction


class _Layout(NamedTuple):
    """The static shape of the low-rank memory (and the arrays that index it)."""

    mem: int  # updates kept before a restart
    rows: int  # buffer rows (see broyden_inverse.Memory)
    blocked: bool  # read only the filled rows, block by block
    bn: int  # batch_ndim
    ids: jax.Array  # int32 [rows]
    lead: tuple[int, ...]  # (1,) * bn
    batch_shape: tuple[int, ...]
    rdtype: jnp.dtype


class _Rows(NamedTuple):
    """Which rows hold the current inverse, and where this step's update goes."""

    pos: jax.Array  # [*batch]: the row of this update (accepted steps differ per problem)
    restart: jax.Array  # the memory is full: the inverse restarts from -I
    valid: jax.Array  # bool [*batch, rows] (or lead + (rows,))
    n_rows: Any  # a bound on the filled rows (blocked reads), else None


def _current_rows(s: _State, lay: _Layout) -> _Rows:
    """The rows of the current inverse.

    When the memory is full the inverse restarts from -I (rows are masked out, not cleared): each
    stored pair (u_i, v_i) was derived from the inverse made of the pairs before it, so evicting
    only the oldest (a ring buffer) leaves an inconsistent inverse; on a hard d=512,
    rho(W)=1.5 problem a ring of 10 left 23% of a batch unconverged after 100 steps, restarting
    converges all of it in 80.
    """
    pos = s.num_updates % lay.mem  # [*batch]: accepted steps differ per problem
    restart = (pos == 0) & (s.num_updates > 0)
    valid = lay.ids.reshape(lay.lead + (lay.rows,)) < pos[..., None]
    return _Rows(pos, restart, valid, jnp.max(pos) if lay.blocked else None)


def _good_update(s: _State, r: _Rows, k: jax.Array, x: PyTree, gx: PyTree, lay: _Layout):
    """Broyden's good update from ``(x_base, g_base)`` to ``(x, g(x))``: ``(u, v, J^{-1} g)``
    (``u = v = 0`` where the denominator is tiny or not finite: the update is skipped)."""
    bn = lay.bn
    dx = tree.tree_sub(x, s.x_base)
    # J^{-1} g(x) before the update.
    jinv_g = broyden_inverse.matvec(s.us, s.vs, gx, bn, r.valid, r.n_rows)
    # J^{-1}(g - g_base) = J^{-1} g + direction (direction = -J^{-1} g_base), or, right after a
    # restart (J^{-1} = -I), J^{-1} g + g_base. v = J^{-H} dx, so that v^H y = dx^H J^{-1} y.
    jinv_dg = tree.tree_add(jinv_g, tree.tree_where(r.restart, s.g_base, s.direction, bn))
    v = broyden_inverse.rmatvec(s.us, s.vs, dx, bn, r.valid, r.n_rows)
    denom = tree.tree_vdot(v, tree.tree_sub(gx, s.g_base), bn)
    tiny = jnp.asarray(jnp.finfo(lay.rdtype).tiny, lay.rdtype)
    ok = (k > 0) & (jnp.abs(denom) > tiny) & jnp.isfinite(denom)
    inv_denom = jnp.where(ok, 1.0 / jnp.where(ok, denom, 1.0), 0.0)
    u = tree.tree_scale(inv_denom, tree.tree_sub(dx, jinv_dg), bn)
    v = tree.tree_where(ok, v, tree.tree_zeros_like(v), bn)
    return u, v, jinv_g


def _armijo_accepts(s: _State, k: jax.Array, gx: PyTree, bn: int) -> jax.Array:
    """The line search's decision on the trial ``x`` (always accepted at the first step)."""
    g2, g2_base = tree.tree_sq_norm(gx, bn), tree.tree_sq_norm(s.g_base, bn)
    sufficient = g2 <= (1.0 - _ARMIJO_C * s.step) * g2_base
    return (k == 0) | sufficient | (s.backtracks >= _MAX_BACKTRACKS) | ~jnp.isfinite(g2)


def _propose(lay: _Layout, s: _State, k: jax.Array, x: PyTree, gx: PyTree, running: jax.Array):
    """One Broyden step with a line search: the next iterate and state (a rejected trial halves
    the step from ``x_base`` instead)."""
    bn = lay.bn
    accept = _armijo_accepts(s, k, gx, bn)
    r = _current_rows(s, lay)
    u, v, jinv_g = _good_update(s, r, k, x, gx, lay)
    # A per-problem row, written by a masked select; a rejected trial (or a stopped problem:
    # its rows are its inverse estimate) writes to row -1, which tree_set_row ignores. A skipped
    # update (tiny or non-finite denominator) writes zero rows (u = v = 0 adds nothing).
    write = accept & (k > 0) & running
    us = tree.tree_set_row(s.us, jnp.where(write, r.pos, -1), u, bn)
    vs = tree.tree_set_row(s.vs, jnp.where(write, r.pos, -1), v, bn)
    # New direction -J_new^{-1} g with J_new^{-1} g = J^{-1} g + u (v^T g).
    direction = tree.tree_scale(-1.0, tree.tree_axpy(tree.tree_vdot(v, gx, bn), u, jinv_g, bn), bn)
    half = s.step / 2
    # Only the small per-problem fields are selected; us/vs were written (or not) above.
    pick = lambda a, b: tree.tree_where(accept, a, b, bn)  # noqa: E731
    new_state = s._replace(
        us=us,
        vs=vs,
        num_updates=s.num_updates + write.astype(jnp.int32),
        x_base=pick(x, s.x_base),
        g_base=pick(gx, s.g_base),
        direction=pick(direction, s.direction),
        step=jnp.where(accept, jnp.ones(lay.batch_shape, lay.rdtype), half),
        backtracks=jnp.where(accept, 0, s.backtracks + 1).astype(jnp.int32),
    )
    next_x = pick(tree.tree_add(x, direction), tree.tree_axpy(half, s.direction, s.x_base, bn))
    return next_x, new_state


def _inverse(lay: _Layout, end: driver.LoopEnd) -> dict[str, BroydenInverse]:
    """The estimate after each problem's last step: after u accepted updates the current rows
    are 0 .. (u - 1) % mem (the last restart on)."""
    s, mem = end.state, lay.mem
    ids = lay.ids.reshape(lay.lead + (lay.rows,))
    n = jnp.where(s.num_updates > 0, (s.num_updates - 1) % mem + 1, 0)
    return {"inverse_estimate": BroydenInverse(s.us, s.vs, ids < n[..., None])}


def proposal_rule(
    problem: Problem, memory: broyden_inverse.Memory, *, return_inverse: bool
) -> driver.ProposalRule:
    """The rule of Broyden's method with a line search on ``problem``.

    Args:
      problem: the checked problem.
      memory: the buffers' shape (:func:`deqjax._src.solvers.broyden_inverse.memory_of`).
      return_inverse: add the final estimate to the Solution (``inverse_estimate``).
    """
    z0, bn = problem.z0, problem.batch_ndim
    lay = _Layout(
        mem=memory.mem,
        rows=memory.rows,
        blocked=memory.blocked,
        bn=bn,
        ids=jnp.arange(memory.rows, dtype=jnp.int32),
        lead=(1,) * bn,
        batch_shape=problem.batch_shape,
        rdtype=problem.rdtype,
    )
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

    finish = (lambda end: _inverse(lay, end)) if return_inverse else None
    return driver.ProposalRule(propose, state0, finish=finish)
