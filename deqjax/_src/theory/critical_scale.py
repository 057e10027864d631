"""The predicted critical scale: where a DEQ at initialization stops having a stable fixed point."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from deqjax._src.theory import activations, ensembles, numerics
from deqjax._src.theory.activations import Phi
from deqjax._src.theory.spectral_radius import predicted_radius


def critical_scale(
    ensemble: str,
    phi: Phi,
    *,
    sigma_x: float = 1.0,
    max_scale: float = 4.0,
    num_grid: int = 64,
    num_bisections: int = 50,
) -> jax.Array:
    """Predicted critical scale: the smallest ``scale`` where :func:`predicted_radius` reaches 1.

    Below it the mean-field theory predicts a stable fixed point of ``h <- W phi(h) + x``; above it
    forward iteration stops converging (the transition of the init paper's Fig. 4, §3.2). Found by
    a scan of ``num_grid`` scales in ``(0, max_scale]`` followed by bisection of the first bracket.
    Closed forms, for checks: linear ``1`` (GOE ``1/2``); relu ``sqrt(2)`` (GOE ``1/sqrt(2)``).

    Args:
      ensemble: ``"gaussian"``, ``"orthogonal"`` or ``"goe"``.
      phi: a name in ``PHI_NAMES`` or a callable.
      sigma_x: input standard deviation, ``> 0``.
      max_scale: upper end of the scan.
      num_grid: scan resolution.
      num_bisections: bisection steps in the first bracket.

    Returns:
      The critical scale, or ``inf`` if the radius stays below 1 up to ``max_scale``.

    Raises:
      ValueError: for unknown names or invalid numeric arguments.

    Example:
      >>> dq.theory.critical_scale("goe", "relu")  # 1 / sqrt(2)
    """
    ensembles.check_ensemble(ensemble)
    activations.check_phi(phi)
    if not max_scale > 0:
        raise ValueError(f"max_scale must be > 0, got {max_scale}.")
    if num_grid < 2:
        raise ValueError(f"num_grid must be >= 2, got {num_grid}.")

    return _critical_scale(
        numerics.as_float(sigma_x),
        numerics.as_float(max_scale),
        ensemble=ensemble,
        phi=phi,
        num_grid=int(num_grid),
        num_bisections=int(num_bisections),
    )


@functools.partial(jax.jit, static_argnames=("ensemble", "phi", "num_grid", "num_bisections"))
def _critical_scale(sigma_x, max_scale, *, ensemble, phi, num_grid, num_bisections):
    def excess(scale):  # radius - 1, with a diverging variance counted as unstable
        r = predicted_radius(scale, ensemble, phi, sigma_x=sigma_x)
        return jnp.where(jnp.isfinite(r), r - 1.0, jnp.inf)

    grid = max_scale * jnp.arange(1, num_grid + 1, dtype=numerics.default_dtype()) / num_grid
    values = jax.vmap(excess)(grid)
    unstable = values >= 0
    first = jnp.argmax(unstable)
    hi0 = grid[first]
    lo0 = jnp.where(first > 0, grid[jnp.maximum(first - 1, 0)], 0.0)

    def bisect(_, bracket):
        lo, hi = bracket
        mid = 0.5 * (lo + hi)
        up = excess(mid) >= 0
        return jnp.where(up, lo, mid), jnp.where(up, mid, hi)

    lo, hi = jax.lax.fori_loop(0, num_bisections, bisect, (lo0, hi0))
    return jnp.where(jnp.any(unstable), 0.5 * (lo + hi), jnp.inf)
