"""JR paper §5.1 / Fig. 5: a 200-parameter DEQ on 1D synthetic data, with and without Jacobian
regularization, plus the adaptive-γ controller.

Model: ``f(z; x) = W₂ᵀ ReLU(W₁ z + U x + b)``, ``W₁, W₂, U, b ∈ ℝ⁵⁰`` (200 parameters), ``ŷ = z*``.
Data: ``y = 3/2 x³ + x² − 5x + 2 sin x − 3 + δ`` (the main text's ``−5x``; App. A.1 writes ``+5x``),
``δ ~ N(0, 0.05²)``, ``x ~ U[−2, 2]`` (the paper does not give the range), 4096 train / 1000 val.
Training: Adam with a cosine schedule, batch 64, 50 epochs, per-example Broyden forward and
backward solves with a budget of 6 (ε 1e-3 / 1e-4), Jacobian penalty with ``p = 0.4``, ``M = 1``,
``γ ∈ {0, 1, 2, 4}``, and one run whose ``γ`` is set by
:class:`deqjax.regularization.AdaptiveGamma`.

Choices that differ from (or are not fixed by) the paper, each logged in ``config.json``:

* Residuals are absolute, ``|f(z) − z|``: solves are per example (``jax.vmap``) and a per-example
  relative residual ``|f(z) − z| / |f(z)|`` is ill-posed for a scalar ``z*`` near 0 (the paper's
  code measures one relative residual over the whole batch).
* Peak learning rate 1e-2 (flag ``--lr``): with the paper's 1e-3 no ``γ`` fits in 50 epochs from our
  initialisation (validation MSE 1–4 against a target variance of 3.6).
* Initialisation: ``W₁, U, b ~ U(±1/√2)``, ``W₂ ~ U(±1/√50)`` (PyTorch's default for a
  ``Linear(2, 50)`` on ``(z, x)`` and a ``Linear(50, 1)``).
* NFE to 1e-3 is measured with plain fixed-point iteration from ``z = 0`` (the iterates drawn in
  Fig. 5, bottom) and with Broyden. In 1D Broyden is the secant method, which converges in a few
  steps even on a steep slope, so the slope shows in the fixed-point-iteration NFE.
* The adaptive controller's signal is that fixed-point-iteration NFE to 1e-3 (a monitoring solve
  with a budget of 30 on each training batch, no gradient), with a target (``--nfe_target``).

All runs share the initial parameters, the data order and the Bernoulli gates; they are trained
together (``jax.vmap`` over runs, ``lax.scan`` over the steps of an epoch).

Usage::

    python experiments/synthetic_1d.py                      # full run (~3-4 min on 2 CPU cores)
    python experiments/synthetic_1d.py --smoke              # plumbing check, a few minutes
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import functools
import json
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

import deqjax as dq
from deqjax import jacobian
from deqjax import regularization as reg_lib

F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class Config:
    """Every setting of a run (logged as ``config.json``)."""

    seed: int = 0
    epochs: int = 50
    batch_size: int = 64
    lr: float = 1e-2
    gammas: tuple[float, ...] = (0.0, 1.0, 2.0, 4.0)
    adaptive: bool = True
    adaptive_init_gamma: float = 1.0
    nfe_target: float = 8.0
    adaptive_lower_ratio: float = 0.6
    adaptive_increase: float = 1.01
    adaptive_decrease: float = 0.995
    adaptive_smoothing: float = 0.9
    p: float = 0.4
    num_samples: int = 1
    hidden: int = 50
    n_train: int = 4096
    n_val: int = 1000
    noise: float = 0.05
    x_min: float = -2.0
    x_max: float = 2.0
    linear_sign: int = -1  # y = 1.5x³ + x² + linear_sign·5x + 2 sin x − 3 (main text: −5x)
    fwd_steps: int = 6
    fwd_tol: float = 1e-3
    bwd_steps: int = 6
    bwd_tol: float = 1e-4
    stop_mode: str = "abs"
    monitor_steps: int = 30
    eval_tol: float = 1e-3
    eval_fpi_steps: int = 200
    eval_broyden_steps: int = 100
    out_dir: str = "runs/synthetic_1d"


# --- data and model ------------------------------------------------------------------------------


def target_fn(x: np.ndarray, linear_sign: int = -1) -> np.ndarray:
    """``h(x) = 3/2 x³ + x² ± 5x + 2 sin x − 3`` (JR paper §5.1 uses ``−5x``)."""
    return 1.5 * x**3 + x**2 + linear_sign * 5.0 * x + 2.0 * np.sin(x) - 3.0


def make_data(cfg: Config) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(x_train, y_train, x_val, y_val)``, float32, from ``cfg.seed``."""
    rng = np.random.default_rng(cfg.seed)
    n = cfg.n_train + cfg.n_val
    x = rng.uniform(cfg.x_min, cfg.x_max, n)
    y = target_fn(x, cfg.linear_sign) + cfg.noise * rng.normal(size=n)
    x, y = x.astype(np.float32), y.astype(np.float32)
    return x[: cfg.n_train], y[: cfg.n_train], x[cfg.n_train :], y[cfg.n_train :]


