"""JR paper §5.1 / Fig. 5: a 200-parameter DEQ on 1D synthetic data, with and without Jacobian
regularization, plus the adaptive-γ controller.

Model and data: ``dq.models.ScalarDEQ`` (``f(z; x) = W₂ᵀ ReLU(W₁ z + U x + b)``, ``ŷ = z*``) and
``dq.models.jr_synthetic_data`` (``y = 3/2 x³ + x² − 5x + 2 sin x − 3 + δ``, ``x ~ U[−2, 2]``),
4096 train / 1000 val. Training (``dq.training.fit``): Adam with a cosine schedule, batch 64, 50
epochs, per-example Broyden forward and backward solves with a budget of 6 (ε 1e-3 / 1e-4),
Jacobian penalty with ``p = 0.4``, ``M = 1``, ``γ ∈ {0, 1, 2, 4}``, and one run whose ``γ`` is set
by :class:`deqjax.regularization.AdaptiveGamma` from a monitoring solve's NFE.

Choices the paper does not fix (logged in ``config.json``): absolute residuals ``|f(z) − z|`` (a
per-example relative residual is ill-posed for a scalar ``z*`` near 0); peak learning rate 1e-2
(``--lr``; with 1e-3 no ``γ`` fits in 50 epochs); NFE to 1e-3 measured with fixed-point iteration
from ``z = 0`` (the iterates of Fig. 5, bottom) and with Broyden (the secant method in 1D); the
adaptive controller's signal is that fixed-point NFE on each training batch (budget 30, no
gradient, at the parameters before the step).

All runs share the initial parameters, data order and Bernoulli gates: one stacked parameter tree
(``jax.vmap`` over runs; the loss sums the runs' losses, so each gradient and Adam update is the
run's own). Outputs: ``results.csv`` (every seed), ``results.md`` (medians),
``metrics_seed<s>.jsonl``, ``history.npz``, ``fig5.png``, ``adaptive_gamma.png`` (first seed).

Usage: ``python experiments/synthetic_1d.py`` (full run, ~3-4 min on 2 CPU cores; ``--smoke``: a
plumbing check of a few minutes).
"""

from __future__ import annotations

import dataclasses
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax

import deqjax as dq
from deqjax import models, regularization, training
from deqjax.training import positive_float, positive_int

SMOKE = {"epochs": 2, "n_train": 512, "n_val": 200, "num_seeds": 1}
OUTPUTS = ("results.csv", "results.md", "history.npz", "fig5.png", "adaptive_gamma.png")
MODEL = models.ScalarDEQ(hidden=50)


ADAPTIVE = dict(lower_ratio=0.6, increase=1.01, decrease=0.995, min_gamma=0.05, max_gamma=20.0,
                smoothing=0.9, init_gamma=1.0)  # fmt: skip
BROYDEN = functools.partial(dq.solvers.Broyden, stop_mode="abs")
FPI = functools.partial(dq.solvers.FixedPointIteration, stop_mode="abs")


@dataclasses.dataclass(frozen=True)
class Settings:
    """The fixed settings (logged in ``config.json`` with ``ADAPTIVE``, the controller's)."""

    batch_size: int = 64
    num_samples: int = 1  # Hutchinson probes M of the JR penalty
    forward: dq.solvers.Solver = BROYDEN(max_steps=6, tol=1e-3)
    backward: dq.solvers.Solver = BROYDEN(max_steps=6, tol=1e-4)
    monitor: dq.solvers.Solver = FPI(max_steps=30, tol=1e-3)  # the adaptive controller's signal
    tight: dq.solvers.Solver = BROYDEN(max_steps=100, tol=1e-6)  # z* for the slope and Fig. 5
    eval_fpi: dq.solvers.Solver = FPI(max_steps=200, tol=1e-3)
    eval_broyden: dq.solvers.Solver = BROYDEN(max_steps=100, tol=1e-3)


def add_flags(p) -> None:
    g = p.add_argument_group("runs")
    g.add_argument("--num_seeds", type=positive_int, default=5, help="seeds per setting")
    g.add_argument("--epochs", type=positive_int, default=50, help="training epochs per run")
    g.add_argument("--lr", type=positive_float, default=1e-2, help="peak Adam learning rate")
    g.add_argument("--gammas", type=float, nargs="+", default=[0.0, 1.0, 2.0, 4.0],
                   help="fixed JR strengths gamma to compare")  # fmt: skip
    g.add_argument("--no_adaptive", action="store_true", help="skip the adaptive-γ run")
    g.add_argument("--nfe_target", type=float, default=8.0, help="NFE the adaptive run aims at")
    g.add_argument("--p", type=float, default=0.4, help="Bernoulli gate probability of JR")
    g.add_argument("--n_train", type=positive_int, default=4096, help="training examples")
    g.add_argument("--n_val", type=positive_int, default=1000, help="validation examples")


