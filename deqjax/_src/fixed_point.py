"""``dq.fixed_point``: the implicit layer ``z* = f(θ, x, z*)`` with a pluggable gradient."""

from __future__ import annotations

from typing import Any, Callable

import jax

from deqjax._src import adjoints, tree
from deqjax._src.solvers import anderson as anderson_lib
from deqjax._src.solvers import base

PyTree = Any
CellFn = Callable[[PyTree, PyTree, PyTree], PyTree]


def _check_no_traced_closure(f: CellFn, params: PyTree, x: PyTree, z0: PyTree) -> None:
    """Raises if ``f`` captures values that could carry gradients (they would get none)."""
    _, hoisted = jax.closure_convert(f, params, x, z0)
    if hoisted:
        shapes = ", ".join(f"{h.dtype}{list(h.shape)}" for h in hoisted[:4])
        raise ValueError(
            "f closes over traced array(s) "
            f"({shapes}{', ...' if len(hoisted) > 4 else ''}) that are not among its arguments. "
            "Their gradients would be silently wrong: pass every array f depends on through "
            "`params` or `x` (any pytrees), e.g. fixed_point(f, (params, extra), x, z0)."
        )


def fixed_point(
    f: CellFn,
    params: PyTree,
    x: PyTree,
    z0: PyTree,
    *,
    solver: base.SolverFn = anderson_lib.anderson,
    adjoint: adjoints.Adjoint | None = None,
) -> tuple[PyTree, base.Solution]:
    """Solves ``z* = f(params, x, z*)`` and makes ``z*`` differentiable in ``params`` and ``x``.

    The forward pass runs ``solver`` on ``z ↦ f(params, x, z)`` from ``z0``; the backward pass is
    chosen by ``adjoint`` (default :class:`~deqjax.ImplicitAdjoint`: the implicit function theorem,
    DEQ paper Theorem 1, with a VJP-only backward solve, Eq. 11). Works under ``jit``, ``grad``,
    ``vmap`` (per-example forward and backward solves), ``lax.scan`` and ``pmap``.

    Args:
      f: the cell ``f(params, x, z) -> z``, positional; every array it depends on must be passed
        through ``params`` or ``x`` (a closure over traced values raises ``ValueError``).
      params: parameters, any pytree.
      x: input, any pytree (its non-float leaves, e.g. token ids or keys, get no gradient).
      z0: initial state, a pytree of float arrays.
      solver: forward solver ``(f_z, z0) -> Solution``, e.g.
        ``functools.partial(dq.solvers.broyden, max_steps=12)``.
      adjoint: the gradient strategy; ``None`` means ``ImplicitAdjoint()``.

    Returns:
      ``(z_star, sol)``: the fixed point (the solver's lowest-residual iterate), and the forward
      :class:`~deqjax.solvers.Solution` whose ``value`` is ``z_star`` and whose statistics carry no
      gradient.

    Raises:
      ValueError: if ``f`` or ``solver`` is not callable, ``adjoint`` is not an adjoint, ``z0``
        is not a float pytree, ``f`` changes the state's structure, or ``f`` closes over traced
        values.

    Example:
      >>> f = lambda p, x, z: jnp.tanh(p["W"] @ z + x)
      >>> z, sol = dq.fixed_point(f, {"W": W}, x, jnp.zeros_like(x))
      >>> jax.grad(lambda p: dq.fixed_point(f, p, x, jnp.zeros_like(x))[0].sum())({"W": W})
    """
    if not callable(f):
        raise ValueError(f"f must be callable, got {type(f).__name__}.")
    if not callable(solver):
        raise ValueError(f"solver must be callable, got {solver!r}.")
    if adjoint is None:
        adjoint = adjoints.ImplicitAdjoint()
    if not isinstance(adjoint, adjoints.Adjoint):
        raise ValueError(
            "adjoint must be a deqjax adjoint object (ImplicitAdjoint(), PhantomAdjoint(), "
            f"OneStepAdjoint(), UnrolledAdjoint()), got {adjoint!r}."
        )
    tree.check_float_tree(z0, "z0")
    _check_no_traced_closure(f, params, x, z0)
    return adjoint.solve(f, solver, params, x, z0)
