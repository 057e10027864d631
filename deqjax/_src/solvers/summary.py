"""``dq.solvers.summarize``: the metrics dict of a forward solve, for training logs."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from deqjax._src.solvers.solution import STATUS_NAMES, Solution


def summarize(solution: Solution, prefix: str = "") -> dict[str, jax.Array]:
    """Scalar statistics of a (batched) :class:`~deqjax.solvers.Solution`, for a metrics dict.

    Jit-safe (no host sync) and gradient-free; a single solve counts as a batch of one. The
    ``_max`` suffix marks the entries that :func:`deqjax.training.reduce_metrics` reduces with a
    maximum across devices; the others are means.

    Args:
      solution: a Solution with any leading batch axes (``batch_ndim``, ``jax.vmap``, a DEQ's
        per-example mode) or none.
      prefix: prepended to every key (e.g. ``"fwd/"``, ``"eval_"``).

    Returns:
      float32 scalars: ``nfe`` and ``nfe_max`` (evaluations of ``f``, mean and max over the
      batch), ``abs_residual``, ``abs_residual_max``, ``rel_residual``, ``rel_residual_max`` (of
      the returned iterate), and the fractions of the batch that ``converged``, stopped at
      ``max_steps``, ``diverged`` or went ``nonfinite`` (they sum to 1).

    Example:
      >>> z, sol = deq(x)
      >>> metrics = {"loss": loss, **dq.solvers.summarize(sol)}
    """
    stats = jax.lax.stop_gradient(
        (solution.num_steps, solution.abs_residual, solution.rel_residual, solution.status)
    )
    steps, abs_res, rel_res, status = (jnp.asarray(a) for a in stats)
    f32 = lambda a: a.astype(jnp.float32)  # noqa: E731
    out = {
        "nfe": jnp.mean(f32(steps)),
        "nfe_max": jnp.max(f32(steps)),
        "abs_residual": jnp.mean(f32(abs_res)),
        "abs_residual_max": jnp.max(f32(abs_res)),
        "rel_residual": jnp.mean(f32(rel_res)),
        "rel_residual_max": jnp.max(f32(rel_res)),
    }
    for code, name in STATUS_NAMES.items():
        out[name] = jnp.mean(f32(status == code))
    return {prefix + k: v for k, v in out.items()}
