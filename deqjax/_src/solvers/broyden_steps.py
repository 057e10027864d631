"""Broyden's method without a line search: the steps-only limited-memory form (Kelley), the form
of :class:`~deqjax.solvers.Broyden` chosen by ``line_search=False`` (the default).

Every step is ``s_n = -H_n g_n``, and then ``s - H y = s_{n+1} ||s_n||^2 / (s_n^H H_n y_n)``
(Kelley, *Iterative Methods for Linear and Nonlinear Equations*, SIAM 1995, §7.3): Broyden's good
update (Bai, Kolter & Koltun 2019, Eq. 10) is ``H_{n+1} = (I + s_{n+1} s_n^H / ||s_n||^2) H_n``,
so the inverse is a product of factors ``I + gamma_j c_j d_j^H`` whose vectors are the steps
themselves (``d_j = s_j``, ``c_j = s_{j+1}``, ``gamma_j = 1 / ||s_j||^2``). Only the steps are
stored (one history buffer, one row written per step), and ``H g`` is rebuilt by Kelley's
recursion over the factors made so far, reading each stored step twice. The first update after a
restart is applied to ``-I``, not to the inverse that made its step: its factor keeps its own
vector ``c_0 = (s - H y) / (s^H H y)`` (``gamma_0 = 1``). The step stored is the one made,
``x_{n+1} - x_n`` rounded to the iterate's precision (a step below its resolution is zero and
makes no update). The iterates are those of the two-buffer form (``H = -I + sum u_i v_i^H``, one
product with ``H`` and one with ``H^H`` per step, :mod:`deqjax._src.solvers.broyden_line_search`
without its line search) up to rounding; a step whose denominator ``s^H H y`` is tiny or not
finite, or whose ``||s||^2`` underflows, makes no update. The final estimate is returned in the
two-buffer form (:class:`~deqjax._src.solvers.broyden_inverse.BroydenInverse`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import jax.scipy.linalg
import numpy as np

from deqjax._src import tree, vma
from deqjax._src.solvers import broyden_inverse, driver
from deqjax._src.solvers.broyden_inverse import BroydenInverse
from deqjax._src.solvers.problem import Problem

PyTree = Any


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

    return vma.fori_loop(0, r.mem - 1 if r.scan else n, factor, z)


def _propose(r: _Ring, s: _Steps, k: jax.Array, x: PyTree, gx: PyTree, running: jax.Array):
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
        # written while any problem runs (see _inverse), and once none runs (the last
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


def _inverse(r: _Ring, rows: int, end: driver.LoopEnd) -> dict[str, BroydenInverse]:
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


def proposal_rule(
    problem: Problem, memory: broyden_inverse.Memory, *, return_inverse: bool
) -> driver.ProposalRule:
    """The rule of Broyden's method without a line search on ``problem``.

    Args:
      problem: the checked problem.
      memory: ``memory.mem`` updates before a restart; the final estimate has ``memory.rows``
        rows (:func:`deqjax._src.solvers.broyden_inverse.memory_of`).
      return_inverse: add the final estimate to the Solution (``inverse_estimate``).
    """
    z0, bn, mem = problem.z0, problem.batch_ndim, memory.mem
    r = _Ring(
        mem=mem,
        ring=mem + 1,
        w_slot=mem + 1,
        junk=mem + 2,
        scan=memory.scan,
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
        return _propose(r, s, k, x, gx, running)

    finish = (lambda end: _inverse(r, memory.rows, end)) if return_inverse else None
    return driver.ProposalRule(propose, state0, finish=finish)
