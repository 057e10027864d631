"""The linear DEQ ``z* = W z* + x``: the second moment of its fixed point (init paper §2.1)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from deqjax._src.theory import ensembles, numerics


def linear_second_moment(scale, ensemble: str) -> jax.Array:
    """``lim_{n->inf} (1/n) E||z*||**2`` for the linear DEQ ``z* = W z* + x``, ``x ~ N(0, I)``.

    Equals ``lim (1/n) tr((I - W)^{-1} (I - W)^{-T})`` (init paper Eq. 8–11, App. A.3):

    * Gaussian and orthogonal: ``1 / (1 - scale**2)`` (Eq. 8);
    * GOE: ``int rho_sc(lambda) / (1 - lambda)**2 d lambda``
      ``= (1/sqrt(1 - 4 scale**2) - 1) / (2 scale**2)`` (Eq. 11, the Catalan generating
      function), which tends to 1 as ``scale -> 0``.

    Args:
      scale: ``E[(1/n) tr(W W^T)] = scale**2`` (scalar, may be traced).
      ensemble: ``"gaussian"``, ``"orthogonal"`` or ``"goe"``.

    Returns:
      The limit; ``inf`` at and beyond the spectral edge (``scale >= 1``, GOE ``scale >= 1/2``),
      where the forward iteration ``z <- W z + x`` diverges.

    Raises:
      ValueError: for an unknown ``ensemble``.

    Example:
      >>> dq.theory.linear_second_moment(0.5, "orthogonal")  # 1 / (1 - 0.25)
    """
    ensembles.check_ensemble(ensemble)
    return _linear_second_moment(numerics.as_float(scale), ensemble=ensemble)


@functools.partial(jax.jit, static_argnames=("ensemble",))
def _linear_second_moment(scale, *, ensemble):
    s2 = scale**2
    if ensemble in ("gaussian", "orthogonal"):
        ok = s2 < 1.0
        return jnp.where(ok, 1.0 / jnp.where(ok, 1.0 - s2, 1.0), jnp.inf)
    ok = 4.0 * s2 < 1.0
    safe = jnp.where(ok, s2, 0.0)
    root = jnp.sqrt(1.0 - 4.0 * safe)
    # (1/root - 1) / (2 s2) = 2 / (root (1 + root)), which is stable at s2 -> 0.
    value = 2.0 / (root * (1.0 + root))
    return jnp.where(ok, value, jnp.inf)