def init_params(key: jax.Array, hidden: int) -> dict[str, jax.Array]:
    """The 4·hidden parameters (see the module docstring for the initialisation)."""
    k1, k2, k3, k4 = jax.random.split(key, 4)
    a, c = 1.0 / np.sqrt(2.0), 1.0 / np.sqrt(hidden)
    uniform = functools.partial(jax.random.uniform, shape=(hidden,), dtype=F32)
    return {
        "W1": uniform(k1, minval=-a, maxval=a),
        "U": uniform(k2, minval=-a, maxval=a),
        "b": uniform(k3, minval=-a, maxval=a),
        "W2": uniform(k4, minval=-c, maxval=c),
    }


def cell(params: dict[str, jax.Array], x: jax.Array, z: jax.Array) -> jax.Array:
    """``f(z; x) = W₂ᵀ ReLU(W₁ z + U x + b)`` for scalar ``x`` and ``z``."""
    return jnp.dot(params["W2"], jax.nn.relu(params["W1"] * z + params["U"] * x + params["b"]))


batch_cell = jax.vmap(cell, in_axes=(None, 0, 0))


def slope(params, x, z):
    """``∂f/∂z`` at ``(x, z)``, per example."""
    return jax.vmap(jax.grad(cell, argnums=2), in_axes=(None, 0, 0))(params, x, z)


def solve_batch(params, xs, solver):
    """Per-example solves of ``z = f(z; x)`` from ``z = 0`` (no gradient); a batched Solution.

    Batch-native (``batch_ndim=1``): one loop for the batch, each example stopping on its own.
    """
    params = jax.lax.stop_gradient(params)
    return solver(lambda z: batch_cell(params, xs, z), jnp.zeros(xs.shape, F32), batch_ndim=1)


# --- training ------------------------------------------------------------------------------------


def run_names(cfg: Config) -> list[str]:
    names = [f"gamma={g:g}" for g in cfg.gammas]
    return names + (["adaptive"] if cfg.adaptive else [])


def _solvers(cfg: Config):
    fwd = functools.partial(
        dq.solvers.broyden, max_steps=cfg.fwd_steps, tol=cfg.fwd_tol, stop_mode=cfg.stop_mode
    )
    bwd = functools.partial(
        dq.solvers.broyden, max_steps=cfg.bwd_steps, tol=cfg.bwd_tol, stop_mode=cfg.stop_mode
    )
    monitor = functools.partial(
        dq.solvers.fixed_point_iteration,
        max_steps=cfg.monitor_steps,
        tol=cfg.eval_tol,
        stop_mode=cfg.stop_mode,
    )
    return fwd, bwd, monitor


def make_controller(cfg: Config) -> reg_lib.AdaptiveGamma:
    """The adaptive-γ controller on the fixed-point-iteration NFE (see the module docstring)."""
    return reg_lib.AdaptiveGamma(
        init_gamma=cfg.adaptive_init_gamma,
        target=cfg.nfe_target,
        lower_ratio=cfg.adaptive_lower_ratio,
        increase=cfg.adaptive_increase,
        decrease=cfg.adaptive_decrease,
        min_gamma=0.05,
        max_gamma=20.0,
        smoothing=cfg.adaptive_smoothing,
    )


