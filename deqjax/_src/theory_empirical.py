"""Monte-Carlo counterparts of :mod:`deqjax.theory`'s predictions (init paper Figs. 1-4).

Each function measures, on one random matrix ``W`` drawn at width ``n``, the quantity a theory
function predicts in the large-``n`` limit: :func:`linear_trace` (``linear_second_moment``, Fig. 1),
:func:`forward_iteration`'s variance ``q`` and residual (``mean_field_variance``, Figs. 2 and 4) and
:func:`jacobian_radius` (Theorem 3.2's ``spectral_radius``, Fig. 3). Host-side numpy results
(float64 when x64 is on): these are measurements for plots and tables, not training code.
:func:`monte_carlo_rows` draws every point of the four figures.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from deqjax._src import random_matrices, theory

SAMPLERS = {
    "gaussian": random_matrices.gaussian,
    "orthogonal": random_matrices.haar_orthogonal,
    "goe": random_matrices.goe,
}


def sample_matrix(ensemble: str, n: int, scale: float, key: jax.Array) -> np.ndarray:
    """An ``n x n`` draw of ``ensemble`` at ``scale`` (numpy, float64 under x64).

    Raises:
      ValueError: for an unknown ensemble.
    """
    theory.check_ensemble(ensemble)
    return np.asarray(SAMPLERS[ensemble](key, (n, n), scale=scale, dtype=jnp.float64))


def linear_trace(w: np.ndarray) -> float:
    """``(1/n) tr((I - W)^{-1} (I - W)^{-T})``: the linear DEQ's ``(1/n) E_x ||z*||^2`` (Fig. 1)."""
    n = w.shape[0]
    resolvent = np.linalg.inv(np.eye(n) - w)
    return float(np.sum(resolvent * resolvent) / n)


def forward_iteration(w, x, phi: str, steps: int) -> tuple[float, float, np.ndarray]:
    """Runs ``h <- W phi(h) + x`` from ``h = 0`` for ``steps`` steps, for each column of ``x``.

    Returns:
      ``(q, residual, h)``: mean of ``h**2`` over the last third of the steps (Fig. 2), the
      relative residual ``||h_T+1 - h_T|| / ||h_T||`` per column, averaged (Fig. 4), and the last
      iterate ``[n, B]``.
    """
    q, res, h = _forward_iteration(jnp.asarray(w), jnp.asarray(x), phi=phi, steps=steps)
    return float(q), float(res), np.asarray(h)


@functools.partial(jax.jit, static_argnames=("phi", "steps"))
def _forward_iteration(w, x, *, phi, steps):
    fn, _ = theory.activation(phi)
    tail = max(steps // 3, 1)

    def body(k, carry):
        h, acc = carry
        h = w @ fn(h) + x
        acc = acc + jnp.where(k >= steps - tail, jnp.mean(h * h), 0.0)
        return h, acc

    h, acc = jax.lax.fori_loop(0, steps, body, (jnp.zeros_like(x), jnp.zeros((), x.dtype)))
    nxt = w @ fn(h) + x
    res = jnp.linalg.norm(nxt - h, axis=0) / (jnp.linalg.norm(h, axis=0) + 1e-30)
    return acc / tail, jnp.mean(res), h


def jacobian_radius(w: np.ndarray, h: np.ndarray, phi: str, ensemble: str) -> float:
    """``max |eig(diag(phi'(h)) W)|`` at the state ``h [n]`` (Fig. 3; the symmetric
    ``D^{1/2} W D^{1/2}`` form for the GOE when ``phi' >= 0``)."""
    _, dphi = theory.activation(phi)
    d = np.asarray(dphi(jnp.asarray(h)))
    if ensemble == "goe" and np.all(d >= 0):
        root = np.sqrt(d)
        return float(np.abs(np.linalg.eigvalsh(root[:, None] * w * root[None, :])).max())
    return float(np.abs(np.linalg.eigvals(d[:, None] * w)).max())


def _row(base: dict, figure: str, quantity: str, empirical: float, predicted: float) -> dict:
    return {"figure": figure, "quantity": quantity, **base, "empirical": empirical,
            "theory": predicted}  # fmt: skip


def monte_carlo_rows(
    *,
    n: int,
    phi: str,
    steps: int,
    batch: int,
    sigma_x: float,
    scales: Sequence[float],
    linear_scales: Sequence[float],
    num_seeds: int,
    seed: int = 0,
    progress: bool = False,
) -> list[dict]:
    """Every Monte-Carlo point of the init paper's Figs. 1-4 with its prediction.

    For each ensemble, seed and scale of ``linear_scales`` one ``fig1`` row (linear trace); for
    each scale of ``scales`` a ``fig2`` (``q``), ``fig3`` (Jacobian spectral radius at the last
    iterate of the first input) and ``fig4`` (relative residual after ``steps`` iterations; its
    "theory" is the predicted critical scale) row, from ``batch`` inputs ``x ~ N(0, sigma_x²)``.
    Keys fold in the seed, the scale and the ensemble, so a point does not depend on the others.

    Returns:
      Rows ``{"figure", "quantity", "ensemble", "scale", "seed", "n", "empirical", "theory"}``.
    """
    from tqdm import tqdm

    rows = []
    critical = {e: float(theory.critical_scale(e, phi, sigma_x=sigma_x)) for e in theory.ENSEMBLES}
    key = jax.random.key(seed)
    jobs = [
        (fig, ens, float(s), k)
        for ens in theory.ENSEMBLES
        for fig, points in (("fig1", linear_scales), ("fig234", scales))
        for s in points
        for k in range(num_seeds)
    ]
    for fig, ens, scale, s in tqdm(jobs, desc="init_theory", disable=not progress):
        k = jax.random.fold_in(jax.random.fold_in(key, s), int(round(scale * 1e4)))
        k_w, k_x = jax.random.split(jax.random.fold_in(k, theory.ENSEMBLES.index(ens)))
        w = sample_matrix(ens, n, scale, k_w)
        base = {"ensemble": ens, "scale": scale, "seed": s, "n": n}
        if fig == "fig1":
            predicted = float(theory.linear_second_moment(scale, ens))
            rows.append(_row(base, "fig1", "linear_trace", linear_trace(w), predicted))
            continue
        x = np.asarray(jax.random.normal(k_x, (n, batch), jnp.float64)) * sigma_x
        q_emp, residual, h = forward_iteration(w, x, phi, steps)
        q_th = float(theory.mean_field_variance(scale, ens, phi, sigma_x=sigma_x))
        radius_th = float(theory.spectral_radius(scale, ens, q_th, phi))
        finite = np.all(np.isfinite(h))
        radius_emp = jacobian_radius(w, h[:, 0], phi, ens) if finite else np.inf
        rows.append(_row(base, "fig2", "q", q_emp, q_th))
        rows.append(_row(base, "fig3", "spectral_radius", radius_emp, radius_th))
        rows.append(_row(base, "fig4", f"residual_after_{steps}", residual, critical[ens]))
    return rows
