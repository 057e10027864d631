"""What a DEQ layer's forward pass returns: :class:`DEQOutput` (the equilibrium, the forward
``Solution``, the pass's cell map and ``f(z*)``), in every framework."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from deqjax._src.solvers.solution import MAX_STEPS, Solution

PyTree = Any


class DEQOutput(NamedTuple):
    """What a DEQ layer's ``solve`` returns (``dq.nn.DEQ.solve``, and the front-ends').

    Attributes:
      z_star: the equilibrium ``z*``, a pytree like the state, differentiable (per ``adjoint``).
      solution: the forward :class:`~deqjax.solvers.Solution`; per-example mode: every field has
        a leading batch axis (``num_steps`` ``[B]``, ``trace`` ``[B, max_steps]``...).
      cell_fn: ``z ↦ f_θ(z; x)`` of this forward pass (same parameters, dropout masks and key),
        batched like ``z_star``; differentiable in the parameters. Use it only inside the same
        trace (the same Haiku transform, the same ``jit`` or ``grad``: it closes over traced
        values), e.g. for ``JacobianRegularizer.penalty(out.cell_fn, out.z_star, key, step)``.
      f_star: ``f(z*)``, the cell output at the returned equilibrium as the solver evaluated it
        (``solution.f_value``, no extra cell evaluation; ``None`` when the solver returns no
        ``f_value``). Its value is ``f(z*)``; its gradient is that of ``z_star``
        (``z* + stop_gradient(f(z*) - z*)``). With the implicit adjoint this equals the gradient
        of the readout ``cell_fn(z_star)`` up to the backward solve's tolerance: ``∂f/∂θ +
        J (I - J)⁻¹ ∂f/∂θ = (I - J)⁻¹ ∂f/∂θ`` (DEQ paper Theorem 1), at the cost of no extra
        cell application forward or backward. With other adjoints use ``cell_fn(z_star)`` to
        differentiate an explicit extra application. At a Haiku ``init`` without
        ``solve_at_init`` it equals ``z_star``.
    """

    z_star: PyTree
    solution: Solution
    cell_fn: Callable[[PyTree], PyTree]
    f_star: PyTree = None


def f_star(z_star: PyTree, sol: Solution) -> PyTree:
    """``f(z*)`` as the solver evaluated it, with the gradient of ``z*`` (``None`` when a user
    solver returns no ``f_value``)."""
    if sol.f_value is None:
        return None
    return jax.tree_util.tree_map(
        lambda z, fz: z + jax.lax.stop_gradient(fz - z), z_star, sol.f_value
    )


def unsolved(shapes: Solution, value: PyTree, *, batch_ndim: int) -> Solution:
    """A Solution shaped like ``shapes`` for "no solve ran": 0 steps, +inf residuals, MAX_STEPS;
    ``samples`` (a solver given ``sample_steps``) hold ``value`` each, the sample axis after the
    ``batch_ndim`` batch axes."""
    full = lambda s, v: jnp.full(s.shape, v, s.dtype)  # noqa: E731
    samples = None
    if shapes.samples is not None:
        samples = jax.tree_util.tree_map(
            lambda s, v: jnp.broadcast_to(jnp.expand_dims(v, batch_ndim), s.shape).astype(s.dtype),
            shapes.samples,
            value,
        )
    return Solution(
        value=value,
        num_steps=full(shapes.num_steps, 0),
        abs_residual=full(shapes.abs_residual, jnp.inf),
        rel_residual=full(shapes.rel_residual, jnp.inf),
        trace=full(shapes.trace, jnp.inf),
        status=full(shapes.status, MAX_STEPS),
        f_value=value,
        samples=samples,
    )
