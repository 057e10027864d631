"""The spectral radius of a DEQ Jacobian ``diag(phi'(h)) W`` at initialization (init paper §3.2).

:func:`spectral_radius` predicts it at a given pre-activation variance ``q`` (Theorem 3.2 for
Gaussian and orthogonal ``W``, free probability for the GOE); :func:`predicted_radius` at the
mean-field ``q`` of :mod:`.mean_field_variance`. The fixed point is stable under forward iteration
when the radius is below 1 (Eq. 29). Its measurement on one matrix is
:func:`deqjax.theory.jacobian_radius`; :func:`deqjax.jacobian.spectral_radius` estimates the same
radius for any cell by the power method.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from deqjax._src.theory import activations, ensembles, gaussian_moments, numerics
from deqjax._src.theory import piecewise_linear as pwl
from deqjax._src.theory.activations import Phi
from deqjax._src.theory.mean_field_variance import mean_field_variance


def _goe_edge(d: jax.Array, weights: jax.Array, *, num_grid: int) -> jax.Array:
    """Right edge of the spectrum of ``D^{1/2} S D^{1/2}``, ``S`` semicircular of unit variance.

    ``D`` has eigenvalue law ``sum_i weights_i delta_{d_i}`` (``d >= 0``), free from ``S``. The
    Dyson equation of this variance-profile Wigner matrix, ``u = E[d / (z - d u)]``, parametrised by
    ``s = u / z``, gives ``z**2 = E[d / (1 - d s)] / s``; the edge is its minimum over
    ``s in (0, 1 / max d)`` (where the real solution branch ends).
    """
    d_max = jnp.max(d)
    t = (jnp.arange(num_grid, dtype=d.dtype) + 0.5) / num_grid  # (0, 1)

    def z2(s):  # s: [k]
        return jnp.sum(weights[None, :] * d[None, :] / (1.0 - d[None, :] * s[:, None]), 1) / s

    coarse = z2(t / d_max)
    i = jnp.argmin(coarse)
    # Refine around the coarse minimum (the curve is smooth and convex near it).
    lo = jnp.maximum(t[i] - 1.0 / num_grid, 0.5 / num_grid**2)
    hi = jnp.minimum(t[i] + 1.0 / num_grid, 1.0 - 0.5 / num_grid**2)
    fine = lo + (hi - lo) * (jnp.arange(num_grid, dtype=d.dtype) / (num_grid - 1))
    best = jnp.minimum(jnp.min(z2(fine / d_max)), coarse[i])
    return jnp.where(d_max > 0, jnp.sqrt(best), 0.0)


def spectral_radius(
    scale,
    ensemble: str,
    q,
    phi: Phi,
    *,
    num_points: int = gaussian_moments.DEFAULT_NUM_POINTS,
    num_grid: int = 512,
) -> jax.Array:
    """Predicted spectral radius ``rho(diag(phi'(h)) W)`` with ``h ~ N(0, q)`` free from ``W``.

    * Gaussian and orthogonal ``W``: Theorem 3.2 (init paper Eq. 30),
      ``rho = scale * sqrt(E[phi'(h)**2])`` (the outer edge of an R-diagonal Brown measure).
    * GOE: ``diag(phi'(h)) W`` has the spectrum of ``D^{1/2} W D^{1/2}``, ``D = diag(phi'(h))``
      (needs monotone ``phi``, i.e. ``phi' >= 0``; App. C.1). For ``"hardtanh"`` (and ``"relu"``,
      ``"linear"``), where ``phi'`` is Bernoulli, the closed form of §3.2 / Eq. 124 is used:
      ``rho = 2 scale sqrt(P(phi'(h) = 1))`` — for hardtanh ``P(|h| < 1)``. Every other case is
      computed NUMERICALLY: the edge of the free product of the semicircle with the law of
      ``phi'(h)`` (discretised by Gauss–Hermite nodes), from the Dyson equation
      ``z**2 = scale**2 min_s E[d / (1 - d s)] / s`` minimised on a grid of ``num_grid`` points
      plus one refinement (relative accuracy ~1e-5 for tanh).

    Args:
      scale: weight scale (scalar, may be traced).
      ensemble: ``"gaussian"``, ``"orthogonal"`` or ``"goe"``.
      q: variance of ``h`` (e.g. from :func:`mean_field_variance`), ``>= 0``.
      phi: a name in ``PHI_NAMES`` or a callable.
      num_points: Gauss–Hermite nodes.
      num_grid: grid size of the GOE numerical minimisation.

    Returns:
      The predicted spectral radius (``< 1``: the fixed point is stable under forward iteration).

    Raises:
      ValueError: for an unknown ``ensemble`` or ``phi``.

    Example:
      >>> dq.theory.spectral_radius(0.8, "orthogonal", 1.3, "relu")  # 0.8 / sqrt(2)
    """
    ensembles.check_ensemble(ensemble)
    phi = activations.check_phi(phi)
    gaussian_moments.check_num_points(num_points)
    if num_grid < 4:
        raise ValueError(f"num_grid must be >= 4, got {num_grid}.")
    return _spectral_radius(
        numerics.as_float(scale),
        numerics.as_float(q),
        ensemble=ensemble,
        phi=phi,
        num_points=int(num_points),
        num_grid=int(num_grid),
    )


@functools.partial(jax.jit, static_argnames=("ensemble", "phi", "num_points", "num_grid"))
def _spectral_radius(scale, q, *, ensemble, phi, num_points, num_grid):
    if ensemble in ("gaussian", "orthogonal"):  # Theorem 3.2, Eq. 30
        moment = gaussian_moments.phi_prime_second_moment(phi, q, num_points=num_points)
        return scale * jnp.sqrt(moment)
    return _goe_radius(scale, q, phi=phi, num_points=num_points, num_grid=num_grid)


def _goe_radius(scale, q, *, phi, num_points, num_grid):
    """The GOE radius: the closed form for a Bernoulli ``phi'``, else the free-probability edge."""
    if phi in ("hardtanh", "relu", "linear"):
        p_one = gaussian_moments.phi_prime_second_moment(phi, q)  # phi' in {0, 1}: P(phi' = 1)
        return 2.0 * scale * jnp.sqrt(p_one)
    pieces = pwl.pieces_of(phi)
    if pieces is not None:  # the exact discrete law of phi'(h): slope v_i with probability P_i
        d = numerics.as_float(np.asarray(pieces.slopes))
        weights, _, _ = pwl.truncated_moments(pieces, q)
        if len(set(pieces.slopes) - {0.0, 1.0}) == 0:  # Bernoulli: the closed form of §3.2
            return 2.0 * scale * jnp.sqrt(jnp.sum(jnp.where(d == 1.0, weights, 0.0)))
        return jnp.abs(scale) * _goe_edge(d, weights, num_grid=num_grid)
    _, dphi = activations.activation(phi)
    nodes, weights = gaussian_moments.hermite_nodes(int(num_points))
    d = dphi(jnp.sqrt(q) * numerics.as_float(nodes))
    return jnp.abs(scale) * _goe_edge(d, numerics.as_float(weights), num_grid=num_grid)


def predicted_radius(
    scale,
    ensemble: str,
    phi: Phi,
    *,
    sigma_x: float = 1.0,
    num_points: int = gaussian_moments.DEFAULT_NUM_POINTS,
) -> jax.Array:
    """:func:`spectral_radius` at the mean-field ``q = mean_field_variance(scale, ...)``.

    The radius the theory predicts for a DEQ at initialization: Theorem 3.2 at Theorem 3.1's ``q``
    (the theory curve of the init paper's Fig. 3).

    Args:
      scale: weight scale (scalar, may be traced).
      ensemble: ``"gaussian"``, ``"orthogonal"`` or ``"goe"``.
      phi: a name in ``PHI_NAMES`` or a callable.
      sigma_x: standard deviation of the inputs, ``> 0``.
      num_points: Gauss–Hermite nodes.

    Returns:
      The predicted radius (``< 1``: a stable fixed point). Where the variance diverges
      (``q = inf``) it is Theorem 3.2 evaluated at ``q = inf``.

    Raises:
      ValueError: for unknown names or invalid numeric arguments.
    """
    q = mean_field_variance(scale, ensemble, phi, sigma_x=sigma_x, num_points=num_points)
    return spectral_radius(scale, ensemble, q, phi, num_points=num_points)
