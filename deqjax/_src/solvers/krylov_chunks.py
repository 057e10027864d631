"""The iterations of BiCGStab and of CG on the normal equations, per problem of a batch.

:class:`~deqjax.solvers.BiCGStab` and :class:`~deqjax.solvers.NormalCG` run in chunks
(:mod:`deqjax._src.solvers.krylov`): each chunk is at most ``iters`` iterations of the method from
the current iterate, then the true residual is judged. With ``batch_ndim = n`` the leading axes
of every leaf index independent problems, and here every scalar of the method (its inner
products, step sizes, stopping) is per problem: a problem's iterates are those it would have
alone (to rounding), whatever its batch-mates are, and a problem whose residual estimate meets its
``target`` stops moving while the others iterate. (``jax.scipy.sparse.linalg``'s versions take
one inner product over the whole pytree: the batch would be one system, each example's answer
depending on the others.) Every product with ``A`` or ``Aᵀ`` is one evaluation for the whole
batch (a VJP or a JVP of the cell, for the implicit backward).

Breakdowns (a zero denominator) stop the problem where it is; its true residual then decides.

Complex states: the inner products are Hermitian (``<a, b> = sum conj(a) b``,
:func:`deqjax._src.tree.tree_vdot`). BiCGStab's scalars ``rho``, ``alpha``, ``omega`` are then
complex (``omega = <t, s> / <t, t>``), and ``A`` must be complex-linear. CG on the normal
equations runs on ``AᴴA`` with ``Aᴴ`` the adjoint for the real inner product ``Re<a, b>``; its
scalars are real (``alpha = ||r||² / Re<p, AᴴA p>``), so it is CG on ``R^{2n}`` and needs ``A``
only real-linear.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from deqjax._src import tree, vma

PyTree = Any
MapFn = Callable[[PyTree], PyTree]


def _div(a: jax.Array, b: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(a / b, ok)`` per problem, 0 where ``b`` is zero or the quotient is not finite."""
    ok = (b != 0) & jnp.isfinite(b)
    q = a / jnp.where(ok, b, 1.0)
    ok = ok & jnp.isfinite(q)
    return jnp.where(ok, q, 0.0), ok


def bicgstab(
    matvec: MapFn, b: PyTree, x0: PyTree, target: jax.Array, iters: int, bn: int
) -> PyTree:
    """At most ``iters`` BiCGStab iterations (van der Vorst 1992) on ``A x = b`` from ``x0``, per
    problem; a problem stops once ``‖r‖ <= target`` (``[*batch]``) or at a breakdown."""
    r0 = tree.tree_sub(b, matvec(x0))
    ones = jnp.ones(target.shape, tree.scalar_dtype(x0))  # complex for a complex state
    zeros = tree.tree_zeros_like(x0)
    active0 = tree.tree_norm(r0, bn) > target

    def cond(c):
        return (c[0] < iters) & jnp.any(c[-1])

    def body(c):
        i, x, r, p, v, rho, alpha, omega, active = c
        rho_new = tree.tree_vdot(r0, r, bn)
        ratio, ok1 = _div(rho_new, rho)
        scale, ok2 = _div(alpha, omega)
        beta = ratio * scale
        p_new = tree.tree_add(r, tree.tree_scale(beta, tree.tree_axpy(-omega, v, p, bn), bn))
        v_new = matvec(p_new)
        alpha_new, ok3 = _div(rho_new, tree.tree_vdot(r0, v_new, bn))
        s = tree.tree_axpy(-alpha_new, v_new, r, bn)
        s_small = tree.tree_norm(s, bn) <= target
        t = matvec(s)
        t_sq = tree.tree_sq_norm(t, bn).astype(ones.dtype)
        omega_new, ok4 = _div(tree.tree_vdot(t, s, bn), t_sq)
        omega_new = jnp.where(s_small, omega, omega_new)
        x_new = tree.tree_axpy(alpha_new, p_new, x, bn)
        x_new = tree.tree_axpy(jnp.where(s_small, 0.0, omega_new), s, x_new, bn)
        r_new = tree.tree_axpy(jnp.where(s_small, 0.0, -omega_new), t, s, bn)
        ok = ok1 & ok2 & ok3 & (ok4 | s_small)
        move = active & ok
        pick = lambda new, old: tree.tree_where(move, new, old, bn)  # noqa: E731
        still = move & ~s_small & (tree.tree_norm(r_new, bn) > target)
        return (
            i + 1,
            pick(x_new, x),
            pick(r_new, r),
            pick(p_new, p),
            pick(v_new, v),
            jnp.where(move, rho_new, rho),
            jnp.where(move, alpha_new, alpha),
            jnp.where(move, omega_new, omega),
            still,
        )

    init = (0, x0, r0, zeros, zeros, ones, ones, ones, active0)
    return vma.while_loop(cond, body, init)[1]


def normal_cg(
    matvec: MapFn,
    rmatvec: MapFn,
    b: PyTree,
    x0: PyTree,
    target: jax.Array,
    iters: int,
    bn: int,
) -> PyTree:
    """At most ``iters`` CG iterations on the normal equations ``AᴴA x = Aᴴb`` from ``x0``, per
    problem; a problem stops once its normal residual ``‖Aᴴ(b − A x)‖ <= target`` or at a
    breakdown. ``rmatvec`` is ``Aᴴ`` (``Aᵀ`` for a real state); the step sizes are real:
    ``alpha = ‖r‖² / Re<p, AᴴA p>``, ``beta = ‖r_new‖² / ‖r‖²``."""
    r0 = rmatvec(tree.tree_sub(b, matvec(x0)))
    rs0 = tree.tree_sq_norm(r0, bn)

    def cond(c):
        return (c[0] < iters) & jnp.any(c[-1])

    def body(c):
        i, x, r, p, rs, active = c
        q = rmatvec(matvec(p))
        alpha, ok = _div(rs, jnp.real(tree.tree_vdot(p, q, bn)))
        x_new = tree.tree_axpy(alpha, p, x, bn)
        r_new = tree.tree_axpy(-alpha, q, r, bn)
        rs_new = tree.tree_sq_norm(r_new, bn)
        beta, ok_beta = _div(rs_new, rs)
        p_new = tree.tree_axpy(beta, p, r_new, bn)
        move = active & ok & ok_beta
        pick = lambda new, old: tree.tree_where(move, new, old, bn)  # noqa: E731
        still = move & (rs_new > target * target)
        return (
            i + 1,
            pick(x_new, x),
            pick(r_new, r),
            pick(p_new, p),
            jnp.where(move, rs_new, rs),
            still,
        )

    init = (0, x0, r0, r0, rs0, rs0 > target * target)
    return vma.while_loop(cond, body, init)[1]
