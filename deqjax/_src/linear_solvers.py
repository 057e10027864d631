"""Krylov solvers for an AFFINE fixed-point problem ``u = f(u) = b + L u``: the implicit backward.

The adjoint equation of the implicit function theorem (DEQ paper, Eq. 11; JR paper, Eq. 2) is the
affine fixed-point problem ``u = g + J_f(z*)ᵀ u``, i.e. the linear system ``(I − Jᵀ) u = g``. The
fixed-point solvers (:func:`~deqjax.solvers.fixed_point_iteration`, Anderson, Broyden) solve it as
a fixed point and can fail where ``J`` has an eigenvalue near ``−1`` (Picard iteration oscillates)
even though ``I − Jᵀ`` is well conditioned. The Krylov methods here solve the linear system
itself, with :mod:`jax.scipy.sparse.linalg` (no hand-written Krylov code):

* :func:`gmres` — restarted GMRES (Saad & Schultz 1986) on ``(I − L) u = b``;
* :func:`bicgstab` — BiCGStab (van der Vorst 1992) on the same system;
* :func:`normal_cg` — conjugate gradients on the normal equations
  ``(I − L)ᵀ(I − L) u = (I − L)ᵀ b`` (CGNR): converges for any nonsingular ``I − L``, at the
  price of a squared condition number and one extra (transposed) product per iteration.

Each takes the affine map ``f`` (``b = f(0)`` and ``L u = f(u) − b`` are read off it) and a start
``z0``, i.e. it has the signature of every deqjax solver, ``(f, z0) -> Solution``, so it plugs in
where a fixed-point solver does: ``dq.ImplicitAdjoint(solver=dq.solvers.gmres)``. For the adjoint
map ``f(u) = g + Jᵀu`` a product with ``I − L`` is one VJP of the cell; :func:`normal_cg` also
needs ``(I − L)ᵀ``, one JVP of the cell (obtained by differentiating the VJP).

The solve runs in chunks (one GMRES restart cycle, or ``chunk`` BiCGStab/CG iterations) inside a
bounded ``lax.while_loop``; after each chunk the true residual ``‖f(u) − u‖`` is computed with one
more evaluation of ``f`` and the usual deqjax statistics are kept: the lowest-residual iterate,
``num_steps``, the residual trace and a status (``CONVERGED`` / ``MAX_STEPS`` / ``NONFINITE``;
a Krylov solve does not report ``DIVERGED``). A start that already meets ``tol`` costs two
evaluations of ``f`` and no Krylov work, which makes these solvers cheap fallbacks.

``num_steps`` counts evaluations of ``f`` charged per chunk: a chunk that
:mod:`jax.scipy.sparse.linalg` ends early (its own residual estimate below the target) is charged
in full, so it is an upper bound (exact for GMRES, whose cycles always run ``restart`` steps).
BiCGStab and CG restart their recurrences at each chunk, so their chunks are long (50
iterations by default). ``trace`` holds, at each evaluation index of a chunk, the
residual measured after that chunk.

With ``batch_ndim = n > 0`` (leading axes of every leaf index independent problems), the residual,
the stopping test, the best iterate and the status are per problem, but the Krylov method runs on
the whole block-diagonal system at once (one set of global inner products; ``num_steps`` is the
same for every problem): it runs until every problem meets ``tol`` and a non-finite problem spoils
the others' Krylov updates (each problem then keeps its own best iterate).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import jax.scipy.sparse.linalg as jsla

from deqjax._src import checks, tree
from deqjax._src.solvers import base

PyTree = Any
MapFn = Callable[[PyTree], PyTree]

_REL_EPS = 1e-30


class _Carry(NamedTuple):
    k: jax.Array  # int32 []: evaluations of f charged so far
    u: PyTree  # current iterate (start of the next chunk)
    scale: jax.Array  # [*batch]: the residual's denominator (1, ||f(u)|| or atol/tol + ||u||)
    best_u: PyTree
    best_fu: PyTree  # f(best_u), kept so that f_value costs no extra evaluation
    best_abs: jax.Array  # [*batch]
    best_rel: jax.Array  # [*batch]
    best_res: jax.Array  # [*batch]: by stop_mode
    trace: jax.Array  # [*batch, max_steps]
    status: jax.Array  # int32 [*batch]


def _check_args(
    f: MapFn,
    z0: PyTree,
    max_steps: int,
    tol: float,
    stop_mode: str,
    atol: float | None,
    batch_ndim: int,
) -> PyTree:
    return base.check_common_args(
        f,
        z0,
        max_steps=max_steps,
        tol=tol,
        stop_mode=stop_mode,
        loop="while",
        atol=atol,
        batch_ndim=batch_ndim,
    )


def _make_solution(**fields: Any) -> base.Solution:
    """A :class:`Solution` from ``fields`` (those this version's Solution has)."""
    names = base.Solution._fields
    return base.Solution(**{name: fields[name] for name in names if name in fields})


def _krylov_solve(
    f: MapFn,
    z0: PyTree,
    *,
    chunk_solve: Callable[[MapFn, PyTree, PyTree, jax.Array], PyTree],
    chunk_cost: int,
    max_steps: int,
    tol: float,
    stop_mode: str,
    atol: float | None,
    batch_ndim: int,
    needs_transpose: bool,
) -> base.Solution:
    """The chunked driver shared by the three methods (see the module docstring)."""
    rdtype = tree.reduction_dtype(z0)
    inf = jnp.asarray(jnp.inf, rdtype)
    b = f(tree.tree_zeros_like(z0))

    def matvec(u: PyTree) -> PyTree:  # (I - L) u = u - (f(u) - b)
        return tree.tree_sub(u, tree.tree_sub(f(u), b))

    if needs_transpose:
        # (I - L)^T by differentiating the (linear) product; for the adjoint map this is a JVP of
        # the cell (the transpose of its VJP).
        _, vjp_a = jax.vjp(matvec, z0)

        def rmatvec(v: PyTree) -> PyTree:
            return vjp_a(v)[0]

        operators = (matvec, rmatvec)
    else:
        operators = (matvec,)

    # Mixed mode: ||r|| <= atol + tol ||u||  <=>  ||r|| / (atol / tol + ||u||) <= tol.
    floor = (tol if atol is None else atol) / tol if stop_mode == "mixed" else 0.0

    def residuals(u: PyTree, fu: PyTree):
        """Absolute and relative residuals, the stop_mode residual and its denominator."""
        abs_res = tree.tree_norm(tree.tree_sub(fu, u), batch_ndim)
        fu_norm = tree.tree_norm(fu, batch_ndim)
        rel_res = abs_res / (fu_norm + jnp.asarray(_REL_EPS, rdtype))
        if stop_mode == "rel":
            scale = fu_norm
        elif stop_mode == "mixed":
            scale = jnp.asarray(floor, rdtype) + tree.tree_norm(u, batch_ndim)
        else:
            scale = jnp.ones_like(abs_res)
        res = rel_res if stop_mode == "rel" else abs_res / scale
        finite = jnp.isfinite(abs_res) & jnp.isfinite(fu_norm) & jnp.isfinite(res)
        return abs_res, rel_res, res, scale, finite

    batch_shape = jax.tree_util.tree_leaves(z0)[0].shape[:batch_ndim]
    # Step indices shaped [1, ..., 1, max_steps] to broadcast against the [*batch, max_steps] trace.
    step_ids = jnp.arange(max_steps, dtype=jnp.int32).reshape((1,) * batch_ndim + (max_steps,))
    fz0 = f(z0)
    abs0, rel0, res0, scale0, finite0 = residuals(z0, fz0)
    k0 = jnp.asarray(2, jnp.int32)  # f(0) and f(z0)
    status0 = jnp.where(
        finite0 & (res0 <= tol),
        base.CONVERGED,
        jnp.where(
            ~finite0,
            base.NONFINITE,
            jnp.where(k0 + chunk_cost + 1 > max_steps, base.MAX_STEPS, base._RUNNING),
        ),
    ).astype(jnp.int32)
    trace0 = jnp.full(batch_shape + (max_steps,), inf, rdtype)
    trace0 = jnp.where(step_ids < k0, jnp.where(finite0, res0, inf)[..., None], trace0)
    init = _Carry(
        k=k0,
        u=z0,
        scale=scale0,
        best_u=z0,
        best_fu=fz0,
        best_abs=jnp.where(finite0, abs0, inf),
        best_rel=jnp.where(finite0, rel0, inf),
        best_res=jnp.where(finite0, res0, inf),
        trace=trace0,
        status=status0,
    )

    def cond_fun(c: _Carry) -> jax.Array:
        return jnp.any(c.status == base._RUNNING)

    def body_fun(c: _Carry) -> _Carry:
        running = c.status == base._RUNNING
        target = jnp.asarray(tol, rdtype) * c.scale  # the absolute residual each problem needs
        # One global Krylov solve: the global residual norm below every running problem's target
        # is sufficient for all of them.
        inner_atol = jnp.min(jnp.where(running, target, inf))
        u = chunk_solve(*operators, b, c.u, inner_atol)
        fu = f(u)
        k = c.k + chunk_cost + 1
        abs_res, rel_res, res, scale, finite = residuals(u, fu)
        improved = running & finite & (res < c.best_res)
        new_status = jnp.where(
            finite & (res <= tol),
            base.CONVERGED,
            jnp.where(
                ~finite,
                base.NONFINITE,
                jnp.where(k + chunk_cost + 1 > max_steps, base.MAX_STEPS, base._RUNNING),
            ),
        ).astype(jnp.int32)
        written = (step_ids >= c.k) & (step_ids < k)
        trace = jnp.where(
            running[..., None] & written, jnp.where(finite, res, inf)[..., None], c.trace
        )
        return _Carry(
            k=k,
            # A non-finite chunk restarts from the best iterate (other problems go on).
            u=tree.tree_where(finite, u, c.best_u, batch_ndim),
            scale=jnp.where(finite, scale, c.scale),
            best_u=tree.tree_where(improved, u, c.best_u, batch_ndim),
            best_fu=tree.tree_where(improved, fu, c.best_fu, batch_ndim),
            best_abs=jnp.where(improved, abs_res, c.best_abs),
            best_rel=jnp.where(improved, rel_res, c.best_rel),
            best_res=jnp.where(improved, res, c.best_res),
            trace=trace,
            status=jnp.where(running, new_status, c.status),
        )

    c = jax.lax.while_loop(cond_fun, body_fun, init)
    num_steps = jnp.broadcast_to(c.k, batch_shape).astype(jnp.int32)
    # f at the returned iterate, for Solutions that carry it (one more evaluation, not charged).
    return _make_solution(
        value=c.best_u,
        num_steps=num_steps,
        abs_residual=c.best_abs,
        rel_residual=c.best_rel,
        trace=c.trace,
        status=c.status,
        f_value=c.best_fu,
    )


def _chunk_iters(requested: int, per_iter: int, overhead: int, max_steps: int) -> int:
    """Iterations per chunk: ``requested``, or fewer so that one chunk fits in ``max_steps``."""
    fit = (max_steps - 3 - overhead) // per_iter
    return int(max(1, min(requested, fit)))


def gmres(
    f: MapFn,
    z0: PyTree,
    *,
    max_steps: int = 100,
    tol: float = 1e-4,
    stop_mode: str = "rel",
    atol: float | None = None,
    restart: int = 20,
    batch_ndim: int = 0,
) -> base.Solution:
    """Solves the affine fixed point ``u = f(u) = b + L u`` by restarted GMRES on ``(I − L)u = b``.

    Built on :func:`jax.scipy.sparse.linalg.gmres` (``solve_method="batched"``), one restart cycle
    per chunk. GMRES minimises ``‖b − (I − L)u‖`` over a growing Krylov space, so it converges for
    any nonsingular ``I − L`` (within ``restart`` iterations per cycle; restarts can slow it on
    strongly non-normal systems). As the implicit backward (DEQ paper, Eq. 11) each product is one
    VJP of the cell; see the module docstring for statistics and batching.

    Args:
      f: an AFFINE map ``Z -> Z`` over any pytree of float arrays (e.g. ``u ↦ g + Jᵀu``); for a
        non-affine ``f`` the true residual is still reported, so the status shows the failure.
      z0: initial iterate (warm start).
      max_steps: budget of evaluations of ``f`` (two go to ``b = f(0)`` and ``f(z0)``; each
        cycle costs ``restart + 3``).
      tol: stop when the residual (by ``stop_mode``) is ``<= tol``.
      stop_mode: ``"abs"`` for ``‖f(u) − u‖``, ``"rel"`` for ``‖f(u) − u‖ / ‖f(u)‖``, or
        ``"mixed"`` for ``‖f(u) − u‖ <= atol + tol ‖u‖`` (as in the fixed-point solvers).
      atol: the absolute part of ``"mixed"`` (``None``: ``tol``).
      restart: Krylov dimension per cycle (reduced so that one cycle fits in ``max_steps``).
      batch_ndim: leading axes of every leaf that index independent problems (per-problem
        statistics; one global Krylov solve).

    Returns:
      A :class:`~deqjax.solvers.Solution`; its value is the lowest-residual iterate.

    Raises:
      ValueError: for invalid arguments (named in the message).

    Example:
      >>> sol = dq.solvers.gmres(lambda u: g + 0.9 * u, jnp.zeros(3), tol=1e-8)  # u = 10 g
    """
    z0 = _check_args(f, z0, max_steps, tol, stop_mode, atol, batch_ndim)
    checks.check_positive_int(restart, "restart")
    size = tree.tree_size(z0)
    iters = _chunk_iters(min(restart, max(size, 1)), 1, 2, max_steps)

    def chunk_solve(matvec, b, u, atol):
        u_new, _ = jsla.gmres(
            matvec, b, u, tol=0.0, atol=atol, restart=iters, maxiter=1, solve_method="batched"
        )
        return u_new

    return _krylov_solve(
        f,
        z0,
        chunk_solve=chunk_solve,
        chunk_cost=iters + 2,
        max_steps=max_steps,
        tol=tol,
        stop_mode=stop_mode,
        atol=atol,
        batch_ndim=batch_ndim,
        needs_transpose=False,
    )


def bicgstab(
    f: MapFn,
    z0: PyTree,
    *,
    max_steps: int = 100,
    tol: float = 1e-4,
    stop_mode: str = "rel",
    atol: float | None = None,
    chunk: int = 50,
    batch_ndim: int = 0,
) -> base.Solution:
    """Solves the affine fixed point ``u = f(u) = b + L u`` by BiCGStab on ``(I − L)u = b``.

    Built on :func:`jax.scipy.sparse.linalg.bicgstab`, ``chunk`` iterations (two products each)
    per chunk. Short recurrences (memory independent of the iteration count) but no minimisation
    guarantee: it can stagnate or break down where GMRES converges. See :func:`gmres` for the
    arguments, and the module docstring for statistics and batching.

    Args:
      f: an AFFINE map ``Z -> Z``.
      z0: initial iterate.
      max_steps: budget of evaluations of ``f`` (each chunk costs ``2 chunk + 2``).
      tol: stop when the residual (by ``stop_mode``) is ``<= tol``.
      stop_mode: ``"abs"``, ``"rel"`` or ``"mixed"``.
      atol: the absolute part of ``"mixed"`` (``None``: ``tol``).
      chunk: BiCGStab iterations between two residual checks.
      batch_ndim: leading axes that index independent problems.

    Returns:
      A :class:`~deqjax.solvers.Solution`.

    Raises:
      ValueError: for invalid arguments (named in the message).
    """
    z0 = _check_args(f, z0, max_steps, tol, stop_mode, atol, batch_ndim)
    checks.check_positive_int(chunk, "chunk")
    iters = _chunk_iters(chunk, 2, 1, max_steps)

    def chunk_solve(matvec, b, u, atol):
        u_new, _ = jsla.bicgstab(matvec, b, u, tol=0.0, atol=atol, maxiter=iters)
        return u_new

    return _krylov_solve(
        f,
        z0,
        chunk_solve=chunk_solve,
        chunk_cost=2 * iters + 1,
        max_steps=max_steps,
        tol=tol,
        stop_mode=stop_mode,
        atol=atol,
        batch_ndim=batch_ndim,
        needs_transpose=False,
    )


def normal_cg(
    f: MapFn,
    z0: PyTree,
    *,
    max_steps: int = 100,
    tol: float = 1e-4,
    stop_mode: str = "rel",
    atol: float | None = None,
    chunk: int = 50,
    batch_ndim: int = 0,
) -> base.Solution:
    """Solves ``u = f(u) = b + L u`` by CG on the normal equations ``AᵀA u = Aᵀb``, ``A = I − L``.

    Built on :func:`jax.scipy.sparse.linalg.cg` (CGNR). ``AᵀA`` is symmetric positive definite for
    any nonsingular ``A``, so CG converges without the eigenvalue conditions of the fixed-point
    solvers, but at the rate of ``cond(A)²``. Each iteration costs one product with ``A`` (a VJP
    of the cell, for the adjoint map) and one with ``Aᵀ`` (a JVP, by differentiating the former).
    CG's internal stopping test is on the normal-equation residual; deqjax's own test on
    ``‖f(u) − u‖`` after each chunk decides. See :func:`gmres` for the arguments.

    Args:
      f: an AFFINE map ``Z -> Z``.
      z0: initial iterate.
      max_steps: budget of evaluations of ``f`` or of its transpose (each chunk costs
        ``2 chunk + 4``).
      tol: stop when the residual (by ``stop_mode``) is ``<= tol``.
      stop_mode: ``"abs"``, ``"rel"`` or ``"mixed"``.
      atol: the absolute part of ``"mixed"`` (``None``: ``tol``).
      chunk: CG iterations between two residual checks.
      batch_ndim: leading axes that index independent problems.

    Returns:
      A :class:`~deqjax.solvers.Solution`.

    Raises:
      ValueError: for invalid arguments (named in the message).
    """
    z0 = _check_args(f, z0, max_steps, tol, stop_mode, atol, batch_ndim)
    checks.check_positive_int(chunk, "chunk")
    iters = _chunk_iters(chunk, 2, 3, max_steps)

    def chunk_solve(matvec, rmatvec, b, u, atol):
        def normal(v):
            return rmatvec(matvec(v))

        # The normal residual A^T r is at most ||A|| ||r||; with ||A|| unknown, stop CG only well
        # below the target and let the true-residual check decide.
        u_new, _ = jsla.cg(normal, rmatvec(b), u, tol=0.0, atol=1e-3 * atol, maxiter=iters)
        return u_new

    return _krylov_solve(
        f,
        z0,
        chunk_solve=chunk_solve,
        chunk_cost=2 * iters + 3,
        max_steps=max_steps,
        tol=tol,
        stop_mode=stop_mode,
        atol=atol,
        batch_ndim=batch_ndim,
        needs_transpose=True,
    )
