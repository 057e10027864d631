"""Restarted GMRES (Saad & Schultz 1986) as ONE bounded loop: one evaluation of ``f`` per step.

:class:`~deqjax.solvers.GMRES` solves the affine fixed point ``u = f(u) = b + L u``, i.e.
``A u = b`` with ``A = I − L`` (for the implicit backward, ``A = I − J_f(z*)ᵀ``: each product is
one VJP of the cell). A cycle of ``n`` Arnoldi steps builds an orthonormal basis ``V`` of the
Krylov space ``K_n(A, r)`` of the cycle's starting residual ``r = b − A u`` and the Hessenberg
matrix ``H`` with ``A V_n = V_{n+1} H̄`` (classical Gram–Schmidt against every basis column,
the unused ones zero); the cycle ends with ``u ← u + V_n y``, ``y`` the least-squares solution of
``min ‖β e₁ − H̄ y‖`` (``β = ‖r‖``, :func:`jax.numpy.linalg.lstsq`). An Arnoldi step
whose new vector vanishes below ``eps ‖A v‖`` (an invariant subspace: ``u + V y`` is exact)
ends the cycle early. The Krylov workspace (the basis, ``H̄``, the least squares) is held in the
problem's reduction dtype: float32 for a bfloat16 or float16 state (a half-precision basis loses
its orthogonality within a few steps, and LAPACK has no half-precision least squares), float64 for
float64; the iterate and every argument of ``f`` keep the state's dtype.

Every step of the loop evaluates ``f`` once: at the cycle's first step, at ``u`` (that
evaluation is judged by the stopping rule, :func:`deqjax._src.solvers.stopping.judge`, and its
residual ``f(u) − u = b − A u`` starts the next cycle); at Arnoldi step ``k``, at ``V[:, k]``. Both
kinds of step share one loop body and every kernel in it: the argument of ``f`` is selected, the
judgement is masked off on Arnoldi steps (``judge(..., active=...)``), the new basis vector is the
residual or ``A v`` orthogonalised, and only the cycle's closing least squares sits under a
``lax.cond``. So ``f``, a VJP of the cell for the adjoint map, appears once in the program, inside
the loop (the start at ``z0`` is the loop's first step, and ``b = f(0)`` is never evaluated: see
:func:`_body`), and the loop does not nest: the chunked form
(:func:`jax.scipy.sparse.linalg.gmres` inside a chunk loop) had five nested loops, and a
fixed-point gradient with it as the fallback took 2.4 s to trace and compile on 2 CPU cores,
against 1.3–1.9 s with a two-branch body (BENCHMARKS.md). A step reduces the state three times:
the stopping rule's ``‖f(u) − u‖`` and ``‖f(u)‖`` (which also give the step ``s``), and the new
basis vector's norm (which with its projections gives ``‖A v‖``).

The accounting is that of a cycle run by :func:`jax.scipy.sparse.linalg.gmres` with one restart
(``solve_method="batched"``, the form deqjax used before) followed by a check of the true
residual: ``n + 3`` evaluations charged per cycle (its starting residual, ``n`` Arnoldi
products, its final residual, the check), written in the trace at each evaluation index of the
cycle; the start costs two (there, ``b = f(0)`` and ``f(z0)``; here one evaluation, so the
charges are an upper bound). The arithmetic is that cycle's too (its least squares solved by an
SVD rather than by normal equations; ``L v`` by a difference, see :func:`_body`), so the
iterates agree with it to float rounding; a cycle whose starting residual already meets the target
(every running problem's ``tol × scale``) is skipped, as there.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from deqjax._src import tree
from deqjax._src.solvers import stopping, verify
from deqjax._src.solvers.problem import Problem
from deqjax._src.solvers.solution import Solution

PyTree = Any


def _normalize(t: PyTree, norm: jax.Array, thresh: jax.Array) -> tuple[PyTree, jax.Array]:
    """``(t / ‖t‖, ‖t‖)``, or zeros and 0 where ``‖t‖ <= thresh`` (``norm``: ``‖t‖`` of the whole
    pytree, every problem of a batch together)."""
    dtype = jnp.result_type(*jax.tree_util.tree_leaves(t))
    use = norm > jnp.asarray(thresh).astype(dtype)
    scale = norm.astype(dtype)
    unit = jax.tree_util.tree_map(lambda a: jnp.where(use, a / scale, 0.0), t)
    return unit, jnp.where(use, norm, 0.0)


def _up(t: PyTree, rdtype: jnp.dtype) -> PyTree:
    """``t`` in the reduction dtype (float32 for half-precision states, float64 for float64)."""
    return jax.tree_util.tree_map(lambda a: a.astype(rdtype), t)


def _like(t: PyTree, ref: PyTree) -> PyTree:
    """``t`` in the dtypes of ``ref``'s leaves (the state's own dtype)."""
    return jax.tree_util.tree_map(lambda a, r: a.astype(r.dtype), t, ref)


def _cycle_update(basis: PyTree, hess: jax.Array, beta: jax.Array) -> PyTree:
    """``V_n y`` with ``y = argmin ‖β e₁ − H̄ y‖`` (``hess`` is ``H̄ᵀ``, row ``k`` holding column
    ``k``; columns not built are unit vectors below the built ones, so their ``y`` is 0)."""
    rhs = jnp.where(jnp.arange(hess.shape[1]) == 0, beta.astype(hess.dtype), 0.0)
    y = jnp.linalg.lstsq(hess.T, rhs)[0]
    return jax.tree_util.tree_map(lambda v: jnp.dot(v[..., :-1], y, precision=tree.HIGHEST), basis)


# Columns of _Carry.scalars: evaluations of f charged so far; the step (0: the next evaluation is
# at u and judged, j + 1: Arnoldi step j); ‖r‖ of the cycle's starting residual; s (Arnoldi step j
# evaluates f at u + s V[:, j]).
_K, _STEP, _BETA, _SPREAD = range(4)


class _Carry(NamedTuple):
    # [4] in the reduction dtype (the columns above): one array, so that a step updates them in
    # one kernel, as stopping.Book does (the counts are exact below 2^24).
    scalars: jax.Array
    u: PyTree  # the current iterate (the next one judged)
    best_u: PyTree
    best_fu: PyTree  # f(best_u), kept so that f_value costs no extra evaluation
    best_aux: PyTree  # the aux of f at best_u (() without has_aux)
    book: stopping.Book  # per-problem residuals, status, trace
    basis: PyTree  # leaves [..., n + 1]: V of the current cycle (columns not yet built are zero)
    hess: jax.Array  # [n, n + 1]: row j is column j of H̄ (identity rows until built)
    f_base: PyTree  # f at the cycle's starting iterate, in the reduction dtype


class _Setup(NamedTuple):
    """What every step uses: the problem, its rule, the cycle length and cost."""

    problem: Problem
    rule: stopping.StoppingRule
    n: int  # Arnoldi steps per cycle
    cost: int  # evaluations charged per cycle: n + 3


def _body(s: _Setup):
    """One evaluation of ``f`` and what it is for: at ``u`` (``step == 0``) its judgement and the
    start of the next cycle from the residual ``r = f(u) − u = b − A u``; at ``u + s V[:, j]``
    Arnoldi step ``j``: ``A v = v − (f(u + s v) − f(u)) / s`` orthogonalised against the basis
    (classical Gram–Schmidt), a new column of ``V`` and of ``H̄``; after the last (or on an
    invariant subspace) ``u ← u + V y``. The two kinds of step share every kernel, with masks.

    ``L v`` is taken as a difference of two values of the affine ``f`` at the cycle's iterate and
    a point ``s`` (:func:`_spread`) away along ``v``, rather than as ``f(v) − f(0)``: the
    rounding is the same order (``eps`` relative to ``‖A v‖``), and ``b = f(0)`` is never
    evaluated, so ``f`` (for the implicit backward, a VJP of the cell) appears once in the
    program."""
    problem, rule, n = s.problem, s.rule, s.n
    bn, rdtype = problem.batch_ndim, problem.rdtype
    cols = jnp.arange(n + 1, dtype=jnp.int32)
    eps = jnp.finfo(rdtype).eps

    def body_fun(c: _Carry) -> _Carry:
        k, beta, spread = c.scalars[_K], c.scalars[_BETA], c.scalars[_SPREAD]
        k_int = k.astype(jnp.int32)
        at_u = c.scalars[_STEP] == 0
        j = jnp.maximum(c.scalars[_STEP].astype(jnp.int32) - 1, 0)
        v = jax.tree_util.tree_map(lambda a: a[..., j], c.basis)
        away = tree.tree_add(_up(c.u, rdtype), tree.tree_scale(spread, v))
        x = tree.tree_where(at_u, c.u, _like(away, c.u))
        fx, aux = problem.fn(x)
        # The judgement of f(u), charged as jax.scipy's restarted GMRES is: 2 for the start, a cycle
        # n + 3 (see the module docstring).
        charge = jnp.where(k_int == 0, 2, s.cost)
        judged = stopping.judge(
            x,
            fx,
            tree.tree_sub(fx, x),
            c.book,
            rule,
            start=k_int,
            count=charge,
            next_count=s.cost,
            active=at_u,
        )
        finite, improved, book = judged.residuals.finite, judged.improved, judged.book
        # A cycle starts from u, or from the best iterate where f(u) is not finite.
        u = tree.tree_where(finite, c.u, c.best_u, bn)
        f_base = _up(tree.tree_where(finite, fx, c.best_fu, bn), rdtype)
        r = tree.tree_sub(f_base, _up(u, rdtype))
        lv = tree.tree_scale(1.0 / spread, tree.tree_sub(_up(fx, rdtype), c.f_base))
        av = tree.tree_sub(v, lv)
        w = tree.tree_where(at_u, r, av)
        # Classical Gram–Schmidt against the basis (none at a cycle's start).
        parts = jax.tree_util.tree_map(
            lambda vs, a: jnp.einsum("...n,...->n", vs, a, precision=tree.HIGHEST), c.basis, w
        )
        h = jnp.where(at_u, 0.0, jax.tree_util.tree_reduce(jnp.add, parts))
        w = jax.tree_util.tree_map(
            lambda a, vs: a - jnp.dot(vs, h, precision=tree.HIGHEST), w, c.basis
        )
        # A vector below eps ‖A v‖ is zero: the Krylov space is invariant and u + V y is exact.
        # ||A v||^2 = ||h||^2 + ||w||^2 (w is A v less its projection on the basis).
        w_norm = tree.tree_norm(w)
        thresh = eps * jnp.sqrt(jnp.where(at_u, 1.0, jnp.sum(h * h) + w_norm * w_norm))
        unit, w_norm = _normalize(w, w_norm, thresh)
        slot = jnp.where(at_u, 0, j + 1)
        basis = jax.tree_util.tree_map(
            lambda vs, a: jnp.where(cols == slot, a[..., None], jnp.where(at_u, 0.0, vs)),
            c.basis,
            unit,
        )
        row = jnp.where(cols == j + 1, w_norm.astype(h.dtype), h)
        fresh = jnp.eye(n, n + 1, dtype=c.hess.dtype)
        hess = jnp.where(at_u, fresh, jnp.where((cols[:n] == j)[:, None], row, c.hess))
        done = ~at_u & ((w_norm == 0.0) | (j + 1 >= n))

        def update() -> PyTree:
            return _like(tree.tree_add(_up(c.u, rdtype), _cycle_update(basis, hess, beta)), c.u)

        u = tree.tree_where(at_u, u, jax.lax.cond(done, update, lambda: c.u))
        # A cycle is skipped (the next step judges u again) where ‖r‖ already meets the target
        # of every running problem: each problem's residual is at most ‖r‖.
        target = jnp.asarray(rule.tol, rdtype) * judged.residuals.scale
        atol = jnp.min(jnp.where(book.running, target, jnp.inf))
        step = jnp.where(at_u, jnp.where(w_norm > atol, 1, 0), jnp.where(done, 0, j + 2))
        scalars = jnp.stack(
            [
                k + jnp.where(at_u, charge, 0).astype(rdtype),
                step.astype(rdtype),
                jnp.where(at_u, w_norm, beta),
                jnp.where(at_u, _spread(judged.residuals, spread), spread),
            ]
        )
        return _Carry(
            scalars=scalars,
            u=u,
            best_u=tree.tree_where(improved, x, c.best_u, bn),
            best_fu=tree.tree_where(judged.take_fx, fx, c.best_fu, bn),
            best_aux=tree.tree_where(judged.take_fx, aux, c.best_aux, bn),
            book=book,
            basis=basis,
            hess=hess,
            f_base=tree.tree_where(at_u, f_base, c.f_base),
        )

    return body_fun


def _spread(r: stopping.Residuals, old: jax.Array) -> jax.Array:
    """``s = max(1, ‖f(u)‖ + ‖f(u) − u‖)`` (whole-batch norms, from the judgement of ``f(u)``):
    at least ``max(1, ‖u‖, ‖f(u)‖)``, far enough from ``u`` that ``f(u + s v) − f(u)`` loses no
    more than ``eps ‖A v‖`` to rounding. A problem whose ``f(u)`` is not finite restarts from its
    best iterate, whose norms are not at hand: there ``s`` is at least the previous one."""
    sq = jnp.where(r.finite, r.fx_norm * r.fx_norm, 0.0), jnp.where(r.finite, r.abs_sq, 0.0)
    s = jnp.maximum(jnp.sqrt(jnp.sum(sq[0])) + jnp.sqrt(jnp.sum(sq[1])), 1.0)
    return jnp.where(jnp.all(r.finite), s, jnp.maximum(s, old))


def solve(problem: Problem, rule: stopping.StoppingRule, n: int) -> Solution:
    """Restarted GMRES with cycles of ``n`` Arnoldi steps on the affine ``problem`` (see the
    module docstring), stopping by ``rule`` (:func:`~deqjax._src.solvers.stopping.krylov_rule`)."""
    z0, rdtype = problem.z0, problem.rdtype
    s = _Setup(problem, rule, n, n + 3)
    basis = jax.tree_util.tree_map(lambda a: jnp.zeros(a.shape + (n + 1,), rdtype), z0)
    init = _Carry(
        scalars=jnp.asarray([0, 0, 0, 1], rdtype),  # k, step, beta, s
        u=z0,
        best_u=z0,
        best_fu=z0,
        best_aux=problem.aux0,
        book=stopping.initial_book(problem.batch_shape, rule.max_steps, rdtype),
        basis=basis,
        hess=jnp.eye(n, n + 1, dtype=rdtype),
        f_base=_up(z0, rdtype),
    )
    c = jax.lax.while_loop(lambda c: jnp.any(c.book.running), _body(s), init)
    return solution_of(c, c.scalars[_K], problem, rule)


def solution_of(c: Any, k: jax.Array, problem: Problem, rule: stopping.StoppingRule) -> Solution:
    """The :class:`Solution` of a Krylov loop's final carry (fields ``best_u``, ``best_fu``,
    ``best_aux``, ``book``) after ``k`` evaluations charged, checked at full precision
    (:mod:`~deqjax._src.solvers.verify`): this loop's and the chunked driver's in
    ``krylov.py``."""
    sol = Solution(
        value=c.best_u,
        num_steps=jnp.broadcast_to(k, problem.batch_shape).astype(jnp.int32),
        abs_residual=c.book.abs_residual,
        rel_residual=c.book.rel_residual,
        trace=c.book.trace,
        status=c.book.status,
        f_value=c.best_fu,
        aux=c.best_aux if problem.has_aux else None,
    )
    return verify.verified(problem, rule, sol)
