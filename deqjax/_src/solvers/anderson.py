"""Anderson acceleration (Anderson 1965; Walker & Ni 2011), the variant used by the DEQ papers."""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from deqjax._src import tree
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
      stop_mode: ``"abs"`` or ``"rel"`` (see :func:`~deqjax.solvers.fixed_point_iteration`).
      m: history size (``>= 1``; ``m = 1`` is damped fixed-point iteration).
      beta: mixing parameter (``> 0``; 1 is undamped, above 1 over-relaxes).
      lam: relative Tikhonov ridge (``>= 0``).
      divergence_factor: stop with ``DIVERGED`` when the residual exceeds this multiple of the best.
      loop: ``"while"`` (default), ``"scan"`` (reverse-differentiable) or ``"python"`` (debugging).

    Returns:
      A :class:`~deqjax.solvers.Solution`; its value is the lowest-residual iterate.

    Raises:
      ValueError: for invalid arguments (named in the message).
    """
    z0 = base.check_common_args(f, z0, max_steps=max_steps, tol=tol, stop_mode=stop_mode, loop=loop)
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        raise ValueError(f"m must be an int >= 1, got {m!r}.")
    if not beta > 0.0:
        raise ValueError(f"beta must be > 0, got {beta}.")
    if not lam >= 0.0:
        raise ValueError(f"lam must be >= 0, got {lam}.")
    if not divergence_factor > 1.0:
        raise ValueError(f"divergence_factor must be > 1, got {divergence_factor}.")

    rdtype = tree.reduction_dtype(z0)
    eye = jnp.eye(m, dtype=rdtype)
    tiny = jnp.asarray(jnp.finfo(rdtype).tiny, rdtype)

    def propose(aux, k, x, fx, gx):
        del fx
        # ps[i] = x_i + beta * G_i (the rows that are mixed), gs[i] = G_i: [m, ...] each.
        # gram: [m, m].
        ps, gs, gram = aux
        slot = k % m
        hit = jnp.arange(m, dtype=jnp.int32) == slot  # [m]: the row the new iterate replaces
        p = tree.tree_axpy(beta, gx, x)
        # Everything below reads the *old* buffers plus the new row, and the updated buffers are
        # only written at the end: under vmap the write then fuses with the loop's per-example
        # select into one pass over each buffer instead of a copy, a select and a re-read.
        row = jnp.where(hit, tree.tree_vdot(gx, gx), tree.tree_rows_vdot(gs, gx))  # [m]
        gram = jnp.where(hit[:, None], row[None, :], jnp.where(hit[None, :], row[:, None], gram))

        valid = jnp.arange(m, dtype=jnp.int32) < jnp.minimum(k + 1, m)  # [m]
        both = valid[:, None] & valid[None, :]
        n_valid = jnp.sum(valid).astype(rdtype)
        scale = jnp.maximum(jnp.sum(jnp.where(valid, jnp.diagonal(gram), 0)) / n_valid, tiny)
        # Normalised system; unused slots get an identity row and a zero right-hand side.
        h = jnp.where(both, gram / scale + lam * eye, eye)
        y = jnp.linalg.solve(h, valid.astype(rdtype))
        # The mixing coefficients carry no gradient: backprop through the ridge-regularised
        # least-squares solve amplifies rounding errors without bound as lam -> 0 (UnrolledAdjoint
        # then differentiates the iteration with alpha frozen, which still has z* as its fixed point).
        alpha = jax.lax.stop_gradient(y / jnp.sum(y))  # [m], zero on unused slots

        # sum_i alpha_i (x_i + beta G_i), with the slot's row taken from the new iterate.
        alpha_slot = jnp.sum(jnp.where(hit, alpha, 0))
        mixed = tree.tree_axpy(alpha_slot, p, tree.tree_combine_rows(jnp.where(hit, 0, alpha), ps))
        ps = tree.tree_set_row(ps, slot, p)
        gs = tree.tree_set_row(gs, slot, gx)
        return mixed, (ps, gs, gram)

    aux0 = (tree.tree_stack_zeros(z0, m), tree.tree_stack_zeros(z0, m), jnp.zeros((m, m), rdtype))
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
    )
