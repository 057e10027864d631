"""``dq.fixed_point``: the implicit layer ``z* = f(θ, x, z*)`` with a pluggable gradient."""

from __future__ import annotations

from typing import Any, Callable

import jax

from deqjax._src import compiled, tree, vma
from deqjax._src import precision as precision_lib
from deqjax._src.adjoints.backward_stats import BackwardStats
from deqjax._src.adjoints.base import Adjoint, strategies
from deqjax._src.adjoints.implicit import ImplicitAdjoint
from deqjax._src.normalise import as_solver
from deqjax._src.solvers import anderson as anderson_lib
from deqjax._src.solvers.solution import Solution

PyTree = Any
CellFn = Callable[[PyTree, PyTree, PyTree], PyTree]


def _check_no_traced_closure(f: CellFn, params: PyTree, x: PyTree, z0: PyTree) -> None:
    """Raises if ``f`` captures values that could carry gradients (they would get none)."""
    # A new function each call: closure_convert caches by the function, which may be unhashable.
    _, hoisted = jax.closure_convert(lambda p, xx, z: f(p, xx, z), params, x, z0)
    if hoisted:
        shapes = ", ".join(f"{h.dtype}{list(h.shape)}" for h in hoisted[:4])
        raise ValueError(
            "f closes over traced array(s) "
            f"({shapes}{', ...' if len(hoisted) > 4 else ''}) that are not among its arguments. "
            "Their gradients would be silently wrong: pass every array f depends on through "
            "`params` or `x` (any pytrees), e.g. fixed_point(f, (params, extra), x, z0)."
        )


def _shapes(t: PyTree) -> str:
    """``float32[3, 4]``-style description of a pytree's leaves, for error messages."""
    leaves = jax.tree_util.tree_leaves(t)
    parts = [f"{tree.leaf_dtype(leaf)}{list(jax.numpy.shape(leaf))}" for leaf in leaves[:6]]
    text = ", ".join(parts) + (", ..." if len(leaves) > 6 else "")
    return text if len(leaves) == 1 else f"({text})"


def _check_cell(f: CellFn, params: PyTree, x: PyTree, z0: PyTree, has_aux: bool) -> None:
    """Evaluates ``f``'s shapes at ``z0``; raises ``ValueError`` naming ``z0``'s and ``x``'s shapes.

    A ``z0`` of the wrong shape otherwise fails deep inside the user's ``f`` (e.g. "dot_general
    requires contracting dimensions to have the same shape") with no mention of ``z0``.
    """
    try:
        out = jax.eval_shape(f, params, x, z0)
    except Exception as err:  # noqa: BLE001 -- re-raised with the shapes, chained
        raise ValueError(
            f"f(params, x, z0) failed for z0 of shape {_shapes(z0)} and x of shape "
            f"{_shapes(x)}: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''} "
            "-- check that z0 has the shape of the state f returns (and x the shape f expects); "
            "the original error is chained above."
        ) from err
    if has_aux:
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            raise ValueError(
                "with has_aux=True, f must return a pair (z, aux); got "
                f"{jax.tree_util.tree_structure(out)}."
            )
        out = out[0]
    in_struct, out_struct = jax.tree_util.tree_structure(z0), jax.tree_util.tree_structure(out)
    if in_struct != out_struct or any(
        jax.numpy.shape(a) != b.shape
        for a, b in zip(jax.tree_util.tree_leaves(z0), jax.tree_util.tree_leaves(out))
    ):
        raise ValueError(
            f"f(params, x, z0) must return a state like z0: z0 has shape {_shapes(z0)} but f "
            f"returns {_shapes(out)}{' as z (has_aux=True)' if has_aux else ''}."
        )


