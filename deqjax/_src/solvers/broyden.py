"""Broyden's ("good") quasi-Newton method on g(z) = f(z) - z, as in the DEQ paper (Eq. 10)."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from deqjax._src import checks, tree
from deqjax._src.solvers import base

PyTree = Any

# Backtracking line search: accept step s when ||g(x + s d)||^2 <= (1 - _ARMIJO_C * s) ||g(x)||^2,
# else halve s, at most _MAX_BACKTRACKS times per direction.
_ARMIJO_C = 1e-4
_MAX_BACKTRACKS = 5


class _BroydenState(NamedTuple):
    us: PyTree  # [memory, ...] ([*batch, memory, ...]) columns u_i of the low-rank inverse part
    vs: PyTree  # like us: rows v_i^T
    num_updates: jax.Array  # int32 [*batch]: updates made (line search: the row is this % memory)
    x_base: PyTree  # the last accepted iterate
    g_base: PyTree  # g(x_base)
    direction: PyTree  # the quasi-Newton step -J^{-1} g(x_base) from x_base
    step: jax.Array  # [*batch]: line-search step size s of the iterate being evaluated
    backtracks: jax.Array  # int32 [*batch]: halvings made along the current direction
    pending: Any  # batch_ndim > 0, no line search: (u, v) of the last update, written next step


class BroydenInverse(NamedTuple):
    """Broyden's final estimate ``J_g^{-1} ≈ -I + sum_{i valid} u_i v_i^T`` of ``g(z) = f(z) - z``.

    Returned in ``Solution.inverse_estimate`` by ``broyden(..., return_inverse=True)``. With
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


def inverse_matvec(inverse: BroydenInverse, x: PyTree) -> PyTree:
    """``J_g^{-1} x`` for the estimate ``inverse`` (per problem; ``x`` batched like it)."""
    bn = inverse.valid.ndim - 1
    return _matvec(inverse.us, inverse.vs, x, bn, inverse.valid, None)


def inverse_rmatvec(inverse: BroydenInverse, x: PyTree) -> PyTree:
    """``J_g^{-T} x`` for the estimate ``inverse`` (per problem; ``x`` batched like it)."""
    bn = inverse.valid.ndim - 1
    return _rmatvec(inverse.us, inverse.vs, x, bn, inverse.valid, None)


# memory=None (or a memory above 2 blocks) on a while/python loop: the low-rank products read the
# buffers in blocks of this many rows, only up to the last filled row, so a step costs
# O(rows filled) and not O(max_steps).
_BLOCK = 16


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