def make_epoch_fn(cfg: Config, optimizer: optax.GradientTransformation):
    """A jitted function running one epoch (``lax.scan`` over steps) for all runs (``vmap``)."""
    fwd, bwd, monitor = _solvers(cfg)
    regularizer = reg_lib.JacobianRegularizer(0.0, p=cfg.p, num_samples=cfg.num_samples)
    controller = make_controller(cfg)
    adjoint = dq.ImplicitAdjoint(solver=bwd)

    def loss_fn(params, xb, yb, key, gamma):
        z, sol = dq.fixed_point(  # batch-native: each example stops on its own
            batch_cell,
            params,
            xb,
            jnp.zeros(xb.shape, F32),
            solver=functools.partial(fwd, batch_ndim=1),
            adjoint=adjoint,
        )
        mse = jnp.mean((z - yb) ** 2)
        jr, jr_metrics = regularizer.penalty(
            lambda zz: batch_cell(params, xb, zz), z, key, gamma=gamma
        )
        metrics = dict(
            jr_metrics,
            mse=mse,
            fwd_residual=jnp.mean(sol.abs_residual),
            fwd_nfe=jnp.mean(sol.num_steps.astype(F32)),
        )
        return mse + jr, metrics

    def run_step(params, opt_state, ctrl_state, adaptive, xb, yb, key):
        grads, metrics = jax.grad(loss_fn, has_aux=True)(params, xb, yb, key, ctrl_state.gamma)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        mon = solve_batch(params, xb, monitor)
        nfe = jnp.mean(mon.num_steps.astype(F32))
        new_ctrl = controller.update(ctrl_state, nfe)
        ctrl_state = jax.tree_util.tree_map(
            lambda new, old: jnp.where(adaptive, new, old), new_ctrl, ctrl_state
        )
        metrics["monitor_nfe"] = nfe
        metrics["slope"] = jnp.mean(jnp.abs(slope(params, xb, mon.value)))
        return params, opt_state, ctrl_state, metrics

    # Runs are vmapped; the batch and the key are shared (so the gate is one real lax.cond).
    vstep = jax.vmap(run_step, in_axes=(0, 0, 0, 0, None, None, None))

    @jax.jit
    def epoch(params, opt_state, ctrl_state, adaptive, xs, ys, keys):
        def body(carry, batch):
            p, o, c = carry
            xb, yb, key = batch
            p, o, c, m = vstep(p, o, c, adaptive, xb, yb, key)
            return (p, o, c), m

        (params, opt_state, ctrl_state), metrics = jax.lax.scan(
            body, (params, opt_state, ctrl_state), (xs, ys, keys)
        )
        return params, opt_state, ctrl_state, metrics

    return epoch, controller


def train(cfg: Config, *, progress: bool = True) -> dict[str, Any]:
    """Trains every run; returns stacked final params ``[R, ...]`` and per-step histories."""
    xt, yt, _, _ = make_data(cfg)
    names = run_names(cfg)
    num_runs = len(names)
    steps_per_epoch = cfg.n_train // cfg.batch_size
    total = steps_per_epoch * cfg.epochs
    optimizer = optax.adam(optax.cosine_decay_schedule(cfg.lr, total))
    epoch_fn, controller = make_epoch_fn(cfg, optimizer)

    key = jax.random.key(cfg.seed)
    init_key, train_key = jax.random.split(key)
    params0 = init_params(init_key, cfg.hidden)
    stack = lambda t: jax.tree_util.tree_map(lambda a: jnp.stack([a] * num_runs), t)
    params = stack(params0)
    opt_state = stack(optimizer.init(params0))
    gammas = list(cfg.gammas) + ([cfg.adaptive_init_gamma] if cfg.adaptive else [])
    ctrl_state = stack(controller.init())._replace(gamma=jnp.asarray(gammas, F32))
    adaptive = jnp.asarray([False] * len(cfg.gammas) + [True] * cfg.adaptive)

    rng = np.random.default_rng(cfg.seed + 1)
    history: list[dict[str, np.ndarray]] = []
    epochs = range(cfg.epochs)
    if progress:
        from tqdm import tqdm

        epochs = tqdm(epochs, desc="synthetic_1d", unit="epoch")
    for _ in epochs:
        perm = rng.permutation(cfg.n_train)[: steps_per_epoch * cfg.batch_size]
        xs = jnp.asarray(xt[perm].reshape(steps_per_epoch, cfg.batch_size))
        ys = jnp.asarray(yt[perm].reshape(steps_per_epoch, cfg.batch_size))
        train_key, sub = jax.random.split(train_key)
        keys = jax.random.split(sub, steps_per_epoch)
        params, opt_state, ctrl_state, metrics = epoch_fn(
            params, opt_state, ctrl_state, adaptive, xs, ys, keys
        )
        metrics = jax.device_get(metrics)  # one host transfer per epoch
        history.append(metrics)
        if progress:
            epochs.set_postfix(
                {
                    n: f"mse={m:.3f},nfe={k:.1f}"
                    for n, m, k in zip(
                        ["g0", "a"],
                        metrics["mse"].mean(0)[[0, -1]],
                        metrics["monitor_nfe"].mean(0)[[0, -1]],
                    )
                }
            )
    hist = {k: np.concatenate([h[k] for h in history]) for k in history[0]}  # [steps, R]
    return {"names": names, "params": params, "history": hist}


