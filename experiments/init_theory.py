"""Reproduces Figs. 1-4 of the init paper (DEQs are sensitive to initialization statistics).

For each ensemble (Gaussian, Haar orthogonal, GOE) and a range of scales, Monte-Carlo points at
width n are drawn over the theory curves of :mod:`deqjax.theory`:

1. ``fig1_linear_trace.png``: ``(1/n) tr((I - W)^{-1} (I - W)^{-T})`` (the linear DEQ's
   ``(1/n) E||z*||^2``) vs ``linear_second_moment``.
2. ``fig2_mean_field_q.png``: empirical ``q = mean h_i^2`` of ``h = W phi(h) + x`` (forward
   iteration, averaged over the last third of the steps) vs ``mean_field_variance``.
3. ``fig3_spectral_radius.png``: ``max |eig(diag(phi'(h)) W)|`` at the final iterate vs Theorem 3.2
   (``spectral_radius`` at the predicted q).
4. ``fig4_residual.png``: relative residual after ``--steps`` forward iterations vs scale, with the
   predicted ``critical_scale`` of each ensemble marked.

Outputs in ``--out_dir`` (default ``runs/init_theory``): the four PNGs, ``results.csv`` (one row per
figure/ensemble/scale/seed: empirical and theory values), ``config.json``, ``summary.json`` and a
``README.md`` stating what was seen for the GOE vs the prediction.

Usage:
  python experiments/init_theory.py                 # n = 500, a few minutes on 2 CPU cores
  python experiments/init_theory.py --smoke         # n = 32, a plumbing check
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import math
import os
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from deqjax import theory
from deqjax._src import random_matrices

ENSEMBLES = ("gaussian", "orthogonal", "goe")
SAMPLERS = {
    "gaussian": random_matrices.gaussian,
    "orthogonal": random_matrices.haar_orthogonal,
    "goe": random_matrices.goe,
}
COLORS = {"gaussian": "tab:blue", "orthogonal": "tab:green", "goe": "tab:red"}
FIGURES = {
    "fig1": "fig1_linear_trace.png",
    "fig2": "fig2_mean_field_q.png",
    "fig3": "fig3_spectral_radius.png",
    "fig4": "fig4_residual.png",
}


def sample_matrix(ensemble: str, n: int, scale: float, key: jax.Array) -> np.ndarray:
    """An ``n x n`` float64 draw of ``ensemble`` at ``scale`` (numpy)."""
    return np.asarray(SAMPLERS[ensemble](key, (n, n), scale=scale, dtype=jnp.float64))


def linear_trace(w: np.ndarray) -> float:
    """``(1/n) tr((I - W)^{-1} (I - W)^{-T})``: the linear DEQ's ``(1/n) E_x ||z*||^2``."""
    n = w.shape[0]
    resolvent = np.linalg.inv(np.eye(n) - w)
    return float(np.sum(resolvent * resolvent) / n)


