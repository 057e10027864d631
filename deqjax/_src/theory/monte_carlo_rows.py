"""Every Monte-Carlo point of the init paper's Figs. 1-4, each with its prediction."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from deqjax._src.theory import monte_carlo
from deqjax._src.theory.critical_scale import critical_scale
from deqjax._src.theory.ensembles import ENSEMBLES
from deqjax._src.theory.linear_second_moment import linear_second_moment
from deqjax._src.theory.mean_field_variance import mean_field_variance
from deqjax._src.theory.spectral_radius import spectral_radius


def _row(base: dict, figure: str, quantity: str, empirical: float, predicted: float) -> dict:
    return {
        "figure": figure,
        "quantity": quantity,
        **base,
        "empirical": empirical,
        "theory": predicted,
    }


def _keys(key: jax.Array, seed: int, scale: float, ensemble: str) -> tuple[jax.Array, jax.Array]:
    """The (matrix, input) keys of one point: the seed, the scale and the ensemble folded in."""
    k = jax.random.fold_in(jax.random.fold_in(key, seed), int(round(scale * 1e4)))
    k_w, k_x = jax.random.split(jax.random.fold_in(k, ENSEMBLES.index(ensemble)))
    return k_w, k_x


def _nonlinear_rows(base, w, k_x, *, n, phi, steps, batch, sigma_x, critical) -> list[dict]:
    """The Fig. 2 (``q``), Fig. 3 (Jacobian radius) and Fig. 4 (residual) rows of one matrix."""
    scale, ens = base["scale"], base["ensemble"]
    x = np.asarray(jax.random.normal(k_x, (n, batch), jnp.float64)) * sigma_x
    q_emp, residual, h = monte_carlo.forward_iteration(w, x, phi, steps=steps)
    q_th = float(mean_field_variance(scale, ens, phi, sigma_x=sigma_x))
    radius_th = float(spectral_radius(scale, ens, q_th, phi))
    finite = np.all(np.isfinite(h))
    radius_emp = monte_carlo.jacobian_radius(w, ens, h[:, 0], phi) if finite else np.inf
    return [
        _row(base, "fig2", "q", q_emp, q_th),
        _row(base, "fig3", "jacobian_radius", radius_emp, radius_th),
        _row(base, "fig4", f"residual_after_{steps}", residual, critical),
    ]


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

    For each ensemble, seed and scale of ``linear_scales`` one ``fig1`` row (``linear_trace``
    against ``linear_second_moment``). For each scale of ``scales`` a ``fig2`` row (``q`` against
    ``mean_field_variance``), a ``fig3`` row (``jacobian_radius`` at the last iterate of the first
    input, against Theorem 3.2's ``spectral_radius`` at the predicted ``q``) and a ``fig4`` row
    (relative residual after ``steps`` iterations; its "theory" is the predicted
    ``critical_scale``), from ``batch`` inputs ``x ~ N(0, sigma_x²)``. Keys fold in the seed, the
    scale and the ensemble, so a point does not depend on the others. ``progress`` shows a tqdm bar
    (tqdm is imported only then).

    Returns:
      Rows ``{"figure", "quantity", "ensemble", "scale", "seed", "n", "empirical", "theory"}``;
      ``quantity`` names the measurement: ``"linear_trace"``, ``"q"``, ``"jacobian_radius"``,
      ``"residual_after_<steps>"``.
    """
    critical = {e: float(critical_scale(e, phi, sigma_x=sigma_x)) for e in ENSEMBLES}
    key = jax.random.key(seed)
    jobs = [
        (fig, ens, float(s), k)
        for ens in ENSEMBLES
        for fig, points in (("fig1", linear_scales), ("fig234", scales))
        for s in points
        for k in range(num_seeds)
    ]
    if progress:
        from tqdm import tqdm

        jobs = tqdm(jobs, desc="init_theory")
    rows = []
    for fig, ens, scale, s in jobs:
        k_w, k_x = _keys(key, s, scale, ens)
        w = monte_carlo.sample_matrix(k_w, n, scale, ens)
        base = {"ensemble": ens, "scale": scale, "seed": s, "n": n}
        if fig == "fig1":
            predicted = float(linear_second_moment(scale, ens))
            rows.append(_row(base, "fig1", "linear_trace", monte_carlo.linear_trace(w), predicted))
        else:
            rows += _nonlinear_rows(
                base,
                w,
                k_x,
                n=n,
                phi=phi,
                steps=steps,
                batch=batch,
                sigma_x=sigma_x,
                critical=critical[ens],
            )
    return rows
