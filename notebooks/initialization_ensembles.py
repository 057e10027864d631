# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # DEQs are sensitive to the initialization ensemble
#
# A companion to the init paper (*Deep equilibrium networks are sensitive to initialization
# statistics*) using `deqjax.initializers` and `deqjax.theory`:
#
# 1. the spectra of the three ensembles at the same scale,
# 2. the paper's Figs. 1–4 (theory over Monte-Carlo points, from `experiments/init_theory.py`),
# 3. a small DEQ trained on scikit-learn digits from each ensemble at a few scales: forward solver
#    cost (NFE) and loss.
#
# Every figure is also saved under `$DEQJAX_NOTEBOOK_OUT` (default
# `runs/notebook_initialization_ensembles`). `DEQJAX_NOTEBOOK_FAST=1` runs a reduced version (CI).

# %%
import functools
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import optax
from IPython.display import Image, display
from sklearn.datasets import load_digits

import deqjax as dq
from deqjax import initializers, theory

# The repository this deqjax was installed from (``pip install -e .``): the notebook runs from any
# directory, and runs the experiment script as a program (nothing is imported from experiments/).
ROOT = pathlib.Path(dq.__file__).resolve().parents[1]

FAST = os.environ.get("DEQJAX_NOTEBOOK_FAST", "0") == "1"
OUT = pathlib.Path(
    os.environ.get("DEQJAX_NOTEBOOK_OUT", str(ROOT / "runs" / "notebook_initialization_ensembles"))
)
OUT.mkdir(parents=True, exist_ok=True)
print("fast mode:", FAST, "| figures ->", OUT)

SAMPLERS = {
    "gaussian": initializers.gaussian,
    "orthogonal": initializers.haar_orthogonal,
    "goe": initializers.goe,
}

# %% [markdown]
# ## 1. Three spectra at the same scale
#
# All families share the convention $\mathbb{E}[\frac1n \operatorname{tr} WW^\top] = \sigma^2$. At
# $\sigma = 1$: the Gaussian spectrum fills the unit disc (circular law), the orthogonal one sits on
# the unit circle, and the GOE one is real, on the semicircle $[-2, 2]$ — twice as far out.

# %%
n_spec = 200 if FAST else 600
fig, axes = plt.subplots(1, 3, figsize=(12, 4))
theta = np.linspace(0, 2 * np.pi, 200)
for ax, (name, sampler) in zip(axes, SAMPLERS.items()):
    w = np.asarray(sampler(jax.random.key(0), (n_spec, n_spec), scale=1.0))
    eig = np.linalg.eigvals(w)
    ax.plot(np.cos(theta), np.sin(theta), "k:", lw=0.8)
    ax.scatter(eig.real, eig.imag, s=4, alpha=0.6)
    ax.axvline(2, color="r", lw=0.5)
    ax.axvline(-2, color="r", lw=0.5)
    ax.set_title(f"{name}: max |eig| = {np.abs(eig).max():.2f}")
    ax.set_aspect("equal")
    ax.set_xlim(-2.3, 2.3)
    ax.set_ylim(-1.4, 1.4)
fig.tight_layout()
fig.savefig(OUT / "spectra.png", dpi=100)
plt.show()

# %% [markdown]
# ## 2. Figs. 1–4: theory vs Monte-Carlo
#
# The experiment script does the work; here we only choose its size. Fig. 2 is where the GOE departs
# from the free-independence prediction: its empirical variance lies *above* the curve.

# %%
args = ["--quiet", "--overwrite", "--out_dir", str(OUT / "init_theory")]
args += ["--smoke"] if FAST else ["--n", "300", "--num_seeds", "1", "--num_scales", "9"]
script = ROOT / "experiments" / "init_theory.py"
subprocess.run([sys.executable, str(script), *args], check=True, capture_output=True, cwd=ROOT)
for name in ("fig1_linear_trace", "fig2_mean_field_q", "fig3_spectral_radius", "fig4_residual"):
    display(Image(filename=str(OUT / "init_theory" / f"{name}.png")))
print(open(OUT / "init_theory" / "README.md").read())

# %% [markdown]
# The theory alone: predicted critical scales (where Theorem 3.2's radius reaches 1, tanh DEQ).

# %%
for ens in theory.ENSEMBLES:
    print(f"{ens:>10}: critical scale {float(theory.critical_scale(ens, 'tanh')):.3f}")

# %% [markdown]
# ## 3. Training a small DEQ on digits from each ensemble
#
# $z^\star = \tanh(W z^\star + U x + b)$, logits $= V z^\star$, with $W$ drawn from each ensemble
# (the pure samplers of `deqjax.initializers`), Anderson forward solves per example and implicit
# gradients. We track the forward NFE (solver evaluations) and the training loss.