def broyden(
    f: Callable[[PyTree], PyTree],
    z0: PyTree,
    *,
    max_steps: int = 50,
    tol: float = 1e-4,
    stop_mode: str = "rel",
    memory: int | None = None,
    line_search: bool = False,
    divergence_factor: float = 1e4,
    loop: str = "while",
    atol: float | None = None,
    batch_ndim: int = 0,
    sample_steps: tuple[int, ...] | None = None,
    return_inverse: bool = False,
) -> base.Solution:
    """Solves ``z = f(z)`` as the root of ``g(z) = f(z) - z`` by Broyden's method.

    The inverse Jacobian of ``g`` is kept in low-rank form ``J^{-1} ≈ -I + U V^T`` (so the first
    step is a plain fixed-point step) and refreshed after each accepted step by the
    Sherman–Morrison form of Broyden's good update (DEQ paper, Eq. 10):

        J^{-1} <- J^{-1} + (dx - J^{-1} dg) dx^T J^{-1} / (dx^T J^{-1} dg),

    i.e. ``u = (dx - J^{-1} dg) / (v^T dg)`` and ``v = J^{-T} dx``. Each step costs one evaluation
    of ``f`` plus ``O(memory * d)`` work; ``J^{-1} dg`` reuses the previous direction, so only one
    product with ``J^{-1}`` and one with ``J^{-T}`` are made per step.

    Args:
      f: the map ``Z -> Z`` over any pytree of float arrays.
      z0: initial iterate.
      max_steps: maximum number of evaluations of ``f`` (line-search trials included).
      tol: stop when the residual (by ``stop_mode``) is ``<= tol``.
      stop_mode: ``"abs"``, ``"rel"`` or ``"mixed"`` (see
        :func:`~deqjax.solvers.fixed_point_iteration`).
      memory: ``None`` keeps every update (``max_steps`` slots); an int keeps at most ``memory``
        updates and restarts from ``J^{-1} = -I`` when they are used up (limited-memory Broyden;
        a restart keeps the inverse consistent, where evicting the oldest update does not).
      line_search: backtracking on ``||g||^2`` (Armijo, halving up to 5 times); each trial is an
        evaluation of ``f`` and counts in ``num_steps`` and ``trace``.
      divergence_factor: stop with ``DIVERGED`` when the absolute residual exceeds this multiple
        of the lowest absolute residual seen (in every ``stop_mode``).
      loop: ``"while"`` (default), ``"scan"`` (reverse-differentiable) or ``"python"`` (debugging).
      atol: absolute tolerance of ``stop_mode="mixed"`` (``None``: equal to ``tol``).
      batch_ndim: leading axes of ``z0``'s leaves that index independent problems; the low-rank
        inverse updates are batched (one ``[*batch, memory, ...]`` buffer per factor).
      sample_steps: ``None``, or loop steps ``s`` in ``[0, max_steps]`` whose iterates ``x_s``
        are returned in ``Solution.samples`` (for the fixed-point correction loss; see
        :func:`deqjax.correction_states`).

      return_inverse: also return the final inverse-Jacobian estimate in
        ``Solution.inverse_estimate`` (a :class:`BroydenInverse`: ``2 * rows`` iterate-sized
        buffers, ``rows`` = ``memory`` or ``max_steps``), for :class:`~deqjax.ShineAdjoint`. It
        is the estimate after the problem's last step. In a batch-native solve with a finite
        ``memory``, a problem that stopped while the batch ran on long enough for the shared
        memory slot to wrap onto its rows loses them (its estimate becomes ``J_g^{-1} ≈ -I``);
        otherwise (always with ``memory=None``, and under ``vmap``) it equals the per-problem
        solve's estimate.

    Returns:
      A :class:`~deqjax.solvers.Solution` (fields with the leading batch axes under
      ``batch_ndim``); its value is the best iterate (lowest residual, not blown up: see
      ``deqjax._src.solvers.base``) and its ``f_value`` is ``f(value)``.

    Raises:
      ValueError: for invalid arguments (named in the message).
    """
    z0 = base.check_common_args(
        f,
        z0,
        max_steps=max_steps,
        tol=tol,
        stop_mode=stop_mode,
        loop=loop,
        atol=atol,
        batch_ndim=batch_ndim,
    )
    checks.check_int(memory, "memory", allow_none=True)
    checks.check_bool(line_search, "line_search")
    if not divergence_factor > 1.0:
        raise ValueError(f"divergence_factor must be > 1, got {divergence_factor}.")
    checks.check_bool(return_inverse, "return_inverse")
    mem = max_steps if memory is None else memory
    rdtype = tree.reduction_dtype(z0)
    batch_shape = tuple(jax.tree_util.tree_leaves(z0)[0].shape[:batch_ndim])
    bn = batch_ndim
    tiny = jnp.asarray(jnp.finfo(rdtype).tiny, rdtype)
    # Blocked reads (only the filled rows) for a long memory on a loop that need not be
    # reverse-differentiable (lax.scan needs a static trip count).
    blocked = mem > 2 * _BLOCK and loop != "scan"
    rows = -(-mem // _BLOCK) * _BLOCK if blocked else mem  # buffer rows
    ids = jnp.arange(rows, dtype=jnp.int32)
    lead = (1,) * bn

    def propose(s: _BroydenState, k, x, fx, gx):
        del fx
        if line_search:
            g2, g2_base = tree.tree_vdot(gx, gx, bn), tree.tree_vdot(s.g_base, s.g_base, bn)
            sufficient = g2 <= (1.0 - _ARMIJO_C * s.step) * g2_base
            accept = (k == 0) | sufficient | (s.backtracks >= _MAX_BACKTRACKS) | ~jnp.isfinite(g2)
        else:
            accept = jnp.asarray(True)

        # Position of this update in the memory, and which rows hold the current inverse. When the
        # memory is full the inverse restarts from -I (rows are masked out, not cleared): each
        # stored pair (u_i, v_i) was derived from the inverse made of the pairs before it, so
        # evicting only the oldest (a ring buffer) leaves an inconsistent inverse; on the hard
        # d=512, rho(W)=1.5 problem a ring of 10 left 23% of a batch unconverged after 100 steps,
        # restarting converges all of it in 80 (issue 15).
        if line_search:
            pos = s.num_updates % mem  # [*batch]: accepted steps differ per problem
            restart = (pos == 0) & (s.num_updates > 0)
            valid = ids.reshape(lead + (rows,)) < pos[..., None]
            n_rows = jnp.max(pos) if blocked else None
        else:
            # Every step after the first is an accepted step: the position (k - 1) % mem is shared.
            pos = jnp.maximum(k - 1, 0) % mem
            if bn > 0:
                # The previous update's rows are written FIRST (at its shared position), so the
                # carried buffers' only user is an in-place dynamic_update_slice and the reads
                # below see the updated buffers: XLA then copies no buffer per step.
                prev = jnp.maximum(k - 2, 0) % mem
                s = s._replace(
                    us=tree.tree_put_row(s.us, prev, s.pending[0], bn),
                    vs=tree.tree_put_row(s.vs, prev, s.pending[1], bn),
                )
            restart = (pos == 0) & (k > 1)
            valid = (ids < pos).reshape(lead + (rows,))
            n_rows = pos if blocked else None

        # Accept: Broyden update with dx = x - x_base, dg = gx - g_base, then a new direction.
        dx = tree.tree_sub(x, s.x_base)
        jinv_g = _matvec(s.us, s.vs, gx, bn, valid, n_rows)  # J^{-1} g(x) before the update
        # J^{-1}(g - g_base) = J^{-1} g + direction (direction = -J^{-1} g_base), or, right after a
        # restart (J^{-1} = -I), J^{-1} g + g_base.
        jinv_dg = tree.tree_add(jinv_g, tree.tree_where(restart, s.g_base, s.direction, bn))
        v = _rmatvec(s.us, s.vs, dx, bn, valid, n_rows)
        denom = tree.tree_vdot(v, tree.tree_sub(gx, s.g_base), bn)
        ok = (k > 0) & (jnp.abs(denom) > tiny) & jnp.isfinite(denom)
        inv_denom = jnp.where(ok, 1.0 / jnp.where(ok, denom, 1.0), 0.0)
        u = tree.tree_scale(inv_denom, tree.tree_sub(dx, jinv_dg), bn)
        v = tree.tree_where(ok, v, tree.tree_zeros_like(v), bn)
        if line_search:
            # A per-problem row, written by a masked select; a rejected trial writes to row -1,
            # which tree_set_row ignores. A skipped update (tiny or non-finite denominator) writes
            # zero rows (u = v = 0 adds nothing to J^{-1}).
            write = accept & (k > 0)
            us = tree.tree_set_row(s.us, jnp.where(write, pos, -1), u, bn)
            vs = tree.tree_set_row(s.vs, jnp.where(write, pos, -1), v, bn)
            num_updates = s.num_updates + write.astype(jnp.int32)
        elif bn == 0:
            us = tree.tree_set_row(s.us, pos, u)
            vs = tree.tree_set_row(s.vs, pos, v)
            num_updates = s.num_updates + ok.astype(jnp.int32)
        else:  # the shared row, written at the start of the next step (see above)
            us, vs = s.us, s.vs
            num_updates = s.num_updates + ok.astype(jnp.int32)
        # New direction -J_new^{-1} g with J_new^{-1} g = J^{-1} g + u (v^T g).
        direction = tree.tree_scale(
            -1.0, tree.tree_axpy(tree.tree_vdot(v, gx, bn), u, jinv_g, bn), bn
        )
        ones = jnp.ones(batch_shape, rdtype)
        accepted = _BroydenState(
            us=us,
            vs=vs,
            num_updates=num_updates,
            x_base=x,
            g_base=gx,
            direction=direction,
            step=ones,
            backtracks=jnp.zeros(batch_shape, jnp.int32),
            pending=(u, v) if bn > 0 and not line_search else (),
        )
        if not line_search:
            return tree.tree_add(x, direction), accepted

        half = s.step / 2
        # Only the small per-problem fields are selected; us/vs were written (or not) above.
        pick = lambda a, b: tree.tree_where(accept, a, b, bn)  # noqa: E731
        new_state = _BroydenState(
            us=us,
            vs=vs,
            num_updates=num_updates,
            x_base=pick(x, s.x_base),
            g_base=pick(gx, s.g_base),
            direction=pick(direction, s.direction),
            step=jnp.where(accept, ones, half),
            backtracks=jnp.where(accept, 0, s.backtracks + 1).astype(jnp.int32),
            pending=(),
        )
        next_x = pick(tree.tree_add(x, direction), tree.tree_axpy(half, s.direction, s.x_base, bn))
        return next_x, new_state

    state0 = _BroydenState(
        us=tree.tree_stack_zeros(z0, rows, batch_ndim),
        vs=tree.tree_stack_zeros(z0, rows, batch_ndim),
        num_updates=jnp.zeros(batch_shape, jnp.int32),
        x_base=tree.tree_zeros_like(z0),
        g_base=tree.tree_zeros_like(z0),
        direction=tree.tree_zeros_like(z0),
        step=jnp.ones(batch_shape, rdtype),
        backtracks=jnp.zeros(batch_shape, jnp.int32),
        pending=(
            (tree.tree_zeros_like(z0), tree.tree_zeros_like(z0))
            if batch_ndim and not line_search
            else ()
        ),
    )

    def inverse_output(k: jax.Array, num_steps: jax.Array, s: _BroydenState) -> BroydenInverse:
        """The estimate after each problem's last step (``num_steps`` evaluations of its own)."""
        us, vs = s.us, s.vs
        if line_search:
            # After u updates the current rows are 0 .. (u - 1) % mem (the last restart on).
            n = jnp.where(s.num_updates > 0, (s.num_updates - 1) % mem + 1, 0)
            valid = ids.reshape(lead + (rows,)) < n[..., None]
            return BroydenInverse(us, vs, valid)
        # The update of a problem's last step (index num_steps - 1) is in row (num_steps - 2) % mem
        # (row 0 for a single step), and its current rows are 0 .. that row.
        last = jnp.maximum(num_steps - 2, 0) % mem
        if bn > 0:
            # The loop's last update is still pending: write it. A problem that stopped before the
            # loop's last step had zero rows (no update: its iterate no longer moves) written after
            # its own rows; if they wrapped around onto its rows, its estimate restarts from -I.
            k_last = jnp.maximum(k - 2, 0) % mem
            us = tree.tree_put_row(us, k_last, s.pending[0], bn)
            vs = tree.tree_put_row(vs, k_last, s.pending[1], bn)
            intact = (k - num_steps) <= mem - 1 - last
            last = jnp.where(intact, last, -1)
        valid = ids.reshape(lead + (rows,)) <= last[..., None]
        return BroydenInverse(us, vs, valid)

    return base.solve(
        f,
        z0,
        propose=propose,
        aux0=state0,
        max_steps=max_steps,
        tol=tol,
        stop_mode=stop_mode,
        loop=loop,
        divergence_factor=divergence_factor,
        atol=atol,
        batch_ndim=batch_ndim,
        sample_steps=sample_steps,
        aux_output=inverse_output if return_inverse else None,
    )
