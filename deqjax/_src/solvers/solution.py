"""What a solve returns: the :class:`Solution` and its status codes.

Every deqjax solver returns a :class:`Solution` whose ``status`` is one of six int32 codes, so a
solve never raises or prints and runs under ``jit`` and ``vmap``. :func:`status_name` names one
code; :func:`deqjax.solvers.summarize` counts the codes of a batch.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import numpy as np

PyTree = Any

# Status codes (int32). RUNNING only ever appears inside a solver's loop.
CONVERGED = 0
MAX_STEPS = 1
DIVERGED = 2
NONFINITE = 3
STALLED = 4  # no new lowest residual in the solver's last stall_steps evaluations
# Reached tol in the reduced-precision products f ran in, but not when f is evaluated at full
# precision at the returned iterate (deqjax._src.solvers.verify).
PRECISION_FLOOR = 5
RUNNING = -1

STATUS_NAMES = {
    CONVERGED: "converged",
    MAX_STEPS: "max_steps",
    DIVERGED: "diverged",
    NONFINITE: "nonfinite",
    STALLED: "stalled",
    PRECISION_FLOOR: "precision_floor",
}


def status_name(status: Any) -> str:
    """The name of one status code, e.g. ``status_name(sol.status)`` -> ``"converged"``.

    Args:
      status: an int status code (a Python or numpy int, or a 0-d array such as the ``status``
        of a single solve).

    Returns:
      ``"converged"``, ``"max_steps"``, ``"diverged"``, ``"nonfinite"``, ``"stalled"``,
      ``"precision_floor"``, or ``"unknown(<code>)"``.

    Raises:
      ValueError: for an array of codes (a batched solve's ``status``).

    Example:
      >>> dq.solvers.status_name(dq.solvers.anderson(jnp.cos, jnp.array(1.0)).status)
      'converged'
    """
    arr = np.asarray(status)
    if arr.ndim != 0:
        raise ValueError(
            f"status_name takes one status code, got an array of shape {arr.shape}; for a batch "
            "use dq.solvers.summarize(solution) (the fraction of each status) or "
            "np.vectorize(dq.solvers.status_name)(solution.status) (an array of names)."
        )
    code = int(arr)
    return STATUS_NAMES.get(code, f"unknown({code})")


def _concrete(x: Any) -> np.ndarray | None:
    """``x`` as a numpy array, or None when it is abstract (a tracer under jit/vmap/grad)."""
    try:
        return np.asarray(x)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError, TypeError):
        return None


class Solution(NamedTuple):
    """Result of a forward solve of ``z = f(z)`` (one problem, or a batch with ``batch_ndim``).

    With ``batch_ndim = n`` (or under ``jax.vmap``) every field gains the leading batch axes and
    holds per-problem values.

    The status and residuals hold at full precision whatever matmul precision ``f`` ran in: where
    it ran at reduced precision (JAX's default on GPUs and TPUs, or ``precision=``), the solver
    evaluates ``f`` once more, at full precision, at ``value`` and reports those residuals; a
    solve that met ``tol`` only in the reduced arithmetic reports ``PRECISION_FLOOR`` instead of
    ``CONVERGED`` (:mod:`deqjax._src.solvers.verify`).

    Attributes:
      value: pytree like ``z0``: the best iterate seen (the lowest residual among those not blown
        up; see :mod:`deqjax._src.solvers.stopping`).
      num_steps: int32 ``[*batch]``, the number of evaluations of ``f`` in the solver's loop (a
        solve whose ``f`` runs at reduced matmul precision makes one more, at full precision, to
        check its result: see above).
      abs_residual: ``||f(value) - value||``.
      rel_residual: ``||f(value) - value|| / ||f(value)||``.
      trace: ``[*batch, max_steps]`` residual (in ``stop_mode``) after each evaluation, as the
        loop computed it; ``+inf`` afterwards.
      status: int32, one of ``CONVERGED``, ``MAX_STEPS``, ``DIVERGED``, ``NONFINITE``,
        ``STALLED``, ``PRECISION_FLOOR``.
      f_value: pytree like ``z0``: ``f(value)``, as evaluated by the solver (no extra evaluation);
        a DEQ readout that needs ``f(z*)`` can use it.
      samples: ``None`` unless the solver has ``sample_steps=(s_1, ..., s_n)``: then a pytree
        like ``z0`` whose leaves have ``[*batch, n, ...]``: ``samples[..., i, ...]`` is the
        iterate ``x_{s_i}`` the solver evaluated after ``s_i`` steps (``x_0 = z0``), or ``value``
        where the problem stopped before evaluating it (for the fixed-point correction loss,
        :func:`deqjax.correction_states`).
      inverse_estimate: ``None`` unless requested from a solver that keeps one
        (``Broyden(return_inverse=True)``): its final low-rank estimate of the inverse Jacobian
        of ``g(z) = f(z) - z`` (a :class:`~deqjax.solvers.BroydenInverse`), which
        :class:`~deqjax.ShineAdjoint` reuses in the backward pass.
      reversible_state: ``None`` unless requested from the reversible solver
        (``Reversible(return_state=True)``): the :class:`~deqjax.solvers.ReversibleState` (the
        returned iterate's pair and index) that :class:`~deqjax.ReversibleAdjoint` reverses from.
      aux: ``None`` unless the solver has ``has_aux=True`` (``f`` returns ``(z, aux)``): the
        ``aux`` of ``f`` at ``value`` (per problem under ``batch_ndim``), kept like ``f_value``
        (no extra evaluation).
    """

    value: PyTree
    num_steps: jax.Array
    abs_residual: jax.Array
    rel_residual: jax.Array
    trace: jax.Array
    status: jax.Array
    f_value: PyTree = None
    samples: PyTree = None
    inverse_estimate: Any = None
    reversible_state: Any = None
    aux: PyTree = None

    def __repr__(self) -> str:
        status = _concrete(self.status)
        if status is None:  # abstract: shapes only
            return (
                f"Solution(<abstract: status {getattr(self.status, 'shape', ())}, "
                f"value {jax.tree_util.tree_map(lambda a: getattr(a, 'shape', ()), self.value)}>)"
            )
        steps = np.asarray(self.num_steps)
        abs_res, rel_res = np.asarray(self.abs_residual), np.asarray(self.rel_residual)
        if status.ndim == 0:
            return (
                f"Solution(status={status_name(status)}, num_steps={int(steps)}, "
                f"abs_residual={float(abs_res):.3e}, rel_residual={float(rel_res):.3e})"
            )
        names, counts = np.unique(status, return_counts=True)
        summary = ", ".join(f"{status_name(n)}: {c}" for n, c in zip(names.tolist(), counts))
        return (
            f"Solution(batch={status.shape}, status={{{summary}}}, "
            f"num_steps=[min {steps.min()}, mean {steps.mean():.1f}, max {steps.max()}], "
            f"max abs_residual={np.max(abs_res):.3e}, max rel_residual={np.max(rel_res):.3e})"
        )
