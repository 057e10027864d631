"""Reproduces Figs. 1-4 of the init paper (DEQs are sensitive to initialization statistics).

For each ensemble (Gaussian, Haar orthogonal, GOE) and a range of scales, Monte-Carlo points at
width n (``dq.theory.sample_matrix``, ``linear_trace``, ``forward_iteration``,
``jacobian_radius``) are drawn over the theory curves of :mod:`deqjax.theory`:

1. ``fig1_linear_trace.png``: ``(1/n) tr((I - W)^{-1} (I - W)^{-T})`` (the linear DEQ's
   ``(1/n) E||z*||^2``) vs ``linear_second_moment``.
2. ``fig2_mean_field_q.png``: empirical ``q = mean h_i^2`` of ``h = W phi(h) + x`` (forward
   iteration, averaged over the last third of the steps) vs ``mean_field_variance``.
3. ``fig3_spectral_radius.png``: ``max |eig(diag(phi'(h)) W)|`` at the final iterate vs Theorem 3.2
   (``spectral_radius`` at the predicted q).
4. ``fig4_residual.png``: relative residual after ``--steps`` forward iterations vs scale, with the
   predicted ``critical_scale`` of each ensemble marked.

Outputs in ``--out_dir`` (default ``runs/init_theory``): the four PNGs, ``results.csv`` (one row
per figure/ensemble/scale/seed: empirical and theory values), ``config.json``, ``summary.json``,
``results.json`` and a ``README.md`` stating what was seen for the GOE vs the prediction.

Usage:
  python experiments/init_theory.py                 # n = 500, a few minutes on 2 CPU cores
  python experiments/init_theory.py --smoke         # n = 32, a plumbing check
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from typing import Annotated, Literal

import jax
import numpy as np

from deqjax import harness, theory

COLORS = {"gaussian": "tab:blue", "orthogonal": "tab:green", "goe": "tab:red"}
FIGURES = dict(fig1="fig1_linear_trace.png", fig2="fig2_mean_field_q.png")
FIGURES |= dict(fig3="fig3_spectral_radius.png", fig4="fig4_residual.png")
SMOKE = {"n": 32, "steps": 30, "batch": 2, "num_seeds": 1, "num_scales": 3, "num_linear_scales": 3}


@dataclasses.dataclass(frozen=True)
class Config:
    """The Monte-Carlo points."""

    n: Annotated[int, harness.at_least(2)] = 500  # matrix width (>= 2)
    phi: Literal[theory.PHI_NAMES] = "tanh"  # activation
    steps: harness.PositiveInt = 200  # forward iterations (Figs 2-4)
    batch: harness.PositiveInt = 8  # inputs x per matrix
    sigma_x: harness.PositiveFloat = 1.0  # std of the inputs x
    num_seeds: harness.PositiveInt = 2  # matrices per point
    num_scales: harness.PositiveInt = 13  # scales for Figs. 2-4
    num_linear_scales: harness.PositiveInt = 19  # scales for Fig. 1
    max_scale: harness.PositiveFloat = 2.5  # largest scale sigma
    run: harness.RunConfig = harness.RunConfig()


def setup(c: Config):
    jax.config.update("jax_enable_x64", True)
    scales = [round(float(s), 4) for s in np.linspace(0.1, c.max_scale, c.num_scales)]
    linear = [round(float(s), 4) for s in np.linspace(0.05, 0.95, c.num_linear_scales)]
    return None, {"scales": scales, "linear_scales": linear}


def by_scale(rows, figure, ensemble):
    """``(scales, [empirical values per scale], theory per scale)`` of one figure and ensemble."""
    sel = [r for r in rows if r["figure"] == figure and r["ensemble"] == ensemble]
    scales = sorted({r["scale"] for r in sel})
    emp = [np.array([r["empirical"] for r in sel if r["scale"] == s]) for s in scales]
    theory_values = [next(r["theory"] for r in sel if r["scale"] == s) for s in scales]
    return np.array(scales), emp, np.array(theory_values)


def theory_curve(fig: str, ens: str, scales: np.ndarray, c: Config) -> np.ndarray:
    """Theory at each scale (a loop of the already-compiled scalar functions: no new compiles)."""
    if fig == "fig1":
        return np.array([float(theory.linear_second_moment(v, ens)) for v in scales])
    qs = [theory.mean_field_variance(v, ens, c.phi, sigma_x=c.sigma_x) for v in scales]
    if fig == "fig2":
        return np.array([float(q) for q in qs])
    return np.array([float(theory.spectral_radius(v, ens, q, c.phi)) for v, q in zip(scales, qs)])


def plot(rows: list[dict], c: Config, ctx) -> dict[str, str]:
    """Writes the four figures; returns ``{figure: path}``."""
    titles = {
        "fig1": ("linear DEQ: (1/n) tr((I-W)^-1 (I-W)^-T)", "(1/n) E||z*||^2", "log"),
        "fig2": (f"{c.phi} DEQ: variance q of the fixed point", "q", "linear"),
        "fig3": ("spectral radius of diag(phi'(h)) W  (Thm 3.2)", "max |eig|", "linear"),
        "fig4": (f"relative residual after {c.steps} forward steps", "residual", "log"),
    }
    paths = {}
    for fig, (title, ylabel, yscale) in titles.items():
        f, ax = harness.pyplot().subplots(figsize=(6, 4.2))
        for ens in theory.ENSEMBLES:
            scales, emp, th = by_scale(rows, fig, ens)
            means, spread = [np.mean(e) for e in emp], [np.std(e) for e in emp]
            color, label = COLORS[ens], f"{ens} (n={c.n})"
            ax.errorbar(scales, means, yerr=spread, fmt="o", ms=4, color=color, label=label)
            if fig == "fig4" and np.isfinite(th[0]):
                ax.axvline(th[0], color=color, ls="--", lw=1, label=f"{ens} predicted critical")
            elif fig != "fig4":
                dense = np.linspace(scales.min(), scales.max(), 15 if c.run.smoke else 60)
                curve = theory_curve(fig, ens, dense, c)
                ax.plot(dense, np.where(np.isfinite(curve), curve, np.nan), color=color, lw=1.5)
        if fig == "fig3":
            ax.axhline(1.0, color="k", lw=0.8, ls=":")
        ax.set(yscale=yscale, xlabel="scale  (E[(1/n) tr W W^T] = scale^2)", ylabel=ylabel)
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7)
        f.tight_layout()
        paths[fig] = harness.save_figure(f, ctx.path(FIGURES[fig]))
    return paths


def _ratios(rows, figure, ensemble, keep) -> list[float]:
    sel = [r for r in rows if r["figure"] == figure and r["ensemble"] == ensemble and keep(r)]
    return [r["empirical"] / r["theory"] for r in sel]


def summarize(rows: list[dict]) -> dict:
    """Per ensemble: median empirical/theory ratios of q (Fig. 2) below the predicted critical
    scale, and the empirical transition scale of Fig. 4 (first scale with residual > 1e-3)."""
    out = {}
    for ens in theory.ENSEMBLES:
        scales, res, th = by_scale(rows, "fig4", ens)
        crit = float(th[0]) if len(th) else math.inf  # the predicted critical scale
        below = _ratios(rows, "fig2", ens, lambda r, c=crit: r["scale"] < c)
        every = _ratios(rows, "fig2", ens, lambda r: math.isfinite(r["theory"]))
        lin = _ratios(rows, "fig1", ens, lambda r: math.isfinite(r["theory"]))
        above = [s for s, e in zip(scales, res) if np.mean(e) > 1e-3]
        out[ens] = {
            "predicted_critical_scale": crit,
            "empirical_transition_scale": float(above[0]) if above else math.inf,
            "median_q_ratio_below_critical": float(np.median(below)) if below else math.nan,
            "max_q_ratio": float(np.max(every)) if every else math.nan,
            "median_linear_trace_ratio": float(np.median(lin)) if lin else math.nan,
        }
    return out


def write_readme(summary: dict, config: dict, ctx) -> None:
    table = harness.markdown_table([{"ensemble": e, **s} for e, s in summary.items()])
    goe = summary["goe"]["median_q_ratio_below_critical"]
    verdict = "not above the prediction"
    if goe > 1.02:
        verdict = "ABOVE the mean-field prediction (as the paper reports)"
    text = (
        f"# init_theory: Figs. 1-4 of the init paper\n\nCommand config: "
        f"`{json.dumps(harness.to_python(config))}`\n\n{table}\n\nGOE: the empirical variance"
        f" q is {verdict}: median ratio {goe:.3f} below the predicted critical scale, up to "
        f"{summary['goe']['max_q_ratio']:.2f}x over the scanned scales.\n"
    )
    ctx.write_text("README.md", text)


def run(c: Config, _, ctx) -> dict:
    start = time.time()
    rows = theory.monte_carlo_rows(
        n=c.n,
        phi=c.phi,
        steps=c.steps,
        batch=c.batch,
        sigma_x=c.sigma_x,
        scales=ctx.config["scales"],
        linear_scales=ctx.config["linear_scales"],
        num_seeds=c.num_seeds,
        seed=c.run.seed,
        progress=c.run.progress,
    )
    harness.write_csv(ctx.path("results.csv"), rows)
    paths = plot(rows, c, ctx)
    summary = summarize(rows)
    write_readme(summary, ctx.config, ctx)
    summary["seconds"] = time.time() - start
    ctx.write_json("summary.json", summary)
    print(json.dumps(harness.to_python(summary), indent=1))
    return {"rows": rows, "figures": paths, "summary": summary}


EXPERIMENT = harness.Experiment(
    name="init_theory",
    doc=__doc__,
    config=Config(),
    setup=setup,
    run=run,
    smoke=SMOKE,
    outputs=(*FIGURES.values(), "results.csv", "summary.json", "README.md"),
)


def main(argv=None) -> dict:
    return harness.run(EXPERIMENT, argv)


if __name__ == "__main__":
    main()
