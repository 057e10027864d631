"""Krylov solvers for an AFFINE fixed-point problem ``u = f(u) = b + L u``: the implicit backward.

The adjoint equation of the implicit function theorem (DEQ paper, Eq. 11; JR paper, Eq. 2) is the
affine fixed-point problem ``u = g + J_f(z*)ᵀ u``, i.e. the linear system ``(I − Jᵀ) u = g``. The
fixed-point solvers (:func:`~deqjax.solvers.fixed_point_iteration`, Anderson, Broyden) solve it as
a fixed point and can fail where ``J`` has an eigenvalue near ``−1`` (Picard iteration oscillates)
even though ``I − Jᵀ`` is well conditioned. The Krylov methods here solve the linear system
itself:

* :func:`gmres` — restarted GMRES (Saad & Schultz 1986) on ``(I − L) u = b``, written as one
  ``lax.while_loop`` in :mod:`deqjax._src.solvers.gmres` (the default fallback of the implicit
  backward, so its program is kept small: :func:`jax.scipy.sparse.linalg.gmres` nests loops);
* :func:`bicgstab` — BiCGStab (van der Vorst 1992) on the same system
  (:func:`deqjax._src.solvers.krylov_chunks.bicgstab`);
* :func:`normal_cg` — conjugate gradients on the normal equations
  ``(I − L)ᴴ(I − L) u = (I − L)ᴴ b`` (CGNR; ``ᴴ = ᵀ`` for a real state): converges for any
  nonsingular ``I − L``, at the price of a squared condition number and one extra (transposed)
  product per iteration (:func:`deqjax._src.solvers.krylov_chunks.normal_cg`).

Complex states (``complex64``, ``complex128``) are solved in ``C^n`` with the Hermitian inner
product (:mod:`deqjax._src.tree`): GMRES and BiCGStab need ``L`` complex-linear (for the implicit
backward: a cell holomorphic in ``z``); CG on the normal equations keeps real step sizes and needs
``L`` only real-linear (a cell through ``conj(z)``, ``abs``, ``real``, ``imag``).

Each takes the affine map ``f`` (``b = f(0)`` and ``L u = f(u) − b`` are read off it) and a start
``z0``, i.e. it has the signature of every deqjax solver, ``(f, z0) -> Solution``, so it plugs in
where a fixed-point solver does: ``dq.ImplicitAdjoint(solver=dq.solvers.gmres)``. For the adjoint
map ``f(u) = g + Jᵀu`` a product with ``I − L`` is one VJP of the cell; :func:`normal_cg` also
needs ``(I − L)ᵀ``, one JVP of the cell (obtained by differentiating the VJP).

The solve runs in chunks (one GMRES restart cycle, or ``chunk`` BiCGStab/CG iterations) inside a
bounded ``lax.while_loop``; after each chunk the true residual ``‖f(u) − u‖`` is computed with one
more evaluation of ``f`` and judged by the stopping rule of every deqjax solver
(:mod:`deqjax._src.solvers.stopping`): the lowest-residual iterate, ``num_steps``, the residual
trace and a status (``CONVERGED`` / ``MAX_STEPS`` / ``NONFINITE``; a Krylov solve does not report
``DIVERGED``). A start that already meets ``tol`` costs two
evaluations of ``f`` and no Krylov work, which makes these solvers cheap fallbacks.

``num_steps`` counts evaluations of ``f`` charged per chunk: a chunk that ends early (every
running problem's own residual estimate below its target) is charged in full, so it is an upper
bound (exact for GMRES, whose cycles always run ``restart`` steps).
BiCGStab and CG restart their recurrences at each chunk, so their chunks are long (50
iterations by default). ``trace`` holds, at each evaluation index of a chunk, the
residual measured after that chunk.

With ``batch_ndim = n > 0`` (leading axes of every leaf index independent problems) every
scalar of the method is per problem: GMRES's Gram–Schmidt projections, norms, step and least
squares (:mod:`deqjax._src.solvers.gmres`), BiCGStab's and CG's inner products and step sizes
(:mod:`deqjax._src.solvers.krylov_chunks`), the residual, the stopping test, the best iterate,
``num_steps`` and the status. One product with ``I − L`` serves the whole batch (one VJP of the
cell for the implicit backward), but each problem's iterates are those it would have alone (to
rounding): an example's gradient does not depend on its batch-mates, or on which device they
share (``tests/adjoints/test_batch_independence.py``). A problem that meets its tolerance stops
moving while the others iterate, and a non-finite one spoils no other.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from deqjax._src import checks, tree, vma
from deqjax._src.solvers import gmres as gmres_lib
from deqjax._src.solvers import krylov_chunks, registry, stopping
from deqjax._src.solvers.options import Options
from deqjax._src.solvers.problem import Problem, check_problem
from deqjax._src.solvers.solution import Solution

PyTree = Any
MapFn = Callable[[PyTree], PyTree]


class _Method(NamedTuple):
    """A Krylov method: the loop that runs it on a problem, by a stopping rule."""

    run: Callable[[Problem, stopping.StoppingRule], Solution]


class _Chunks(NamedTuple):
    """A Krylov method as the chunked driver runs it."""

    chunk_solve: Callable[
        ..., PyTree
    ]  # (*operators, b, u, target [*batch], bn) -> u after one chunk
    cost: int  # evaluations of f charged per chunk, its residual check included
    needs_transpose: bool  # the operators are (A, Aᵀ), else (A,)


class _Carry(NamedTuple):
    k: jax.Array  # int32 []: evaluations of f charged so far
    u: PyTree  # current iterate (start of the next chunk)
    scale: jax.Array  # [*batch]: the residual's denominator (1, ||f(u)|| or atol/tol + ||u||)
    best_u: PyTree
    best_fu: PyTree  # f(best_u), kept so that f_value costs no extra evaluation
    best_aux: PyTree  # the aux of f at best_u (() without has_aux)
    book: stopping.Book  # per-problem residuals, status, trace


def _operators(fn: Callable, z0: PyTree, b: PyTree, needs_transpose: bool) -> tuple[MapFn, ...]:
    """``A u = (I - L) u = u - (f(u) - b)``, and with ``needs_transpose`` also ``Aᴴ``.

    ``Aᴴ v = conj(Aᵀ conj(v))`` with ``Aᵀ`` JAX's VJP: the adjoint of ``A`` for the inner product
    ``Re<a, b>`` (for a complex-linear ``A``, its conjugate transpose; ``Aᵀ`` for a real state,
    where no conjugation is applied).
    """

    def matvec(u: PyTree) -> PyTree:
        return tree.tree_sub(u, tree.tree_sub(fn(u)[0], b))

    if not needs_transpose:
        return (matvec,)
    # (I - L)^T by differentiating the (linear) product; for the adjoint map this is a JVP of the
    # cell (the transpose of its VJP).
    _, vjp_a = jax.vjp(matvec, z0)
    return matvec, lambda v: tree.tree_conj(vjp_a(tree.tree_conj(v))[0])


def _chunk_step(problem: Problem, rule: stopping.StoppingRule, method: _Chunks, operators, b):
    """The loop body: one chunk of the method, then its true residual judged."""
    bn, rdtype = problem.batch_ndim, problem.rdtype
    inf = jnp.asarray(jnp.inf, rdtype)

    def body_fun(c: _Carry) -> _Carry:
        running = c.book.running
        # The absolute residual each problem needs (+inf: a stopped problem does not move).
        target = jnp.where(running, jnp.asarray(rule.tol, rdtype) * c.scale, inf)
        u = method.chunk_solve(*operators, b, c.u, target, bn)
        fu, aux = problem.fn(u)
        step = stopping.judge(
            u,
            fu,
            tree.tree_sub(fu, u),
            c.book,
            rule,
            start=c.k,
            count=method.cost,
            next_count=method.cost,
        )
        finite, improved = step.residuals.finite, step.improved
        return _Carry(
            k=c.k + method.cost,
            # A non-finite chunk restarts from the best iterate (other problems go on).
            u=tree.tree_where(finite, u, c.best_u, bn),
            scale=jnp.where(finite, step.residuals.scale, c.scale),
            best_u=tree.tree_where(improved, u, c.best_u, bn),
            best_fu=tree.tree_where(improved, fu, c.best_fu, bn),
            best_aux=tree.tree_where(improved, aux, c.best_aux, bn),
            book=step.book,
        )

    return body_fun


def _solve(problem: Problem, options: KrylovSolver, method: _Method) -> Solution:
    """Runs ``method`` on ``problem`` with the stopping rule of ``options``."""
    return method.run(problem, stopping.krylov_rule(options))


def _run_chunks(problem: Problem, rule: stopping.StoppingRule, method: _Chunks) -> Solution:
    """The chunked driver of BiCGStab and CG (see the module docstring)."""
    z0 = problem.z0
    b, _ = problem.fn(tree.tree_zeros_like(z0))
    operators = _operators(problem.fn, z0, b, method.needs_transpose)
    fz0, aux0 = problem.fn(z0)
    book0 = stopping.initial_book(problem.batch_shape, rule.max_steps, problem.rdtype)
    # The start costs two evaluations, f(0) and f(z0).
    first = stopping.judge(
        z0, fz0, tree.tree_sub(fz0, z0), book0, rule, start=0, count=2, next_count=method.cost
    )
    init = _Carry(
        k=jnp.asarray(2, jnp.int32),
        u=z0,
        scale=first.residuals.scale,
        best_u=z0,
        best_fu=fz0,
        best_aux=aux0,
        book=first.book,
    )
    c = vma.while_loop(
        lambda c: jnp.any(c.book.running),
        _chunk_step(problem, rule, method, operators, b),
        init,
    )
    return gmres_lib.solution_of(c, problem, rule)


def _chunked(chunk_solve: Callable[..., PyTree], cost: int, needs_transpose: bool) -> _Method:
    """A method run in chunks by :func:`_run_chunks`."""
    chunks = _Chunks(chunk_solve, cost, needs_transpose)
    return _Method(functools.partial(_run_chunks, method=chunks))


def _chunk_iters(requested: int, per_iter: int, overhead: int, max_steps: int) -> int:
    """Iterations per chunk: ``requested``, or fewer so that one chunk fits in ``max_steps``."""
    fit = (max_steps - 3 - overhead) // per_iter
    return int(max(1, min(requested, fit)))


@dataclasses.dataclass(frozen=True, kw_only=True)
class KrylovSolver(Options):
    """A Krylov solver for an affine ``f``: a subclass declares its fields and its method.

    Fields: those of :class:`~deqjax._src.solvers.options.Options` (``max_steps`` defaults to 100:
    two evaluations go to ``b = f(0)`` and ``f(z0)``, then each chunk is charged in full). The
    solve runs its own ``lax.while_loop`` (no ``loop`` field).
    """

    loop_kinds: ClassVar[tuple[str, ...]] = ()

    max_steps: int = 100

    def method(self, size: int) -> _Method:
        """The method for a problem of ``size`` scalar entries."""
        raise NotImplementedError

    def _run(self, f: Callable[[PyTree], PyTree], z0: PyTree, /) -> Solution:
        """Solves the affine fixed point ``u = f(u)`` from ``z0``."""
        problem = check_problem(f, z0, batch_ndim=self.batch_ndim, has_aux=self.has_aux)
        stopping.check_resolvable(self.tol, self.stop_mode, problem.z0)
        return _solve(problem, self, self.method(tree.tree_size(problem.z0)))


@dataclasses.dataclass(frozen=True, kw_only=True)
class GMRES(KrylovSolver):
    """Restarted GMRES (Saad & Schultz 1986) on ``(I − L)u = b`` for ``u = f(u) = b + L u``.

    One ``lax.while_loop`` with one evaluation of ``f`` per step (:mod:`deqjax._src.solvers.gmres`),
    charged ``restart + 3`` evaluations per cycle. GMRES minimises ``‖b − (I − L)u‖`` over a growing
    Krylov space, so it converges for any nonsingular ``I − L`` (within ``restart`` iterations per
    cycle; restarts can slow it on strongly non-normal systems). As the implicit backward (DEQ
    paper, Eq. 11) each product is one VJP of the cell.

    Attributes:
      restart: Krylov dimension per cycle (reduced so that one cycle fits in ``max_steps``).

    Example:
      >>> sol = dq.solvers.GMRES(tol=1e-8)(lambda u: g + 0.9 * u, jnp.zeros(3))  # u = 10 g
    """

    restart: int = 20

    def check(self) -> None:
        super().check()
        checks.check_positive_int(self.restart, "restart")

    def method(self, size: int) -> _Method:
        iters = _chunk_iters(min(self.restart, max(size, 1)), 1, 2, self.max_steps)
        return _Method(functools.partial(gmres_lib.solve, n=iters))


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Chunked(KrylovSolver):
    """A Krylov solver whose chunks are ``chunk`` iterations (its recurrence restarts at each)."""

    chunk: int = 50

    def check(self) -> None:
        super().check()
        checks.check_positive_int(self.chunk, "chunk")


@dataclasses.dataclass(frozen=True, kw_only=True)
class BiCGStab(_Chunked):
    """BiCGStab (van der Vorst 1992) on ``(I − L)u = b`` for ``u = f(u) = b + L u``.

    Per problem (:func:`deqjax._src.solvers.krylov_chunks.bicgstab`), ``chunk`` iterations (two
    products each)
    per chunk (``2 chunk + 2`` evaluations). Short recurrences (memory independent of the
    iteration count) but no minimisation guarantee: it can stagnate or break down where GMRES
    converges.

    Attributes:
      chunk: BiCGStab iterations between two residual checks.
    """

    def method(self, size: int) -> _Method:
        iters = _chunk_iters(self.chunk, 2, 1, self.max_steps)

        def chunk_solve(matvec, b, u, target, bn):
            return krylov_chunks.bicgstab(matvec, b, u, target, iters, bn)

        return _chunked(chunk_solve, 2 * iters + 2, needs_transpose=False)


@dataclasses.dataclass(frozen=True, kw_only=True)
class NormalCG(_Chunked):
    """CG on the normal equations ``AᴴA u = Aᴴb``, ``A = I − L``, for ``u = f(u) = b + L u`` (CGNR).

    Per problem (:func:`deqjax._src.solvers.krylov_chunks.normal_cg`). ``AᴴA`` is symmetric
    (Hermitian, for a complex state) positive definite for any nonsingular ``A``, so CG converges
    without the eigenvalue conditions of the fixed-point solvers, but at the rate of ``cond(A)²``.
    Each iteration costs one product with ``A`` (a VJP of the cell, for the adjoint map) and one
    with ``Aᴴ`` (a JVP, by differentiating the former); a chunk costs ``2 chunk + 4``
    evaluations. CG's internal stopping test is on the normal-equation residual; deqjax's own
    test on ``‖f(u) − u‖`` after each chunk decides.

    Attributes:
      chunk: CG iterations between two residual checks.
    """

    def method(self, size: int) -> _Method:
        iters = _chunk_iters(self.chunk, 2, 3, self.max_steps)

        def chunk_solve(matvec, rmatvec, b, u, target, bn):
            # The normal residual A^T r is at most ||A|| ||r||; with ||A|| unknown, stop CG only
            # well below the target and let the true-residual check decide.
            return krylov_chunks.normal_cg(matvec, rmatvec, b, u, 1e-3 * target, iters, bn)

        return _chunked(chunk_solve, 2 * iters + 4, needs_transpose=True)


@registry.function_form(GMRES)
def gmres(f: MapFn, z0: PyTree, /, **options) -> Solution:
    """Solves the affine fixed point ``u = f(u)`` by restarted GMRES: ``GMRES(**options)(f, z0)``.

    ``f`` must be AFFINE (e.g. ``u ↦ g + Jᵀu``); for a non-affine ``f`` the true residual is still
    reported, so the status shows the failure. ``options``: the fields of
    :class:`~deqjax.solvers.GMRES` (``max_steps=100``, ``tol=1e-4``, ``stop_mode="rel"``,
    ``restart=20``, ...). Returns a :class:`~deqjax.solvers.Solution` whose value is the
    lowest-residual iterate.
    """
    return GMRES(**options)(f, z0)


@registry.function_form(BiCGStab)
def bicgstab(f: MapFn, z0: PyTree, /, **options) -> Solution:
    """BiCGStab on the affine fixed point ``u = f(u)``: ``BiCGStab(**options)(f, z0)`` (fields:
    ``max_steps=100``, ``tol=1e-4``, ``stop_mode="rel"``, ``chunk=50``, ...)."""
    return BiCGStab(**options)(f, z0)


@registry.function_form(NormalCG)
def normal_cg(f: MapFn, z0: PyTree, /, **options) -> Solution:
    """CG on the normal equations of ``u = f(u)`` (affine): ``NormalCG(**options)(f, z0)``
    (fields: ``max_steps=100``, ``tol=1e-4``, ``stop_mode="rel"``, ``chunk=50``, ...)."""
    return NormalCG(**options)(f, z0)
