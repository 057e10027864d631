"""Exact backprop through the reversible solver by reversal (McCallum, Arora, Foster 2025).

:class:`ReversibleAdjoint` differentiates what :func:`deqjax.solvers.reversible` actually computed
(no fixed-point assumption, no backward linear solve) while storing only the returned iterate's pair
``(w_{k-1}, w_k)`` and its index ``k``: the backward pass rebuilds the iterates in reverse with the
algebraic inverse of each step and back-propagates one VJP of ``f`` through each (the paper's
Algorithm "exact backpropagation"). By default the forward also keeps every
:data:`DEFAULT_CHECKPOINT_EVERY`-th pair, so that the reverse pass amplifies rounding over at most
that many steps: the gradient is then that of backprop through the same steps to float rounding
at any number of steps, with memory ``O(steps / 8)``; ``checkpoint_every=None`` is the paper's
O(1)-memory method.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from deqjax._src import tree, vma
from deqjax._src.adjoints import backward_stats as stats_lib
from deqjax._src.adjoints import base as adjoint_base
from deqjax._src.solvers import reversible as reversible_lib

PyTree = Any
CellFn = Callable[[PyTree, PyTree, PyTree], PyTree]

# The reverse pass restarts from a stored pair every 8 evaluations by default: measured on a
# contractive tanh layer (BENCHMARKS.md, "Precision"; tests/adjoints/test_reversible.py), the
# gradient is then 1.1e-6 (float32) and 1e-15 (float64) off backprop through the same 40 or 160
# steps; without checkpoints 2.7e-4 and 3.5e-9 there, and up to 1e-3 in float32 elsewhere.
DEFAULT_CHECKPOINT_EVERY = 8


def _is_float(leaf: Any) -> bool:
    """A differentiable leaf: a float array or Python float (not ints, bools or PRNG keys)."""
    dtype = leaf.dtype if hasattr(leaf, "dtype") else jnp.asarray(leaf).dtype
    return jnp.issubdtype(dtype, jnp.inexact)


def _split(t: PyTree) -> tuple[list, Callable[[list], PyTree]]:
    """The float leaves of ``t`` and a function rebuilding ``t`` from (new) float leaves."""
    leaves, treedef = jax.tree_util.tree_flatten(t)
    mask = [_is_float(leaf) for leaf in leaves]

    def rebuild(float_leaves: list) -> PyTree:
        it = iter(float_leaves)
        return jax.tree_util.tree_unflatten(
            treedef, [next(it) if m else leaf for leaf, m in zip(leaves, mask)]
        )

    return [leaf for leaf, m in zip(leaves, mask) if m], rebuild


def _join(t: PyTree, float_cotangents: list) -> PyTree:
    """Cotangent of ``t``: the given float leaves, float0 zeros for the others."""
    leaves, treedef = jax.tree_util.tree_flatten(t)
    it = iter(float_cotangents)
    out = [
        next(it) if _is_float(leaf) else np.zeros(np.shape(leaf), jax.dtypes.float0)
        for leaf in leaves
    ]
    return jax.tree_util.tree_unflatten(treedef, out)


def _zero_cotangent(leaf: Any) -> Any:
    if _is_float(leaf):
        return jnp.zeros_like(leaf)
    return np.zeros(np.shape(leaf), jax.dtypes.float0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _reversed(f, batch_ndim, params, x, z0, state, probe):
    """Identity on ``state.value`` whose VJP back-propagates through the ``state.steps``
    reversible steps that led from ``(z0, z0)`` to ``(state.prev, state.value)``; ``probe``
    (``BackwardStats`` or None) receives the reversal statistics as its cotangent."""
    del f, batch_ndim, params, x, z0, probe
    return state.value


def _reversed_fwd(f, batch_ndim, params, x, z0, state, probe):
    return state.value, (params, x, z0, state, probe)


def _reversal_stats(batch_ndim, z0, value, y0_hat, z0_hat, steps):
    """Per-solve sums for the BackwardStats channel: count, reverse steps, reversal error (as
    ``rel_residual``), failures (a non-finite rebuilt start), no fallbacks."""
    err = jnp.maximum(
        tree.tree_norm(tree.tree_sub(y0_hat, z0), batch_ndim),
        tree.tree_norm(tree.tree_sub(z0_hat, z0), batch_ndim),
    )
    scale = jnp.maximum(tree.tree_norm(z0, batch_ndim), tree.tree_norm(value, batch_ndim))
    err = err / jnp.maximum(scale, jnp.finfo(scale.dtype).tiny)
    return stats_lib.summed(
        (steps >= 0).astype(err.dtype),  # ones, batched like steps (ones_like is not, under vmap)
        steps.astype(err.dtype),
        err,
        (~jnp.isfinite(err)).astype(err.dtype),
        jnp.zeros_like(err),
        dtype=err.dtype,
    )


def _reverse_pass(cell, p_leaves, x_leaves, state, g_value, batch_ndim):
    """The paper's exact backpropagation: from ``(w_{k-1}, w_k)`` with cotangent ``(0, g)`` back
    to ``(w_{-1}, w_0)``, one VJP of ``cell`` per step. Returns the rebuilt start pair, its
    cotangents and the parameter and input cotangents (float leaves)."""
    beta, steps = state.beta, state.steps

    def body_fun(c):
        # Pair (u, v) = (w_{j}, w_{j+1}) with cotangents (gu, gv); one step back gives
        # (w_{j-1}, w_j) with w_{j-1} = (v - β f(u)) / (1 - β) and, from v = (1-β) w_{j-1} + β f(u):
        # g_{w_{j-1}} = (1-β) gv, g_{w_j} = gu + J_f(u)ᵀ (β gv), g_θ += ∂f/∂θ(u)ᵀ (β gv).
        i, u, v, gu, gv, gp, gx = c
        active = i < steps
        beta_gv = jax.tree_util.tree_map(lambda a: beta * a, gv)
        cot = tree.tree_where(active, beta_gv, tree.tree_zeros_like(gv), batch_ndim)
        fu, vjp = jax.vjp(cell, p_leaves, x_leaves, u)
        dp, dx, du = vjp(cot)
        older, newer = reversible_lib.reverse_step(fu, state, i, u, v, batch_ndim)
        g_older = jax.tree_util.tree_map(lambda a: (1.0 - beta) * a, gv)
        return (
            i + 1,
            older,
            newer,
            tree.tree_where(active, g_older, gu, batch_ndim),
            tree.tree_where(active, tree.tree_add(gu, du), gv, batch_ndim),
            tree.tree_add(gp, dp),
            tree.tree_add(gx, dx),
        )

    init = (
        jnp.zeros((), jnp.int32),
        state.prev,
        state.value,
        tree.tree_zeros_like(state.prev),
        g_value,
        tree.tree_zeros_like(p_leaves),
        tree.tree_zeros_like(x_leaves),
    )
    _, y0_hat, z0_hat, g_a, g_b, gp, gx = vma.while_loop(
        lambda c: jnp.any(c[0] < steps), body_fun, init
    )
    return y0_hat, z0_hat, g_a, g_b, gp, gx


def _reversed_bwd(f, batch_ndim, residuals, g_value):
    params, x, z0, state, probe = residuals
    p_leaves, p_rebuild = _split(params)
    x_leaves, x_rebuild = _split(x)

    def cell(pl, xl, z):
        return f(p_rebuild(pl), x_rebuild(xl), z)

    y0_hat, z0_hat, g_a, g_b, gp, gx = _reverse_pass(
        cell, p_leaves, x_leaves, state, g_value, batch_ndim
    )
    # The pair is back at (w_{-1}, w_0) = (z0, z0): z0's cotangent is the sum of both slots.
    g_z0 = tree.tree_add(g_a, g_b)
    g_probe = None
    if probe is not None:
        stats = _reversal_stats(batch_ndim, z0, state.value, y0_hat, z0_hat, state.steps)
        g_probe = stats_lib.probe_cotangent(stats, probe)
    return (
        _join(params, gp),
        _join(x, gx),
        g_z0,
        jax.tree_util.tree_map(_zero_cotangent, state),
        g_probe,
    )


_reversed.defvjp(_reversed_fwd, _reversed_bwd)


@dataclasses.dataclass(frozen=True)
class ReversibleAdjoint(adjoint_base.Adjoint):
    """Exact gradient of the reversible solve, by reversal, in O(1) memory in the solver's steps.

    McCallum, Arora and Foster (2025), "Reversible Deep Equilibrium Models": the forward solver
    must be the reversible solver (:class:`deqjax.solvers.Reversible`, the function
    :func:`deqjax.solvers.reversible` or a ``functools.partial`` of it); any other solver raises
    ``ValueError`` (its steps are not invertible). The forward keeps only the returned iterate
    ``w_k``, the one before it and ``k`` (the solver runs with ``return_state=True`` and hands
    them over in ``Solution.reversible_state``); the backward rebuilds ``w_{k-1}, ..., w_{-1}`` by
    the algebraic inverse ``w_{j-1} = (w_{j+1} - β f(w_j)) / (1 - β)`` and back-propagates through
    each step with one VJP of ``f`` (``k`` evaluations of ``f`` and ``k`` VJPs in all), so the
    gradient is that of ordinary backprop through the same ``k`` steps (what
    :class:`UnrolledAdjoint` computes with O(k) memory), in ``params``, ``x`` and ``z0``.

    With a batch-native solve (``batch_ndim = n``) each problem reverses its own number of steps
    in one batched loop (finished problems are masked); under ``jax.vmap`` likewise.

    Floating-point: the inverse expands rounding at the rate the forward contracts, so iterates
    from long before the returned one are rebuilt inaccurately once the forward has converged far
    (tight ``tol``, many steps, float32); the cotangent reaching them shrinks at the forward's
    (slower) convergence rate. Check a configuration with :func:`deqjax.solvers.reversal_error`
    (and BENCHMARKS.md, "Reversible solver"), or pass a :class:`~deqjax.BackwardStats` probe:
    the reverse pass reports, per problem, ``num_steps`` = steps reversed (VJPs of ``f``),
    ``rel_residual`` = the reversal error ``max(‖ŷ_0 − z_0‖, ‖ẑ_0 − z_0‖) / max(‖z_0‖, ‖z*‖)``
    of the start it rebuilt (free: the reverse pass computes it anyway), ``failures`` = problems
    whose rebuilt start is not finite, ``fallbacks`` = 0.

    Cost: the backward evaluates ``f`` once and takes one full VJP (in ``z``, ``params`` and ``x``)
    per forward evaluation, about three forward passes. Like the implicit backward, the reverse
    pass is not itself differentiable (no gradients of gradients).

    Args:
      checkpoint_every: ``"auto"`` (default): the solver's own ``checkpoint_every`` if it sets
        one, else :data:`DEFAULT_CHECKPOINT_EVERY` (8): exact to float rounding at any number of
        steps, ``2 max_steps / 8`` stored states. An int ``m >= 1``: the forward stores the pair at
        every ``m``-th evaluation (``2 max_steps / m`` states) and the reverse pass restarts from
        each stored pair, so rounding is amplified over at most ``m`` steps instead of all of
        them. ``None``: the solver's own setting, by default none: the paper's method, O(1)
        memory in the steps, whose reversal error is amplified over all of them (float32:
        1e-4 to 1e-3 off backprop through the same steps).
    """

    checkpoint_every: int | str | None = "auto"

    def __post_init__(self):
        if self.checkpoint_every != "auto":
            reversible_lib.check_checkpoint_every(self.checkpoint_every)

    def checkpoints_for(self, solver: reversible_lib.Reversible) -> int | None:
        """The ``checkpoint_every`` the forward ``solver`` runs with under this adjoint."""
        if self.checkpoint_every == "auto":
            own = solver.checkpoint_every
            return DEFAULT_CHECKPOINT_EVERY if own is None else own
        if self.checkpoint_every is None:
            return solver.checkpoint_every
        return self.checkpoint_every

    def solve(self, f, solver, params, x, z0, *, backward_stats=None):
        adjoint_base.require_solver(
            solver,
            reversible_lib.Reversible,
            "ReversibleAdjoint",
            "its gradient reverses the reversible solver's steps, which other solvers cannot",
            "ImplicitAdjoint, or UnrolledAdjoint for backprop through its steps",
        )
        forward = solver.replace(return_state=True, checkpoint_every=self.checkpoints_for(solver))
        sol = adjoint_base.solve_without_gradient(f, forward, params, x, z0)
        state, sol = sol.reversible_state, sol._replace(reversible_state=None)
        z_out = _reversed(f, solver.batch_ndim, params, x, z0, state, backward_stats)
        return z_out, adjoint_base.stop_statistics(sol, z_out)
