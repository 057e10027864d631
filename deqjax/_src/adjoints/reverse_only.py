"""Forward mode refused, naming ``forward_mode=True``, on the reverse-mode-only layers.

The default implicit layer (and SHINE's) is a ``jax.custom_vjp``: its gradient is the backward
solve, and nothing in it may be differentiated in forward mode. Left alone, JAX either refuses
with its own message or, worse, differentiates the solver loops of the rules themselves (a
``jvp`` of ``grad`` of a ``jax.jit``-ed loss sees the forward and backward solves as ordinary
code, and returns the loops' derivative, close to the implicit answer but not it). Three
guards, one message (:func:`message`), each free when nothing is differentiated in forward mode:

* :func:`refuse_forward_mode`: an eager check of the caller's tracers (``jax.jvp`` around the
  call), before anything is traced;
* :func:`refuse_jvp`, on the layer's inputs: an identity whose tangent is an op that transposes
  to the identity but cannot be evaluated, so ``jax.grad`` (a linearisation, transposed) runs as
  before while a ``jvp`` of the layer fails where the tangent is lowered or evaluated, in place
  of JAX's "can't apply forward-mode autodiff (jvp) to a custom_vjp function";
* :func:`refuse_derivatives`, inside the ``custom_vjp``'s rules around the solves: an identity
  whose derivative rule raises. Plain ``jax.grad`` calls the rules un-differentiated; any
  derivative of them (forward mode of the gradient, ``jax.hessian``, ``grad`` of ``grad``, with
  or without ``jax.jit`` in between) reaches it and raises.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

PyTree = Any


def message(adjoint: str) -> str:
    """The error of forward mode through the reverse-mode layer of ``adjoint`` (e.g.
    ``"dq.ImplicitAdjoint()"``)."""
    return (
        f"{adjoint} differentiates in reverse mode only (jax.grad, jax.vjp, jax.jacrev), and its "
        "gradient is not differentiable: forward mode (jax.jvp, jax.jacfwd, jax.linearize, "
        "jax.hessian) and gradients of gradients need dq.ImplicitAdjoint(forward_mode=True), "
        "whose tangent is the implicit-function-theorem linear solve and whose reverse mode is "
        "the same backward solve."
    )


def _guarded(args: PyTree) -> tuple[list[Any], list[bool], Any]:
    """The leaves of ``args``, which of them are float arrays (the only ones a tangent can
    reach), and the tree structure."""
    leaves, treedef = jax.tree_util.tree_flatten(args)
    floats = [isinstance(a, jax.Array) and jnp.issubdtype(a.dtype, jnp.inexact) for a in leaves]
    return leaves, floats, treedef


def _through(fn: Any, name: str, args: PyTree) -> PyTree:
    """``args`` with ``fn(name, float_leaves)`` applied to its float array leaves."""
    leaves, floats, treedef = _guarded(args)
    if not any(floats):
        return args
    picked = fn(name, tuple(a for a, f in zip(leaves, floats) if f))
    it = iter(picked)
    return treedef.unflatten([next(it) if f else a for a, f in zip(leaves, floats)])


# --- the eager check of the caller's tracers -----------------------------------------------------


def _carries_forward_tangent(leaf: Any) -> bool:
    """Whether ``leaf`` is, or wraps, a tracer of ``jax.jvp`` (forward mode: ``jvp``, ``jacfwd``,
    ``hessian``'s outer pass). ``grad``, ``vjp`` and ``linearize`` trace with ``LinearizeTrace``;
    a ``vmap`` or a ``linearize`` tracer may wrap a ``jvp`` one, so the chain is followed."""
    for _ in range(64):
        if not isinstance(leaf, jax.core.Tracer):
            return False
        if type(leaf).__name__ == "JVPTracer":
            return True
        inner = getattr(leaf, "primal", None)
        leaf = getattr(leaf, "val", None) if inner is None else inner
    return False


def refuse_forward_mode(adjoint: str, params: PyTree, x: PyTree) -> None:
    """``ValueError`` (:func:`message`) where ``params`` or ``x`` carry a ``jax.jvp`` tangent.

    Seen where ``dq.fixed_point`` is called inside the ``jvp`` (eagerly, or with ``jit`` around
    the ``jvp``); a ``jvp`` of a function already jitted around the call reaches the layer after
    it is traced, where :func:`refuse_jvp` stops it.
    """
    if any(_carries_forward_tangent(leaf) for leaf in jax.tree_util.tree_leaves((params, x))):
        raise ValueError(message(adjoint))


# --- on the layer's inputs: a tangent that transposes but cannot be evaluated --------------------


def _refuse(*_: Any, message: str, **__: Any) -> None:
    raise ValueError(message)


# The tangent of refuse_jvp's inputs: abstractly the identity, transposed to the identity (the
# cotangent passes through, nothing is bound), batched as the identity (a per-example solve under
# jax.vmap, differentiated by jax.grad, batches the linearised program before transposing it),
# and an error wherever it would run, be lowered or be differentiated again, that is wherever a
# forward-mode tangent is computed.
_forward_tangent_p = Primitive("deqjax_forward_tangent_refused")
_forward_tangent_p.def_abstract_eval(lambda x, **_: x)
_forward_tangent_p.def_impl(_refuse)
ad.primitive_transposes[_forward_tangent_p] = lambda ct, x, **_: [ct]
ad.primitive_jvps[_forward_tangent_p] = _refuse
batching.primitive_batchers[_forward_tangent_p] = lambda args, dims, **params: (
    _forward_tangent_p.bind(*args, **params),
    dims[0],
)
mlir.register_lowering(_forward_tangent_p, _refuse)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _identity_refusing_jvp(adjoint: str, leaves: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
    del adjoint
    return leaves


def _refusing_jvp_rule(adjoint, primals, tangents):
    (leaves,), (dleaves,) = primals, tangents

    def refused(t: Any) -> Any:
        if isinstance(t, SymbolicZero):
            return t
        return _forward_tangent_p.bind(t, message=message(adjoint))

    return leaves, tuple(refused(t) for t in dleaves)


_identity_refusing_jvp.defjvp(_refusing_jvp_rule, symbolic_zeros=True)


def refuse_jvp(adjoint: str, args: PyTree) -> PyTree:
    """``args`` unchanged, with forward-mode tangents refused (:func:`message`) where they are
    computed, and reverse mode passing through: no op is added to a ``grad``'s program."""
    return _through(_identity_refusing_jvp, adjoint, args)


# --- inside the rules: no derivative at all ------------------------------------------------------


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _identity_refusing_derivatives(
    adjoint: str, leaves: tuple[jax.Array, ...]
) -> tuple[jax.Array, ...]:
    del adjoint
    return leaves


def _derivative_refused(adjoint, primals, tangents):
    raise ValueError(message(adjoint))


_identity_refusing_derivatives.defjvp(_derivative_refused)


def refuse_derivatives(adjoint: str, args: PyTree) -> PyTree:
    """``args`` unchanged; a derivative of anything computed from them raises
    :func:`message` (JAX calls the rule only where a tangent reaches them)."""
    return _through(_identity_refusing_derivatives, adjoint, args)
