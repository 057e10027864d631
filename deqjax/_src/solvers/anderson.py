"""Anderson acceleration (Anderson 1965; Walker & Ni 2011), the variant used by the DEQ papers.

With ``G_i = f(x_i) - x_i`` over the last ``m`` iterates, each step solves the regularised
least-squares problem

    alpha = argmin ||sum_i alpha_i G_i||^2 + lam' ||alpha||^2   s.t.  sum_i alpha_i = 1,

i.e. ``alpha = H^{-1} 1 / (1^T H^{-1} 1)`` with ``H = G^H G + lam' I`` (the Gram matrix
``H_ij = <G_i, G_j>``), and mixes

    x_{k+1} = beta * sum_i alpha_i f(x_i) + (1 - beta) * sum_i alpha_i x_i
            = sum_i alpha_i (x_i + beta G_i).

For a complex state ``<a, b> = sum conj(a) b``: ``H`` is Hermitian positive definite, the
objective is ``alpha^H H alpha``, and the coefficients ``alpha`` are complex (the constraint stays
``sum_i alpha_i = 1``, and ``1^T H^{-1} 1 = 1^H H^{-1} 1`` is real). A real state's are real.

The ridge is relative: ``lam' = lam * mean(diag(G^H G))``, so it shrinks with the residuals and
does not stall at tight tolerances. The Gram matrix is updated one row per step (``O(m d)``) and
the history stores the mixed rows ``x_i + beta G_i`` next to ``G_i``, so a step reads each of the
two ``[m, ...]`` buffers once.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import jax.scipy.linalg

from deqjax._src import checks, tree, vma
from deqjax._src.solvers import driver, registry
from deqjax._src.solvers.problem import Problem
from deqjax._src.solvers.solution import Solution

PyTree = Any


def _gram_with_row(
    gram: jax.Array, gs: PyTree, gx: PyTree, gx_sq: jax.Array, hit: jax.Array, bn: int
) -> jax.Array:
    """``gram`` (``[*batch, m, m]``, ``gram[i, j] = <G_i, G_j>``) with the column of slot ``hit``
    set to ``<G_i, gx>`` and its row to the conjugates (Hermitian): the new iterate replaces that
    slot, and its own entry is ``gx_sq = ||gx||^2`` (the stopping rule's)."""
    rows = tree.tree_rows_vdot(gs, gx, bn)  # [*batch, m]
    row = jnp.where(hit, gx_sq[..., None].astype(rows.dtype), rows)
    hit_r, hit_c = hit[..., :, None], hit[..., None, :]
    return jnp.where(hit_r, tree.conj(row)[..., None, :], jnp.where(hit_c, row[..., :, None], gram))


def _spd_solve(h: jax.Array, rhs: jax.Array) -> jax.Array:
    """``h⁻¹ rhs`` for symmetric (Hermitian, if complex) positive definite ``h``
    (``[*batch, m, m]``; ``rhs`` ``[*batch, m]``) by Gauss–Jordan elimination without pivoting
    (stable for SPD and HPD matrices).

    A ``fori_loop`` of ``m`` steps on the augmented ``[*batch, m, m + 1]`` system, one fused
    kernel each, in place of LAPACK's batched ``potrf`` and two ``trsm`` calls, which make one
    call per matrix: for the small Gram systems of Anderson acceleration it is the cheaper per
    solver step, and compiles as fast (BENCHMARKS.md, "Loop cost", "Where a step's time went").
    """
    m = h.shape[-1]
    rows = jnp.arange(m).reshape((m, 1))

    def eliminate(j, a):
        pivot_row = jax.lax.dynamic_slice_in_dim(a, j, 1, a.ndim - 2)  # [*batch, 1, m + 1]
        pivot_row = pivot_row / jax.lax.dynamic_slice_in_dim(pivot_row, j, 1, a.ndim - 1)
        column = jax.lax.dynamic_slice_in_dim(a, j, 1, a.ndim - 1)  # [*batch, m, 1]
        return jnp.where(rows == j, pivot_row, a - column * pivot_row)

    a = vma.fori_loop(0, m, eliminate, jnp.concatenate([h, rhs[..., None]], axis=-1))
    return a[..., m]


def _mixing_weights(
    gram: jax.Array, valid: jax.Array, lam: float, eye: jax.Array, batch_shape: tuple[int, ...]
) -> jax.Array:
    """The coefficients ``alpha = H^{-1} 1 / (1^T H^{-1} 1)`` over the ``valid`` slots (zero on
    the others), ``H`` the Gram matrix normalised by its mean diagonal plus the ridge ``lam``
    (complex for a complex state's Hermitian ``H``; ``eye`` is in ``H``'s dtype)."""
    sdtype, m = gram.dtype, gram.shape[-1]
    diag = jnp.real(jnp.diagonal(gram, axis1=-2, axis2=-1))  # [*batch, m]: ||G_i||^2
    rdtype = diag.dtype
    tiny = jnp.asarray(jnp.finfo(rdtype).tiny, rdtype)
    both = valid[..., :, None] & valid[..., None, :]
    n_valid = jnp.sum(valid).astype(rdtype)
    scale = jnp.maximum(jnp.sum(jnp.where(valid, diag, 0), axis=-1) / n_valid, tiny)
    # Normalised system; unused slots get an identity row and a zero right-hand side.
    h = jnp.where(both, gram / scale[..., None, None].astype(sdtype) + lam * eye, eye)
    rhs = jnp.broadcast_to(valid.astype(sdtype), batch_shape + (m,))
    y = _spd_solve(h, rhs)
    # The mixing coefficients carry no gradient: backprop through the ridge-regularised
    # least-squares solve amplifies rounding errors without bound as lam -> 0 (UnrolledAdjoint
    # then differentiates the iteration with alpha frozen, which still has z* as its fixed point).
    return jax.lax.stop_gradient(y / jnp.sum(y, axis=-1, keepdims=True))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Anderson(driver.DriverSolver):
    """Anderson acceleration with a ring buffer of the last ``m`` iterates, as a solver object.

    Fields: those of :class:`~deqjax._src.solvers.options.Options` and
    :class:`~deqjax._src.solvers.options.DriverOptions`, and

    Attributes:
      m: history size (``>= 1``; ``m = 1`` is damped fixed-point iteration).
      beta: mixing parameter (``> 0``; 1 is undamped, above 1 over-relaxes).
      lam: relative Tikhonov ridge (``>= 0``).

    With ``batch_ndim``, the Gram matrices (``[*batch, m, m]``) and their small solves are
    batched, and the ring buffer slot (the shared step counter mod ``m``) is written with one
    ``dynamic_update_slice``.

    A complex state is mixed with complex coefficients, a model of a complex-linear Jacobian: for a
    cell that is not holomorphic in ``z`` (through ``conj(z)``, ``abs``, ``real`` or ``imag`` of the
    state) Anderson may need far more steps than fixed-point iteration, or stop at ``max_steps``
    where it converges. Solve such a cell with :class:`~deqjax.solvers.FixedPointIteration`, or pass
    its state as the pair of real arrays ``(Re z, Im z)``, on which Anderson mixes in ``R^{2n}``.

    Example:
      >>> solver = dq.solvers.Anderson(max_steps=30, tol=1e-3)
      >>> sol = solver(f, z0)                 # == dq.solvers.anderson(f, z0, max_steps=30, ...)
      >>> solver.replace(tol=1e-5).to_dict()  # {'solver': 'Anderson', 'max_steps': 30, ...}
    """

    m: int = 5
    beta: float = 1.0
    lam: float = 1e-4

    def check(self) -> None:
        super().check()
        checks.check_positive_int(self.m, "m")
        if not checks.check_real(self.beta, "beta") > 0.0:
            raise ValueError(f"beta must be > 0, got {self.beta}.")
        if not checks.check_real(self.lam, "lam") >= 0.0:
            raise ValueError(f"lam must be >= 0, got {self.lam}.")

    def rule(self, problem: Problem) -> driver.ProposalRule:
        m, beta, lam = self.m, self.beta, self.lam
        z0, bn, batch_shape = problem.z0, problem.batch_ndim, problem.batch_shape
        lead = (1,) * bn  # explicit broadcasting of [m]-shaped masks (rank promotion may be strict)
        sdtype = tree.scalar_dtype(z0)  # the Gram matrix's: complex for a complex state
        eye = jnp.eye(m, dtype=sdtype).reshape(lead + (m, m))
        ids = jnp.arange(m, dtype=jnp.int32)

        def propose(state, k, x, fx, gx, gx_sq, running):
            del fx, running
            # ps[i] = x_i + beta * G_i (the rows that are mixed), gs[i] = G_i: [m, ...] each
            # ([*batch, m, ...] under batch_ndim, see tree.tree_stack_zeros). The slot k % m is
            # shared by every problem (k is the shared step counter, and a running problem has
            # made exactly k steps).
            ps, gs, gram = state
            slot = k % m
            hit = (ids == slot).reshape(lead + (m,))  # the row the new iterate replaces
            valid = (ids < jnp.minimum(k + 1, m)).reshape(lead + (m,))
            p = tree.tree_axpy(beta, gx, x)
            new_ps, new_gs = ps, gs
            if bn > 0:
                # The shared slot is written first, in place, and every read below sees the
                # updated buffers: the reads then come after the writes in XLA's dependency
                # order, so neither buffer (nor x, read by the write) is copied. (The slot's row
                # is read with a zero weight; the new row enters as p and gx_sq, as under vmap.)
                new_ps = tree.tree_put_row(ps, slot, p, bn)
                new_gs = tree.tree_put_row(gs, slot, gx, bn)
            gram = _gram_with_row(gram, new_gs, gx, gx_sq, hit, bn)
            alpha = _mixing_weights(gram, valid, lam, eye, batch_shape)
            # sum_i alpha_i (x_i + beta G_i), with the slot's row taken from the new iterate.
            alpha_slot = jnp.sum(jnp.where(hit, alpha, 0), axis=-1)  # [*batch]
            rest = tree.tree_combine_rows(jnp.where(hit, 0, alpha), new_ps, bn)
            mixed = tree.tree_axpy(alpha_slot, p, rest, bn)
            if bn == 0:
                # k is batched under vmap: masked-select writes, last (they fuse with the loop's
                # per-example select into one pass over each buffer).
                new_ps, new_gs = tree.tree_set_row(ps, slot, p), tree.tree_set_row(gs, slot, gx)
            return mixed, (new_ps, new_gs, gram)

        state0 = (
            tree.tree_stack_zeros(z0, m, bn),
            tree.tree_stack_zeros(z0, m, bn),
            jnp.zeros(batch_shape + (m, m), sdtype),
        )
        return driver.ProposalRule(propose, state0)


@registry.function_form(Anderson)
def anderson(f: Callable[[PyTree], PyTree], z0: PyTree, /, **options) -> Solution:
    """Solves ``z = f(z)`` by Anderson acceleration: ``Anderson(**options)(f, z0)``.

    Args:
      f: the map ``Z -> Z`` over any pytree of float (or complex) arrays (``(z, aux)`` with
        ``has_aux``).
      z0: initial iterate.
      **options: the fields of :class:`~deqjax.solvers.Anderson` (``max_steps=50``, ``tol=1e-4``,
        ``stop_mode="rel"``, ``m=5``, ``beta=1.0``, ``lam=1e-4``, ...).

    Returns:
      A :class:`~deqjax.solvers.Solution` (fields with the leading batch axes under
      ``batch_ndim``); its value is the best iterate (lowest residual, not blown up: see
      :mod:`deqjax._src.solvers.stopping`) and its ``f_value`` is ``f(value)``.

    Raises:
      ValueError: for invalid arguments (named in the message).
    """
    return Anderson(**options)(f, z0)