def run_names(args) -> list[str]:
    return [f"gamma={g:g}" for g in args.gammas] + ([] if args.no_adaptive else ["adaptive"])


def setup(args):
    extra = {"settings": Settings(), "adaptive_gamma": ADAPTIVE, "runs": run_names(args)}
    extra |= {"seeds": [args.seed + i for i in range(args.num_seeds)], "jax": jax.__version__}
    return Settings(), extra


def train(args, s: Settings, seed: int, ctx):
    """Trains every run of one seed through ``fit``; returns the stacked params and the records."""
    xt, yt, _, _ = models.jr_synthetic_data(seed, args.n_train, args.n_val)
    names, adaptive = run_names(args), jnp.asarray([n == "adaptive" for n in run_names(args)])
    regularizer = regularization.JacobianRegularizer(0.0, p=args.p, num_samples=s.num_samples)
    adjoint = dq.ImplicitAdjoint(solver=s.backward)
    controller = regularization.AdaptiveGamma(target=args.nfe_target, **ADAPTIVE)

    def run_loss(params, xb, yb, key, gamma):
        z0, fwd = jnp.zeros(xb.shape, jnp.float32), s.forward.replace(batch_ndim=1)
        z, sol = dq.fixed_point(MODEL.batch_cell, params, xb, z0, solver=fwd, adjoint=adjoint)
        mse = jnp.mean((z - yb) ** 2)
        f = lambda zz: MODEL.batch_cell(params, xb, zz)  # noqa: E731
        jr, metrics = regularizer.penalty(f, z, key, gamma=gamma)
        mon = MODEL.solve(params, xb, s.monitor)
        slope = jnp.mean(jnp.abs(MODEL.slope(jax.lax.stop_gradient(params), xb, mon.value)))
        metrics |= {"mse": mse, "fwd_residual": jnp.mean(sol.abs_residual), "slope": slope,
                    "fwd_nfe": jnp.mean(sol.num_steps.astype(jnp.float32)),
                    "monitor_nfe": jnp.mean(mon.num_steps.astype(jnp.float32))}  # fmt: skip
        return mse + jr, metrics

    def loss_fn(params, batch, key, ctrl, step):  # the runs' sum: each gradient is its own
        losses, m = jax.vmap(run_loss, (0, None, None, None, 0))(
            params, batch["x"], batch["y"], key, ctrl.gamma)  # fmt: skip
        return jnp.sum(losses), {
            f"{k}/{n}": v[i] for k, v in m.items() for i, n in enumerate(names)
        }

    def update_ctrl(ctrl, metrics, step):
        nfe = jnp.stack([metrics[f"monitor_nfe/{n}"] for n in names])
        new = jax.vmap(controller.update)(ctrl, nfe)  # the fixed runs track the signal only
        return new._replace(gamma=jnp.where(adaptive, new.gamma, ctrl.gamma))

    key_init = jax.random.fold_in(jax.random.PRNGKey(seed), 0)
    stack = lambda t: jax.tree_util.tree_map(lambda a: jnp.stack([a] * len(names)), t)  # noqa: E731
    gammas = list(args.gammas) + [ADAPTIVE["init_gamma"]] * (not args.no_adaptive)
    ctrl = stack(controller.init())._replace(gamma=jnp.asarray(gammas, jnp.float32))
    it = dq.data.ShuffledBatches({"x": xt, "y": yt}, batch_size=s.batch_size, seed=seed + 1)
    total = it.steps_per_epoch * args.epochs
    ckpt = ctx.path(f"ckpt/seed{seed}")
    result = training.fit(
        params=stack(MODEL.init(key_init)), loss_fn=loss_fn, num_steps=total,
        optimizer=optax.adam(optax.cosine_decay_schedule(args.lr, total)), train_data=it,
        rng=jax.random.PRNGKey(seed), per_device_rng=False, reg_state=ctrl,
        update_reg_state=update_ctrl, log_every=1, desc=f"synthetic_1d seed {seed}",
        **ctx.fit_kwargs(checkpoint_dir=ckpt, metrics_path=ctx.path(f"metrics_seed{seed}.jsonl"),
                         resume=ctx.resume and os.path.isdir(ckpt) and bool(os.listdir(ckpt)))
    )  # fmt: skip
    train = [r for r in result.history if r["split"] == "train"]
    keys = ("monitor_nfe", "slope", "jr/gamma", "mse", "fwd_nfe", "fwd_residual")
    history = {k: np.asarray([[r[f"{k}/{n}"] for n in names] for r in train]) for k in keys}
    return result.state.params, history


