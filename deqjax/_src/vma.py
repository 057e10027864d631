"""Control flow whose carries and branches keep their types inside a checked ``shard_map``.

Inside ``jax.shard_map(..., check_vma=True)`` every value has a type saying over which manual
(device) axes it varies, its *vma* (:func:`of`): an argument sharded along ``"batch"`` varies over
it; a replicated argument and a constant such as ``jnp.zeros(...)`` do not. A loop's carry must
keep its type from one iteration to the next and the branches of a ``cond`` must agree, so a solve
started from zeros whose function reads this device's examples (``f(z) = tanh(W z + U x)``, ``x``
varying) is refused by ``lax.while_loop``: its carry goes in invariant and comes out varying.

:func:`while_loop`, :func:`fori_loop`, :func:`scan` and :func:`cond` are the ``jax.lax`` ones with
that settled first: the initial carry, or the branches' outputs, cast to varying
(``jax.lax.pcast(..., to="varying")``: no data moves, no collective) over exactly the axes the body
or the other branch makes them vary over (:func:`match_carry`). Each device then runs its own loop
on its own shard, as it did unchecked; a ``cond`` that ``vmap`` batches on a device-varying
predicate selects its branches' outputs (:func:`cond` says why). Outside ``shard_map`` (plain
``jit``, ``vmap``, ``pmap``, ``grad``) there is no manual axis: each is the ``jax.lax`` function,
nothing traced twice.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

Carry = Any


def manual_axes() -> frozenset[str]:
    """The mesh axes of the enclosing ``jax.shard_map`` (none outside one)."""
    return frozenset(jax.sharding.get_abstract_mesh().manual_axes)


def _aval_vma(aval: Any) -> frozenset[str]:
    """An abstract value's vma: ``.vma`` up to JAX 0.9, ``.manual_axis_type.varying`` from 0.10."""
    mat = getattr(aval, "manual_axis_type", None)
    return frozenset(aval.vma if mat is None else mat.varying)


def of(x: jax.typing.ArrayLike) -> frozenset[str]:
    """The manual axes ``x`` varies over (the vma of ``jax.typeof(x)``)."""
    return _aval_vma(jax.typeof(x))


def to_varying(x: jax.typing.ArrayLike, axes: frozenset[str]) -> jax.Array:
    """``x`` varying over ``axes`` as well (``jax.lax.pcast(..., to="varying")``, or
    ``jax.lax.pvary`` where JAX has no ``pcast``); ``x`` itself where it already does."""
    axes = tuple(sorted(frozenset(axes) - of(x)))
    if not axes:
        return x
    if hasattr(jax.lax, "pcast"):
        return jax.lax.pcast(x, axes, to="varying")
    return jax.lax.pvary(x, axes)  # pragma: no cover (JAX < 0.9)


def vary_over(tree: Any, axis_name: str) -> Any:
    """Each leaf of ``tree`` varying over ``axis_name`` inside a ``shard_map`` over it (a no-op
    elsewhere: ``pmap``, ``jit``).

    A replicated value differentiated through a per-device loss: cast to varying, its gradient is
    this device's own (reduced afterwards, e.g. by ``pmean``), as under ``pmap``; left invariant,
    autodiff sums it over the devices (the transpose of the cast JAX inserts is a ``psum``).
    """
    if axis_name not in manual_axes():
        return tree
    return jax.tree_util.tree_map(lambda x: to_varying(x, frozenset({axis_name})), tree)


def vary_alike(tree: Any) -> Any:
    """Each leaf of ``tree`` varying over every manual axis that one of them varies over (a no-op
    outside ``shard_map``).

    The inputs of a solve, cast at its entry: the solve and its ``custom_vjp`` rules then see one
    type, and the gradient of an input that was invariant is summed over the devices once, where
    this cast's transpose stands, not inside a loop.
    """
    if not manual_axes():
        return tree
    leaves = jax.tree_util.tree_leaves(tree)
    axes = frozenset().union(*(of(x) for x in leaves))
    return jax.tree_util.tree_map(lambda x: to_varying(x, axes), tree) if axes else tree


def like(tree: Any, ref: Any) -> Any:
    """Each leaf of ``tree`` varying over the axes its counterpart in ``ref`` (same structure)
    varies over (a no-op outside ``shard_map``).

    A vector made here (random probes, a starting vector) and fed to a ``vjp`` or ``jvp`` of a
    map whose output or input varies over the devices must carry that type: JAX refuses a
    cotangent or tangent typed invariant where the primal varies.
    """
    if not manual_axes():
        return tree
    return jax.tree_util.tree_map(lambda x, r: to_varying(x, of(r)), tree, ref)


def _out_vmas(fn: Callable[..., Any], *args: Any) -> list[frozenset[str]]:
    """The vma of each output leaf of ``fn(*args)``, traced, not run."""
    return [_aval_vma(a) for a in jax.make_jaxpr(fn)(*args).out_avals]


