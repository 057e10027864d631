"""Restarted GMRES (Saad & Schultz 1986) as ONE bounded loop: one evaluation of ``f`` per step.

:class:`~deqjax.solvers.GMRES` solves the affine fixed point ``u = f(u) = b + L u``, i.e.
``A u = b`` with ``A = I − L`` (for the implicit backward, ``A = I − J_f(z*)ᵀ``: each product is
one VJP of the cell). A cycle of ``n`` Arnoldi steps builds an orthonormal basis ``V`` of the
Krylov space ``K_n(A, r)`` of the cycle's starting residual ``r = b − A u`` and the Hessenberg
matrix ``H`` with ``A V_n = V_{n+1} H̄`` (classical Gram–Schmidt against every basis column,
the unused ones zero); the cycle ends with ``u ← u + V_n y``, ``y`` the least-squares solution of
``min ‖β e₁ − H̄ y‖`` (``β = ‖r‖``, Givens rotations and back substitution). An Arnoldi step
whose new vector vanishes below ``eps ‖A v‖`` (an invariant subspace: ``u + V y`` is exact)
ends the cycle early. The Krylov workspace (the basis, ``H̄``, the least squares) is held in the
problem's scalar dtype (:func:`deqjax._src.tree.scalar_dtype`): float32 for a bfloat16 or float16
state (a half-precision basis loses its orthogonality within a few steps), float64 for float64,
complex64 / complex128 for a complex state; the iterate and every argument of ``f`` keep the
state's dtype.

A complex state is solved in ``C^n`` (``f`` must be affine over ``C``, i.e. ``L`` complex-linear):
the projections are ``V^H w`` (conjugated basis), ``H̄`` is complex, and its least squares uses
complex Givens rotations ``[[conj(c), conj(s)], [-s, c]]`` with ``c = a / r``, ``s = b / r``,
``r = sqrt(|a|^2 + |b|^2)`` (unitary, and they zero the subdiagonal); for a real state these are
the usual real rotations.

With ``batch_ndim = n`` every quantity of a cycle is per problem (the projections, norms, ``β``,
the step ``s``, ``H̄`` and its least squares): the cycles start at the same steps for the whole
batch, a problem whose residual already meets its target (or that stopped) takes a cycle of
zero vectors (its iterate does not move), and one whose Krylov space became invariant gets zero
columns (their ``y`` is 0) while the others go on. Each problem's iterates are those it would
have alone, to rounding.

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
fixed-point gradient with it as the fallback took longer to trace and compile than with a
two-branch body (BENCHMARKS.md, "Eager calls"). A step reduces the state three times:
the stopping rule's ``‖f(u) − u‖`` and ``‖f(u)‖`` (which also give the step ``s``), and the new
basis vector's norm (which with its projections gives ``‖A v‖``).

The accounting is that of a cycle run by :func:`jax.scipy.sparse.linalg.gmres` with one restart
(``solve_method="batched"``, the form deqjax used before) followed by a check of the true
residual: ``n + 3`` evaluations charged per cycle (its starting residual, ``n`` Arnoldi
products, its final residual, the check), written in the trace at each evaluation index of the
cycle; the start costs two (there, ``b = f(0)`` and ``f(z0)``; here one evaluation, so the
charges are an upper bound). The arithmetic is that cycle's too (its least squares solved by
Givens rotations rather than by normal equations; ``L v`` by a difference, see :func:`_body`), so
the iterates agree with it to float rounding; a cycle whose starting residual already meets the
target (every running problem's ``tol × scale``) is skipped, as there.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from deqjax._src import tree, vma
from deqjax._src.solvers import stopping, verify
from deqjax._src.solvers.problem import Problem
from deqjax._src.solvers.solution import Solution

PyTree = Any


def _normalize(t: PyTree, norm: jax.Array, thresh: jax.Array, bn: int) -> tuple[PyTree, jax.Array]:
    """``(t / ‖t‖, ‖t‖)`` per problem, or zeros and 0 where ``‖t‖ <= thresh`` (``norm`` and
    ``thresh``: ``[*batch]``)."""
    use = norm > thresh
    unit = tree.tree_scale(jnp.where(use, 1.0 / jnp.where(use, norm, 1.0), 0.0), t, bn)
    return unit, jnp.where(use, norm, 0.0)


def _flat(a: jax.Array, bn: int, keep_last: bool = False) -> jax.Array:
    """``a`` as ``[problems, features]`` (``[problems, features, last]`` with ``keep_last``)."""
    problems = int(np.prod(a.shape[:bn]))
    return a.reshape((problems, -1, a.shape[-1]) if keep_last else (problems, -1))


def _project(basis: PyTree, w: PyTree, bn: int) -> jax.Array:
    """``Vᴴ w`` per problem: ``[*batch, n + 1]`` (``Vᵀ w`` for a real state)."""

    def one(vs, a):
        flat_v = tree.conj(_flat(vs, bn, True))
        out = jnp.einsum("pfn,pf->pn", flat_v, _flat(a, bn), precision=tree.HIGHEST)
        return out.reshape(a.shape[:bn] + vs.shape[-1:])

    return jax.tree_util.tree_reduce(jnp.add, jax.tree_util.tree_map(one, basis, w))


def _combine(basis: PyTree, y: jax.Array, bn: int) -> PyTree:
    """``V y`` per problem, ``y`` ``[*batch, columns]`` over the first columns of ``V``."""

    def one(vs):
        cols = vs[..., : y.shape[-1]]
        flat = jnp.einsum(
            "pfn,pn->pf",
            _flat(cols, bn, True),
            y.reshape((-1, y.shape[-1])),
            precision=tree.HIGHEST,
        )
        return flat.reshape(vs.shape[:-1])

    return jax.tree_util.tree_map(one, basis)


def _up(t: PyTree, rdtype: jnp.dtype) -> PyTree:
    """``t`` in the workspace dtype (float32 for half-precision states, float64 for float64,
    the complex counterparts for a complex state)."""
    return jax.tree_util.tree_map(lambda a: a.astype(rdtype), t)


def _like(t: PyTree, ref: PyTree) -> PyTree:
    """``t`` in the dtypes of ``ref``'s leaves (the state's own dtype)."""
    return jax.tree_util.tree_map(lambda a, r: a.astype(r.dtype), t, ref)


def _abs_sq(a: jax.Array) -> jax.Array:
    """``|a|^2`` elementwise, real (``a * a`` for a real array)."""
    if tree.is_complex_dtype(a.dtype):
        return jnp.real(a) ** 2 + jnp.imag(a) ** 2
    return a * a


def _hessenberg_lstsq(hess: jax.Array, beta: jax.Array) -> jax.Array:
    """``y = argmin ‖β e₁ − H̄ y‖`` per problem by Givens rotations and back substitution
    (``hess`` ``[*batch, n, n + 1]`` is ``H̄ᵀ``; ``y`` ``[*batch, n]``).

    Elementwise work on the batch in two ``fori_loop``s of ``n`` steps, no LAPACK call: a batched
    SVD per cycle inside the solver's loop hung XLA:CPU with several devices (pmap over 4 fake
    devices), and the rotations are backward stable where normal equations would square the
    condition number. A zero pivot (a column that was never built, a problem whose cycle is all
    zeros) gives that ``y_j = 0``. Complex ``H̄``: complex rotations (see the module
    docstring)."""
    n = hess.shape[-2]
    cplx = tree.is_complex_dtype(hess.dtype)
    h = jnp.swapaxes(hess, -1, -2)  # [*batch, n + 1, n]: H̄
    g = jnp.where(jnp.arange(n + 1) == 0, beta[..., None].astype(h.dtype), 0.0)  # [*batch, n + 1]
    rows = jnp.arange(n + 1)[:, None]

    def rotate(j, hg):
        h, g = hg
        h_j = jax.lax.dynamic_index_in_dim(h, j, -2, False)  # [*batch, n]
        h_k = jax.lax.dynamic_index_in_dim(h, j + 1, -2, False)
        a = jax.lax.dynamic_index_in_dim(h_j, j, -1, False)  # [*batch]
        b = jax.lax.dynamic_index_in_dim(h_k, j, -1, False)
        r = jnp.hypot(jnp.abs(a), jnp.abs(b)).astype(h.dtype) if cplx else jnp.hypot(a, b)
        safe = (jnp.abs(r) if cplx else r) > 0
        c = jnp.where(safe, a / jnp.where(safe, r, 1.0), 1.0)
        sn = jnp.where(safe, b / jnp.where(safe, r, 1.0), 0.0)
        hj = jax.lax.dynamic_index_in_dim(h, j, -2)  # [*batch, 1, n]
        hk = jax.lax.dynamic_index_in_dim(h, j + 1, -2)
        gj = jax.lax.dynamic_index_in_dim(g, j, -1)  # [*batch, 1]
        gk = jax.lax.dynamic_index_in_dim(g, j + 1, -1)
        # [[conj(c), conj(s)], [-s, c]]: unitary, and it zeros row j + 1's entry j.
        c3, s3 = c[..., None, None], sn[..., None, None]
        cc3, cs3 = tree.conj(c3), tree.conj(s3)
        h = jnp.where(
            rows == j, cc3 * hj + cs3 * hk, jnp.where(rows == j + 1, c3 * hk - s3 * hj, h)
        )
        ids = jnp.arange(n + 1)
        c2, s2 = c[..., None], sn[..., None]
        cc2, cs2 = tree.conj(c2), tree.conj(s2)
        g = jnp.where(ids == j, cc2 * gj + cs2 * gk, jnp.where(ids == j + 1, c2 * gk - s2 * gj, g))
        return h, g

    h, g = vma.fori_loop(0, n, rotate, (h, g))
    tiny = jnp.finfo(h.dtype).tiny

    def substitute(i, y):
        j = n - 1 - i
        row = jax.lax.dynamic_index_in_dim(h, j, -2, False)  # [*batch, n]
        pivot = jax.lax.dynamic_index_in_dim(row, j, -1, False)
        rest = jnp.sum(jnp.where(jnp.arange(n) > j, row * y, 0.0), axis=-1)
        g_j = jax.lax.dynamic_index_in_dim(g, j, -1, False)
        ok = jnp.abs(pivot) > tiny
        y_j = jnp.where(ok, (g_j - rest) / jnp.where(ok, pivot, 1.0), 0.0)
        return jnp.where(jnp.arange(n) == j, y_j[..., None], y)

    return vma.fori_loop(0, n, substitute, jnp.zeros(h.shape[:-2] + (n,), h.dtype))


def _cycle_update(basis: PyTree, hess: jax.Array, beta: jax.Array, bn: int) -> PyTree:
    """``V_n y`` with ``y = argmin ‖β e₁ − H̄ y‖`` per problem (:func:`_hessenberg_lstsq`)."""
    return _combine(basis, _hessenberg_lstsq(hess, beta), bn)


# Columns of _Carry.scalars, shared by every problem: evaluations of f charged so far; the step
# (0: the next evaluation is at u and judged, j + 1: Arnoldi step j).
_K, _STEP = range(2)
# Columns of _Carry.per_problem: ‖r‖ of the cycle's starting residual; s (Arnoldi step j evaluates
# f at u + s V[:, j]).
_BETA, _SPREAD = range(2)


class _Carry(NamedTuple):
    # [2] in the reduction dtype (the columns above; the counts are exact below 2^24).
    scalars: jax.Array
    per_problem: jax.Array  # [*batch, 2]: the columns above, per problem
    u: PyTree  # the current iterate (the next one judged)
    best_u: PyTree
    best_fu: PyTree  # f(best_u), kept so that f_value costs no extra evaluation
    best_aux: PyTree  # the aux of f at best_u (() without has_aux)
    book: stopping.Book  # per-problem residuals, status, trace
    basis: PyTree  # leaves [..., n + 1]: V of the current cycle (columns not yet built are zero)
    hess: jax.Array  # [*batch, n, n + 1]: row j is column j of H̄ (identity rows until built)
    f_base: PyTree  # f at the cycle's starting iterate, in the workspace dtype


class _Setup(NamedTuple):
    """What every step uses: the problem, its rule, the cycle length and cost."""

    problem: Problem
    rule: stopping.StoppingRule
    n: int  # Arnoldi steps per cycle
    cost: int  # evaluations charged per cycle: n + 3


def _new_column(
    s: _Setup,
    c: _Carry,
    w: PyTree,
    at_u: jax.Array,
    j: jax.Array,
    target: jax.Array,
    running: jax.Array,
) -> tuple[PyTree, jax.Array, jax.Array, jax.Array]:
    """``w`` (the residual ``r`` at a cycle's start, else ``A v``) orthogonalised against the basis
    and normalised, as the new column of ``V`` and of ``H̄``: ``(basis, hess, ‖w‖, need)``, with
    ``need`` the problems whose cycle runs (``‖r‖`` above ``target``, and running)."""
    n, bn = s.n, s.problem.batch_ndim
    wdtype = tree.scalar_dtype(s.problem.z0)  # the workspace's: complex for a complex state
    cols = jnp.arange(n + 1, dtype=jnp.int32)
    eps = jnp.finfo(s.problem.rdtype).eps
    lead = (1,) * bn  # [n + 1]-shaped masks broadcast against [*batch, n + 1]
    # Classical Gram–Schmidt against the basis (none at a cycle's start), per problem.
    h = jnp.where(at_u, 0.0, _project(c.basis, w, bn))  # [*batch, n + 1]
    w = tree.tree_sub(w, _combine(c.basis, h, bn))
    # A vector below eps ‖A v‖ is zero: the Krylov space is invariant and u + V y is exact.
    # ||A v||^2 = ||h||^2 + ||w||^2 (w is A v less its projection on the basis).
    w_norm = tree.tree_norm(w, bn)
    # A cycle is run for the problems whose ‖r‖ is above their target (and that run); for
    # the others its basis stays zero (their u does not move): each problem's cycle is the one
    # it would run alone.
    need = running & (w_norm > target)
    w_norm = jnp.where(at_u & ~need, 0.0, w_norm)
    h_sq = jnp.sum(_abs_sq(h), axis=-1)
    thresh = eps * jnp.sqrt(jnp.where(at_u, 1.0, h_sq + w_norm * w_norm))
    unit, w_norm = _normalize(w, w_norm, thresh, bn)
    slot = jnp.where(at_u, 0, j + 1)
    basis = jax.tree_util.tree_map(
        lambda vs, a: jnp.where(cols == slot, a[..., None], jnp.where(at_u, 0.0, vs)),
        c.basis,
        unit,
    )
    row = jnp.where((cols == j + 1).reshape(lead + (n + 1,)), w_norm[..., None].astype(wdtype), h)
    fresh = jnp.eye(n, n + 1, dtype=c.hess.dtype)
    built = (cols[:n] == j).reshape(lead + (n, 1))
    hess = jnp.where(at_u, fresh, jnp.where(built, row[..., None, :], c.hess))
    return basis, hess, w_norm, need


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
    wdtype = tree.scalar_dtype(problem.z0)  # the workspace's: complex for a complex state

    def body_fun(c: _Carry) -> _Carry:
        k, beta, spread = c.scalars[_K], c.per_problem[..., _BETA], c.per_problem[..., _SPREAD]
        k_int = k.astype(jnp.int32)
        at_u = c.scalars[_STEP] == 0
        j = jnp.maximum(c.scalars[_STEP].astype(jnp.int32) - 1, 0)
        v = jax.tree_util.tree_map(lambda a: a[..., j], c.basis)
        away = tree.tree_add(_up(c.u, wdtype), tree.tree_scale(spread, v, bn))
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
        f_base = _up(tree.tree_where(finite, fx, c.best_fu, bn), wdtype)
        r = tree.tree_sub(f_base, _up(u, wdtype))
        lv = tree.tree_scale(1.0 / spread, tree.tree_sub(_up(fx, wdtype), c.f_base), bn)
        av = tree.tree_sub(v, lv)
        w = tree.tree_where(at_u, r, av)
        # A cycle is run for the problems whose ‖r‖ is above their target (and that run).
        target = jnp.asarray(rule.tol, rdtype) * judged.residuals.scale
        basis, hess, w_norm, need = _new_column(s, c, w, at_u, j, target, book.running)
        done = ~at_u & (jnp.all(w_norm == 0.0) | (j + 1 >= n))

        def update() -> PyTree:
            step = _cycle_update(basis, hess, beta, bn)
            return _like(tree.tree_add(_up(c.u, wdtype), step), c.u)

        u = tree.tree_where(at_u, u, vma.cond(done, update, lambda: c.u))
        step = jnp.where(at_u, jnp.where(jnp.any(need), 1, 0), jnp.where(done, 0, j + 2))
        scalars = jnp.stack([k + jnp.where(at_u, charge, 0).astype(rdtype), step.astype(rdtype)])
        per_problem = jnp.stack(
            [
                jnp.where(at_u, w_norm, beta),
                jnp.where(at_u, _spread(judged.residuals, spread), spread),
            ],
            axis=-1,
        )
        return _Carry(
            scalars=scalars,
            per_problem=per_problem,
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
    """``s = max(1, ‖f(u)‖ + ‖f(u) − u‖)`` per problem (from the judgement of ``f(u)``): at least
    ``max(1, ‖u‖, ‖f(u)‖)``, far enough from ``u`` that ``f(u + s v) − f(u)`` loses no more than
    ``eps ‖A v‖`` to rounding. A problem whose ``f(u)`` is not finite restarts from its best
    iterate, whose norms are not at hand: there ``s`` is the previous one."""
    s = jnp.maximum(r.fx_norm + r.abs, 1.0)
    return jnp.where(r.finite, s, old)


def solve(problem: Problem, rule: stopping.StoppingRule, n: int) -> Solution:
    """Restarted GMRES with cycles of ``n`` Arnoldi steps on the affine ``problem`` (see the
    module docstring), stopping by ``rule`` (:func:`~deqjax._src.solvers.stopping.krylov_rule`)."""
    z0, rdtype = problem.z0, problem.rdtype
    wdtype = tree.scalar_dtype(z0)
    s = _Setup(problem, rule, n, n + 3)
    basis = jax.tree_util.tree_map(lambda a: jnp.zeros(a.shape + (n + 1,), wdtype), z0)
    init = _Carry(
        scalars=jnp.zeros((2,), rdtype),  # k, step
        per_problem=jnp.broadcast_to(jnp.asarray([0, 1], rdtype), problem.batch_shape + (2,)),
        u=z0,
        best_u=z0,
        best_fu=z0,
        best_aux=problem.aux0,
        book=stopping.initial_book(problem.batch_shape, rule.max_steps, rdtype),
        basis=basis,
        hess=jnp.broadcast_to(jnp.eye(n, n + 1, dtype=wdtype), problem.batch_shape + (n, n + 1)),
        f_base=_up(z0, wdtype),
    )
    c = vma.while_loop(lambda c: jnp.any(c.book.running), _body(s), init)
    return solution_of(c, problem, rule)


def solution_of(c: Any, problem: Problem, rule: stopping.StoppingRule) -> Solution:
    """The :class:`Solution` of a Krylov loop's final carry (fields ``best_u``, ``best_fu``,
    ``best_aux``, ``book``: ``num_steps`` the evaluations charged to each problem while it ran),
    checked at full precision (:mod:`~deqjax._src.solvers.verify`): this loop's and the chunked
    driver's in ``krylov.py``."""
    sol = Solution(
        value=c.best_u,
        num_steps=c.book.num_steps,
        abs_residual=c.book.abs_residual,
        rel_residual=c.book.rel_residual,
        trace=c.book.trace,
        status=c.book.status,
        f_value=c.best_fu,
        aux=c.best_aux if problem.has_aux else None,
    )
    return verify.verified(problem, rule, sol)