def fixed_point(
    f: CellFn,
    params: PyTree,
    x: PyTree,
    z0: PyTree,
    *,
    solver: Any = anderson_lib.anderson,
    adjoint: Adjoint | None = None,
    has_aux: bool = False,
    backward_stats: BackwardStats | None = None,
    precision: str | None = None,
) -> tuple[PyTree, Solution]:
    """Solves ``z* = f(params, x, z*)`` and makes ``z*`` differentiable in ``params`` and ``x``.

    The forward pass runs ``solver`` on ``z ↦ f(params, x, z)`` from ``z0``; the backward pass is
    chosen by ``adjoint`` (default :class:`~deqjax.ImplicitAdjoint`: the implicit function theorem,
    DEQ paper Theorem 1, with a VJP-only backward solve, Eq. 11). Works under ``jit``, ``grad``,
    ``vmap`` (per-example forward and backward solves), ``lax.scan`` and ``pmap``. With a
    batch-native solver (``dq.solvers.Anderson(batch_ndim=1)`` and an ``f``
    that maps the whole batch) the implicit backward is batch-native too: the adjoints of all
    examples are solved in one batched loop with per-example stopping (the forward solver's
    ``batch_ndim`` is carried to the backward solver) and the parameter VJP is taken once for the
    batch, with no per-example parameter cotangents.

    Called eagerly (no ``jax.jit`` around it), the whole solve runs as one compiled program from
    a bounded cache keyed by ``f``'s code and the values it reads (arrays as operands, other
    values by their contents), the solver, the adjoint and the arguments' shapes and dtypes: a
    repeated eager call compiles nothing (design note, "The compiled entry"). Inside a staging
    trace (``jit``, ``scan``, ``pmap``) the solve is traced inline; an ``f`` that cannot be
    keyed runs un-jitted, with one warning naming the value.

    Args:
      f: the cell ``f(params, x, z) -> z``, positional; every array it depends on must be passed
        through ``params`` or ``x`` (a closure over traced values raises ``ValueError``).
      params: parameters, any pytree.
      x: input, any pytree (its non-float leaves, e.g. token ids or keys, get no gradient).
      z0: initial state, a pytree of float arrays, or of complex arrays (all leaves complex).
      solver: forward solver ``(f_z, z0) -> Solution``, e.g.
        ``dq.solvers.Broyden(max_steps=12)`` or ``functools.partial(dq.solvers.broyden,
        max_steps=12)`` (the two are the same solver: what is passed is turned into a solver
        object once, here).
      adjoint: the gradient strategy; ``None`` means ``ImplicitAdjoint()``.
      has_aux: if True, ``f`` returns ``(z, aux)`` (as in jaxopt and optimistix): the solve uses
        ``z`` and the result's first element is ``(z_star, aux)``, with ``aux`` that of
        ``f(params, x, z_star)`` (one more evaluation of ``f``; differentiable like ``z_star``).
      backward_stats: a :class:`~deqjax.BackwardStats` probe (``dq.BackwardStats.zeros()``), or
        ``None``. Differentiate the loss with respect to it to receive the implicit backward
        solve's statistics as its gradient (the gradient channel; see ``BackwardStats``).
      precision: the matmul precision of every evaluation of ``f``: in the forward solve, the
        backward solve and the final VJP (``None``: the ambient one, JAX's default unless set:
        TF32-class for float32 on NVIDIA GPUs; ``"highest"``: full float32; any value
        ``jax.default_matmul_precision`` accepts). The solvers' own products (Anderson's Gram
        matrix, Broyden's low-rank updates, the Krylov bases) are full precision whatever it is.
        At a reduced precision each solve (forward and backward) is checked with one more
        evaluation of ``f`` at full precision, so its status and residuals hold at full
        precision (a solve that met ``tol`` only in the reduced arithmetic reports
        ``dq.solvers.PRECISION_FLOOR``). On a GPU, choose ``"highest"`` for tolerances below
        about 1e-3.

    Returns:
      ``(z_star, sol)``, or ``((z_star, aux), sol)`` with ``has_aux``: the fixed point (the
      solver's lowest-residual iterate), and the forward :class:`~deqjax.solvers.Solution` whose
      ``value`` is ``z_star`` and whose statistics carry no gradient.

    Raises:
      ValueError: if ``f`` or ``solver`` is not callable, ``adjoint`` is not an adjoint, ``z0``
        is not a float or complex pytree, ``f`` fails on ``z0`` (the message names ``z0``'s and
        ``x``'s shapes) or changes the state's structure, ``f`` closes over traced values, or
        ``precision`` is not a matmul precision.

    Example:
      >>> f = lambda p, x, z: jnp.tanh(p["W"] @ z + x)
      >>> z, sol = dq.fixed_point(f, {"W": W}, x, jnp.zeros_like(x))
      >>> jax.grad(lambda p: dq.fixed_point(f, p, x, jnp.zeros_like(x))[0].sum())({"W": W})
    """
    if not callable(f):
        raise ValueError(f"f must be callable, got {type(f).__name__}.")
    solver = as_solver(solver)  # the one normalisation: from here on, declared fields only
    if adjoint is None:
        adjoint = ImplicitAdjoint()
    if not isinstance(adjoint, Adjoint):
        raise ValueError(
            "adjoint must be a deqjax adjoint object "
            f"({', '.join(f'{name}()' for name in strategies())}), got {adjoint!r}."
        )
    tree.check_state_tree(z0, "z0")
    if backward_stats is not None and not isinstance(backward_stats, BackwardStats):
        raise ValueError(
            "backward_stats must be a dq.BackwardStats probe (dq.BackwardStats.zeros()) or None, "
            f"got {type(backward_stats).__name__}."
        )
    adjoint.check_inputs(params, x)
    static = (solver, adjoint, has_aux, precision_lib.check_precision(precision))
    args = (params, x, z0, backward_stats)
    out = compiled.run(_run_compiled, f, static, args, traced_operands=False)
    if out is not compiled.NOT_JITTED:
        return out
    _check_cell(f, params, x, z0, has_aux)
    _check_no_traced_closure(f, params, x, z0)
    return _run(f, static, *args)