def match_carry(body_fun: Callable[[Carry], Carry], init_val: Carry) -> Carry:
    """``init_val`` with each leaf varying over every manual axis its ``body_fun`` output varies
    over, so that ``body_fun`` maps the carry's type to itself (a loop's requirement).

    The body is traced (not run) at the carry's types until they stop changing: a leaf made
    varying can make another vary in the next iteration, and each round adds at least one axis
    to one leaf, so it ends. A body whose output structure differs from the carry's is left to
    the loop to report.

    Args:
      body_fun: a loop body, carry -> carry.
      init_val: the initial carry.

    Returns:
      ``init_val``, cast to varying where the body makes it vary; ``init_val`` itself outside a
      ``shard_map``.
    """
    axes = manual_axes()
    if not axes:
        return init_val
    leaves, treedef = jax.tree_util.tree_flatten(init_val)
    for _ in range(len(leaves) * len(axes) + 1):
        out = _out_vmas(body_fun, jax.tree_util.tree_unflatten(treedef, leaves))
        if len(out) != len(leaves) or all(o <= of(x) for x, o in zip(leaves, out)):
            break
        leaves = [to_varying(x, o) for x, o in zip(leaves, out)]
        if all(of(x) >= axes for x in leaves):
            break  # nothing can vary more: no need to trace the body again
    return jax.tree_util.tree_unflatten(treedef, leaves)


def while_loop(
    cond_fun: Callable[[Carry], jax.Array], body_fun: Callable[[Carry], Carry], init_val: Carry
) -> Carry:
    """``jax.lax.while_loop`` from ``init_val`` matched to its body (:func:`match_carry`)."""
    return jax.lax.while_loop(cond_fun, body_fun, match_carry(body_fun, init_val))


def fori_loop(
    lower: int, upper: int, body_fun: Callable[[Any, Carry], Carry], init_val: Carry
) -> Carry:
    """``jax.lax.fori_loop`` from ``init_val`` matched to its body (:func:`match_carry`)."""
    init_val = match_carry(lambda c: body_fun(jnp.asarray(lower), c), init_val)
    return jax.lax.fori_loop(lower, upper, body_fun, init_val)


def scan(
    f: Callable[[Carry, Any], tuple[Carry, Any]],
    init: Carry,
    xs: Any = None,
    length: int | None = None,
) -> tuple[Carry, Any]:
    """``jax.lax.scan`` from ``init`` matched to its body (:func:`match_carry`, the body traced at
    the first of ``xs``)."""
    if xs is None or all(jnp.shape(a)[0] for a in jax.tree_util.tree_leaves(xs)):
        x0 = None if xs is None else jax.tree_util.tree_map(lambda a: a[0], xs)
        init = match_carry(lambda c: f(c, x0)[0], init)
    return jax.lax.scan(f, init, xs, length=length)


def batched(x: Any) -> bool:
    """Whether ``x`` is batched by an enclosing ``jax.vmap`` (at any level, under ``jvp`` too)
    where it is traced now. A ``vmap`` applied later, to a program already traced (``vmap`` of
    a ``jit``), is not seen."""
    while isinstance(x, jax.core.Tracer):
        if getattr(x, "batch_dim", None) is not None:  # a vmap's tracer, mapped
            return True
        x = getattr(x, "val", getattr(x, "primal", None))  # the value under a vmap's or jvp's
    return False


def cond(
    pred: jax.typing.ArrayLike,
    true_fun: Callable[..., Any],
    false_fun: Callable[..., Any],
    *operands: Any,
) -> Any:
    """``jax.lax.cond`` whose branches' outputs vary over the same axes: each output leaf over
    those of both branches and of ``pred`` (the value taken depends on it).

    A predicate that varies over devices and is batched by ``vmap`` runs both branches and
    selects their outputs. ``vmap`` makes a ``lax.cond`` on a batched predicate into just that,
    but JAX (0.8 to 0.12) selects the branches' *inputs* on the predicate, the values they close
    over included: an input that does not vary over the devices turns varying after the branches
    were typed, and the first cast or mixed operation recorded in them fails (``pvary`` on a
    value already varying). Selecting the outputs gives the same values, typed.
    """
    if not manual_axes():
        return jax.lax.cond(pred, true_fun, false_fun, *operands)
    vmas = [_out_vmas(branch, *operands) for branch in (true_fun, false_fun)]
    if len(vmas[0]) != len(vmas[1]):
        return jax.lax.cond(pred, true_fun, false_fun, *operands)  # let cond report it
    pred_axes = of(pred)
    want = [a | b | pred_axes for a, b in zip(*vmas)]

    def matched(branch: Callable[..., Any]) -> Callable[..., Any]:
        def run(*ops: Any) -> Any:
            leaves, treedef = jax.tree_util.tree_flatten(branch(*ops))
            leaves = [to_varying(x, w) for x, w in zip(leaves, want)]
            return jax.tree_util.tree_unflatten(treedef, leaves)

        return run

    if not (pred_axes and batched(pred)):
        return jax.lax.cond(pred, matched(true_fun), matched(false_fun), *operands)
    take = jnp.asarray(pred)
    take = take if take.dtype == jnp.bool_ else take != 0
    outs = [matched(branch)(*operands) for branch in (true_fun, false_fun)]
    return jax.tree_util.tree_map(lambda t, f: jnp.where(take, t, f), *outs)


def optimization_barrier(val: Carry) -> Carry:
    """``jax.lax.optimization_barrier(val)`` keeping each leaf's vma: one barrier per group of
    leaves that vary over the same axes (JAX 0.10 types every output of one barrier as varying
    over the union of its operands' axes). One group, one barrier, outside ``shard_map``."""
    leaves, treedef = jax.tree_util.tree_flatten(val)
    groups: dict[frozenset[str], list[int]] = {}
    for i, x in enumerate(leaves):
        groups.setdefault(of(x), []).append(i)
    out = list(leaves)
    for idx in groups.values():
        for i, y in zip(idx, jax.lax.optimization_barrier([leaves[i] for i in idx])):
            out[i] = y
    return jax.tree_util.tree_unflatten(treedef, out)