def unstack(params, names: list[str]) -> dict:  # {run name: that run's params}
    return {n: jax.tree_util.tree_map(lambda a, i=i: a[i], params) for i, n in enumerate(names)}


def evaluate(args, s: Settings, seed: int, params) -> list[dict]:
    """The Fig. 5 table (``dq.models.jr_fig5_metrics``) of every run on the validation set."""
    _, _, xv, yv = map(jnp.asarray, models.jr_synthetic_data(seed, args.n_train, args.n_val))
    fig5 = {k: v for k, v in vars(s).items() if k not in ("batch_size", "num_samples", "monitor")}
    one = jax.jit(lambda p: models.jr_fig5_metrics(MODEL, p, xv, yv, **fig5))
    return [{"run": n, **{k: float(v) for k, v in jax.device_get(one(p)).items()}}
            for n, p in unstack(params, run_names(args)).items()]  # fmt: skip


def plot(args, s: Settings, params, history: dict, ctx) -> None:
    """Fig. 5 per run, and the monitoring NFE, slope (moving averages) and γ per training step."""
    names, w = run_names(args), min(64, len(history["slope"]))  # moving-average window
    models.plot_jr_fig5(MODEL, unstack(params, names), ctx.path("fig5.png"), solver=s.tight)
    avg = lambda v: (np.arange(v.size - w + 1) + w, np.convolve(v, np.ones(w) / w, "valid"))  # noqa: E731
    per_run = lambda k, f: {n: f(history[k][:, i]) for i, n in enumerate(names)}  # noqa: E731
    panels = {"fixed-point NFE to 1e-3\n(moving avg)": per_run("monitor_nfe", avg),
              "mean |∂f/∂z| at z*": per_run("slope", avg),
              "γ": per_run("jr/gamma", lambda v: (np.arange(v.size), v))}  # fmt: skip
    training.plot_panels(ctx.path("adaptive_gamma.png"), panels, xlabel="training step",
                         styles={"adaptive": {"lw": 2.0, "color": "k"}},
                         hlines={next(iter(panels)): (args.nfe_target, "NFE target")})  # fmt: skip


def run(args, s: Settings, ctx) -> dict:
    per_seed = []
    for seed in ctx.config["seeds"]:
        params, history = train(args, s, seed, ctx)
        rows, final = evaluate(args, s, seed, params), history["jr/gamma"][-1]
        per_seed.append([r | {"seed": seed, "final_gamma": float(g)} for r, g in zip(rows, final)])
        if seed == args.seed:
            hist = {k.replace("/", "_"): v for k, v in history.items()}
            np.savez(ctx.path("history.npz"), names=np.asarray(run_names(args)), **hist)
            plot(args, s, params, history, ctx)
    training.write_csv(ctx.path("results.csv"), [r for rows in per_seed for r in rows])
    keys = [k for k in per_seed[0][0] if k != "run"]
    median = lambda rs: {k: float(np.median([r[k] for r in rs])) for k in keys}  # noqa: E731
    medians = [{"run": rs[0]["run"], **median(rs)} for rs in zip(*per_seed)]
    md = f"Median over seeds {ctx.config['seeds']}:\n\n" + training.markdown_table(medians)
    with open(ctx.path("results.md"), "w") as fh:
        fh.write(md + "\n")
    print(md)
    return {"medians": medians, "per_seed": per_seed}


EXPERIMENT = training.Experiment(
    name="synthetic_1d", doc=__doc__, add_flags=add_flags, setup=setup, run=run, smoke=SMOKE,
    safe_on_resume=("num_seeds",), outputs=OUTPUTS)  # fmt: skip
main = functools.partial(training.run, EXPERIMENT)  # main(argv=None) -> results

if __name__ == "__main__":
    main()
