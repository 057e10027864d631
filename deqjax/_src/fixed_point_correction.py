"""Fixed-point correction: a loss on a few sampled solver iterates, each with a cheap gradient.

Bai, Geng, Kolter et al., "Deep Equilibrium Optical Flow Estimation", CVPR 2022 ("fixed-point
correction"): besides the loss at the equilibrium, apply the loss to ``N`` intermediate
states ``z_1, ..., z_N`` of the forward solver, each given a phantom (Geng et al. 2021) or one-step
(Jacobian-free) gradient, and weight them like RAFT's sequence loss,

    L = sum_{k=1}^{N} w_k ℓ(z_k),   w_k = γ^{N - k}   (γ = 0.8: TorchDEQ's default weights),

so that the later, more accurate states count most. The states are sampled by the solver itself
(``sample_steps=`` on any deqjax solver, see :func:`uniform_sample_steps`) into
``Solution.samples``; nothing is re-run. :func:`correction_states` attaches the gradients and
:func:`correction_loss` forms the weighted sum.

Example (``dq.fixed_point``)::

    solver = functools.partial(dq.solvers.anderson, max_steps=30,
                               sample_steps=dq.uniform_sample_steps(30, 3))
    z, sol = dq.fixed_point(f, params, x, z0, solver=solver)
    states = dq.correction_states(lambda z: f(params, x, z), sol, gradient="phantom")
    loss = dq.correction_loss([loss_fn(s) for s in states])

With :class:`deqjax.nn.DEQ` give the DEQ such a solver and use ``DEQ.solve``'s ``cell_fn`` and
``solution``: ``dq.correction_states(out.cell_fn, out.solution)``.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

from deqjax._src import checks, tree
from deqjax._src.solvers.solution import Solution

PyTree = Any

GRADIENTS = ("one_step", "phantom")


def uniform_sample_steps(max_steps: int, n_states: int) -> tuple[int, ...]:
    """``n_states`` evenly spaced solver steps ending at ``max_steps``, for ``sample_steps=``.

    ``round(max_steps * i / n_states)`` for ``i = 1..n_states`` (as TorchDEQ's ``n_states``). The
    last, ``max_steps``, is never evaluated by the solver, so it always holds the returned value
    (the equilibrium estimate); earlier steps a problem did not reach hold it too.

    Raises:
      ValueError: unless ``1 <= n_states <= max_steps``.
    """
    for name, v in (("max_steps", max_steps), ("n_states", n_states)):
        checks.check_positive_int(v, name)
    if n_states > max_steps:
        raise ValueError(f"n_states must be <= max_steps={max_steps}, got {n_states}.")
    return tuple(int(round(max_steps * i / n_states)) for i in range(1, n_states + 1))


def _split_samples(samples: PyTree, n: int, axis: int) -> list[PyTree]:
    return [
        jax.tree_util.tree_map(lambda leaf, i=i: jnp.take(leaf, i, axis=axis), samples)
        for i in range(n)
    ]


def correction_states(
    cell_fn: Callable[[PyTree], PyTree],
    solution: Solution,
    *,
    gradient: str = "phantom",
    steps: int = 1,
    tau: float = 0.5,
) -> list[PyTree]:
    """The sampled iterates of ``solution``, each with a phantom or one-step gradient.

    For each sampled iterate ``z_k`` (``Solution.samples``, recorded by a solver called with
    ``sample_steps=``) the returned state has the VALUE ``z_k`` and the gradient (in whatever
    ``cell_fn`` closes over: parameters, input) of

    * ``"one_step"``: ``f(stop_gradient(z_k))`` (Jacobian-free backprop, Fung et al.);
    * ``"phantom"``: ``steps`` damped steps ``z ← (1 − tau) z + tau f(z)`` from
      ``stop_gradient(z_k)`` (Geng et al. 2021; DEQ-flow's correction uses such phantom
      gradients), the same as :class:`~deqjax.PhantomAdjoint` at ``z_k``.

    Args:
      cell_fn: ``z ↦ f(z)`` of this forward pass, differentiable in what it closes over (for
        ``dq.fixed_point``: ``lambda z: f(params, x, z)``; for ``dq.nn.DEQ``: ``DEQ.solve(...)
        .cell_fn``), mapping states batched like ``solution.value``.
      solution: the forward :class:`~deqjax.solvers.Solution`, with ``samples``.
      gradient: ``"phantom"`` (default) or ``"one_step"``.
      steps: phantom steps (``>= 1``; ignored for ``"one_step"``).
      tau: phantom damping in ``(0, 1]``.

    Returns:
      A list with one state per sample step, each a pytree like ``solution.value``.

    Raises:
      ValueError: if ``solution.samples`` is None (the solver was not asked for samples) or an
        argument is invalid.
    """
    if gradient not in GRADIENTS:
        raise ValueError(f"gradient must be one of {GRADIENTS}, got {gradient!r}.")
    checks.check_positive_int(steps, "steps")
    if not 0.0 < tau <= 1.0:
        raise ValueError(f"tau must be in (0, 1], got {tau!r}.")
    if not callable(cell_fn):
        raise ValueError(f"cell_fn must be callable, got {type(cell_fn).__name__}.")
    samples = getattr(solution, "samples", None)
    if samples is None:
        raise ValueError(
            "solution.samples is None: call the solver with sample_steps=... (e.g. "
            "functools.partial(dq.solvers.anderson, sample_steps=dq.uniform_sample_steps(30, 3)))."
        )
    axis = jnp.ndim(solution.status)  # the sample axis follows the batch axes
    n = jax.tree_util.tree_leaves(samples)[0].shape[axis]
    out = []
    for z_k in _split_samples(jax.lax.stop_gradient(samples), n, axis):
        if gradient == "one_step":
            z_grad = cell_fn(z_k)
        else:
            z_grad = z_k
            for _ in range(steps):
                z_grad = tree.tree_axpy(tau, tree.tree_sub(cell_fn(z_grad), z_grad), z_grad)
        # Value z_k, gradient of z_grad.
        out.append(
            jax.tree_util.tree_map(lambda a, b: a + (b - jax.lax.stop_gradient(b)), z_k, z_grad)
        )
    return out


def correction_weights(n_states: int, gamma: float = 0.8) -> jax.Array:
    """DEQ-flow's weights ``w_k = gamma^(N - k)``, ``k = 1..N`` (the last state weighs 1)."""
    checks.check_positive_int(n_states, "n_states")
    if not 0.0 < gamma <= 1.0:
        raise ValueError(f"gamma must be in (0, 1], got {gamma!r}.")
    return jnp.asarray([gamma ** (n_states - k) for k in range(1, n_states + 1)])


def correction_loss(losses: Sequence[jax.Array], gamma: float = 0.8) -> jax.Array:
    """``sum_k gamma^(N - k) losses[k-1]``: the fixed-point correction loss (DEQ-flow).

    Args:
      losses: ``N`` scalar losses, ``ℓ(z_1), ..., ℓ(z_N)``, of the :func:`correction_states`.
      gamma: the decay in ``(0, 1]`` (0.8: TorchDEQ's default exponential weights).
    """
    losses = list(losses)
    if not losses:
        raise ValueError("losses must be a non-empty sequence of scalar losses.")
    for i, loss in enumerate(losses):
        if jnp.ndim(loss) != 0:
            raise ValueError(
                f"losses must be scalars; losses[{i}] has shape {list(jnp.shape(loss))}."
            )
    weights = correction_weights(len(losses), gamma)
    total = losses[0] * weights[0].astype(jnp.result_type(losses[0]))
    for w, loss in zip(weights[1:], losses[1:]):
        total = total + loss * w.astype(jnp.result_type(loss))
    return total
