"""Damped fixed-point (Picard) iteration: ``z_{k+1} = (1 - damping) z_k + damping f(z_k)``."""

from __future__ import annotations

from typing import Any, Callable

from deqjax._src import tree
from deqjax._src.solvers import base

PyTree = Any


def fixed_point_iteration(
    f: Callable[[PyTree], PyTree],
    z0: PyTree,
    *,
    max_steps: int = 50,
    tol: float = 1e-4,
    stop_mode: str = "rel",
    damping: float = 1.0,
    divergence_factor: float = 1e4,
    loop: str = "while",
    atol: float | None = None,
    batch_ndim: int = 0,
    sample_steps: tuple[int, ...] | None = None,
) -> base.Solution:
    """Solves ``z = f(z)`` by damped fixed-point iteration.

    Converges when ``f`` is a contraction (Banach); ``damping < 1`` (Krasnosel'skii–Mann averaging)
    can also tame maps whose Jacobian has eigenvalues near -1, at the price of slower steps.

    Args:
      f: the map ``Z -> Z`` over any pytree of float arrays.
      z0: initial iterate.
      max_steps: maximum number of evaluations of ``f``.
      tol: stop when the residual (by ``stop_mode``) is ``<= tol``.
      stop_mode: ``"abs"`` for ``||f(z) - z||``, ``"rel"`` for ``||f(z) - z|| / ||f(z)||``, or
        ``"mixed"`` for ``||f(z) - z|| <= atol + tol * ||z||`` (see :mod:`deqjax.solvers`).
      damping: the step ``z <- (1 - damping) z + damping f(z)``, in ``(0, 1]``.
      divergence_factor: stop with ``DIVERGED`` when the absolute residual exceeds this multiple
        of the lowest absolute residual seen (in every ``stop_mode``).
      loop: ``"while"`` (default), ``"scan"`` (reverse-differentiable) or ``"python"`` (debugging).
      atol: absolute tolerance of ``stop_mode="mixed"`` (``None``: equal to ``tol``).
      batch_ndim: the number of leading axes of every leaf of ``z0`` that index independent
        problems, solved together in one loop with per-problem stopping (0: one problem).
      sample_steps: ``None``, or loop steps ``s`` in ``[0, max_steps]`` whose iterates ``x_s``
        are returned in ``Solution.samples`` (for the fixed-point correction loss; see
        :func:`deqjax.correction_states`).

    Returns:
      A :class:`~deqjax.solvers.Solution` (fields with the leading batch axes under
      ``batch_ndim``); its value is the best iterate (lowest residual, not blown up: see
      ``deqjax._src.solvers.base``) and its ``f_value`` is ``f(value)``.

    Raises:
      ValueError: for invalid arguments (named in the message).

    Example:
      >>> sol = fixed_point_iteration(jnp.cos, jnp.array(1.0), tol=1e-6)
      >>> sol.value  # 0.739085...
    """
    z0 = base.check_common_args(
        f,
        z0,
        max_steps=max_steps,
        tol=tol,
        stop_mode=stop_mode,
        loop=loop,
        atol=atol,
        batch_ndim=batch_ndim,
    )
    if not 0.0 < damping <= 1.0:
        raise ValueError(f"damping must be in (0, 1], got {damping}.")
    if not divergence_factor > 1.0:
        raise ValueError(f"divergence_factor must be > 1, got {divergence_factor}.")

    def propose(aux, k, x, fx, gx):
        del k, fx
        return tree.tree_axpy(damping, gx, x), aux

    return base.solve(
        f,
        z0,
        propose=propose,
        aux0=(),
        max_steps=max_steps,
        tol=tol,
        stop_mode=stop_mode,
        loop=loop,
        divergence_factor=divergence_factor,
        atol=atol,
        batch_ndim=batch_ndim,
        sample_steps=sample_steps,
    )
