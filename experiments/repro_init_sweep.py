"""Init paper §4.1 / Fig. 5 at CPU size (REPRODUCTION.md claim 1): test error of an un-normalised
fully connected DEQ vs the scale σ of its recurrent weight, per matrix family, over many seeds.

Model (per run): Fashion-MNIST images average-pooled 2×2 to 14×14 (196 inputs, standardised) -> DEQ
cell ``z = φ(W z + U x + b)`` (``W`` ``[n, n]`` from ``dq.initializers.{Gaussian, HaarOrthogonal,
GOE}(σ)``; ``U ~ N(0, 1/196)``; no normalisation: the effect is about the spectrum of ``W``) ->
linear readout. Forward: Anderson (≤ ``--max_steps``, tol 1e-3, one residual per batch); backward:
implicit, Anderson with the same budget, no GMRES fallback. Adam with a cosine schedule. Every
(family, σ, seed) run is trained in ONE jitted ``vmap`` over runs (``lax.scan`` over an epoch's
steps), so the sweep costs one training loop.

Per run: the spectral radius at initialisation of ``W`` and of the cell's Jacobian ``J =
diag(φ'(·)) W`` at ``z*`` (mean over 32 test examples), the final test error (full test subset),
the forward NFE and the fraction of test solves that converged.

Usage: python experiments/repro_init_sweep.py --width 32 --seeds 10 --epochs 10 --out runs/x.json
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
import optax

import deqjax as dq
from deqjax import data, harness
from deqjax import initializers as random_matrices

FAMILIES = {
    "gaussian": random_matrices.gaussian,
    "orthogonal": random_matrices.haar_orthogonal,
    "goe": random_matrices.goe,
}
ACTS = {"relu": jax.nn.relu, "tanh": jnp.tanh}
Families = harness.choice_list(tuple(FAMILIES))  # the matrix families --families names


def load(n_train: int, n_test: int):
    def prep(split, n):
        d = data.load_fashion_mnist(split=split)
        img = d["image"][:n].astype(np.float32) / 255.0
        img = img.reshape(-1, 14, 2, 14, 2).mean((2, 4)).reshape(len(img), -1)
        return img, d["label"][:n].astype(np.int32)

    xtr, ytr = prep("train", n_train)
    xte, yte = prep("test", n_test)
    mu, sd = xtr.mean(0), xtr.std(0) + 1e-3
    return (xtr - mu) / sd, ytr, (xte - mu) / sd, yte


def init_run(key, family: str, scale: float, n: int, d_in: int) -> dict[str, jax.Array]:
    kw, ku, kv = jax.random.split(key, 3)
    return {
        "W": FAMILIES[family](kw, (n, n), scale=scale, dtype=jnp.float32),
        "U": jax.random.normal(ku, (d_in, n)) / np.sqrt(d_in),
        "b": jnp.zeros((n,)),
        "V": jax.random.normal(kv, (n, 10)) / np.sqrt(n),
        "c": jnp.zeros((10,)),
    }


@dataclasses.dataclass(frozen=True)
class Config:
    """The sweep (family, scale, seed) and the training of every run."""

    width: harness.PositiveInt = 32  # DEQ state size n
    families: Families = ("gaussian", "orthogonal", "goe")  # comma-separated families of W
    scales: harness.FloatList = (0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0)  # sigma of W
    seeds: harness.PositiveInt = 10  # seeds per (family, scale)
    act: Literal[tuple(ACTS)] = "relu"  # the cell's activation phi
    train_size: harness.PositiveInt = 10000  # training images
    test_size: harness.PositiveInt = 2000  # test images
    batch_size: harness.PositiveInt = 128  # batch of every run
    epochs: harness.PositiveInt = 10  # passes over the training images
    lr: harness.PositiveFloat = 1e-3  # peak Adam learning rate (cosine decay)
    max_steps: harness.PositiveInt = 30  # Anderson budget, forward and backward
    out: str = "runs/repro_init_sweep.json"  # the JSON of every run


def make_forward(c: Config):
    """``forward(params, x) -> (logits, Solution, z*)`` of one run: the DEQ cell of the module
    docstring, Anderson forward, implicit backward with the same budget, no GMRES fallback."""
    act = ACTS[c.act]
    fwd = functools.partial(dq.solvers.anderson, max_steps=c.max_steps, tol=1e-3)
    bwd = functools.partial(dq.solvers.anderson, max_steps=c.max_steps, tol=1e-3)
    adjoint = dq.ImplicitAdjoint(solver=bwd, fallback=None)

    def cell(prm, xb, z):
        return act(z @ prm["W"] + xb @ prm["U"] + prm["b"])

    def forward(prm, xb):
        z0 = jnp.zeros((xb.shape[0], c.width))
        z, sol = dq.fixed_point(cell, prm, xb, z0, solver=fwd, adjoint=adjoint)
        return z @ prm["V"] + prm["c"], sol, z

    return forward


def make_epoch(forward, opt):
    """One epoch of every run: a jitted ``lax.scan`` over the steps of a ``vmap`` over runs."""

    def loss_fn(prm, xb, yb):
        logits, sol, _ = forward(prm, xb)
        nll = -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), yb[:, None], 1))
        return nll, jnp.mean(sol.num_steps.astype(jnp.float32))

    def step(prm, ost, xb, yb):
        (nll, nfe), g = jax.value_and_grad(loss_fn, has_aux=True)(prm, xb, yb)
        g = jax.tree_util.tree_map(lambda v: jnp.where(jnp.isfinite(v), v, 0.0), g)
        upd, ost = opt.update(g, ost, prm)
        return optax.apply_updates(prm, upd), ost, (nll, nfe)

    vstep = jax.vmap(step, in_axes=(0, 0, None, None))

    @jax.jit
    def epoch(prm, ost, xs, ys):
        def body(carry, batch):
            prm, ost, m = vstep(*carry, *batch)
            return (prm, ost), m

        (prm, ost), m = jax.lax.scan(body, (prm, ost), (xs, ys))
        return prm, ost, m

    return epoch


def make_evaluate(forward, act, xte, yte):
    """``evaluate(stacked params) -> (error, NFE, converged fraction, J at z*)`` per run."""

    @jax.jit
    def evaluate(prm):
        def one(pr):
            logits, sol, z = forward(pr, jnp.asarray(xte))
            err = jnp.mean(jnp.argmax(logits, -1) != jnp.asarray(yte))
            conv = jnp.mean((sol.status == dq.solvers.CONVERGED).astype(jnp.float32))
            pre = z[:32] @ pr["W"] + jnp.asarray(xte[:32]) @ pr["U"] + pr["b"]
            dphi = jax.vmap(jax.grad(lambda u: jnp.sum(act(u))))(pre)  # [32, n]
            jac = dphi[:, None, :] * pr["W"].T[None]  # J = diag(φ') Wᵀ (z @ W convention)
            return err, jnp.mean(sol.num_steps.astype(jnp.float32)), conv, jac

        return jax.lax.map(one, prm)

    return evaluate


def main(argv: list[str] | None = None) -> None:
    c = harness.parse_config(Config(), argv, description=__doc__)
    xtr, ytr, xte, yte = load(c.train_size, c.test_size)
    grid = harness.grid(family=c.families, scale=c.scales, seed=range(c.seeds))
    runs = [(r["family"], r["scale"], r["seed"]) for r in grid]
    keys = [jax.random.PRNGKey(1000 * seed + 7) for _, _, seed in runs]  # same U, V per seed
    inits = [init_run(k, f, s, c.width, xtr.shape[1]) for k, (f, s, _) in zip(keys, runs)]
    params = jax.tree_util.tree_map(lambda *v: jnp.stack(v), *inits)  # [R, ...]
    forward = make_forward(c)
    steps_per_epoch = c.train_size // c.batch_size
    opt = optax.adam(optax.cosine_decay_schedule(c.lr, steps_per_epoch * c.epochs))
    opt_state = jax.vmap(opt.init)(params)
    epoch = make_epoch(forward, opt)
    evaluate = make_evaluate(forward, ACTS[c.act], xte, yte)
    t0 = time.perf_counter()
    err0, nfe0, conv0, jac0 = evaluate(params)
    rho_j0 = np.abs(np.linalg.eigvals(np.asarray(jac0, np.float64))).max(-1).mean(-1)  # per run
    rho_w0 = np.abs(np.linalg.eigvals(np.asarray(params["W"], np.float64))).max(-1)
    rng = np.random.default_rng(0)
    curve = []
    for ep in range(c.epochs):
        perm = rng.permutation(c.train_size)[: steps_per_epoch * c.batch_size]
        xs = jnp.asarray(xtr[perm].reshape(steps_per_epoch, c.batch_size, -1))
        ys = jnp.asarray(ytr[perm].reshape(steps_per_epoch, c.batch_size))
        params, opt_state, (nll, nfe) = epoch(params, opt_state, xs, ys)
        curve.append([np.asarray(nll).mean(0).tolist(), np.asarray(nfe).mean(0).tolist()])
        print(f"epoch {ep + 1}/{c.epochs} {time.perf_counter() - t0:.0f}s", flush=True)
    err, nfe, conv, jac = evaluate(params)
    rows = []
    for i, (f, s, seed) in enumerate(runs):
        row = {"family": f, "scale": s, "seed": seed, "width": c.width}
        row |= {"rho_W_init": float(rho_w0[i]), "rho_J_init": float(rho_j0[i])}
        row |= {"test_err_init": float(err0[i]), "test_err": float(err[i])}
        row |= {"test_nfe": float(nfe[i]), "test_converged": float(conv[i])}
        row["train_nll_per_epoch"] = [ep[0][i] for ep in curve]
        rows.append(row | {"train_nfe_per_epoch": [ep[1][i] for ep in curve]})
    os.makedirs(os.path.dirname(c.out) or ".", exist_ok=True)
    with open(c.out, "w") as fh:
        args = harness.flat_dict(c)
        json.dump({"args": args, "wall_s": time.perf_counter() - t0, "rows": rows}, fh)
    print(f"wrote {c.out} ({time.perf_counter() - t0:.0f}s)")


if __name__ == "__main__":
    main()
