"""Anderson acceleration (Anderson 1965; Walker & Ni 2011), the variant used by the DEQ papers."""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import jax.scipy.linalg

from deqjax._src import checks, tree
from deqjax._src.solvers import base

PyTree = Any


def anderson(
    f: Callable[[PyTree], PyTree],
    z0: PyTree,
    *,
    max_steps: int = 50,
    tol: float = 1e-4,
    stop_mode: str = "rel",
    m: int = 5,
    beta: float = 1.0,
    lam: float = 1e-4,
    divergence_factor: float = 1e4,
    loop: str = "while",
    atol: float | None = None,
    batch_ndim: int = 0,
    sample_steps: tuple[int, ...] | None = None,
) -> base.Solution:
    """Solves ``z = f(z)`` by Anderson acceleration with a ring buffer of the last ``m`` iterates.

    With ``G_i = f(x_i) - x_i`` over the stored iterates, each step solves the regularised
    least-squares problem

        alpha = argmin ||sum_i alpha_i G_i||^2 + lam' ||alpha||^2   s.t.  sum_i alpha_i = 1,

    i.e. ``alpha = H^{-1} 1 / (1^T H^{-1} 1)`` with ``H = G G^T + lam' I``, and mixes

        x_{k+1} = beta * sum_i alpha_i f(x_i) + (1 - beta) * sum_i alpha_i x_i
                = sum_i alpha_i (x_i + beta G_i).

    The ridge is relative: ``lam' = lam * mean(diag(G G^T))``, so it shrinks with the residuals and
    does not stall at tight tolerances. The Gram matrix is updated one row per step (``O(m d)``)
    and the history stores the mixed rows ``x_i + beta G_i`` next to ``G_i``, so a step reads each
    of the two ``[m, ...]`` buffers once.

    Args:
      f: the map ``Z -> Z`` over any pytree of float arrays.
      z0: initial iterate.
      max_steps: maximum number of evaluations of ``f``.
      tol: stop when the residual (by ``stop_mode``) is ``<= tol``.
      stop_mode: ``"abs"``, ``"rel"`` or ``"mixed"`` (see
        :func:`~deqjax.solvers.fixed_point_iteration`).
      m: history size (``>= 1``; ``m = 1`` is damped fixed-point iteration).
      beta: mixing parameter (``> 0``; 1 is undamped, above 1 over-relaxes).
      lam: relative Tikhonov ridge (``>= 0``).
      divergence_factor: stop with ``DIVERGED`` when the absolute residual exceeds this multiple
        of the lowest absolute residual seen (in every ``stop_mode``).
      loop: ``"while"`` (default), ``"scan"`` (reverse-differentiable) or ``"python"`` (debugging).
      atol: absolute tolerance of ``stop_mode="mixed"`` (``None``: equal to ``tol``).
      batch_ndim: leading axes of ``z0``'s leaves that index independent problems; the Gram
        matrices (``[*batch, m, m]``) and their small solves are batched, the ring buffer slot
        (the shared step counter mod ``m``) is written with one ``dynamic_update_slice``.
      sample_steps: ``None``, or loop steps ``s`` in ``[0, max_steps]`` whose iterates ``x_s``
        are returned in ``Solution.samples`` (for the fixed-point correction loss; see
        :func:`deqjax.correction_states`).

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
    checks.check_positive_int(m, "m")
    if not beta > 0.0:
        raise ValueError(f"beta must be > 0, got {beta}.")
    if not lam >= 0.0:
        raise ValueError(f"lam must be >= 0, got {lam}.")
    if not divergence_factor > 1.0:
        raise ValueError(f"divergence_factor must be > 1, got {divergence_factor}.")

    rdtype = tree.reduction_dtype(z0)
    batch_shape = tuple(jax.tree_util.tree_leaves(z0)[0].shape[:batch_ndim])
    bn = batch_ndim
    lead = (1,) * bn  # explicit broadcasting of [m]-shaped masks (rank promotion may be strict)
    eye = jnp.eye(m, dtype=rdtype).reshape(lead + (m, m))
    tiny = jnp.asarray(jnp.finfo(rdtype).tiny, rdtype)
    ids = jnp.arange(m, dtype=jnp.int32)

    def propose(aux, k, x, fx, gx):
        del fx
        # ps[i] = x_i + beta * G_i (the rows that are mixed), gs[i] = G_i: [m, ...] each
        # ([*batch, m, ...] under batch_ndim, see tree.tree_stack_zeros).
        # gram: [*batch, m, m]. The slot k % m is shared by every problem (k is the shared step
        # counter, and a running problem has made exactly k steps).
        ps, gs, gram, pending = aux
        if bn > 0:
            # Under batch_ndim > 0 the previous step's rows are written FIRST, at its shared slot,
            # so the carried buffers' only user is an in-place dynamic_update_slice and every read
            # below sees the updated buffer: XLA then needs no copy of the buffers per step.
            ps = tree.tree_put_row(ps, (k - 1) % m, pending[0], bn)
            gs = tree.tree_put_row(gs, (k - 1) % m, pending[1], bn)
        slot = k % m
        hit = (ids == slot).reshape(lead + (m,))  # the row the new iterate replaces
        p = tree.tree_axpy(beta, gx, x)
        # Everything below reads the *old* buffers plus the new row, and the updated buffers are
        # only written at the end: under vmap the write then fuses with the loop's per-example
        # select into one pass over each buffer instead of a copy, a select and a re-read.
        gg = tree.tree_vdot(gx, gx, bn)[..., None]  # [*batch, 1]
        row = jnp.where(hit, gg, tree.tree_rows_vdot(gs, gx, bn))  # [*batch, m]
        hit_r, hit_c = hit[..., :, None], hit[..., None, :]
        gram = jnp.where(hit_r, row[..., None, :], jnp.where(hit_c, row[..., :, None], gram))

        valid = (ids < jnp.minimum(k + 1, m)).reshape(lead + (m,))
        both = valid[..., :, None] & valid[..., None, :]
        n_valid = jnp.sum(valid).astype(rdtype)
        diag = jnp.diagonal(gram, axis1=-2, axis2=-1)  # [*batch, m]
        scale = jnp.maximum(jnp.sum(jnp.where(valid, diag, 0), axis=-1) / n_valid, tiny)
        # Normalised system; unused slots get an identity row and a zero right-hand side.
        h = jnp.where(both, gram / scale[..., None, None] + lam * eye, eye)  # eye: lead + (m, m)
        rhs = jnp.broadcast_to(valid.astype(rdtype), batch_shape + (m,))
        # h is symmetric positive definite (a Gram matrix plus a ridge, identity rows on unused
        # slots): a Cholesky solve, which needs no pivoting (LU's row permutation is a small loop
        # of its own in every step on CPU).
        y = jax.scipy.linalg.cho_solve(jax.scipy.linalg.cho_factor(h), rhs[..., None])[..., 0]
        # The mixing coefficients carry no gradient: backprop through the ridge-regularised
        # least-squares solve amplifies rounding errors without bound as lam -> 0 (UnrolledAdjoint
        # then differentiates the iteration with alpha frozen, which still has z* as its fixed
        # point). Zero on unused slots.
        alpha = jax.lax.stop_gradient(y / jnp.sum(y, axis=-1, keepdims=True))

        # sum_i alpha_i (x_i + beta G_i), with the slot's row taken from the new iterate.
        alpha_slot = jnp.sum(jnp.where(hit, alpha, 0), axis=-1)  # [*batch]
        mixed = tree.tree_axpy(
            alpha_slot, p, tree.tree_combine_rows(jnp.where(hit, 0, alpha), ps, bn), bn
        )
        if bn == 0:
            ps = tree.tree_set_row(ps, slot, p)
            gs = tree.tree_set_row(gs, slot, gx)
        else:  # written at the start of the next step (see above)
            pending = (p, gx)
        return mixed, (ps, gs, gram, pending)

    aux0 = (
        tree.tree_stack_zeros(z0, m, batch_ndim),
        tree.tree_stack_zeros(z0, m, batch_ndim),
        jnp.zeros(batch_shape + (m, m), rdtype),
        (tree.tree_zeros_like(z0), tree.tree_zeros_like(z0)) if batch_ndim else (),
    )
    return base.solve(
        f,
        z0,
        propose=propose,
        aux0=aux0,
        max_steps=max_steps,
        tol=tol,
        stop_mode=stop_mode,
        loop=loop,
        divergence_factor=divergence_factor,
        atol=atol,
        batch_ndim=batch_ndim,
        sample_steps=sample_steps,
    )
