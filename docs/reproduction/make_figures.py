"""Figures of REPRODUCTION.md from the JSON results kept in ``docs/reproduction/data/``.

Usage: python docs/reproduction/make_figures.py   (writes docs/reproduction/*.png; a claim whose
data file is missing is skipped)
"""

from __future__ import annotations

import glob
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")
COLORS = {"gaussian": "C3", "orthogonal": "C0", "goe": "C2"}


def _load(name):
    path = os.path.join(DATA, name)
    return json.load(open(path)) if os.path.exists(path) else None


def claim5_lm() -> None:
    runs = sorted(glob.glob(os.path.join(DATA, "lm_p*.json")))  # lm_pre_*, lm_post_*
    if not runs:
        return
    fig, axes = plt.subplots(1, 4, figsize=(17, 3.6))
    keys = [("nll", "train NLL"), ("nfe", "forward NFE"), ("rel_residual", "fwd rel. residual")]
    keys.append(("z_rms", "RMS of z*"))
    for path in runs:
        label = os.path.basename(path)[3:-5]
        hist = json.load(open(path))["history"]
        color = "C1" if label.startswith("post") else ("C2" if "g0_" not in label else "C3")
        for ax, (k, title) in zip(axes, keys):
            v = np.asarray(hist[k], float)
            if k == "nll":  # 10-step running mean
                v = np.convolve(v, np.ones(10) / 10, mode="valid")
            ax.plot(v, color=color, lw=1, label=label)
            ax.set_title(title)
            ax.set_xlabel("step")
    for ax in axes[2:]:
        ax.set_yscale("log")
    axes[0].legend(fontsize=7)
    fig.suptitle("Claim 5: DEQ-Transformer LM (KJV stand-in), pre-LN (fixed cell) with/without JR")
    fig.tight_layout()
    fig.savefig(os.path.join(HERE, "claim5_preln_lm.png"), dpi=100)


def claim3_1d() -> None:
    res = _load("repro_1d.json")
    if res is None:
        return
    names = list(res)
    fig, axes = plt.subplots(1, 5, figsize=(22, 3.8))
    for j, (key, title) in enumerate(
        [
            ("val_mse", "val MSE (budget 6)"),
            ("nfe_fpi", "fixed-point NFE to 1e-3"),
            ("mean_abs_slope", "mean |∂f/∂z| at z*"),
        ]
    ):
        ax = axes[j]
        for i, name in enumerate(names):
            for g, dx, c in ((0.0, -0.15, "C3"), (1.0, 0.15, "C0")):
                v = [r[key] for r in res[name]["rows"] if r["gamma"] == g]
                ax.scatter(
                    np.full(len(v), i + dx), v, s=12, color=c, label=f"γ={g:g}" if i == 0 else None
                )
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=20, fontsize=8)
        ax.set_yscale("log")
        ax.set_title(title)
    axes[0].legend()
    for ax, key, title in ((axes[3], "mse", "train MSE"), (axes[4], "slope", "mean |∂f/∂z|")):
        for r in res[names[0]]["rows"]:
            if r["gamma"] == 0.0:
                ok = r["val_mse"] < 0.02
                ax.plot(r["history"][key], lw=1, color="C2" if ok else "C3", alpha=0.8)
        ax.set_yscale("log")
        ax.set_title(f"γ=0, {names[0]}: {title} (green: fits, red: fails)")
        ax.set_xlabel("training progress (% of steps)")
    axes[4].axhline(1.0, color="k", lw=0.6)
    fig.suptitle("Claim 3: JR §5.1 1D fit, every seed (red γ=0, blue γ=1)")
    fig.tight_layout()
    fig.savefig(os.path.join(HERE, "claim3_1d.png"), dpi=100)


def claim1_sweep() -> None:
    files = sorted(glob.glob(os.path.join(DATA, "init_sweep_*.json")))
    if not files:
        return
    fig, axes = plt.subplots(len(files), 3, figsize=(16, 3.8 * len(files)), squeeze=False)
    for row, path in zip(axes, files):
        res = json.load(open(path))
        rows, width, act = res["rows"], res["args"]["width"], res["args"].get("act", "relu")
        for fam in dict.fromkeys(r["family"] for r in rows):
            sc = sorted({r["scale"] for r in rows if r["family"] == fam})
            errs = [
                [r["test_err"] for r in rows if r["family"] == fam and r["scale"] == s] for s in sc
            ]
            med = [np.median(e) for e in errs]
            row[0].plot(sc, med, "-o", color=COLORS[fam], label=f"{fam} median", ms=3)
            row[0].plot(
                sc, [np.mean(e) for e in errs], "--", color=COLORS[fam], label=f"{fam} mean"
            )
            row[0].fill_between(
                sc,
                [np.percentile(e, 25) for e in errs],
                [np.percentile(e, 75) for e in errs],
                color=COLORS[fam],
                alpha=0.15,
            )
            x = [r["rho_J_init"] for r in rows if r["family"] == fam]
            y = [r["test_err"] for r in rows if r["family"] == fam]
            row[1].scatter(x, y, s=8, color=COLORS[fam], label=fam)
            nfe = [
                np.median([r["test_nfe"] for r in rows if r["family"] == fam and r["scale"] == s])
                for s in sc
            ]
            row[2].plot(sc, nfe, "-o", color=COLORS[fam], ms=3, label=fam)
        row[0].set_xlabel("init scale σ")
        row[0].set_ylabel("test error")
        row[0].set_title(f"{act}, width {width}: test error (median, dashed mean, IQR)")
        row[0].legend(fontsize=7)
        row[1].axvline(1.0, color="k", lw=0.5)
        row[1].set_xlabel("ρ(J) at init (mean over 32 test inputs)")
        row[1].set_ylabel("final test error")
        row[1].set_title("each run: ρ(J) at init vs final error")
        row[2].set_xlabel("init scale σ")
        row[2].set_title("median final test NFE (cap = max_steps)")
    fig.suptitle("Claim 1: init paper Fig. 5 at CPU size (Fashion-MNIST subset, un-normalised DEQ)")
    fig.tight_layout()
    fig.savefig(os.path.join(HERE, "claim1_fig5.png"), dpi=100)


