"""The problem ``z = f(z)`` a solver is called on: ``(f, z0)`` validated once per call.

:func:`check_problem` checks that ``f`` maps ``z0``'s pytree to one of the same structure, shapes
and dtypes (one abstract evaluation, ``jax.eval_shape``), that ``z0`` is a float or complex pytree
(:func:`deqjax._src.tree.check_state_tree`: all leaves real, or all complex) with the declared
batch axes, and, with ``has_aux``, that ``f`` returns a pair ``(z, aux)``. The same
abstract evaluation tells whether ``f``'s products run at reduced matmul precision
(:func:`deqjax._src.precision.full_twin`): then the problem carries ``f`` at full precision too,
for the check of the solve's result (:mod:`deqjax._src.solvers.verify`). It returns the
:class:`Problem` every solver then runs on.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from deqjax._src import precision as precision_lib
from deqjax._src import tree

PyTree = Any


class Problem(NamedTuple):
    """A validated problem ``z = f(z)``.

    Attributes:
      fn: ``z -> (f(z), aux)`` (``aux = ()`` without ``has_aux``): the map as the solvers call it.
      z0: the start, every leaf a JAX array.
      batch_ndim: leading axes of every leaf that index independent problems.
      batch_shape: those axes' sizes.
      rdtype: the (real) dtype of the reductions (norms, residuals): ``tree.reduction_dtype(z0)``.
        A solver's own scalars (inner products, Gram matrices, Krylov workspace) are in
        ``tree.scalar_dtype(z0)``: ``rdtype``, or its complex counterpart for a complex state.
      aux0: zeros like ``f``'s ``aux`` (``()`` without ``has_aux``): what a solver's carry holds
        before the first evaluation.
      has_aux: whether ``f`` returns ``(z, aux)``.
      full_fn: ``fn`` at full matmul precision where ``f`` runs at a reduced one, else ``None``.
      precision: the matmul precision ``f`` runs at, for messages (``"default"``: JAX's).
    """

    fn: Callable[[PyTree], tuple[PyTree, PyTree]]
    z0: PyTree
    batch_ndim: int
    batch_shape: tuple[int, ...]
    rdtype: jnp.dtype
    aux0: PyTree
    has_aux: bool
    full_fn: Callable[[PyTree], tuple[PyTree, PyTree]] | None = None
    precision: str = "default"


def _check_batch_axes(z0: PyTree, batch_ndim: int) -> tuple[int, ...]:
    """The batch shape shared by every leaf of ``z0``; ``ValueError`` when they disagree."""
    batch_shape = None
    for leaf in jax.tree_util.tree_leaves(z0):
        if leaf.ndim < batch_ndim:
            raise ValueError(
                f"batch_ndim={batch_ndim} needs every leaf of z0 to have at least "
                f"{batch_ndim} leading batch axes; got a leaf of shape {list(leaf.shape)}."
            )
        if batch_shape is None:
            batch_shape = tuple(leaf.shape[:batch_ndim])
        elif leaf.shape[:batch_ndim] != batch_shape:
            raise ValueError(
                f"batch_ndim={batch_ndim}: every leaf of z0 must share the leading batch axes "
                f"{list(batch_shape)}; got a leaf of shape {list(leaf.shape)}."
            )
    return batch_shape


def _check_output(z0: PyTree, out: PyTree) -> None:
    """``ValueError`` unless ``out`` (abstract) has ``z0``'s structure, shapes and dtypes."""
    in_struct = jax.tree_util.tree_structure(z0)
    out_struct = jax.tree_util.tree_structure(out)
    if in_struct != out_struct:
        raise ValueError(
            f"f must return a pytree with the structure of z0: got {out_struct}, "
            f"expected {in_struct}."
        )
    for a, b in zip(jax.tree_util.tree_leaves(z0), jax.tree_util.tree_leaves(out)):
        if np.shape(a) != b.shape or a.dtype != b.dtype:
            raise ValueError(
                "f must preserve the shape and dtype of every leaf of z0: got "
                f"{b.dtype}{list(b.shape)} for a leaf of {a.dtype}{list(np.shape(a))}."
            )


def _split_aux(out: Any, has_aux: bool) -> tuple[PyTree, PyTree]:
    """``(z, aux)`` of ``f``'s (abstract) output."""
    if not has_aux:
        return out, ()
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise ValueError(
            f"f must return a pair (z, aux) with has_aux=True, got {type(out).__name__}."
        )
    return out[0], out[1]


def _check_aux_batch(aux: PyTree, batch_shape: tuple[int, ...]) -> None:
    """``ValueError`` unless every leaf of ``aux`` has the batch axes ``batch_shape`` first."""
    for leaf in jax.tree_util.tree_leaves(aux):
        if tuple(leaf.shape[: len(batch_shape)]) != batch_shape:
            raise ValueError(
                f"has_aux with batch_ndim={len(batch_shape)}: every leaf of aux must have the "
                f"leading batch axes {list(batch_shape)} (it is kept per problem); got a leaf of "
                f"shape {list(leaf.shape)}."
            )


def check_problem(f: Callable, z0: PyTree, *, batch_ndim: int, has_aux: bool) -> Problem:
    """Validates ``(f, z0)`` for a solver with these settings (one ``jax.eval_shape`` of ``f``).

    Raises:
      ValueError: naming ``f``, ``z0``, ``batch_ndim`` or ``aux`` and what is wrong.
    """
    if not callable(f):
        raise ValueError(f"f must be callable, got {type(f).__name__}.")
    tree.check_state_tree(z0, "z0")
    z0 = jax.tree_util.tree_map(jnp.asarray, z0)
    batch_shape = _check_batch_axes(z0, batch_ndim) if batch_ndim else ()
    with precision_lib.watching() as watch:  # a new function: eval_shape caches by function
        out, aux = _split_aux(jax.eval_shape(lambda z: f(z), z0), has_aux)
    _check_output(z0, out)
    if has_aux and batch_ndim:
        _check_aux_batch(aux, batch_shape)
    full, precision = precision_lib.full_twin(f, watch)
    if has_aux:
        fn, full_fn = f, full
        aux0 = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), aux)
    else:
        fn, full_fn, aux0 = _with_no_aux(f), None if full is None else _with_no_aux(full), ()
    rdtype = tree.reduction_dtype(z0)
    return Problem(fn, z0, batch_ndim, batch_shape, rdtype, aux0, has_aux, full_fn, precision)


def _with_no_aux(f: Callable[[PyTree], PyTree]) -> Callable[[PyTree], tuple[PyTree, tuple]]:
    """``z -> (f(z), ())``: a map without aux in the form the solvers call."""
    return lambda z: (f(z), ())