def forward_iteration(w, x, phi: str, steps: int):
    """Runs ``h <- W phi(h) + x`` from ``h = 0`` for ``steps`` steps, for each column of ``x``.

    Returns:
      ``(q, residual, h)``: mean of ``h**2`` over the last third of the steps, the relative residual
      ``||h_T+1 - h_T|| / ||h_T||`` per column (mean over columns), and the last iterate ``[n, B]``.
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
    """``max |eig(diag(phi'(h)) W)|`` (symmetric ``D^{1/2} W D^{1/2}`` form for the GOE)."""
    _, dphi = theory.activation(phi)
    d = np.asarray(dphi(jnp.asarray(h)))
    if ensemble == "goe" and np.all(d >= 0):
        root = np.sqrt(d)
        return float(np.abs(np.linalg.eigvalsh(root[:, None] * w * root[None, :])).max())
    return float(np.abs(np.linalg.eigvals(d[:, None] * w)).max())


def run_experiment(config: dict) -> list[dict]:
    """Computes every Monte-Carlo point and its prediction; returns CSV rows."""
    from tqdm import tqdm

    rows = []
    critical = {
        ens: float(theory.critical_scale(ens, config["phi"], sigma_x=config["sigma_x"]))
        for ens in ENSEMBLES
    }
    n, phi, steps, batch = config["n"], config["phi"], config["steps"], config["batch"]
    key = jax.random.key(config["seed"])
    jobs = [
        (fig, ens, float(s), seed)
        for ens in ENSEMBLES
        for fig, scales in (("fig1", config["linear_scales"]), ("fig234", config["scales"]))
        for s in scales
        for seed in range(config["num_seeds"])
    ]
    for fig, ens, scale, seed in tqdm(jobs, desc="init_theory", disable=config["quiet"]):
        k = jax.random.fold_in(jax.random.fold_in(key, seed), int(round(scale * 1e4)))
        k_w, k_x = jax.random.split(jax.random.fold_in(k, ENSEMBLES.index(ens)))
        w = sample_matrix(ens, n, scale, k_w)
        base = {"ensemble": ens, "scale": scale, "seed": seed, "n": n}
        if fig == "fig1":
            rows.append(
                {
                    **base,
                    "figure": "fig1",
                    "quantity": "linear_trace",
                    "empirical": linear_trace(w),
                    "theory": float(theory.linear_second_moment(scale, ens)),
                }
            )
            continue
        x = np.asarray(jax.random.normal(k_x, (n, batch), jnp.float64)) * config["sigma_x"]
        q_emp, residual, h = forward_iteration(w, x, phi, steps)
        q_th = float(theory.mean_field_variance(scale, ens, phi, sigma_x=config["sigma_x"]))
        radius_th = float(theory.spectral_radius(scale, ens, q_th, phi))
        radius_emp = jacobian_radius(w, h[:, 0], phi, ens) if np.all(np.isfinite(h)) else np.inf
        rows += [
            {**base, "figure": "fig2", "quantity": "q", "empirical": q_emp, "theory": q_th},
            {
                **base,
                "figure": "fig3",
                "quantity": "spectral_radius",
                "empirical": radius_emp,
                "theory": radius_th,
            },
            {
                **base,
                "figure": "fig4",
                "quantity": f"residual_after_{steps}",
                "empirical": residual,
                "theory": critical[ens],
            },
        ]
    return rows


def _mean_by_scale(rows, figure, ensemble):
    sel = [r for r in rows if r["figure"] == figure and r["ensemble"] == ensemble]
    scales = sorted({r["scale"] for r in sel})
    emp = [np.array([r["empirical"] for r in sel if r["scale"] == s]) for s in scales]
    th = [next(r["theory"] for r in sel if r["scale"] == s) for s in scales]
    return np.array(scales), emp, np.array(th)


def plot(rows: list[dict], config: dict, out_dir: str) -> dict[str, str]:
    """Writes the four figures; returns ``{figure: path}``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    titles = {
        "fig1": ("linear DEQ: (1/n) tr((I-W)^-1 (I-W)^-T)", "(1/n) E||z*||^2", "log"),
        "fig2": (f"{config['phi']} DEQ: variance q of the fixed point", "q", "linear"),
        "fig3": ("spectral radius of diag(phi'(h)) W  (Thm 3.2)", "max |eig|", "linear"),
        "fig4": (f"relative residual after {config['steps']} forward steps", "residual", "log"),
    }
    paths = {}
    for fig, (title, ylabel, yscale) in titles.items():
        f, ax = plt.subplots(figsize=(6, 4.2))
        for ens in ENSEMBLES:
            scales, emp, th = _mean_by_scale(rows, fig, ens)
            if scales.size == 0:
                continue
            means = np.array([np.mean(e) for e in emp])
            spread = np.array([np.std(e) for e in emp])
            c = COLORS[ens]
            ax.errorbar(
                scales, means, yerr=spread, fmt="o", ms=4, color=c, label=f"{ens} (n={config['n']})"
            )
            if fig == "fig4":
                if np.isfinite(th[0]):
                    ax.axvline(th[0], color=c, ls="--", lw=1, label=f"{ens} predicted critical")
            else:
                dense = np.linspace(scales.min(), scales.max(), 15 if config["smoke"] else 60)
                curve = _theory_curve(fig, ens, dense, config)
                ax.plot(dense, np.where(np.isfinite(curve), curve, np.nan), color=c, lw=1.5)
        if fig == "fig3":
            ax.axhline(1.0, color="k", lw=0.8, ls=":")
        ax.set_yscale(yscale)
        ax.set_xlabel("scale  (E[(1/n) tr W W^T] = scale^2)")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7)
        f.tight_layout()
        path = os.path.join(out_dir, FIGURES[fig])
        f.savefig(path, dpi=110)
        plt.close(f)
        paths[fig] = path
    return paths


def _theory_curve(fig: str, ensemble: str, scales: np.ndarray, config: dict) -> np.ndarray:
    """Theory at each scale (a loop of the already-compiled scalar functions: no new compiles)."""
    phi, sigma_x = config["phi"], config["sigma_x"]
    out = []
    for v in scales:
        if fig == "fig1":
            out.append(float(theory.linear_second_moment(v, ensemble)))
            continue
        q = theory.mean_field_variance(v, ensemble, phi, sigma_x=sigma_x)
        out.append(
            float(q) if fig == "fig2" else float(theory.spectral_radius(v, ensemble, q, phi))
        )
    return np.array(out)


def summarize(rows: list[dict], config: dict) -> dict:
    """Per ensemble: median empirical/theory ratios of q (Fig. 2) below the predicted critical
    scale, and the empirical transition scale of Fig. 4 (first scale with residual > 1e-3)."""
    out = {}
    for ens in ENSEMBLES:
        crit = next(
            (r["theory"] for r in rows if r["figure"] == "fig4" and r["ensemble"] == ens), math.inf
        )
        ratios = [
            r["empirical"] / r["theory"]
            for r in rows
            if r["figure"] == "fig2" and r["ensemble"] == ens and r["scale"] < crit
        ]
        ratios_all = [
            r["empirical"] / r["theory"]
            for r in rows
            if r["figure"] == "fig2" and r["ensemble"] == ens and math.isfinite(r["theory"])
        ]
        lin = [
            r["empirical"] / r["theory"]
            for r in rows
            if r["figure"] == "fig1" and r["ensemble"] == ens and math.isfinite(r["theory"])
        ]
        scales, res, _ = _mean_by_scale(rows, "fig4", ens)
        above = [s for s, e in zip(scales, res) if np.mean(e) > 1e-3]
        out[ens] = {
            "predicted_critical_scale": crit,
            "empirical_transition_scale": float(above[0]) if above else math.inf,
            "median_q_ratio_below_critical": float(np.median(ratios)) if ratios else math.nan,
            "max_q_ratio": float(np.max(ratios_all)) if ratios_all else math.nan,
            "median_linear_trace_ratio": float(np.median(lin)) if lin else math.nan,
        }
    return out


def write_readme(summary: dict, config: dict, out_dir: str) -> None:
    lines = [
        "# init_theory: Figs. 1-4 of the init paper",
        "",
        f"Command config: `{json.dumps(config)}`",
        "",
        "| ensemble | median q_emp/q_theory (scale < critical) | max q_emp/q_theory (all scales)"
        " | median linear trace emp/theory | predicted critical scale"
        " | first scale with residual > 1e-3 |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for ens, s in summary.items():
        lines.append(
            f"| {ens} | {s['median_q_ratio_below_critical']:.3f} | {s['max_q_ratio']:.3f} | "
            f"{s['median_linear_trace_ratio']:.3f} | {s['predicted_critical_scale']:.3f} | "
            f"{s['empirical_transition_scale']:.3f} |"
        )
    goe = summary["goe"]["median_q_ratio_below_critical"]
    verdict = (
        "ABOVE the mean-field prediction (as the paper reports)"
        if goe > 1.02
        else "not above the prediction"
    )
    lines += [
        "",
        f"GOE: the empirical variance q is {verdict}: median ratio {goe:.3f} below the predicted"
        f" critical scale, up to {summary['goe']['max_q_ratio']:.2f}x over the scanned scales.",
        "",
    ]
    with open(os.path.join(out_dir, "README.md"), "w") as f:
        f.write("\n".join(lines))


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=500, help="matrix width")
    parser.add_argument(
        "--phi", default="tanh", choices=theory.PHI_NAMES, help="activation of the DEQ layer"
    )
    parser.add_argument("--steps", type=int, default=200, help="forward iterations (Figs. 2-4)")
    parser.add_argument("--batch", type=int, default=8, help="inputs x per matrix")
    parser.add_argument("--sigma_x", type=float, default=1.0, help="std of the inputs x")
    parser.add_argument("--num_seeds", type=int, default=2, help="matrices per point")
    parser.add_argument("--num_scales", type=int, default=13, help="scales for Figs. 2-4")
    parser.add_argument("--max_scale", type=float, default=2.5, help="largest scale sigma")
    parser.add_argument("--seed", type=int, default=0, help="first seed")
    parser.add_argument(
        "--out_dir",
        default=os.path.join("runs", "init_theory"),
        help="output folder (--smoke: ..._smoke)",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny n and few scales (under 4 minutes on 2 CPU cores); into runs/init_theory_smoke",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    if parser.parse_known_args(argv)[0].smoke:  # a smoke run never overwrites the full run
        parser.set_defaults(out_dir=os.path.join("runs", "init_theory_smoke"))
    args = parser.parse_args(argv)
    if args.n < 2:
        parser.error("--n must be >= 2")
    jax.config.update("jax_enable_x64", True)

    config = vars(args).copy()
    if args.smoke:
        config.update(n=32, steps=30, batch=2, num_seeds=1, num_scales=3)
    config["scales"] = [
        round(float(s), 4) for s in np.linspace(0.1, config["max_scale"], config["num_scales"])
    ]
    num_linear = 3 if args.smoke else 19
    config["linear_scales"] = [round(float(s), 4) for s in np.linspace(0.05, 0.95, num_linear)]
    os.makedirs(config["out_dir"], exist_ok=True)
    print(json.dumps(config, indent=1))
    with open(os.path.join(config["out_dir"], "config.json"), "w") as f:
        json.dump(config, f, indent=1)

    start = time.time()
    rows = run_experiment(config)
    fields = ["figure", "quantity", "ensemble", "scale", "seed", "n", "empirical", "theory"]
    with open(os.path.join(config["out_dir"], "results.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    paths = plot(rows, config, config["out_dir"])
    summary = summarize(rows, config)
    summary["seconds"] = time.time() - start
    with open(os.path.join(config["out_dir"], "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    write_readme({k: v for k, v in summary.items() if k in ENSEMBLES}, config, config["out_dir"])
    print(json.dumps(summary, indent=1))
    return {"rows": rows, "figures": paths, "summary": summary, "config": config}


if __name__ == "__main__":
    main()