def claim2_lm_init() -> None:
    files = sorted(glob.glob(os.path.join(DATA, "lm_init_*.json")))  # one per scale
    if not files:
        return
    res = [json.load(open(path)) for path in files]
    runs = [r for x in res for r in x["runs"]]
    thr, every = res[0]["threshold"], res[0]["curve_every"]
    scales = sorted({r["scale"] for r in runs})
    fig, axes = plt.subplots(len(scales), 4, figsize=(20, 3.8 * len(scales)), squeeze=False)
    for row, scale in zip(axes, scales):
        for fam, c in COLORS.items():
            rs = [r for r in runs if r["scale"] == scale and r["family"] == fam]
            if not rs:
                continue
            for i, r in enumerate(rs):
                x = np.arange(1, len(r["train_nll"]) + 1) * every
                kw = dict(color=c, lw=0.7, alpha=0.7, label=fam if i == 0 else None)
                row[0].plot(x, r["train_nll"], **kw)
                row[1].plot(x, r["rel_residual"], **kw)
            losses = np.sort([r["valid_loss"] for r in rs])
            grid = np.linspace(4.6, 5.6, 200)
            row[2].plot(grid, [np.mean(losses < g) for g in grid], color=c, label=fam)
            row[3].scatter([fam] * len(rs), [r["valid_loss"] for r in rs], color=c, s=14)
            row[3].plot([fam], [np.median(losses)], "k_", ms=18)
        row[0].set_title(f"σ = {scale:g}: train NLL (nats/token)")
        row[0].set_ylim(4.3, 6.5)
        row[1].set_title("train forward rel. residual (cap 12 Anderson steps)")
        row[1].set_yscale("log")
        row[2].axvline(thr, color="k", ls=":", lw=0.8)
        row[2].set_title("fraction of seeds with final valid loss < threshold")
        row[2].set_xlabel("threshold (nats/token)")
        row[3].axhline(thr, color="k", ls=":", lw=0.8)
        row[3].set_title("final valid loss per seed (bar: median)")
        for ax in row[:2]:
            ax.set_xlabel("step")
        row[0].legend(fontsize=8)
    fig.suptitle("Claim 2: init paper §4.3, DEQ-Transformer LM (KJV stand-in), FFN init families")
    fig.tight_layout()
    fig.savefig(os.path.join(HERE, "claim2_lm_init.png"), dpi=100)


def claim4_fm() -> None:
    files = sorted(glob.glob(os.path.join(DATA, "fm_*.jsonl")))
    if not files:
        return
    fig, axes = plt.subplots(1, 5, figsize=(24, 3.8))
    for path in files:
        label = os.path.basename(path)[3:-6]
        recs = [json.loads(line) for line in open(path)]
        split = {
            s: [r for r in recs if r.get("split") == s] for s in ("train", "eval", "diagnostics")
        }
        c = "C3" if label.startswith("nojr") else "C0"
        panels = (
            ("train", "nfe"),
            ("train", "rel_residual"),
            ("eval", "nfe"),
            ("eval", "accuracy"),
            ("diagnostics", "jac_frobenius"),
        )
        for ax, (s, key) in zip(axes, panels):
            rs = split[s]
            style = "-o" if s == "eval" else "-"
            kw = dict(color=c, lw=0.8, ms=3, label=label if ax is axes[0] else None)
            ax.plot([r["step"] for r in rs], [r[key] for r in rs], style, **kw)
    titles = (
        "train forward NFE (cap 20)",
        "train forward rel. residual",
        "test NFE (each epoch)",
        "test accuracy",
        "‖J_f(z*)‖_F (Hutchinson, one batch)",
    )
    for ax, t in zip(axes, titles):
        ax.set_title(t)
        ax.set_xlabel("step")
    axes[1].set_yscale("log")
    axes[0].legend(fontsize=7)
    fig.suptitle("Claim 4: Fashion-MNIST main job, 20 epochs: no JR (red) vs JR γ=1 (blue)")
    fig.tight_layout()
    fig.savefig(os.path.join(HERE, "claim4_fmnist_jr.png"), dpi=100)


if __name__ == "__main__":
    for fn in (claim5_lm, claim3_1d, claim1_sweep, claim2_lm_init, claim4_fm):
        fn()
