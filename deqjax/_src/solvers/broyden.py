"""Broyden's ("good") quasi-Newton method (Broyden 1965) on ``g(z) = f(z) - z``, as in the DEQ
paper (Bai, Kolter & Koltun 2019, Eq. 10).

The inverse Jacobian ``H ≈ J_g^{-1}`` starts at ``-I`` (so the first step is a plain fixed-point
step) and after each accepted step ``s = x_+ - x`` (``y = g(x_+) - g(x)``) takes Broyden's good
update, in its Sherman–Morrison form:

    H <- H + (s - H y) s^T H / (s^T H y).

For a complex state every transpose is the conjugate transpose (``s^T`` above is ``s^H``, and
``s^H x = <s, x>``, :func:`deqjax._src.tree.tree_vdot`): the same update of ``C^n``, with
complex denominators and coefficients.

A finite ``memory`` keeps at most that many updates and then restarts from ``H = -I`` (the pending
update is applied to ``-I``). Each step costs one evaluation of ``f`` plus ``O(memory * d)`` work.

**Without a line search** every step is ``s_n = -H_n g_n``, and then ``s - H y = s_{n+1} ||s_n||^2
/ (s_n^T H_n y_n)`` (Kelley, *Iterative Methods for Linear and Nonlinear Equations*, SIAM 1995,
§7.3): the update is ``H_{n+1} = (I + s_{n+1} s_n^T / ||s_n||^2) H_n``, so the inverse is a product
of factors ``I + gamma_j c_j d_j^T`` whose vectors are the steps themselves (``d_j = s_j``,
``c_j = s_{j+1}``, ``gamma_j = 1 / ||s_j||^2``). Only the steps are stored (one history buffer,
one row written per step), and ``H g`` is rebuilt by Kelley's recursion over the factors made so
far, reading each stored step twice. The first update after a restart is applied to ``-I``, not to
the inverse that made its step: its factor keeps its own vector ``c_0 = (s - H y) / (s^T H y)``
(``gamma_0 = 1``). The step stored is the one made, ``x_{n+1} - x_n`` rounded to the iterate's
precision (a step below its resolution is zero and makes no update). The iterates are those of the
two-buffer form (``H = -I + sum u_i v_i^T``, one
product with ``H`` and one with ``H^T`` per step) up to rounding; a step whose denominator
``s^T H y`` is tiny or not finite, or whose ``||s||^2`` underflows, makes no update.

**With a line search** (backtracking, Armijo on ``||g||^2``, halving the step along the
quasi-Newton direction) the steps are not ``-H g``, and the two-buffer form is used: ``H = -I +
U V^T`` with ``u = (dx - H dg) / (v^T dg)`` and ``v = H^T dx``; ``H dg`` reuses the previous
direction, so one product with ``H`` and one with ``H^T`` are made per step.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import jax.scipy.linalg
import numpy as np

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
    """Broyden's final estimate ``J_g^{-1} ≈ -I + sum_{i valid} u_i v_i^H`` of ``g(z) = f(z) - z``
    (``v^H = v^T`` for a real state).

    Returned in ``Solution.inverse_estimate`` by ``Broyden(return_inverse=True)``. With
    ``g = f - I`` the inverse of the DEQ's ``I - J_f`` is ``-J_g^{-1}``. Apply it with
    :func:`inverse_matvec` / :func:`inverse_rmatvec` (the transpose, what an adjoint needs in
    JAX's convention for cotangents).

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
    """``sum_{i valid} b_i <a_i, x>`` per problem (``<a, x> = sum conj(a) x``).

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
    """``J^{-1} x`` with ``J^{-1} = -I + sum_{i valid} u_i v_i^H`` (per problem)."""
    return tree.tree_sub(_lowrank(vs, us, x, bn, valid, n_rows), x)


def _rmatvec(us: PyTree, vs: PyTree, x: PyTree, bn: int, valid: jax.Array, n_rows: Any) -> PyTree:
    """``J^{-H} x = -x + sum_{i valid} v_i (u_i^H x)`` (per problem; ``J^{-T}`` for a real
    state)."""
    return tree.tree_sub(_lowrank(us, vs, x, bn, valid, n_rows), x)


def inverse_matvec(inverse: BroydenInverse, x: PyTree) -> PyTree:
    """``J_g^{-1} x`` for the estimate ``inverse`` (per problem; ``x`` batched like it)."""
    bn = inverse.valid.ndim - 1
    return _matvec(inverse.us, inverse.vs, x, bn, inverse.valid, None)


def inverse_rmatvec(inverse: BroydenInverse, x: PyTree) -> PyTree:
    """``J_g^{-T} x`` for the estimate ``inverse`` (per problem; ``x`` batched like it).

    The plain transpose also for a complex state, ``J^{-T} x = conj(J^{-H} conj(x))``: the map a
    cotangent goes through in JAX's convention (``jax.vjp`` of ``x -> A x`` is ``A^T``), which is
    what SHINE's adjoint ``u = -J_g^{-T} g`` needs.
    """
    bn = inverse.valid.ndim - 1
    x = tree.tree_conj(x)
    return tree.tree_conj(_rmatvec(inverse.us, inverse.vs, x, bn, inverse.valid, None))


# --- with a line search: the two-buffer form -----------------------------------------------------


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
    rows: int  # buffer rows (mem, and the scratch row; rounded up to a whole block when blocked)
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
    jinv_g = _matvec(s.us, s.vs, gx, bn, r.valid, r.n_rows)  # J^{-1} g(x) before the update
    # J^{-1}(g - g_base) = J^{-1} g + direction (direction = -J^{-1} g_base), or, right after a
    # restart (J^{-1} = -I), J^{-1} g + g_base. v = J^{-H} dx, so that v^H y = dx^H J^{-1} y.
    jinv_dg = tree.tree_add(jinv_g, tree.tree_where(r.restart, s.g_base, s.direction, bn))
    v = _rmatvec(s.us, s.vs, dx, bn, r.valid, r.n_rows)
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


# --- without a line search: the steps-only form (Kelley) ------------------------------------------


class _Ring(NamedTuple):
    """The static layout of the steps-only memory.

    The step proposed at loop step ``t`` is stored in slot ``t % ring``: a segment of ``mem``
    updates (from one restart to the next) reads ``mem + 1`` consecutive steps, the first of them
    the last step of the segment before, so nothing is moved at a restart.
    """

    mem: int  # updates kept before a restart
    ring: int  # mem + 1 slots of steps
    w_slot: int  # slot ring: the vector c_0 of the first factor after a restart
    junk: int  # slot ring + 1, read by no factor: where a write that must change nothing goes
    scan: bool  # the factors in a loop of static trip count (reverse-mode differentiable)
    bn: int  # batch_ndim
    rdtype: jnp.dtype


class _Steps(NamedTuple):
    steps: PyTree  # [ring + 2, *batch, ...], slots first: the steps, then c_0, then junk
    gammas: jax.Array  # [*batch, ring + 2]: gamma_j, in the slot of the factor's d_j (0: no-op)
    head: PyTree  # dx - g_base: the last step less g at the previous iterate (a restart's s - H y)
    dg: jax.Array  # [*batch]: <dx, g_base> (a restart's -dx^H H g_base)


def _row(stack: PyTree, slot: jax.Array) -> PyTree:
    """Slot ``slot`` of every leaf of ``stack`` (slots first: a contiguous ``[*batch, ...]``
    block, read in place)."""
    return jax.tree_util.tree_map(
        lambda s: jax.lax.dynamic_index_in_dim(s, slot, 0, keepdims=False), stack
    )


def _apply_factors(s: _Steps, z: PyTree, start: jax.Array, n: jax.Array, r: _Ring) -> PyTree:
    """``F_{n-1} ... F_0 z`` per problem, ``F_j = I + gamma_j c_j d_j^H`` the factors of the
    segment whose first update was made at loop step ``start``: ``d_j`` is the step proposed at
    loop step ``start - 1 + j``, ``c_0`` the restart's own vector and ``c_j = d_{j+1}`` after it.

    Kelley's recursion, one factor at a time: a trip reads its two rows once (one reduction, one
    ``axpy``), and only the ``n`` factors made so far are read; on a loop that must be
    reverse-differentiable, ``mem - 1`` trips with the unused ones masked.
    """
    bn = r.bn

    def factor(j, z):
        d_slot = (start - 1 + j) % r.ring
        c_slot = jnp.where(j == 0, r.w_slot, (start + j) % r.ring)
        gamma = jax.lax.dynamic_index_in_dim(s.gammas, d_slot, bn, keepdims=False)
        if r.scan:
            gamma = jnp.where(j < n, gamma, 0)
        dz = tree.tree_vdot(_row(s.steps, d_slot), z, bn)
        coeff = gamma.astype(dz.dtype) * dz
        return tree.tree_axpy(coeff, _row(s.steps, c_slot), z, bn)

    return jax.lax.fori_loop(0, r.mem - 1 if r.scan else n, factor, z)


def _steps_propose(r: _Ring, s: _Steps, k: jax.Array, x: PyTree, gx: PyTree, running: jax.Array):
    """One Broyden step in the steps-only form: ``(the next iterate, the new state)``.

    With ``H`` the current inverse (``pos`` factors) and ``dx`` the last step, made as
    ``-H_prev g_base``: ``s - H y = dx - H g + H g_base`` and ``s^H H y = dx^H H g - dx^H H
    g_base``, where ``H g_base = -dx`` within a segment (``H_prev = H``) and ``-g_base`` at a
    restart (``H = -I``). The update ``H_+ = (I + u dx^H) H`` has
    ``u = (dx - H y) / (dx^H H y)``, which within a segment is ``s_new / ||dx||^2``.
    """
    bn, tiny = r.bn, jnp.asarray(jnp.finfo(r.rdtype).tiny, r.rdtype)
    pos = jnp.maximum(k - 1, 0) % r.mem  # factors in the current inverse
    start = k - pos  # the loop step of this segment's first update
    first = pos == 0  # H = -I: the first step, or a restart
    z = _apply_factors(s, tree.tree_scale(-1.0, gx, bn), start, pos, r)  # H g
    dx = _row(s.steps, (k - 1) % r.ring)  # the last step (zeros before the first)
    dz, dd = tree.tree_vdot(dx, z, bn), tree.tree_sq_norm(dx, bn).astype(r.rdtype)
    # -dx^H H g_base: ||dx||^2 within a segment, dx^H g_base after a restart.
    base = jnp.where(first, s.dg, dd.astype(dz.dtype))
    denom = dz + base  # dx^T H y
    ok = (k > 0) & (jnp.abs(denom) > tiny) & jnp.isfinite(denom) & (first | (dd > tiny))
    inv = jnp.where(ok, 1.0 / jnp.where(ok, denom, 1.0), 0.0)
    # dx - H y = (dx - g_base at a restart, else 0) - z; s_new = -(H g + u dx^T H g).
    head = tree.tree_where(first, s.head, tree.tree_zeros_like(z), bn)
    u = tree.tree_scale(inv, tree.tree_sub(head, z), bn)
    proposed = tree.tree_sub(x, tree.tree_axpy(dz, u, z, bn))
    # The step as made, rounded to the iterate's precision, is the one stored and taken: a step
    # below the iterate's resolution (at the arithmetic's floor) is zero and makes no update,
    # where the step computed would update the inverse with a secant pair the iterates do not
    # satisfy.
    step = tree.tree_sub(proposed, x)
    # The factor's coefficient, at the slot of its d_j = dx (the step proposed at loop step k - 1).
    gamma = jnp.where(ok, jnp.where(first, 1.0, 1.0 / jnp.where(ok & ~first, dd, 1.0)), 0.0)
    gamma = gamma.astype(r.rdtype)
    slot, gamma_slot, w_slot = k % r.ring, (k - 1) % r.ring, r.w_slot
    if bn == 0:  # k is batched under vmap: masked selects (row -1: none)
        steps = tree.tree_set_row(s.steps, jnp.where(running, slot, -1), step)
        steps = tree.tree_set_row(steps, jnp.where(running & first, w_slot, -1), u)
        ids = jnp.arange(r.ring + 2, dtype=jnp.int32)
        gammas = jnp.where(ids == jnp.where(running, gamma_slot, -1), gamma, s.gammas)
    else:
        # Shared slots, written in place (the reads above all come first: every write depends
        # on z). A stopped problem's slots are its inverse estimate; the shared slots are
        # written while any problem runs (see _steps_inverse), and once none runs (the last
        # steps of a check_every chunk) every write goes to the junk slot.
        live = jnp.any(running)
        slot = jnp.where(live, slot, r.junk)
        gamma_slot = jnp.where(live, gamma_slot, r.junk)
        w_slot = jnp.where(live & first, w_slot, r.junk)
        steps = tree.tree_put_row(s.steps, w_slot, u)
        steps = tree.tree_put_row(steps, slot, step)
        gammas = jax.lax.dynamic_update_index_in_dim(s.gammas, gamma, gamma_slot, bn)
        # Read back after the write: what follows then depends on the write, and XLA updates
        # the buffer and the iterate in place, where it copied them on every step.
        step = _row(steps, slot)
    # The iterate moves by the step stored (x + (x_+ - x) is x_+ except in an entry where the
    # difference rounds, by one rounding).
    next_x = tree.tree_add(x, step)
    # What the next step needs of this one beside its row, should it restart: dx - g_base and
    # dx^H g_base (its dx is this step, its g_base this g). Carrying g itself would have XLA
    # copy it on every step (it is computed before the reads of the old one).
    state = _Steps(
        steps=steps,
        gammas=gammas,
        head=tree.tree_sub(step, gx),
        dg=tree.tree_vdot(step, gx, bn),
    )
    return next_x, state


def _gather_rows(stack: PyTree, slots: jax.Array, bn: int) -> PyTree:
    """Rows ``slots`` (``[*batch, n]``, or ``[n]`` for one problem) of every leaf of ``stack``."""

    def gather(s):
        idx = slots.reshape(slots.shape + (1,) * (s.ndim - bn - 1))
        return jnp.take_along_axis(s, jnp.broadcast_to(idx, slots.shape + s.shape[bn + 1 :]), bn)

    return jax.tree_util.tree_map(gather, stack)


def _rows_products(a: PyTree, b: PyTree, bn: int) -> jax.Array:
    """``[<b_i, a_j>]_{j, i} = [b_i^H a_j]`` per problem (``[*batch, n, n]``), at full precision
    (``b_i^T a_j`` for a real state)."""
    dtype = tree.scalar_dtype(a, b)

    def gram(x, y):
        batch, n = x.shape[:bn], x.shape[bn]
        flat = lambda t: t.reshape((-1, n, int(np.prod(t.shape[bn + 1 :])))).astype(dtype)  # noqa: E731
        out = jnp.einsum("bjd,bid->bji", flat(x), tree.conj(flat(y)), precision=tree.HIGHEST)
        return out.reshape(batch + (n, n))

    leaves = jax.tree_util.tree_leaves(jax.tree_util.tree_map(gram, a, b))
    return sum(leaves[1:], leaves[0])


def _steps_inverse(r: _Ring, rows: int, end: driver.LoopEnd) -> dict[str, BroydenInverse]:
    """The estimate after each problem's last step, in the two-buffer form ``-I + U V^T``.

    The factors ``F_j = I + u_j d_j^H`` (``u_j = gamma_j c_j``) give ``u_j`` as they are and
    ``v_j = H_j^H d_j = -d_j + sum_{i<j} (u_i^H d_j) v_i``: ``V = -(I - L)^{-1} D`` with ``L`` the
    strictly lower part of ``[u_i^H d_j]_{j, i}``, one small triangular solve and two products,
    once.
    The rows are padded to ``rows`` (those of the two-buffer form's memory).
    """
    s, n, bn, mem = end.state, end.num_steps, r.bn, r.mem
    last = n - 1  # the loop step of the last evaluation
    pos = jnp.maximum(last - 1, 0) % mem
    start = last - pos
    n_factors = jnp.where(n >= 2, pos + 1, 0)
    if bn > 0:
        # A problem that stopped before the last one of its batch had the shared slots of the
        # steps until then written after its own; if they wrapped around onto its slots (or a
        # restart overwrote c_0), its estimate restarts from -I. (Slots are written only while
        # some problem runs, so a loop that checks every k steps writes no more.)
        intact = (jnp.max(n) - n) <= mem - 1 - pos
        n_factors = jnp.where(intact, n_factors, 0)
    j = jnp.arange(mem, dtype=jnp.int32).reshape((1,) * bn + (mem,))
    d_slots = (start[..., None] - 1 + j) % r.ring
    c_slots = jnp.where(j == 0, r.w_slot, (start[..., None] + j) % r.ring)
    valid = j < n_factors[..., None]  # [*batch, mem]
    gammas = jnp.where(valid, jnp.take_along_axis(s.gammas, d_slots, bn), 0)
    zeros = tree.tree_stack_zeros(s.head, mem, bn)
    steps = jax.tree_util.tree_map(lambda t: jnp.moveaxis(t, 0, bn), s.steps)  # [*batch, slots]
    ds = tree.tree_where(valid, _gather_rows(steps, d_slots, bn), zeros, bn + 1)
    us = jax.tree_util.tree_map(
        lambda c: c * gammas.reshape(gammas.shape + (1,) * (c.ndim - bn - 1)).astype(c.dtype),
        tree.tree_where(valid, _gather_rows(steps, c_slots, bn), zeros, bn + 1),
    )
    lower = jnp.tril(_rows_products(ds, us, bn), -1)
    eye = jnp.broadcast_to(jnp.eye(mem, dtype=lower.dtype), lower.shape)
    a = -jax.scipy.linalg.solve_triangular(eye - lower, eye, lower=True, unit_diagonal=True)

    def combine(d):
        batch = d.shape[:bn]
        flat = d.reshape((-1, mem, int(np.prod(d.shape[bn + 1 :]))))
        out = jnp.einsum(
            "bji,bid->bjd", a.reshape((-1, mem, mem)).astype(d.dtype), flat, precision=tree.HIGHEST
        )
        return out.reshape(batch + d.shape[bn:])

    vs = jax.tree_util.tree_map(combine, ds)
    pad = lambda t: jnp.pad(t, [(0, 0)] * bn + [(0, rows - mem)] + [(0, 0)] * (t.ndim - bn - 1))  # noqa: E731
    return {
        "inverse_estimate": BroydenInverse(
            jax.tree_util.tree_map(pad, us),
            jax.tree_util.tree_map(pad, vs),
            jnp.pad(valid, [(0, 0)] * bn + [(0, rows - mem)]),
        )
    }


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

    Without a line search the memory is one buffer of ``memory + 3`` steps (the steps-only form,
    see the module docstring); with one, two buffers of ``memory`` rows. With ``batch_ndim``
    they are batched (``[*batch, rows, ...]``).
    """

    forward_only: ClassVar[dict[str, Any]] = {
        **driver.DriverSolver.forward_only,
        "return_inverse": False,
    }

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
        # checks its stopping rule every k > 1 steps runs steps after every problem stopped: the
        # estimate keeps a row for them (index mem, never valid).
        bn = problem.batch_ndim
        scratch = bn > 0 and self.loop == "while" and resolve_check_every(self.check_every) > 1
        wanted = mem + int(scratch)
        blocked = mem > 2 * _BLOCK and self.loop != "scan"
        rows = -(-wanted // _BLOCK) * _BLOCK if blocked else wanted
        ids = jnp.arange(rows, dtype=jnp.int32)
        return _Layout(
            mem=mem,
            rows=rows,
            blocked=blocked,
            bn=bn,
            ids=ids,
            lead=(1,) * bn,
            batch_shape=problem.batch_shape,
            rdtype=problem.rdtype,
        )

    def rule(self, problem: Problem) -> driver.ProposalRule:
        lay = self._layout(problem)
        if not self.line_search:
            return self._steps_rule(problem, lay)
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

    def _steps_rule(self, problem: Problem, lay: _Layout) -> driver.ProposalRule:
        """The proposal rule without a line search (the steps-only form)."""
        z0, bn = problem.z0, problem.batch_ndim
        r = _Ring(
            mem=lay.mem,
            ring=lay.mem + 1,
            w_slot=lay.mem + 1,
            junk=lay.mem + 2,
            scan=self.loop == "scan",
            bn=bn,
            rdtype=problem.rdtype,
        )
        state0 = _Steps(
            steps=tree.tree_stack_zeros(z0, r.ring + 2),
            gammas=jnp.zeros(problem.batch_shape + (r.ring + 2,), problem.rdtype),
            head=tree.tree_zeros_like(z0),
            dg=jnp.zeros(problem.batch_shape, tree.scalar_dtype(z0)),
        )

        def propose(s, k, x, fx, gx, gx_sq, running):
            del fx, gx_sq
            return _steps_propose(r, s, k, x, gx, running)

        finish = (lambda end: _steps_inverse(r, lay.rows, end)) if self.return_inverse else None
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
