"""Pytree arithmetic: the one copy of vdot, norm and axpy used by every solver.

States of a DEQ are arbitrary pytrees of float arrays (a multiscale model carries one array per
resolution), or of complex arrays. Leaves may have different float dtypes; reductions are
accumulated in :func:`reduction_dtype` (at least float32, float64 if any leaf is float64 or
complex128) with explicit casts, so the code is valid under ``jax_numpy_dtype_promotion="strict"``.

Complex states (``complex64``, ``complex128``) are vectors of ``C^n`` with the Hermitian inner
product, conjugate-linear in its first argument:

    <x, y> = sum_i conj(x_i) y_i,     ||x|| = sqrt(sum_i |x_i|^2)   (a real number),

accumulated in :func:`scalar_dtype` (the complex counterpart of :func:`reduction_dtype`). Every
solver's inner products, Gram matrices, projections and low-rank updates go through
:func:`tree_vdot`, :func:`tree_rows_vdot` and :func:`tree_sq_norm`, so they are
conjugate-aware; on real leaves ``conj`` is never applied (decided at trace time, from the
dtype), so a real state's program is unchanged. A state is either real (every leaf a real float)
or complex (every leaf complex): see :func:`check_state_tree`. The products over stacked
histories (:func:`tree_rows_vdot`, :func:`tree_combine_rows`: Anderson's Gram rows and mixing,
Broyden's low-rank updates) are full precision whatever the ambient matmul precision: a solver's
own arithmetic must not carry the TF32 rounding that ``precision=`` allows the cell.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

PyTree = Any

# The precision of the solvers' own products (histories here, GMRES's basis).
HIGHEST = jax.lax.Precision.HIGHEST


def is_complex_dtype(dtype: Any) -> bool:
    """Whether ``dtype`` is a complex dtype (``complex64``, ``complex128``)."""
    return bool(jnp.issubdtype(dtype, jnp.complexfloating))


def is_complex(tree: PyTree) -> bool:
    """Whether any leaf of ``tree`` is complex (static: read from the dtypes)."""
    return any(is_complex_dtype(leaf_dtype(leaf)) for leaf in jax.tree_util.tree_leaves(tree))


def reduction_dtype(tree: PyTree) -> jnp.dtype:
    """The real dtype in which norms and residuals of ``tree`` are accumulated.

    float64 if any leaf is float64 or complex128, else float32 (half-precision leaves accumulate
    in float32, complex64 leaves in float32).
    """
    leaves = jax.tree_util.tree_leaves(tree)
    wide = (jnp.float64, jnp.complex128)
    if any(jnp.dtype(leaf_dtype(leaf)) in wide for leaf in leaves):
        return jnp.dtype(jnp.float64)
    return jnp.dtype(jnp.float32)


def scalar_dtype(tree: PyTree, *others: PyTree) -> jnp.dtype:
    """The dtype of inner products with ``tree`` (and of a solver's own scalars: Gram matrices,
    mixing coefficients, Krylov workspace): ``reduction_dtype(tree)``, or its complex counterpart
    (``complex64`` for float32, ``complex128`` for float64) where any leaf of ``tree`` or
    ``others`` is complex."""
    rdtype = reduction_dtype(tree)
    if any(is_complex(t) for t in (tree, *others)):
        return jnp.dtype(jnp.complex128 if rdtype == jnp.float64 else jnp.complex64)
    return rdtype


def conj(a: jax.Array) -> jax.Array:
    """``jnp.conj(a)`` for a complex array; ``a`` itself otherwise (no kernel on real arrays)."""
    return jnp.conj(a) if is_complex_dtype(a.dtype) else a


def tree_conj(x: PyTree) -> PyTree:
    """Leafwise :func:`conj`."""
    return jax.tree_util.tree_map(conj, x)


def check_state_tree(tree: PyTree, name: str) -> None:
    """Raises ``ValueError`` naming ``name`` unless ``tree`` is a non-empty pytree of inexact
    arrays, all real floats or all complex.

    A solver's state is a vector of ``R^n`` (every leaf a real float: float16, bfloat16,
    float32, float64, possibly mixed) or of ``C^n`` (every leaf complex64 or complex128). Real
    and complex leaves are not mixed in one state: a solver combines iterates with complex
    coefficients (Anderson's mixing, Broyden's updates, Krylov bases), which a real leaf cannot
    hold; cast the real leaves to complex (or split the complex ones into real and imaginary
    parts). Integer and boolean leaves are refused.

    This is the one validator of a state: the solvers, ``dq.fixed_point``, ``dq.nn.DEQ``, the
    Jacobian tools and Jacobian regularisation all call it.
    """
    leaves = jax.tree_util.tree_leaves(tree)
    if not leaves:
        raise ValueError(
            f"{name} must be a non-empty pytree of float or complex arrays, got {tree!r}."
        )
    kinds = set()
    for leaf in leaves:
        dtype = leaf_dtype(leaf)
        if not jnp.issubdtype(dtype, jnp.inexact):
            raise ValueError(
                f"{name} must contain only floating-point or complex arrays; found a leaf of "
                f"dtype {dtype}. Cast it, e.g. jnp.asarray(x, jnp.float32)."
            )
        kinds.add(is_complex_dtype(dtype))
    if len(kinds) > 1:
        raise ValueError(
            f"{name} mixes real and complex leaves ({', '.join(_dtype_names(leaves))}): a state "
            "must be all real or all complex (a solver combines iterates with complex "
            "coefficients, which a real leaf cannot hold). Cast the real leaves to complex, e.g. "
            "jnp.asarray(x, jnp.complex64)."
        )


def _dtype_names(leaves: list[Any]) -> list[str]:
    """The distinct dtype names of ``leaves``, in order of appearance."""
    return list(dict.fromkeys(str(leaf_dtype(leaf)) for leaf in leaves))


def leaf_dtype(leaf: Any) -> np.dtype:
    """dtype of an array or Python scalar leaf (Python floats are JAX's default float)."""
    return np.dtype(leaf.dtype) if hasattr(leaf, "dtype") else jnp.asarray(leaf).dtype


def tree_size(tree: PyTree) -> int:
    """Total number of scalar entries in ``tree`` (static)."""
    return sum(int(np.prod(np.shape(leaf))) for leaf in jax.tree_util.tree_leaves(tree))


def _per_problem(a: jax.typing.ArrayLike, leaf: jax.Array, batch_ndim: int) -> jax.Array:
    """``a`` (shape ``[*batch]``, one value per problem) cast to ``leaf``'s dtype and reshaped to
    broadcast against ``leaf`` (shape ``[*batch, ...]``); a scalar for ``batch_ndim=0``."""
    a = jnp.asarray(a, leaf.dtype)
    if batch_ndim == 0 or a.ndim == 0:
        return a
    return a.reshape(a.shape + (1,) * (leaf.ndim - batch_ndim))


def _sum_tail(a: jax.Array, batch_ndim: int) -> jax.Array:
    """Sum over every axis after the leading ``batch_ndim`` (all axes when it is 0)."""
    if batch_ndim == 0:
        return jnp.sum(a)
    return jnp.sum(a, axis=tuple(range(batch_ndim, a.ndim)))


def tree_vdot(x: PyTree, y: PyTree, batch_ndim: int = 0) -> jax.Array:
    """Inner product ``<x, y> = sum_leaves sum_i conj(x_i) y_i``, in :func:`scalar_dtype`.

    Conjugate-linear in ``x``, linear in ``y`` (``<x, y> = conj(<y, x>)``); on real leaves no
    conjugation is applied. With ``batch_ndim = n`` the leading ``n`` axes of every leaf index
    independent problems and the result has shape ``[*batch]`` (one inner product per problem).
    For ``<x, x>`` use :func:`tree_sq_norm` (real-valued, cheaper on complex leaves).
    """
    dtype = scalar_dtype(x, y)
    # An elementwise product and a reduction (not jnp.vdot): under vmap this stays a fused reduce,
    # where a batched dot_general of [B, d] x [B, d] is slower (BENCHMARKS.md, "Solvers").
    parts = jax.tree_util.tree_map(
        lambda a, b: _sum_tail(conj(a.astype(dtype)) * b.astype(dtype), batch_ndim), x, y
    )
    leaves = jax.tree_util.tree_leaves(parts)
    return sum(leaves[1:], leaves[0])


def tree_sq_norm(x: PyTree, batch_ndim: int = 0) -> jax.Array:
    """Squared Euclidean norm ``||x||^2 = sum_leaves sum_i |x_i|^2``, real, in
    :func:`reduction_dtype` (per problem: shape ``[*batch]``).

    A complex entry contributes ``Re(x_i)^2 + Im(x_i)^2``.
    """
    dtype = reduction_dtype(x)

    def square(a):
        if is_complex_dtype(a.dtype):
            re, im = jnp.real(a).astype(dtype), jnp.imag(a).astype(dtype)
            return _sum_tail(re * re + im * im, batch_ndim)
        a = a.astype(dtype)
        return _sum_tail(a * a, batch_ndim)

    leaves = jax.tree_util.tree_leaves(jax.tree_util.tree_map(square, x))
    return sum(leaves[1:], leaves[0])


def tree_norm(x: PyTree, batch_ndim: int = 0) -> jax.Array:
    """Euclidean norm ``sqrt(sum_i |x_i|^2)`` of all entries of ``x``, real (per problem: shape
    ``[*batch]``)."""
    return jnp.sqrt(tree_sq_norm(x, batch_ndim))


def tree_sub(x: PyTree, y: PyTree) -> PyTree:
    """Leafwise ``x - y``."""
    return jax.tree_util.tree_map(jnp.subtract, x, y)


def tree_add(x: PyTree, y: PyTree) -> PyTree:
    """Leafwise ``x + y``."""
    return jax.tree_util.tree_map(jnp.add, x, y)


def tree_scale(a: jax.typing.ArrayLike, x: PyTree, batch_ndim: int = 0) -> PyTree:
    """Leafwise ``a * x`` with ``a`` (scalar, or ``[*batch]``) cast to each leaf's dtype."""
    return jax.tree_util.tree_map(lambda leaf: _per_problem(a, leaf, batch_ndim) * leaf, x)


def tree_axpy(a: jax.typing.ArrayLike, x: PyTree, y: PyTree, batch_ndim: int = 0) -> PyTree:
    """Leafwise ``a * x + y`` with ``a`` (scalar or ``[*batch]``) cast to each leaf's dtype."""
    return jax.tree_util.tree_map(lambda u, v: _per_problem(a, u, batch_ndim) * u + v, x, y)


def tree_where(pred: jax.typing.ArrayLike, x: PyTree, y: PyTree, batch_ndim: int = 0) -> PyTree:
    """Leafwise ``jnp.where(pred, x, y)`` with a scalar (or per-problem ``[*batch]``) predicate."""
    if batch_ndim == 0:
        return jax.tree_util.tree_map(lambda u, v: jnp.where(pred, u, v), x, y)
    pred = jnp.asarray(pred)
    return jax.tree_util.tree_map(
        lambda u, v: jnp.where(pred.reshape(pred.shape + (1,) * (u.ndim - batch_ndim)), u, v), x, y
    )


def tree_where_finite(x: PyTree, y: PyTree) -> PyTree:
    """Leafwise ``y`` where ``x`` is finite, else ``x`` (entry by entry)."""
    return jax.tree_util.tree_map(
        lambda a, b: jnp.where(jnp.isfinite(a), b, a.astype(b.dtype)), x, y
    )


def tree_zeros_like(x: PyTree) -> PyTree:
    """Zeros with the structure, shapes and dtypes of ``x``."""
    return jax.tree_util.tree_map(jnp.zeros_like, x)


def tree_all_finite(x: PyTree) -> jax.Array:
    """Scalar bool: every entry of every leaf is finite."""
    flags = [jnp.all(jnp.isfinite(leaf)) for leaf in jax.tree_util.tree_leaves(x)]
    return jnp.all(jnp.stack(flags)) if flags else jnp.array(True)


# --- stacked histories: leaves with a leading memory axis [m, ...] --------------------------------


def tree_stack_zeros(x: PyTree, m: int, batch_ndim: int = 0) -> PyTree:
    """A history buffer of ``m`` rows like ``x``, zeros.

    Layout: ``[m, *leaf.shape]`` for ``batch_ndim = 0``; ``[*batch, m, *rest]`` (the row axis right
    after the batch axes) for ``batch_ndim > 0``, so each problem's rows are contiguous and the
    row products below are plain batched matrix-vector products without transposes.
    """

    def zeros(leaf):
        bn = batch_ndim
        return jnp.zeros((*leaf.shape[:bn], m, *leaf.shape[bn:]), leaf.dtype)

    return jax.tree_util.tree_map(zeros, x)


def tree_set_row(stack: PyTree, i: jax.typing.ArrayLike, x: PyTree, batch_ndim: int = 0) -> PyTree:
    """Writes ``x`` into row ``i`` of ``stack``; an ``i`` outside ``[0, m)`` writes nothing.

    ``i`` is a scalar, or with ``batch_ndim = n`` one row index per problem (shape ``[*batch]``).
    Implemented as a masked select rather than ``stack.at[i].set(x)``: inside a ``vmap``-ed
    ``while_loop`` (a batch of solves) the index is batched, the update becomes a scatter, and XLA
    must copy the whole buffer for it and again for the loop's per-example select; the select form
    fuses with that select into one pass over the buffer (measured in BENCHMARKS.md, "Solvers").
    With a shared (unbatched) row index use :func:`tree_put_row`.
    """
    i = jnp.asarray(i, jnp.int32)
    bn = batch_ndim

    def set_row(s, leaf):
        m = s.shape[bn]
        rows = jnp.arange(m, dtype=jnp.int32)
        if bn == 0:
            hit = (rows == i).reshape((m,) + (1,) * leaf.ndim)
            return jnp.where(hit, leaf[None], s)
        i_b = jnp.broadcast_to(i, leaf.shape[:bn])
        hit = rows.reshape((1,) * bn + (m,)) == i_b[..., None]  # [*batch, m]
        hit = hit.reshape(hit.shape + (1,) * (leaf.ndim - bn))
        return jnp.where(hit, jnp.expand_dims(leaf, bn), s)

    return jax.tree_util.tree_map(set_row, stack, x)


def tree_put_row(stack: PyTree, i: jax.Array, x: PyTree, batch_ndim: int = 0) -> PyTree:
    """Writes ``x`` into row ``i`` (a shared int scalar in ``[0, m)``) of ``stack``, in place.

    One ``dynamic_update_slice`` per leaf: touches only the row written (batch-native solvers,
    whose step counter is shared by every problem, use it for their ring buffers).
    """
    i = jnp.asarray(i, jnp.int32)
    return jax.tree_util.tree_map(
        lambda s, leaf: jax.lax.dynamic_update_index_in_dim(s, leaf.astype(s.dtype), i, batch_ndim),
        stack,
        x,
    )


def tree_rows_vdot(stack: PyTree, x: PyTree, batch_ndim: int = 0) -> jax.Array:
    """``[<stack[i], x> for i]`` with ``<a, b> = sum conj(a) b`` (see :func:`tree_vdot`): shape
    ``[m]`` (``[*batch, m]`` with ``batch_ndim``), in :func:`scalar_dtype`."""
    dtype = scalar_dtype(x)
    if batch_ndim == 0:
        parts = jax.tree_util.tree_map(
            lambda s, leaf: jnp.tensordot(
                conj(s.reshape(s.shape[0], -1).astype(dtype)),
                leaf.reshape(-1).astype(dtype),
                axes=1,
                precision=HIGHEST,
            ),
            stack,
            x,
        )
        return sum(jax.tree_util.tree_leaves(parts))

    def rows(s, leaf):
        batch, m = leaf.shape[:batch_ndim], s.shape[batch_ndim]
        n_b = int(np.prod(batch))
        flat_s = conj(s.reshape(n_b, m, -1).astype(dtype))
        flat_x = leaf.reshape(n_b, -1).astype(dtype)
        # One batched matrix-vector product per problem on the batch-major buffer.
        return jnp.einsum("bmd,bd->bm", flat_s, flat_x, precision=HIGHEST).reshape(batch + (m,))

    leaves = jax.tree_util.tree_leaves(jax.tree_util.tree_map(rows, stack, x))
    return sum(leaves[1:], leaves[0])


def tree_combine_rows(coeffs: jax.Array, stack: PyTree, batch_ndim: int = 0) -> PyTree:
    """``sum_i coeffs[i] * stack[i]`` for every leaf (coefficients cast to each leaf's dtype:
    complex coefficients need complex leaves).

    With ``batch_ndim = n``, ``coeffs`` has shape ``[*batch, m]``: one combination per problem.
    """
    if batch_ndim == 0:
        return jax.tree_util.tree_map(
            lambda s: jnp.tensordot(coeffs.astype(s.dtype), s, axes=1, precision=HIGHEST), stack
        )

    def combine(s):
        batch, m = s.shape[:batch_ndim], s.shape[batch_ndim]
        n_b = int(np.prod(batch))
        flat_s = s.reshape(n_b, m, -1)
        flat_c = coeffs.astype(s.dtype).reshape(n_b, m)
        out = jnp.einsum("bm,bmd->bd", flat_c, flat_s, precision=HIGHEST)
        return out.reshape(batch + s.shape[batch_ndim + 1 :])

    return jax.tree_util.tree_map(combine, stack)
