"""Theory of DEQs at initialization (init paper: Agarwala & Schoenholz, "Deep equilibrium networks
are sensitive to initialization statistics"). Pure JAX/numpy, no Haiku.

Notation: ``W`` is ``n x n`` with ``E[(1/n) tr(W W^T)] = scale**2`` (:mod:`deqjax.initializers`);
``ensemble`` is one of ``"gaussian"`` (i.i.d., circular law of radius ``scale``), ``"orthogonal"``
(Haar, ``|lambda| = scale``) or ``"goe"`` (semicircle on ``[-2 scale, 2 scale]``).

Non-linearities ``phi`` are given either by NAME or as a CALLABLE:

* ``"tanh"``, ``"relu"``, ``"hardtanh"`` (``clip(h, -1, 1)``), ``"linear"``. Gaussian moments of
  ``relu``, ``hardtanh`` and ``linear`` use closed forms (erf); ``tanh`` Gauss–Hermite quadrature.
* a callable ``phi(h)``: an elementwise, jax-traceable scalar function; its derivative is taken with
  ``jax.grad``. A callable that is piecewise LINEAR (``phi'`` piecewise constant: ``relu``,
  ``hard_tanh``, leaky relu, ...) is recognised once per callable (:func:`piecewise_linear`): its
  kinks are located by bisection and every Gaussian moment is then exact (truncated-Gaussian
  moments with ``erf``), and the law of ``phi'(h)`` is the exact discrete law of its slopes. Any
  other callable uses Gauss–Hermite quadrature (``num_points`` nodes, exact to high order for
  smooth ``phi``): quadrature cannot integrate a step-function ``phi'``.

All functions take ``scale`` / ``q`` as scalars that may be traced (``jit``/``vmap`` over them);
``ensemble`` and ``phi`` are static.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import erf

ENSEMBLES = ("gaussian", "orthogonal", "goe")
PHI_NAMES = ("tanh", "relu", "hardtanh", "linear")

Phi = str | Callable[[jax.Array], jax.Array]

DEFAULT_NUM_POINTS = 96  # even: no node at h = 0, where relu-like callables have a kink


def _dtype() -> jnp.dtype:
    return jnp.dtype(jnp.result_type(float))


def _as_float(x) -> jax.Array:
    return jnp.asarray(x, _dtype())


def check_ensemble(ensemble: str) -> str:
    """Raises ``ValueError`` unless ``ensemble`` is one of ``ENSEMBLES``."""
    if ensemble not in ENSEMBLES:
        raise ValueError(f"ensemble must be one of {ENSEMBLES}, got {ensemble!r}.")
    return ensemble


def _check_phi(phi: Phi) -> Phi:
    if isinstance(phi, str):
        if phi not in PHI_NAMES:
            raise ValueError(f"phi must be one of {PHI_NAMES} or a callable, got {phi!r}.")
        return phi
    if not callable(phi):
        raise ValueError(f"phi must be one of {PHI_NAMES} or a callable, got {phi!r}.")
    return phi


def activation(
    phi: Phi,
) -> tuple[Callable[[jax.Array], jax.Array], Callable[[jax.Array], jax.Array]]:
    """Returns ``(phi, phi')`` as elementwise functions, resolving names.

    Raises:
      ValueError: if ``phi`` is neither a known name nor callable.
    """
    phi = _check_phi(phi)
    if phi == "tanh":
        return jnp.tanh, lambda h: 1.0 - jnp.tanh(h) ** 2
    if phi == "relu":
        return jax.nn.relu, lambda h: (h > 0).astype(h.dtype)
    if phi == "hardtanh":
        return (lambda h: jnp.clip(h, -1.0, 1.0)), lambda h: (jnp.abs(h) < 1).astype(h.dtype)
    if phi == "linear":
        return (lambda h: h), jnp.ones_like
    fn = phi
    grad = jax.grad(lambda h: fn(h))

    def dphi(h):
        return jax.vmap(grad)(h.reshape(-1)).reshape(h.shape)

    return fn, dphi


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
        breaks = []
        for j in jumps:  # phi' changes between h[j] and h[j + 1]
            lo, hi = float(h[j]), float(h[j + 1])
            left = float(d[j])
            for _ in range(_KINK_BISECTIONS):
                mid = 0.5 * (lo + hi)
                if float(grad(jnp.asarray([mid], dtype))[0]) == left:
                    lo = mid
                else:
                    hi = mid
            breaks.append(0.5 * (lo + hi))
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


def _piecewise(phi: Phi) -> PiecewiseLinear | None:
    return None if isinstance(phi, str) else piecewise_linear(phi)


def _truncated_moments(pieces: PiecewiseLinear, q: jax.Array) -> tuple[jax.Array, ...]:
    """``(P_i, E[h 1_i], E[h^2 1_i])`` over the pieces ``i`` for ``h ~ N(0, q)`` (arrays [pieces]).

    With ``s = sqrt(q)``, ``a, b`` a piece's ends in units of ``s`` and ``varphi`` the standard
    normal density: ``P = Phi(b) - Phi(a)``, ``E[h 1] = s (varphi(a) - varphi(b))``,
    ``E[h^2 1] = q (P + a varphi(a) - b varphi(b))`` (``x varphi(x) = 0`` at ``x = ±inf``).
    """
    s = jnp.sqrt(q)
    inv = _safe_inv_sqrt(q)
    b = _as_float(np.asarray(pieces.breaks, np.float64)) * inv  # [pieces - 1]
    inf = jnp.full((1,), jnp.inf, b.dtype)
    lo = jnp.concatenate([-inf, b])
    hi = jnp.concatenate([b, inf])
    cdf = lambda x: 0.5 * (1.0 + erf(x / math.sqrt(2.0)))  # noqa: E731
    pdf = lambda x: (
        jnp.where(  # noqa: E731
            jnp.isfinite(x), jnp.exp(-0.5 * jnp.where(jnp.isfinite(x), x, 0.0) ** 2), 0.0
        )
        / math.sqrt(2.0 * math.pi)
    )
    x_pdf = lambda x: jnp.where(jnp.isfinite(x), x, 0.0) * pdf(x)  # noqa: E731
    p = cdf(hi) - cdf(lo)
    m1 = s * (pdf(lo) - pdf(hi))
    m2 = q * (p + x_pdf(lo) - x_pdf(hi))
    return p, m1, m2


MAX_NUM_POINTS = 256  # numpy's hermegauss loses its weights to overflow beyond ~300 nodes


def _check_num_points(num_points: int) -> None:
    if not 2 <= num_points <= MAX_NUM_POINTS:
        raise ValueError(f"num_points must be in [2, {MAX_NUM_POINTS}], got {num_points}.")


@functools.lru_cache(maxsize=16)
def _hermite_nodes(num_points: int) -> tuple[np.ndarray, np.ndarray]:
    nodes, weights = np.polynomial.hermite_e.hermegauss(num_points)
    return nodes, weights / math.sqrt(2.0 * math.pi)  # weights sum to 1 for N(0, 1)


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
    """
    _check_num_points(num_points)
    nodes, weights = _hermite_nodes(int(num_points))
    h = jnp.sqrt(_as_float(q)) * _as_float(nodes)
    return jnp.sum(_as_float(weights) * g(h))


def _safe_inv_sqrt(q: jax.Array) -> jax.Array:
    return jnp.where(q > 0, 1.0 / jnp.sqrt(jnp.where(q > 0, q, 1.0)), jnp.inf)


def phi_second_moment(phi: Phi, q, *, num_points: int = DEFAULT_NUM_POINTS) -> jax.Array:
    """``E_{h ~ N(0, q)}[phi(h)**2]`` (closed form for relu, hardtanh, linear)."""
    phi = _check_phi(phi)
    q = _as_float(q)
    if phi == "linear":
        return q
    if phi == "relu":
        return q / 2.0
    if phi == "hardtanh":
        a = _safe_inv_sqrt(q)  # threshold 1 in units of the standard deviation
        p_in = erf(a / math.sqrt(2.0))
        tail = jnp.where(
            jnp.isfinite(a), a * jnp.exp(-0.5 * jnp.where(jnp.isfinite(a), a, 0.0) ** 2), 0.0
        )
        inner = p_in - math.sqrt(2.0 / math.pi) * tail  # E[z^2 1{|z| < a}], z ~ N(0, 1)
        return q * inner + (1.0 - p_in)
    pieces = _piecewise(phi)
    if pieces is not None:  # sum_i E[(c_i + v_i h)^2 1_i], exact
        p, m1, m2 = _truncated_moments(pieces, q)
        c, v = _as_float(np.asarray(pieces.intercepts)), _as_float(np.asarray(pieces.slopes))
        return jnp.sum(c * c * p + 2.0 * c * v * m1 + v * v * m2)
    fn, _ = activation(phi)
    return gaussian_expectation(lambda h: fn(h) ** 2, q, num_points=num_points)


def phi_prime_second_moment(phi: Phi, q, *, num_points: int = DEFAULT_NUM_POINTS) -> jax.Array:
    """``E_{h ~ N(0, q)}[phi'(h)**2]`` (closed form for relu, hardtanh, linear)."""
    phi = _check_phi(phi)
    q = _as_float(q)
    if phi == "linear":
        return jnp.ones_like(q)
    if phi == "relu":
        return jnp.full_like(q, 0.5)
    if phi == "hardtanh":
        return erf(_safe_inv_sqrt(q) / math.sqrt(2.0))  # P(|h| < 1)
    pieces = _piecewise(phi)
    if pieces is not None:  # sum_i v_i^2 P_i, exact
        p, _, _ = _truncated_moments(pieces, q)
        return jnp.sum(_as_float(np.asarray(pieces.slopes)) ** 2 * p)
    _, dphi = activation(phi)
    return gaussian_expectation(lambda h: dphi(h) ** 2, q, num_points=num_points)


def linear_second_moment(scale, ensemble: str) -> jax.Array:
    """``lim_{n->inf} (1/n) E||z*||**2`` for the linear DEQ ``z* = W z* + x``, ``x ~ N(0, I)``.

    Equals ``lim (1/n) tr((I - W)^{-1} (I - W)^{-T})`` (init paper Eq. 8–11, App. A.3):

    * Gaussian and orthogonal: ``1 / (1 - scale**2)``;
    * GOE: ``int rho_sc(lambda) / (1 - lambda)**2 d lambda``
      ``= (1/sqrt(1 - 4 scale**2) - 1) / (2 scale**2)``
      (Catalan generating function), which tends to 1 as ``scale -> 0``.

    Args:
      scale: ``E[(1/n) tr(W W^T)] = scale**2`` (scalar, may be traced).
      ensemble: ``"gaussian"``, ``"orthogonal"`` or ``"goe"``.

    Returns:
      The limit; ``inf`` at and beyond the spectral edge (``scale >= 1``, GOE ``scale >= 1/2``),
      where the forward iteration ``z <- W z + x`` diverges.

    Raises:
      ValueError: for an unknown ``ensemble``.
    """
    check_ensemble(ensemble)
    return _linear_second_moment(_as_float(scale), ensemble=ensemble)


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


def mean_field_variance(
    scale,
    ensemble: str,
    phi: Phi,
    *,
    sigma_x: float = 1.0,
    max_steps: int = 10_000,
    tol: float = 1e-12,
    num_points: int = DEFAULT_NUM_POINTS,
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
      phi: a name in ``PHI_NAMES`` or a callable (see the module docstring).
      sigma_x: standard deviation of the input injection ``x ~ N(0, sigma_x**2 I)``; ``> 0``.
      max_steps: iteration budget.
      tol: stop when ``|q_{k+1} - q_k| <= tol * q_k``.
      num_points: Gauss–Hermite nodes for quadrature-based moments.

    Returns:
      ``q``; ``inf`` when the variance diverges (the iteration does not settle within ``max_steps``,
      e.g. ``relu`` at ``scale >= sqrt(2)``).

    Raises:
      ValueError: for an unknown ``ensemble``/``phi`` or invalid numeric arguments.
    """
    check_ensemble(ensemble)
    phi = _check_phi(phi)
    if not (isinstance(sigma_x, jax.core.Tracer) or float(sigma_x) > 0.0):
        raise ValueError(f"sigma_x must be > 0, got {sigma_x}.")
    if max_steps < 1:
        raise ValueError(f"max_steps must be >= 1, got {max_steps}.")
    if not tol > 0:
        raise ValueError(f"tol must be > 0, got {tol}.")
    _check_num_points(num_points)
    return _mean_field_variance(
        _as_float(scale),
        _as_float(sigma_x),
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

    def update(s2_, q):
        return s2_ * phi_second_moment(phi, q, num_points=num_points) + x2

    # A tolerance below the dtype's resolution could never be met (float32 iterates may cycle
    # between two adjacent floats) and would report a finite q as divergent.
    tol = max(tol, 8.0 * float(jnp.finfo(_dtype()).eps))

    def solve(residual, q0):
        del residual

        def cond(state):
            k, q, q_prev = state
            settled = jnp.abs(q - q_prev) <= tol * jnp.abs(q_prev)
            return (k < max_steps) & ~settled & jnp.isfinite(q)

        def body(state):
            k, q, _ = state
            return k + 1, update(s2, q), q

        k, q, q_prev = jax.lax.while_loop(cond, body, (0, update(s2, q0), q0))
        settled = jnp.abs(q - q_prev) <= tol * jnp.abs(q_prev)
        return jnp.where(settled & jnp.isfinite(q), q, jnp.inf)

    def tangent_solve(g, y):
        return y / g(jnp.ones_like(y))

    return jax.lax.custom_root(lambda q: update(s2, q) - q, x2, solve, tangent_solve)


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
    num_points: int = DEFAULT_NUM_POINTS,
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
    """
    check_ensemble(ensemble)
    phi = _check_phi(phi)
    _check_num_points(num_points)
    if num_grid < 4:
        raise ValueError(f"num_grid must be >= 4, got {num_grid}.")
    return _spectral_radius(
        _as_float(scale),
        _as_float(q),
        ensemble=ensemble,
        phi=phi,
        num_points=int(num_points),
        num_grid=int(num_grid),
    )


@functools.partial(jax.jit, static_argnames=("ensemble", "phi", "num_points", "num_grid"))
def _spectral_radius(scale, q, *, ensemble, phi, num_points, num_grid):
    if ensemble in ("gaussian", "orthogonal"):
        return scale * jnp.sqrt(phi_prime_second_moment(phi, q, num_points=num_points))
    if phi in ("hardtanh", "relu", "linear"):
        p_one = phi_prime_second_moment(phi, q)  # phi' in {0, 1}: E[phi'^2] = P(phi' = 1)
        return 2.0 * scale * jnp.sqrt(p_one)
    pieces = _piecewise(phi)
    if pieces is not None:  # the exact discrete law of phi'(h): slope v_i with probability P_i
        d = _as_float(np.asarray(pieces.slopes))
        weights, _, _ = _truncated_moments(pieces, q)
        if len(set(pieces.slopes) - {0.0, 1.0}) == 0:  # Bernoulli: the closed form of §3.2
            return 2.0 * scale * jnp.sqrt(jnp.sum(jnp.where(d == 1.0, weights, 0.0)))
        return jnp.abs(scale) * _goe_edge(d, weights, num_grid=num_grid)
    _, dphi = activation(phi)
    nodes, weights = _hermite_nodes(int(num_points))
    d = dphi(jnp.sqrt(q) * _as_float(nodes))
    return jnp.abs(scale) * _goe_edge(d, _as_float(weights), num_grid=num_grid)


def predicted_radius(
    scale,
    ensemble: str,
    phi: Phi,
    *,
    sigma_x: float = 1.0,
    num_points: int = DEFAULT_NUM_POINTS,
) -> jax.Array:
    """:func:`spectral_radius` at the mean-field ``q = mean_field_variance(scale, ...)``."""
    q = mean_field_variance(scale, ensemble, phi, sigma_x=sigma_x, num_points=num_points)
    return spectral_radius(scale, ensemble, q, phi, num_points=num_points)


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
    forward iteration stops converging (the transition of the init paper's Fig. 4). Found by a scan
    of ``num_grid`` scales in ``(0, max_scale]`` followed by bisection of the first bracket.
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
    """
    check_ensemble(ensemble)
    _check_phi(phi)
    if not max_scale > 0:
        raise ValueError(f"max_scale must be > 0, got {max_scale}.")
    if num_grid < 2:
        raise ValueError(f"num_grid must be >= 2, got {num_grid}.")

    return _critical_scale(
        _as_float(sigma_x),
        _as_float(max_scale),
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

    grid = max_scale * jnp.arange(1, num_grid + 1, dtype=_dtype()) / num_grid
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
