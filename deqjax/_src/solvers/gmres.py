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
evaluation is judged by the stopping rule, :func:`deqjax._src.solvers.stopping.judge`, and gives
the next cycle's residual ``r = b − A u``); at Arnoldi step ``k``, at ``V[:, k]``. Both kinds of
step share the loop body (the argument of ``f`` is selected, then a ``lax.cond`` applies the
step's update), so ``f``, a VJP of the cell for the adjoint map, appears once in the program, and
the loop does not nest: the chunked form (:func:`jax.scipy.sparse.linalg.gmres` inside a chunk
loop) had five nested loops, and a fixed-point gradient with it as the fallback took 2.4 s to
trace and compile on 2 CPU cores, against 1.3–1.9 s with this one (BENCHMARKS.md).

The accounting is that of a cycle run by :func:`jax.scipy.sparse.linalg.gmres` with one restart
(``solve_method="batched"``, the form deqjax used before) followed by a check of the true
residual: ``n + 3`` evaluations charged per cycle (its starting residual, ``n`` Arnoldi
products, its final residual, the check), written in the trace at each evaluation index of the
cycle; the start costs two (``b = f(0)`` and ``f(z0)``). The arithmetic is that cycle's too (its
least squares solved by an SVD rather than by normal equations), so the iterates agree with it
to float rounding; a cycle whose starting residual already meets the target (every running
problem's ``tol × scale``) is skipped, as there.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from deqjax._src import tree
from deqjax._src.solvers import stopping
from deqjax._src.solvers.problem import Problem
from deqjax._src.solvers.solution import Solution

PyTree = Any

_HIGHEST = jax.lax.Precision.HIGHEST


def _normalize(t: PyTree, thresh: jax.Array | None = None) -> tuple[PyTree, jax.Array]:
    """``(t / ‖t‖, ‖t‖)``, or zeros and 0 where ``‖t‖ <= thresh`` (default: the dtype's eps).
    The norm is of the whole pytree: every problem of a batch together."""
    norm = tree.tree_norm(t)
    dtype = jnp.result_type(*jax.tree_util.tree_leaves(t))
    thresh = jnp.finfo(norm.dtype).eps if thresh is None else thresh
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


class _Cycle(NamedTuple):
    """The Arnoldi state of the current cycle."""

    basis: PyTree  # leaves [..., n + 1]: V (its columns not yet built are zero)
    hess: jax.Array  # [n, n + 1]: row k is column k of H̄ (identity rows until built)
    beta: jax.Array  # ‖r‖ of the cycle's starting residual
    step: jax.Array  # int32: 0 = the next evaluation is at u (judged); k + 1 = Arnoldi step k


def _start_cycle(r: PyTree, n: int) -> _Cycle:
    """A cycle from the starting residual ``r``, its next step Arnoldi step 0."""
    unit, beta = _normalize(r)
    basis = jax.tree_util.tree_map(
        lambda a: jnp.concatenate([a[..., None], jnp.zeros(a.shape + (n,), a.dtype)], -1), unit
    )
    dtype = jnp.result_type(*jax.tree_util.tree_leaves(r))
    hess = jnp.eye(n, n + 1, dtype=dtype)
    return _Cycle(basis, hess, beta, jnp.asarray(1, jnp.int32))


def _arnoldi(c: _Cycle, av: PyTree, k: jax.Array) -> tuple[_Cycle, jax.Array]:
    """Arnoldi step ``k`` with ``av = A V[:, k]``: the new basis vector and row ``k`` of
    ``H``; ``True`` where the new vector vanished (the Krylov space is invariant)."""
    _, av_norm = _normalize(av)
    parts = jax.tree_util.tree_map(
        lambda v, a: jnp.einsum("...n,...->n", v, a, precision=_HIGHEST), c.basis, av
    )
    h = jax.tree_util.tree_reduce(jnp.add, parts)
    w = jax.tree_util.tree_map(lambda a, v: a - jnp.dot(v, h, precision=_HIGHEST), av, c.basis)
    eps = jnp.finfo(c.hess.dtype).eps
    unit, w_norm = _normalize(w, thresh=eps * av_norm)
    # Masked selects, not .at[k].set: a scatter per update costs more to compile than the rest.
    slot = jnp.arange(h.shape[0], dtype=k.dtype) == k + 1
    basis = jax.tree_util.tree_map(lambda v, u: jnp.where(slot, u[..., None], v), c.basis, unit)
    row = jnp.where(slot, w_norm.astype(h.dtype), h)
    hess = jnp.where((jnp.arange(c.hess.shape[0], dtype=k.dtype) == k)[:, None], row, c.hess)
    return c._replace(basis=basis, hess=hess), w_norm == 0.0


def _cycle_update(c: _Cycle) -> PyTree:
    """``V_n y`` with ``y = argmin ‖β e₁ − H̄ y‖`` (``c.hess`` is ``H̄ᵀ``, row ``k`` holding
    column ``k``; columns not built are unit vectors below the built ones, so their ``y`` is 0)."""
    rhs = jnp.where(jnp.arange(c.hess.shape[1]) == 0, c.beta.astype(c.hess.dtype), 0.0)
    y = jnp.linalg.lstsq(c.hess.T, rhs)[0]
    return jax.tree_util.tree_map(lambda v: jnp.dot(v[..., :-1], y, precision=_HIGHEST), c.basis)


class _Carry(NamedTuple):
    k: jax.Array  # int32 []: evaluations of f charged so far
    u: PyTree  # the current iterate (the next one judged)
    scale: jax.Array  # [*batch]: the residual's denominator (1, ||f(u)|| or atol/tol + ||u||)
    best_u: PyTree
    best_fu: PyTree  # f(best_u), kept so that f_value costs no extra evaluation
    best_aux: PyTree  # the aux of f at best_u (() without has_aux)
    book: stopping.Book  # per-problem residuals, status, trace
    cycle: _Cycle


class _Setup(NamedTuple):
    """What every step uses: the problem, its rule, the cycle length and cost, ``b = f(0)``."""

    problem: Problem
    rule: stopping.StoppingRule
    n: int  # Arnoldi steps per cycle
    cost: int  # evaluations charged per cycle: n + 3
    b: PyTree
    floor: jax.Array  # 0, or NaN when b is not finite (then no cycle runs)


def _next_cycle(s: _Setup, u: PyTree, fu: PyTree, book: stopping.Book, scale) -> _Cycle:
    """The cycle from ``u`` (``fu = f(u)``), run unless ``‖b − A u‖`` already meets every
    running problem's target ``tol × scale``."""
    rdtype = s.problem.rdtype
    target = jnp.where(book.running, jnp.asarray(s.rule.tol, rdtype) * scale, jnp.inf)
    atol = jnp.maximum(s.floor, jnp.min(target))
    # b − A u with A u = u − (f(u) − b): the residual of the linear system (in rdtype).
    r = tree.tree_sub(s.b, tree.tree_sub(_up(u, rdtype), tree.tree_sub(_up(fu, rdtype), s.b)))
    cycle = _start_cycle(r, s.n)
    # A skipped cycle (step 0): the next step judges u again.
    return cycle._replace(step=jnp.where(cycle.beta > atol, 1, 0).astype(jnp.int32))


def _judged(s: _Setup, c: _Carry, fu: PyTree, aux: PyTree) -> _Carry:
    """A step at ``u``: judge ``f(u)``, keep the best iterate, start the next cycle (from the
    best iterate where ``f(u)`` is not finite)."""
    bn = s.problem.batch_ndim
    step = stopping.judge(
        c.u,
        fu,
        tree.tree_sub(fu, c.u),
        c.book,
        s.rule,
        start=c.k,
        count=s.cost,
        next_count=s.cost,
    )
    finite, improved = step.residuals.finite, step.improved
    scale = jnp.where(finite, step.residuals.scale, c.scale)
    u = tree.tree_where(finite, c.u, c.best_u, bn)
    f_u = tree.tree_where(finite, fu, c.best_fu, bn)
    return _Carry(
        k=c.k + s.cost,
        u=u,
        scale=scale,
        best_u=tree.tree_where(improved, c.u, c.best_u, bn),
        best_fu=tree.tree_where(improved, fu, c.best_fu, bn),
        best_aux=tree.tree_where(improved, aux, c.best_aux, bn),
        book=step.book,
        cycle=_next_cycle(s, u, f_u, step.book, scale),
    )


def _arnoldi_step(s: _Setup, c: _Carry, fv: PyTree, v: PyTree) -> _Carry:
    """Arnoldi step ``k = cycle.step − 1`` (``fv = f(V[:, k])``); its last (or an invariant
    subspace) ends the cycle with ``u ← u + V y``."""
    k = c.cycle.step - 1
    av = tree.tree_sub(v, tree.tree_sub(_up(fv, s.problem.rdtype), s.b))  # A v = v − (f(v) − b)
    cycle, invariant = _arnoldi(c.cycle, av, k)
    done = invariant | (k + 1 >= s.n)

    def update() -> PyTree:
        return _like(tree.tree_add(_up(c.u, s.problem.rdtype), _cycle_update(cycle)), c.u)

    u = jax.lax.cond(done, update, lambda: c.u)
    return c._replace(u=u, cycle=cycle._replace(step=jnp.where(done, 0, k + 2)))


def _body(s: _Setup):
    def body_fun(c: _Carry) -> _Carry:
        at_u = c.cycle.step == 0
        column = jnp.maximum(c.cycle.step - 1, 0)
        v = jax.tree_util.tree_map(lambda a: a[..., column], c.cycle.basis)
        fx, aux = s.problem.fn(tree.tree_where(at_u, c.u, _like(v, c.u)))
        return jax.lax.cond(
            at_u, lambda: _judged(s, c, fx, aux), lambda: _arnoldi_step(s, c, fx, v)
        )

    return body_fun


def solve(problem: Problem, rule: stopping.StoppingRule, n: int) -> Solution:
    """Restarted GMRES with cycles of ``n`` Arnoldi steps on the affine ``problem`` (see the
    module docstring), stopping by ``rule`` (:func:`~deqjax._src.solvers.stopping.krylov_rule`)."""
    z0 = problem.z0
    b = _up(problem.fn(tree.tree_zeros_like(z0))[0], problem.rdtype)
    s = _Setup(problem, rule, n, n + 3, b, 0.0 * tree.tree_norm(b))
    fz0, aux0 = problem.fn(z0)
    book0 = stopping.initial_book(problem.batch_shape, rule.max_steps, problem.rdtype)
    # The start costs two evaluations, f(0) and f(z0).
    first = stopping.judge(
        z0, fz0, tree.tree_sub(fz0, z0), book0, rule, start=0, count=2, next_count=s.cost
    )
    scale = first.residuals.scale
    init = _Carry(
        k=jnp.asarray(2, jnp.int32),
        u=z0,
        scale=scale,
        best_u=z0,
        best_fu=fz0,
        best_aux=aux0,
        book=first.book,
        cycle=_next_cycle(s, z0, fz0, first.book, scale),
    )
    c = jax.lax.while_loop(lambda c: jnp.any(c.book.running), _body(s), init)
    return solution_of(c, problem)


def solution_of(c: Any, problem: Problem) -> Solution:
    """The :class:`Solution` of a Krylov loop's final carry (fields ``k``, ``best_u``,
    ``best_fu``, ``best_aux``, ``book``): this loop's and the chunked driver's in ``krylov.py``."""
    return Solution(
        value=c.best_u,
        num_steps=jnp.broadcast_to(c.k, problem.batch_shape).astype(jnp.int32),
        abs_residual=c.book.stats[..., stopping.BEST_ABS],
        rel_residual=c.book.stats[..., stopping.BEST_REL],
        trace=c.book.trace,
        status=c.book.status,
        f_value=c.best_fu,
        aux=c.best_aux if problem.has_aux else None,
    )