def _run(
    f: CellFn,
    static: tuple[Any, Adjoint, bool, str | None],
    params: PyTree,
    x: PyTree,
    z0: PyTree,
    backward_stats: BackwardStats | None,
) -> tuple[PyTree, Solution]:
    """The solve of :func:`fixed_point` once its arguments are checked (un-jitted)."""
    solver, adjoint, has_aux, precision = static
    # Inside a checked shard_map: the solve's inputs typed alike (z0 = zeros, say, varying like x),
    # so that its custom VJPs see one type and no collective lands in a loop (vma.vary_alike).
    params, x, z0, backward_stats = vma.vary_alike((params, x, z0, backward_stats))
    if precision is not None:
        f = precision_lib.at_precision(f, precision)
    cell = (lambda p, xx, z: f(p, xx, z)[0]) if has_aux else f
    kwargs = {} if backward_stats is None else {"backward_stats": backward_stats}
    z_star, sol = adjoint.solve(cell, solver, params, x, z0, **kwargs)
    if has_aux:
        return (z_star, f(params, x, z_star)[1]), sol
    return z_star, sol


def _run_compiled(
    make: Callable[[Any], CellFn],
    operands: list[Any],
    static: tuple[Any, Adjoint, bool, str | None],
    params: PyTree,
    *rest: Any,
) -> tuple[PyTree, Solution]:
    """:func:`fixed_point`'s compiled program; ``rest`` is ``(x, z0, backward_stats)``.

    The arrays ``f`` closes over travel with the parameters (``(params, operands)``), so the cell
    handed to the adjoint closes over no traced value (a ``custom_vjp`` must not); they receive
    cotangents that nobody reads."""
    f = make(operands)
    if operands:

        def f(p: PyTree, xx: PyTree, z: PyTree) -> PyTree:
            return make(p[1])(p[0], xx, z)

        params = (params, operands)
    x, z0, _ = rest
    _check_cell(f, params, x, z0, static[2])
    return _run(f, static, params, *rest)
