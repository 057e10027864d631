"""The gradient channel: statistics of a backward pass, returned as the cotangent of a probe.

A VJP can return nothing but cotangents. To report how the backward solve went (steps, residual,
fallbacks, failures) without a host round trip, :func:`deqjax.fixed_point` takes a
:class:`BackwardStats` *probe* among its differentiable inputs; the backward pass gives the probe
its statistics as its "gradient". Cotangents add up, so the statistics of several solves sharing a
probe (layers, time steps, the examples of a ``vmap``) are summed.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class BackwardStats(NamedTuple):
    """Statistics of implicit backward solves, summed: the gradient channel of ``fixed_point``.

    Pass ``probe = dq.BackwardStats.zeros()`` as ``dq.fixed_point(..., backward_stats=probe)``
    (or ``dq.nn.DEQ(..., backward_stats=True)``) and differentiate the loss with respect to the
    probe too: the implicit VJP returns this backward solve's statistics as the probe's
    "gradient". ``jax.grad(loss, argnums=(0, k))`` then gives ``(param_grads, stats)`` under
    ``jit``, ``vmap`` and ``pmap`` with no host synchronisation. The probe does not change the
    forward value or any other gradient.

    Every field is a float sum, so statistics add up the way cotangents do: over several
    ``fixed_point`` calls that share a probe (layers, time steps of a scan), over the examples of
    a ``vmap`` with an unbatched probe, and over the problems of a batch-native solve
    (``batch_ndim > 0``: one count per problem). Divide by ``count`` for means
    (:meth:`metrics`). :class:`~deqjax.ShineAdjoint` reports its refinement steps, checked
    adjoint residual and fallbacks, :class:`~deqjax.ReversibleAdjoint` its reversal (see their
    docstrings); the phantom, one-step and unrolled strategies run no backward solve and leave
    every field 0.

    Attributes:
      count: number of backward solves (problems).
      num_steps: evaluations of the adjoint map used, first solve and fallback together.
      rel_residual: final relative residual ``‖g + Jᵀu − u‖ / ‖g + Jᵀu‖`` of the ``u`` used.
      failures: solves whose final status (after any fallback) is not ``CONVERGED``; these used
        the ``on_failure`` policy.
      fallbacks: solves whose first attempt did not converge and that ran the fallback solver.
    """

    count: jax.Array
    num_steps: jax.Array
    rel_residual: jax.Array
    failures: jax.Array
    fallbacks: jax.Array

    @classmethod
    def zeros(cls, dtype: jnp.dtype = jnp.float32) -> BackwardStats:
        """The probe: every field a scalar 0 of ``dtype`` (a float dtype)."""
        if not jnp.issubdtype(dtype, jnp.floating):
            raise ValueError(f"dtype must be a float dtype, got {dtype}.")
        zero = jnp.zeros((), dtype)
        return cls(zero, zero, zero, zero, zero)

    def metrics(self, prefix: str = "bwd_") -> dict[str, jax.Array]:
        """Scalars to log: mean steps and residual per solve, failure and fallback fractions.

        Means are ``sum / max(count, 1)``; with no backward solve every entry is 0. Names carry
        no reduction suffix, so :func:`deqjax.training.reduce_metrics` averages them across
        devices (equal per-device counts make that the global mean).
        """
        count = jnp.maximum(self.count, 1.0)
        return {
            f"{prefix}steps": self.num_steps / count,
            f"{prefix}rel_residual": self.rel_residual / count,
            f"{prefix}failure_rate": self.failures / count,
            f"{prefix}fallback_rate": self.fallbacks / count,
        }


def summed(
    count: jax.Array,
    num_steps: jax.Array,
    rel_residual: jax.Array,
    failures: jax.Array,
    fallbacks: jax.Array,
    dtype: jnp.dtype = jnp.float32,
) -> BackwardStats:
    """:class:`BackwardStats` from per-problem values (any shapes), each summed in ``dtype``.

    ``count`` must be computed from per-problem values (e.g. ``status >= 0``), not a static
    size or ``ones_like`` (unbatched under ``vmap``): under ``jax.vmap`` the cotangent must be
    batched so that JAX sums it over the examples for an unbatched probe.
    """
    fields = (count, num_steps, rel_residual, failures, fallbacks)
    return BackwardStats(*(jnp.sum(jnp.asarray(a).astype(dtype)) for a in fields))


def probe_cotangent(stats: BackwardStats, probe: BackwardStats | None) -> BackwardStats | None:
    """The probe's cotangent: ``stats`` in the probe's dtypes (``None`` without a probe)."""
    if probe is None:
        return None
    return jax.tree_util.tree_map(lambda s, p: s.astype(p.dtype), stats, probe)