# --- evaluation ----------------------------------------------------------------------------------


def evaluate(cfg: Config, params: dict[str, jax.Array], names: list[str]) -> list[dict[str, Any]]:
    """The Fig. 5 table: per run, validation MSE, mean |∂f/∂z| at z*, NFE to ``eval_tol``."""
    _, _, xv, yv = make_data(cfg)
    xv, yv = jnp.asarray(xv), jnp.asarray(yv)
    fwd, bwd, _ = _solvers(cfg)
    tight = functools.partial(dq.solvers.broyden, max_steps=100, tol=1e-6, stop_mode="abs")
    fpi = functools.partial(
        dq.solvers.fixed_point_iteration,
        max_steps=cfg.eval_fpi_steps,
        tol=cfg.eval_tol,
        stop_mode=cfg.stop_mode,
    )
    broyden = functools.partial(
        dq.solvers.broyden,
        max_steps=cfg.eval_broyden_steps,
        tol=cfg.eval_tol,
        stop_mode=cfg.stop_mode,
    )

    @jax.jit
    def one(p):
        s6 = solve_batch(p, xv, fwd)
        st = solve_batch(p, xv, tight)
        sf = solve_batch(p, xv, fpi)
        sb = solve_batch(p, xv, broyden)
        z = st.value
        g = 2.0 * (z - yv) / yv.shape[0]  # ∂(MSE)/∂z*
        back = jax.vmap(
            lambda x, zz, gg: jacobian.backward_convergence(cell, p, x, zz, gg, solver=bwd)
        )(xv, z, g)
        conv_f = sf.status == dq.solvers.CONVERGED
        return {
            "val_mse": jnp.mean((s6.value - yv) ** 2),
            "val_mse_tight": jnp.mean((z - yv) ** 2),
            "mean_abs_slope": jnp.mean(jnp.abs(slope(p, xv, z))),
            "max_abs_slope": jnp.max(jnp.abs(slope(p, xv, z))),
            "nfe_fpi": jnp.mean(jnp.where(conv_f, sf.num_steps, cfg.eval_fpi_steps).astype(F32)),
            "fpi_converged": jnp.mean(conv_f.astype(F32)),
            "nfe_broyden": jnp.mean(sb.num_steps.astype(F32)),
            "backward_rel_residual": jnp.mean(back.rel_residual),
        }

    rows = []
    for i, name in enumerate(names):
        p = jax.tree_util.tree_map(lambda a, i=i: a[i], params)
        row = {k: float(v) for k, v in jax.device_get(one(p)).items()}
        rows.append({"run": name, **row})
    return rows


# --- outputs -------------------------------------------------------------------------------------

