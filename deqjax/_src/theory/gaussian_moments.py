"""Gaussian moments of the activation: ``E[phi(h)^2]`` and ``E[phi'(h)^2]``, ``h ~ N(0, q)``.

These are the two expectations of the init paper's non-linear theory: ``E[phi(h)^2]`` closes the
mean-field variance equation (Theorem 3.1, Eq. 25) and ``E[phi'(h)^2]`` sets Theorem 3.2's radius
(Eq. 30). Closed forms for ``relu``, ``hardtanh`` and ``linear``; exact truncated-Gaussian sums for
piecewise-linear callables (:mod:`.piecewise_linear`); Gauss–Hermite quadrature otherwise
(``num_points`` nodes, exact to high order for smooth ``phi``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import erf

from deqjax._src.theory import activations, numerics
from deqjax._src.theory import piecewise_linear as pwl
from deqjax._src.theory.activations import Phi

DEFAULT_NUM_POINTS = 96  # even: no node at h = 0, where relu-like callables have a kink
MAX_NUM_POINTS = 256  # numpy's hermegauss loses its weights to overflow beyond ~300 nodes


def check_num_points(num_points: int) -> None:
    """Raises ``ValueError`` unless ``2 <= num_points <= MAX_NUM_POINTS``."""
    if not 2 <= num_points <= MAX_NUM_POINTS:
        raise ValueError(f"num_points must be in [2, {MAX_NUM_POINTS}], got {num_points}.")


@functools.lru_cache(maxsize=16)
def hermite_nodes(num_points: int) -> tuple[np.ndarray, np.ndarray]:
    """Gauss–Hermite nodes and weights for ``N(0, 1)`` (the weights sum to 1)."""
    nodes, weights = np.polynomial.hermite_e.hermegauss(num_points)
    return nodes, weights / math.sqrt(2.0 * math.pi)


def gaussian_expectation(
    g: Callable[[jax.Array], jax.Array], q, *, num_points: int = DEFAULT_NUM_POINTS
) -> jax.Array:
    """``E_{h ~ N(0, q)}[g(h)]`` by Gauss–Hermite quadrature with ``num_points`` nodes.

    Args:
      g: elementwise function (applied to the vector of nodes).
      q: variance ``>= 0`` (scalar, may be traced).
      num_points: number of quadrature nodes.

    Returns:
      A scalar.

    Raises:
      ValueError: if ``num_points`` is outside ``[2, 256]``.

    Example:
      >>> dq.theory.gaussian_expectation(lambda h: h**4, 2.0)  # 3 q**2 = 12
    """
    check_num_points(num_points)
    nodes, weights = hermite_nodes(int(num_points))
    h = jnp.sqrt(numerics.as_float(q)) * numerics.as_float(nodes)
    return jnp.sum(numerics.as_float(weights) * g(h))


def _hardtanh_second_moment(q: jax.Array) -> jax.Array:
    """``E[clip(h, -1, 1)^2]``: ``q E[z^2 1{|z| < a}] + P(|z| >= a)``, ``a = 1 / sqrt(q)``."""
    a = numerics.safe_inv_sqrt(q)  # threshold 1 in units of the standard deviation
    p_in = erf(a / math.sqrt(2.0))
    tail = jnp.where(
        jnp.isfinite(a), a * jnp.exp(-0.5 * jnp.where(jnp.isfinite(a), a, 0.0) ** 2), 0.0
    )
    inner = p_in - math.sqrt(2.0 / math.pi) * tail  # E[z^2 1{|z| < a}], z ~ N(0, 1)
    return q * inner + (1.0 - p_in)


def phi_second_moment(phi: Phi, q, *, num_points: int = DEFAULT_NUM_POINTS) -> jax.Array:
    """``E_{h ~ N(0, q)}[phi(h)**2]``, the moment of the mean-field equation (Eq. 25).

    Args:
      phi: a name in ``PHI_NAMES`` or an elementwise callable.
      q: variance ``>= 0`` (scalar, may be traced).
      num_points: Gauss–Hermite nodes, for callables that are not piecewise linear.

    Returns:
      A scalar (closed form for ``relu``, ``hardtanh``, ``linear``; exact for piecewise-linear
      callables).

    Raises:
      ValueError: for an unknown ``phi``, or an invalid ``num_points`` where quadrature is used.
    """
    phi = activations.check_phi(phi)
    q = numerics.as_float(q)
    if phi == "linear":
        return q
    if phi == "relu":
        return q / 2.0
    if phi == "hardtanh":
        return _hardtanh_second_moment(q)
    pieces = pwl.pieces_of(phi)
    if pieces is not None:  # sum_i E[(c_i + v_i h)^2 1_i], exact
        p, m1, m2 = pwl.truncated_moments(pieces, q)
        c = numerics.as_float(np.asarray(pieces.intercepts))
        v = numerics.as_float(np.asarray(pieces.slopes))
        return jnp.sum(c * c * p + 2.0 * c * v * m1 + v * v * m2)
    fn, _ = activations.activation(phi)
    return gaussian_expectation(lambda h: fn(h) ** 2, q, num_points=num_points)


def phi_prime_second_moment(phi: Phi, q, *, num_points: int = DEFAULT_NUM_POINTS) -> jax.Array:
    """``E_{h ~ N(0, q)}[phi'(h)**2]``, the moment of Theorem 3.2's radius (Eq. 30).

    The arguments, the scalar returned (closed form or exact where :func:`phi_second_moment`'s
    is) and the errors raised are those of :func:`phi_second_moment`, with ``phi'`` for ``phi``.
    """
    phi = activations.check_phi(phi)
    q = numerics.as_float(q)
    if phi == "linear":
        return jnp.ones_like(q)
    if phi == "relu":
        return jnp.full_like(q, 0.5)
    if phi == "hardtanh":
        return erf(numerics.safe_inv_sqrt(q) / math.sqrt(2.0))  # P(|h| < 1)
    pieces = pwl.pieces_of(phi)
    if pieces is not None:  # sum_i v_i^2 P_i, exact
        p, _, _ = pwl.truncated_moments(pieces, q)
        return jnp.sum(numerics.as_float(np.asarray(pieces.slopes)) ** 2 * p)
    _, dphi = activations.activation(phi)
    return gaussian_expectation(lambda h: dphi(h) ** 2, q, num_points=num_points)
