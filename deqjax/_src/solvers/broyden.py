"""Broyden's ("good") quasi-Newton method on g(z) = f(z) - z, as in the DEQ paper (Eq. 10)."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from deqjax._src import tree
from deqjax._src.solvers import base

PyTree = Any

# Backtracking line search: accept step s when ||g(x + s d)||^2 <= (1 - _ARMIJO_C * s) ||g(x)||^2,
# else halve s, at most _MAX_BACKTRACKS times per direction.
_ARMIJO_C = 1e-4
_MAX_BACKTRACKS = 5


class _BroydenState(NamedTuple):
    us: PyTree  # [memory, *batch, ...] columns u_i of the low-rank part of the inverse Jacobian
    vs: PyTree  # [memory, *batch, ...] rows v_i^T
    num_updates: jax.Array  # int32 [*batch]: accepted steps (line search: ring slot % memory)
    x_base: PyTree  # the last accepted iterate
    g_base: PyTree  # g(x_base)
    direction: PyTree  # the quasi-Newton step -J^{-1} g(x_base) from x_base
    step: jax.Array  # [*batch]: line-search step size s of the iterate being evaluated
    backtracks: jax.Array  # int32 [*batch]: halvings made along the current direction


def _matvec(us: PyTree, vs: PyTree, x: PyTree, bn: int) -> PyTree:
    """``J^{-1} x`` with ``J^{-1} = -I + sum_i u_i v_i^T`` (per problem)."""
    return tree.tree_sub(tree.tree_combine_rows(tree.tree_rows_vdot(vs, x, bn), us, bn), x)


def _rmatvec(us: PyTree, vs: PyTree, x: PyTree, bn: int) -> PyTree:
    """``J^{-T} x = -x + sum_i v_i (u_i^T x)`` (per problem)."""
    return tree.tree_sub(tree.tree_combine_rows(tree.tree_rows_vdot(us, x, bn), vs, bn), x)


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
      memory: ``None`` keeps every update (``max_steps`` slots); an int keeps a ring buffer of the
        most recent ``memory`` updates (limited-memory Broyden).
      line_search: backtracking on ``||g||^2`` (Armijo, halving up to 5 times); each trial is an
        evaluation of ``f`` and counts in ``num_steps`` and ``trace``.
      divergence_factor: stop with ``DIVERGED`` when the residual exceeds this multiple of the best.
      loop: ``"while"`` (default), ``"scan"`` (reverse-differentiable) or ``"python"`` (debugging).
      atol: absolute tolerance of ``stop_mode="mixed"`` (``None``: equal to ``tol``).
      batch_ndim: leading axes of ``z0``'s leaves that index independent problems; the low-rank
        inverse updates are batched (one ``[memory, *batch, ...]`` buffer per factor).

    Returns:
      A :class:`~deqjax.solvers.Solution`; its value is the lowest-residual iterate.

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
    if memory is not None and (
        isinstance(memory, bool) or not isinstance(memory, int) or memory < 1
    ):
        raise ValueError(f"memory must be None or an int >= 1, got {memory!r}.")
    if not isinstance(line_search, bool):
        raise ValueError(f"line_search must be a bool, got {line_search!r}.")
    if not divergence_factor > 1.0:
        raise ValueError(f"divergence_factor must be > 1, got {divergence_factor}.")
    mem = max_steps if memory is None else memory
    rdtype = tree.reduction_dtype(z0)
    batch_shape = tuple(jax.tree_util.tree_leaves(z0)[0].shape[:batch_ndim])
    bn = batch_ndim
    tiny = jnp.asarray(jnp.finfo(rdtype).tiny, rdtype)

    def propose(s: _BroydenState, k, x, fx, gx):
        del fx
        if line_search:
            g2, g2_base = tree.tree_vdot(gx, gx, bn), tree.tree_vdot(s.g_base, s.g_base, bn)
            sufficient = g2 <= (1.0 - _ARMIJO_C * s.step) * g2_base
            accept = (k == 0) | sufficient | (s.backtracks >= _MAX_BACKTRACKS) | ~jnp.isfinite(g2)
        else:
            accept = jnp.asarray(True)

        # Accept: Broyden update with dx = x - x_base, dg = gx - g_base, then a new direction.
        dx = tree.tree_sub(x, s.x_base)
        jinv_g = _matvec(s.us, s.vs, gx, bn)  # J^{-1} g(x) before the update
        # J^{-1}(g - g_base) = J^{-1} g + direction (direction = -J^{-1} g_base).
        jinv_dg = tree.tree_add(jinv_g, s.direction)
        v = _rmatvec(s.us, s.vs, dx, bn)
        denom = tree.tree_vdot(v, tree.tree_sub(gx, s.g_base), bn)
        ok = (k > 0) & (jnp.abs(denom) > tiny) & jnp.isfinite(denom)
        inv_denom = jnp.where(ok, 1.0 / jnp.where(ok, denom, 1.0), 0.0)
        u = tree.tree_scale(inv_denom, tree.tree_sub(dx, jinv_dg), bn)
        v = tree.tree_where(ok, v, tree.tree_zeros_like(v), bn)
        if line_search:
            # Accepted steps differ per problem: a per-problem ring slot, written by a masked
            # select; a rejected trial or a skipped update (first step, tiny or non-finite
            # denominator) writes to row -1, which tree_set_row ignores.
            write = accept & ok
            slot = jnp.where(write, s.num_updates % mem, -1)
            us = tree.tree_set_row(s.us, slot, u, bn)
            vs = tree.tree_set_row(s.vs, slot, v, bn)
            num_updates = s.num_updates + write.astype(jnp.int32)
        else:
            # Every step after the first is an accepted step, so the ring slot is (k - 1) % mem,
            # shared by every problem; a skipped update writes zero rows (u = v = 0 adds nothing to
            # J^{-1}). A shared slot is one dynamic_update_slice per buffer under batch_ndim > 0.
            slot = jnp.maximum(k - 1, 0) % mem
            if bn == 0:
                us = tree.tree_set_row(s.us, slot, u)
                vs = tree.tree_set_row(s.vs, slot, v)
            else:
                us = tree.tree_put_row(s.us, slot, u)
                vs = tree.tree_put_row(s.vs, slot, v)
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
        )
        next_x = pick(tree.tree_add(x, direction), tree.tree_axpy(half, s.direction, s.x_base, bn))
        return next_x, new_state

    state0 = _BroydenState(
        us=tree.tree_stack_zeros(z0, mem),
        vs=tree.tree_stack_zeros(z0, mem),
        num_updates=jnp.zeros(batch_shape, jnp.int32),
        x_base=tree.tree_zeros_like(z0),
        g_base=tree.tree_zeros_like(z0),
        direction=tree.tree_zeros_like(z0),
        step=jnp.ones(batch_shape, rdtype),
        backtracks=jnp.zeros(batch_shape, jnp.int32),
    )
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
    )
