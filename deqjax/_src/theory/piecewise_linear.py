"""Piecewise-linear activations: recognised once, then every Gaussian moment is exact.

A callable ``phi`` whose derivative is piecewise constant (``relu``, ``hard_tanh``, leaky relu, ...)
cannot be integrated by Gauss–Hermite quadrature (``phi'`` is a step function). It is recognised
by :func:`piecewise_linear` (kinks located by bisection) and its moments are then sums of
truncated-Gaussian moments (:func:`truncated_moments`); the law of ``phi'(h)`` is the exact discrete
law of its slopes (used by the GOE radius of :mod:`.spectral_radius`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from deqjax._src.theory import numerics
from deqjax._src.theory.activations import Phi


class PiecewiseLinear(NamedTuple):
    """``phi(h) = intercepts[i] + slopes[i] h`` on ``(breaks[i - 1], breaks[i])``.

    ``breaks`` is sorted, with ``-inf`` and ``+inf`` implied at the ends, so
    ``len(slopes) == len(breaks) + 1``.
    """

    breaks: tuple[float, ...]
    slopes: tuple[float, ...]
    intercepts: tuple[float, ...]


# Kink search: phi' on a grid of h in [-_KINK_RANGE, _KINK_RANGE]; a callable with more than
# _MAX_PIECES linear pieces (or any curvature) is treated as smooth.
_KINK_RANGE = 64.0
_KINK_GRID = 1 << 15
_MAX_PIECES = 16
_KINK_BISECTIONS = 60


@functools.lru_cache(maxsize=64)
def piecewise_linear(phi: Callable[[jax.Array], jax.Array]) -> PiecewiseLinear | None:
    """Recognises a piecewise-linear ``phi`` (piecewise-constant, e.g. Bernoulli, ``phi'``).

    ``phi'`` (by ``jax.grad``) is evaluated on a grid of ``2**15`` points of ``[-64, 64]``; where it
    takes at most 16 constant values, each jump is located by bisection to machine precision and
    ``phi`` is checked to be linear on every piece (at grid points). Runs once per callable, eagerly
    (also when called under ``jit``: ``phi`` is a static argument).

    Args:
      phi: an elementwise callable.

    Returns:
      The pieces, or ``None`` when ``phi`` is not piecewise linear (then quadrature is used).

    Example:
      >>> dq.theory.piecewise_linear(jax.nn.hard_tanh).slopes
      (0.0, 1.0, 0.0)
    """
    with jax.ensure_compile_time_eval():
        dtype = jnp.float64 if jax.config.jax_enable_x64 else jnp.float32
        grad = jax.jit(jax.vmap(jax.grad(lambda h: jnp.asarray(phi(h), dtype).sum())))
        h = np.linspace(-_KINK_RANGE, _KINK_RANGE, _KINK_GRID)
        try:
            d = np.asarray(grad(jnp.asarray(h, dtype)), np.float64)
            values = np.asarray(jax.vmap(phi)(jnp.asarray(h, dtype)), np.float64)
        except Exception:  # noqa: BLE001 - any failure to trace means "not recognised"
            return None
        if not (np.all(np.isfinite(d)) and np.all(np.isfinite(values))):
            return None
        jumps = np.nonzero(d[1:] != d[:-1])[0]
        if len(jumps) + 1 > _MAX_PIECES:
            return None
        # phi' changes between h[j] and h[j + 1]: locate each jump to machine precision.
        breaks = [
            _locate_break(grad, float(h[j]), float(h[j + 1]), float(d[j]), dtype) for j in jumps
        ]
        return _fit_pieces(h, d, values, breaks)


def _locate_break(grad, lo: float, hi: float, left: float, dtype) -> float:
    """The point in ``(lo, hi)`` where ``grad`` leaves the value ``left``, by bisection."""
    for _ in range(_KINK_BISECTIONS):
        mid = 0.5 * (lo + hi)
        if float(grad(jnp.asarray([mid], dtype))[0]) == left:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _fit_pieces(h, d, values, breaks: list[float]) -> PiecewiseLinear | None:
    """The line on each piece between ``breaks``; ``None`` if ``phi`` is curved on one."""
    edges = [-np.inf, *breaks, np.inf]
    slopes, intercepts = [], []
    for i in range(len(edges) - 1):
        inside = (h > edges[i]) & (h < edges[i + 1])
        if not np.any(inside):
            return None
        slope = float(d[inside][0])
        intercept = float(np.median(values[inside] - slope * h[inside]))
        fit = intercept + slope * h[inside]
        tol = 1e-4 * (1.0 + np.abs(values[inside]))
        if not np.all(np.abs(fit - values[inside]) <= tol):
            return None  # curved between the kinks: not piecewise linear
        slopes.append(slope)
        intercepts.append(intercept)
    return PiecewiseLinear(tuple(breaks), tuple(slopes), tuple(intercepts))


def pieces_of(phi: Phi) -> PiecewiseLinear | None:
    """:func:`piecewise_linear` of a callable ``phi``; ``None`` for a name (closed forms apply)."""
    return None if isinstance(phi, str) else piecewise_linear(phi)


def truncated_moments(pieces: PiecewiseLinear, q: jax.Array) -> tuple[jax.Array, ...]:
    """``(P_i, E[h 1_i], E[h^2 1_i])`` over the pieces ``i`` for ``h ~ N(0, q)`` (arrays [pieces]).

    With ``s = sqrt(q)``, ``a, b`` a piece's ends in units of ``s`` and ``varphi`` the standard
    normal density: ``P = Phi(b) - Phi(a)``, ``E[h 1] = s (varphi(a) - varphi(b))``,
    ``E[h^2 1] = q (P + a varphi(a) - b varphi(b))`` (``x varphi(x) = 0`` at ``x = ±inf``).
    """
    s = jnp.sqrt(q)
    inv = numerics.safe_inv_sqrt(q)
    b = numerics.as_float(np.asarray(pieces.breaks, np.float64)) * inv  # [pieces - 1]
    inf = jnp.full((1,), jnp.inf, b.dtype)
    lo = jnp.concatenate([-inf, b])
    hi = jnp.concatenate([b, inf])
    p = numerics.normal_cdf(hi) - numerics.normal_cdf(lo)
    m1 = s * (numerics.normal_pdf(lo) - numerics.normal_pdf(hi))
    m2 = q * (p + numerics.x_normal_pdf(lo) - numerics.x_normal_pdf(hi))
    return p, m1, m2