# %%
digits = load_digits()
x_all = jnp.asarray(digits.data / 16.0, jnp.float32)  # [1797, 64]
y_all = jnp.asarray(digits.target)
d_hidden, num_classes = 64, 10
solver = functools.partial(dq.solvers.anderson, max_steps=40, tol=1e-4, m=5)


def cell(params, x, z):  # f(params, x, z): one example
    return jnp.tanh(params["W"] @ z + params["U"] @ x + params["b"])


def init_params(key, ensemble, scale):
    k_w, k_u, k_v = jax.random.split(key, 3)
    return {
        "W": SAMPLERS[ensemble](k_w, (d_hidden, d_hidden), scale=scale, dtype=jnp.float32),
        "U": initializers.gaussian(k_u, (d_hidden, 64), scale=1.0, dtype=jnp.float32),
        "b": jnp.zeros((d_hidden,), jnp.float32),
        "V": initializers.gaussian(k_v, (num_classes, d_hidden), scale=1.0, dtype=jnp.float32),
    }


def loss_fn(params, x, y):
    def solve(xi):
        return dq.fixed_point(
            cell,
            params,
            xi,
            jnp.zeros((d_hidden,), jnp.float32),
            solver=solver,
            adjoint=dq.ImplicitAdjoint(),
        )

    z, sol = jax.vmap(solve)(x)  # [B, d], per-example solves
    logits = z @ params["V"].T
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    converged = jnp.mean((sol.status == dq.solvers.CONVERGED).astype(jnp.float32))
    return loss, (jnp.mean(sol.num_steps), converged)


optimizer = optax.adam(3e-3)


@jax.jit
def train_step(params, opt_state, x, y):
    (loss, (nfe, converged)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, x, y)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss, nfe, converged


num_steps, batch = (25, 128) if FAST else (150, 256)
scales = (0.5, 1.0) if FAST else (0.4, 0.8, 1.2)
history = {}
for ensemble in SAMPLERS:
    for scale in scales:
        params = init_params(jax.random.key(1), ensemble, scale)
        opt_state = optimizer.init(params)
        losses, nfes, convs = [], [], []
        for step in range(num_steps):
            idx = jax.random.choice(jax.random.key(step), x_all.shape[0], (batch,), replace=False)
            params, opt_state, loss, nfe, conv = train_step(
                params, opt_state, x_all[idx], y_all[idx]
            )
            losses.append(float(loss))
            nfes.append(float(nfe))
            convs.append(float(conv))
        history[(ensemble, scale)] = (losses, nfes)
        print(
            f"{ensemble:>10} scale {scale}: loss {losses[0]:.3f} -> {losses[-1]:.3f}, forward NFE"
            f" {nfes[0]:.1f} -> {nfes[-1]:.1f}, converged {convs[0]:.0%} -> {convs[-1]:.0%}"
        )

# %%
fig, (ax_nfe, ax_loss) = plt.subplots(1, 2, figsize=(12, 4))
colors = {"gaussian": "tab:blue", "orthogonal": "tab:green", "goe": "tab:red"}
styles = dict(zip(scales, ["-", "--", ":"]))
for (ensemble, scale), (losses, nfes) in history.items():
    label = f"{ensemble}, scale {scale}"
    ax_nfe.plot(nfes, styles[scale], color=colors[ensemble], label=label)
    ax_loss.plot(losses, styles[scale], color=colors[ensemble], label=label)
ax_nfe.set(xlabel="training step", ylabel="forward NFE (mean over batch)", title="solver cost")
ax_loss.set(xlabel="training step", ylabel="cross-entropy", title="training loss", yscale="log")
ax_loss.legend(fontsize=7)
fig.tight_layout()
fig.savefig(OUT / "digits_training.png", dpi=100)
plt.show()

# %% [markdown]
# What to read off: the GOE's spectral edge is $2\sigma$, so its predicted critical scale (0.74
# for tanh) is far below that of the Gaussian and orthogonal families (1.86). In the
# `DEQJAX_NOTEBOOK_FAST=1` run recorded when this notebook was written (25 steps, scales 0.5 and
# 1.0), the three families trained alike at scale 0.5 (loss ~0.44-0.53), while at scale 1.0 the
# GOE started with only 77% of the forward solves converged (the others >= 96%) and its loss
# stalled at 2.6 against ~0.43 for Gaussian and orthogonal. Numbers change with the run size; the
# point is the paper's: the *family*, not only the scale, sets the stability of a DEQ.
