"""Broyden's inverse-Jacobian estimate ``J_g^{-1} ≈ -I + sum_i u_i v_i^H`` and its products.

Both forms of :class:`~deqjax.solvers.Broyden` (:mod:`deqjax._src.solvers.broyden_steps`,
:mod:`deqjax._src.solvers.broyden_line_search`) return their final estimate in this two-buffer
form (``Solution.inverse_estimate`` with ``return_inverse=True``), which
:class:`~deqjax.ShineAdjoint` applies with :func:`inverse_rmatvec`; the line-search form also
keeps its running inverse in it. ``v^H = v^T`` for a real state; for a complex one ``<a, x> =
sum conj(a) x`` (:func:`deqjax._src.tree.tree_vdot`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from deqjax._src import tree, vma

PyTree = Any

# memory=None (or a memory above 2 blocks) on a while/python loop: the low-rank products read the
# buffers in blocks of this many rows, only up to the last filled row, so a step costs
# O(rows filled) and not O(max_steps).
_BLOCK = 16


class Memory(NamedTuple):
    """The static shape of a Broyden memory, and how it is read."""

    mem: int  # updates kept before a restart
    rows: int  # rows of the estimate (mem, rounded up to whole blocks when blocked)
    blocked: bool  # products read only the filled rows, block by block
    scan: bool  # the loop must be reverse-differentiable: reads in loops of static trip count


def memory_of(mem: int, loop: str) -> Memory:
    """The memory of ``mem`` updates on a ``loop`` of that kind.

    Blocked reads (only the filled rows) for a long memory on a loop that need not be
    reverse-differentiable (``lax.scan`` needs a static trip count).
    """
    scan = loop == "scan"
    blocked = mem > 2 * _BLOCK and not scan
    rows = -(-mem // _BLOCK) * _BLOCK if blocked else mem
    return Memory(mem=mem, rows=rows, blocked=blocked, scan=scan)


class BroydenInverse(NamedTuple):
    """Broyden's final estimate ``J_g^{-1} ≈ -I + sum_{i valid} u_i v_i^H`` of ``g(z) = f(z) - z``
    (``v^H = v^T`` for a real state).

    Returned in ``Solution.inverse_estimate`` by ``Broyden(return_inverse=True)``. With
    ``g = f - I`` the inverse of the DEQ's ``I - J_f`` is ``-J_g^{-1}``. Apply it with
    :func:`inverse_matvec` / :func:`inverse_rmatvec` (the transpose, what an adjoint needs in
    JAX's convention for cotangents).

    Attributes:
      us: pytree like ``z0`` with leaves ``[*batch, rows, ...]``: the columns ``u_i``.
      vs: like ``us``: the rows ``v_i^T``.
      valid: bool ``[*batch, rows]``: which rows make up the current estimate (a limited-memory
        restart masks the older rows out).
    """

    us: PyTree
    vs: PyTree
    valid: jax.Array


def lowrank(
    a_stack: PyTree, b_stack: PyTree, x: PyTree, bn: int, valid: jax.Array, n_rows: Any
) -> PyTree:
    """``sum_{i valid} b_i <a_i, x>`` per problem (``<a, x> = sum conj(a) x``).

    ``n_rows`` is None (read every row) or a traced int bound on the rows that can be valid; then
    the rows are read block by block up to it (the buffers have a multiple of ``_BLOCK`` rows).
    """
    if n_rows is None:
        coeffs = jnp.where(valid, tree.tree_rows_vdot(a_stack, x, bn), 0)
        return tree.tree_combine_rows(coeffs, b_stack, bn)

    def block(i, acc):
        start = i * _BLOCK
        rows = lambda s: jax.lax.dynamic_slice_in_dim(s, start, _BLOCK, bn)  # noqa: E731
        a_blk = jax.tree_util.tree_map(rows, a_stack)
        b_blk = jax.tree_util.tree_map(rows, b_stack)
        v_blk = jax.lax.dynamic_slice_in_dim(valid, start, _BLOCK, valid.ndim - 1)
        coeffs = jnp.where(v_blk, tree.tree_rows_vdot(a_blk, x, bn), 0)
        return tree.tree_add(acc, tree.tree_combine_rows(coeffs, b_blk, bn))

    n_blocks = (n_rows + _BLOCK - 1) // _BLOCK
    return vma.fori_loop(0, n_blocks, block, tree.tree_zeros_like(x))


def matvec(us: PyTree, vs: PyTree, x: PyTree, bn: int, valid: jax.Array, n_rows: Any) -> PyTree:
    """``J^{-1} x`` with ``J^{-1} = -I + sum_{i valid} u_i v_i^H`` (per problem)."""
    return tree.tree_sub(lowrank(vs, us, x, bn, valid, n_rows), x)


def rmatvec(us: PyTree, vs: PyTree, x: PyTree, bn: int, valid: jax.Array, n_rows: Any) -> PyTree:
    """``J^{-H} x = -x + sum_{i valid} v_i (u_i^H x)`` (per problem; ``J^{-T}`` for a real
    state)."""
    return tree.tree_sub(lowrank(us, vs, x, bn, valid, n_rows), x)


def inverse_matvec(inverse: BroydenInverse, x: PyTree) -> PyTree:
    """``J_g^{-1} x`` for the estimate ``inverse`` (per problem; ``x`` batched like it)."""
    bn = inverse.valid.ndim - 1
    return matvec(inverse.us, inverse.vs, x, bn, inverse.valid, None)


def inverse_rmatvec(inverse: BroydenInverse, x: PyTree) -> PyTree:
    """``J_g^{-T} x`` for the estimate ``inverse`` (per problem; ``x`` batched like it).

    The plain transpose also for a complex state, ``J^{-T} x = conj(J^{-H} conj(x))``: the map a
    cotangent goes through in JAX's convention (``jax.vjp`` of ``x -> A x`` is ``A^T``), which is
    what SHINE's adjoint ``u = -J_g^{-T} g`` needs.
    """
    bn = inverse.valid.ndim - 1
    x = tree.tree_conj(x)
    return tree.tree_conj(rmatvec(inverse.us, inverse.vs, x, bn, inverse.valid, None))