COLUMNS = [
    ("run", "run"),
    ("final_gamma", "γ (final)"),
    ("val_mse", "val MSE (budget 6)"),
    ("val_mse_tight", "val MSE (solved to 1e-6)"),
    ("mean_abs_slope", "mean abs(∂f/∂z) at z*"),
    ("max_abs_slope", "max abs(∂f/∂z)"),
    ("nfe_fpi", "NFE to 1e-3, fixed-point iter."),
    ("fpi_converged", "FPI converged (≤200)"),
    ("nfe_broyden", "NFE to 1e-3, Broyden"),
    ("backward_rel_residual", "backward rel. residual (budget 6)"),
]


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """The results as a markdown table."""
    head = "| " + " | ".join(title for _, title in COLUMNS) + " |"
    sep = "|" + "---|" * len(COLUMNS)
    lines = [head, sep]
    for r in rows:
        cells = [r[k] if isinstance(r[k], str) else f"{r[k]:.4g}" for k, _ in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def aggregate(per_seed: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per run, the median over seeds of every numeric column."""
    rows = []
    for i, first in enumerate(per_seed[0]):
        row = {"run": first["run"]}
        for key, _ in COLUMNS[1:]:
            row[key] = float(np.median([rows_s[i][key] for rows_s in per_seed]))
        rows.append(row)
    return rows


def write_table(per_seed: list[list[dict[str, Any]]], seeds: list[int], out_dir: str) -> str:
    """Writes ``results.csv`` (every seed) and ``results.md`` (medians); returns the markdown."""
    keys = [k for k, _ in COLUMNS]
    with open(os.path.join(out_dir, "results.csv"), "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["seed", *keys])
        writer.writeheader()
        for seed, rows in zip(seeds, per_seed):
            for r in rows:
                writer.writerow({"seed": seed, **{k: r[k] for k in keys}})
    md = f"Median over seeds {seeds}:\n\n" + markdown_table(aggregate(per_seed))
    md += "\n\nValidation MSE (budget 6) per seed:\n\n"
    md += "| run | " + " | ".join(f"seed {s}" for s in seeds) + " |\n"
    md += "|---|" + "---|" * len(seeds) + "\n"
    for i, r in enumerate(per_seed[0]):
        md += f"| {r['run']} | " + " | ".join(f"{rows[i]['val_mse']:.4g}" for rows in per_seed)
        md += " |\n"
    with open(os.path.join(out_dir, "results.md"), "w") as fh:
        fh.write(md)
    return md


def plot_fig5(cfg: Config, params, names: list[str], path: str) -> None:
    """Fig. 5: top, the surface ``z_out = f(z; x)`` with ``z*(x)``; bottom, the slice at x = −1."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    num = len(names)
    fig = plt.figure(figsize=(4.0 * num, 8.0))
    xs = np.linspace(cfg.x_min, cfg.x_max, 60, dtype=np.float32)
    zs = np.linspace(-6.0, 6.0, 60, dtype=np.float32)
    xx, zz = np.meshgrid(xs, zs)
    tight = functools.partial(dq.solvers.broyden, max_steps=100, tol=1e-6, stop_mode="abs")
    for i, name in enumerate(names):
        p = jax.tree_util.tree_map(lambda a, i=i: a[i], params)
        surf = np.asarray(batch_cell(p, jnp.asarray(xx.ravel()), jnp.asarray(zz.ravel())))
        z_star = np.asarray(solve_batch(p, jnp.asarray(xs), tight).value)
        ax = fig.add_subplot(2, num, i + 1, projection="3d")
        ax.plot_surface(xx, zz, surf.reshape(xx.shape), cmap="viridis", alpha=0.7, linewidth=0)
        ax.plot(xs, z_star, z_star, "r--", lw=2, label="z*(x)")
        ax.set_xlabel("x")
        ax.set_ylabel("z")
        ax.set_zlabel("f(z; x)")
        ax.set_title(name)
        # Bottom: slice at x = -1 and the fixed-point iterates from z = 0 (a cobweb).
        ax2 = fig.add_subplot(2, num, num + i + 1)
        x0 = jnp.asarray(-1.0, F32)
        f_slice = np.asarray(jax.vmap(lambda z, p=p, x0=x0: cell(p, x0, z))(jnp.asarray(zs)))
        ax2.plot(zs, f_slice, color="tab:blue", label="f(z; x=−1)")
        ax2.plot(zs, zs, color="gray", ls=":", label="z_out = z")
        z, path_z, path_f = 0.0, [], []
        for _ in range(15):
            fz = float(cell(p, x0, jnp.asarray(z, F32)))
            path_z += [z, z]
            path_f += [z, fz]
            z = fz
        ax2.plot(path_z, path_f, color="tab:red", lw=0.8, label="fixed-point iterates")
        ax2.axhline(float(target_fn(np.float32(-1.0), cfg.linear_sign)), color="k", lw=0.5)
        ax2.set_xlim(-6, 6)
        ax2.set_ylim(-6, 6)
        ax2.set_xlabel("z")
        if i == 0:
            ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_controller(names: list[str], history: dict[str, np.ndarray], target: float, path: str):
    """Monitoring NFE (moving average) and γ against the training step, every run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    window = 64
    kernel = np.ones(window) / window
    fig, (ax1, ax2, ax3) = plt.subplots(3, 1, figsize=(8, 9), sharex=True)
    for i, name in enumerate(names):
        nfe = np.convolve(history["monitor_nfe"][:, i], kernel, mode="valid")
        sl = np.convolve(history["slope"][:, i], kernel, mode="valid")
        style = {"lw": 2.0, "color": "k"} if name == "adaptive" else {"lw": 1.0}
        ax1.plot(np.arange(nfe.size) + window, nfe, label=name, **style)
        ax2.plot(np.arange(sl.size) + window, sl, label=name, **style)
        ax3.plot(history["jr/gamma"][:, i], label=name, **style)
    ax1.axhline(target, color="k", ls=":", lw=1, label="NFE target")
    ax1.set_ylabel("fixed-point NFE to 1e-3\n(train batch, moving avg)")
    ax2.set_ylabel("mean |∂f/∂z| at z*")
    ax3.set_ylabel("γ")
    ax3.set_xlabel("training step")
    ax1.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(
    cfg: Config, *, num_seeds: int = 1, progress: bool = True, plots: bool = True
) -> list[list[dict[str, Any]]]:
    """Trains and evaluates seeds ``cfg.seed, ..., cfg.seed + num_seeds - 1``.

    Writes ``config.json``, ``results.csv`` (every seed), ``results.md`` (medians),
    ``history.npz`` and the plots (of the first seed) under ``cfg.out_dir``.

    Returns:
      Per seed, the list of table rows (one per run).
    """
    os.makedirs(cfg.out_dir, exist_ok=True)
    seeds = [cfg.seed + i for i in range(num_seeds)]
    config = dataclasses.asdict(cfg)
    config.update(seeds=seeds, jax_version=jax.__version__, backend=jax.default_backend())
    print(json.dumps(config, indent=1))
    with open(os.path.join(cfg.out_dir, "config.json"), "w") as fh:
        json.dump(config, fh, indent=1)
    per_seed = []
    for seed in seeds:
        cfg_s = dataclasses.replace(cfg, seed=seed)
        start = time.perf_counter()
        out = train(cfg_s, progress=progress)
        print(f"seed {seed}: training took {time.perf_counter() - start:.1f} s")
        rows = evaluate(cfg_s, out["params"], out["names"])
        for r, g in zip(rows, out["history"]["jr/gamma"][-1]):
            r["final_gamma"] = float(g)
        per_seed.append(rows)
        if seed == seeds[0]:
            hist = {k.replace("/", "_"): v for k, v in out["history"].items()}
            np.savez(
                os.path.join(cfg.out_dir, "history.npz"), names=np.asarray(out["names"]), **hist
            )
            if plots:
                plot_fig5(cfg_s, out["params"], out["names"], os.path.join(cfg.out_dir, "fig5.png"))
                plot_controller(
                    out["names"],
                    out["history"],
                    cfg.nfe_target,
                    os.path.join(cfg.out_dir, "adaptive_gamma.png"),
                )
    md = write_table(per_seed, seeds, cfg.out_dir)
    print(md)
    print(f"outputs in {cfg.out_dir}")
    return per_seed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--seed", type=int, default=0, help="first seed")
    parser.add_argument("--num_seeds", type=int, default=5, help="seeds per setting")
    parser.add_argument("--epochs", type=int, default=50, help="training epochs per run")
    parser.add_argument("--lr", type=float, default=1e-2, help="Adam learning rate")
    parser.add_argument(
        "--gammas",
        type=float,
        nargs="+",
        default=[0.0, 1.0, 2.0, 4.0],
        help="fixed JR strengths gamma to compare",
    )
    parser.add_argument("--no_adaptive", action="store_true", help="skip the adaptive-γ run")
    parser.add_argument(
        "--nfe_target", type=float, default=8.0, help="forward NFE the adaptive-γ run aims at"
    )
    parser.add_argument("--p", type=float, default=0.4, help="Bernoulli gate probability of JR")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="2 epochs on 512 examples, no plots (under 4 minutes on 2 CPU cores);\n"
        "into runs/synthetic_1d_smoke",
    )
    parser.add_argument(
        "--out_dir", default="runs/synthetic_1d", help="output folder (--smoke: ..._smoke)"
    )
    if parser.parse_known_args(argv)[0].smoke:  # a smoke run never overwrites the full run
        parser.set_defaults(out_dir="runs/synthetic_1d_smoke")
    args = parser.parse_args(argv)
    cfg = Config(
        seed=args.seed,
        epochs=2 if args.smoke else args.epochs,
        lr=args.lr,
        gammas=tuple(args.gammas),
        adaptive=not args.no_adaptive,
        nfe_target=args.nfe_target,
        p=args.p,
        n_train=512 if args.smoke else 4096,
        n_val=200 if args.smoke else 1000,
        out_dir=args.out_dir,
    )
    run(cfg, num_seeds=1 if args.smoke else args.num_seeds, plots=not args.smoke)


if __name__ == "__main__":
    main()
