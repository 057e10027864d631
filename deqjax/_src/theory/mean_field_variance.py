"""The non-linear DEQ ``h = W phi(h) + x``: its mean-field variance (init paper Theorem 3.1)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from deqjax._src.theory import activations, ensembles, gaussian_moments, numerics
from deqjax._src.theory.activations import Phi


def mean_field_variance(
    scale,
    ensemble: str,
    phi: Phi,
    *,
    sigma_x: float = 1.0,
    max_steps: int = 10_000,
    tol: float = 1e-12,
    num_points: int = gaussian_moments.DEFAULT_NUM_POINTS,
) -> jax.Array:
    """Self-consistent variance ``q`` of the non-linear DEQ ``h = W phi(h) + x`` (Theorem 3.1).

    Solves ``q = scale**2 E_{h ~ N(0, q)}[phi(h)**2] + sigma_x**2`` (init paper Eq. 25) by
    fixed-point iteration from ``q = sigma_x**2`` (closed form for ``"linear"``:
    ``sigma_x**2 / (1 - scale**2)``,
    and ``"relu"``: ``sigma_x**2 / (1 - scale**2 / 2)``). The equation is exact for orthogonal ``W``
    and the free-independence approximation otherwise; the paper (Fig. 2) finds the GOE empirical
    ``q`` ABOVE this prediction. Differentiable in ``scale`` (implicit function theorem through
    ``jax.lax.custom_root``).

    Args:
      scale: weight scale (scalar, may be traced).
      ensemble: ``"gaussian"``, ``"orthogonal"`` or ``"goe"`` (the equation is the same for all).
      phi: a name in ``PHI_NAMES`` or a callable (see :mod:`.activations`).
      sigma_x: standard deviation of the input injection ``x ~ N(0, sigma_x**2 I)``; ``> 0``.
      max_steps: iteration budget.
      tol: stop when ``|q_{k+1} - q_k| <= tol * q_k``.
      num_points: Gauss–Hermite nodes for quadrature-based moments.

    Returns:
      ``q``; ``inf`` when the variance diverges (the iteration does not settle within ``max_steps``,
      e.g. ``relu`` at ``scale >= sqrt(2)``).

    Raises:
      ValueError: for an unknown ``ensemble``/``phi`` or invalid numeric arguments.

    Example:
      >>> q = dq.theory.mean_field_variance(0.9, "orthogonal", "tanh")
    """
    ensembles.check_ensemble(ensemble)
    phi = activations.check_phi(phi)
    if not (isinstance(sigma_x, jax.core.Tracer) or float(sigma_x) > 0.0):
        raise ValueError(f"sigma_x must be > 0, got {sigma_x}.")
    if max_steps < 1:
        raise ValueError(f"max_steps must be >= 1, got {max_steps}.")
    if not tol > 0:
        raise ValueError(f"tol must be > 0, got {tol}.")
    gaussian_moments.check_num_points(num_points)
    return _mean_field_variance(
        numerics.as_float(scale),
        numerics.as_float(sigma_x),
        phi=phi,
        max_steps=int(max_steps),
        tol=float(tol),
        num_points=int(num_points),
    )


@functools.partial(jax.jit, static_argnames=("phi", "max_steps", "tol", "num_points"))
def _mean_field_variance(scale, sigma_x, *, phi, max_steps, tol, num_points):
    s2 = scale**2
    x2 = sigma_x**2
    if phi in ("linear", "relu"):
        gain = s2 if phi == "linear" else s2 / 2.0
        ok = gain < 1.0
        return jnp.where(ok, x2 / jnp.where(ok, 1.0 - gain, 1.0), jnp.inf)

    def update(s2_, q):  # the right-hand side of Eq. 25
        return s2_ * gaussian_moments.phi_second_moment(phi, q, num_points=num_points) + x2

    # A tolerance below the dtype's resolution could never be met (float32 iterates may cycle
    # between two adjacent floats) and would report a finite q as divergent.
    tol = max(tol, 8.0 * float(jnp.finfo(numerics.default_dtype()).eps))

    def solve(residual, q0):
        del residual
        return _iterate(lambda q: update(s2, q), q0, max_steps=max_steps, tol=tol)

    def tangent_solve(g, y):
        return y / g(jnp.ones_like(y))

    return jax.lax.custom_root(lambda q: update(s2, q) - q, x2, solve, tangent_solve)


def _iterate(update, q0, *, max_steps: int, tol: float) -> jax.Array:
    """``q <- update(q)`` from ``q0`` until settled (relative ``tol``); ``inf`` if it never does."""

    def cond(state):
        k, q, q_prev = state
        settled = jnp.abs(q - q_prev) <= tol * jnp.abs(q_prev)
        return (k < max_steps) & ~settled & jnp.isfinite(q)

    def body(state):
        k, q, _ = state
        return k + 1, update(q), q

    k, q, q_prev = jax.lax.while_loop(cond, body, (0, update(q0), q0))
    settled = jnp.abs(q - q_prev) <= tol * jnp.abs(q_prev)
    return jnp.where(settled & jnp.isfinite(q), q, jnp.inf)
