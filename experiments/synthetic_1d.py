"""JR paper §5.1 / Fig. 5: a 200-parameter DEQ on 1D synthetic data, with and without Jacobian
regularization, plus the adaptive-γ controller.

Model and data: ``dq.models.ScalarDEQ`` (``f(z; x) = W₂ᵀ ReLU(W₁ z + U x + b)``, ``ŷ = z*``) and
``dq.models.jr_synthetic_data`` (``y = 3/2 x³ + x² − 5x + 2 sin x − 3 + δ``, ``x ~ U[−2, 2]``).
Training (``dq.training.fit``): Adam with a cosine schedule, batch 64, per-example Broyden forward
and backward solves with a budget of 6 (ε 1e-3 / 1e-4), Jacobian penalty with ``M = 1`` at each
``--gammas`` value, and one run whose ``γ`` is set by ``dq.regularization.AdaptiveGamma`` from a
monitoring solve's NFE.

Choices the paper does not fix (logged in ``config.json``): absolute residuals ``|f(z) − z|`` (a
per-example relative residual is ill-posed for a scalar ``z*`` near 0); peak learning rate 1e-2
(``--lr``; with 1e-3 no ``γ`` fits in 50 epochs); NFE to 1e-3 measured with fixed-point iteration
from ``z = 0`` (the iterates of Fig. 5, bottom) and with Broyden (the secant method in 1D); the
adaptive controller's signal is that fixed-point NFE on each training batch (budget 30, no
gradient, at the parameters before the step).

All runs share the initial parameters, data order and Bernoulli gates (one stacked tree,
``parts/stacked_runs.py``). Outputs: ``results.csv`` (every seed), ``results.md`` (medians),
``metrics_seed<s>.jsonl``; of the first seed ``history.npz``, ``fig5.png``, ``adaptive_gamma.png``.

Usage: ``python experiments/synthetic_1d.py`` (~3-4 min on 2 CPU cores; ``--smoke``: minutes).
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
from deqjax import harness, models, regularization, training

if __package__:  # python -m experiments.<name>, or imported as experiments.<name>
    from experiments.parts import scalar_deq_figure, seed_medians, stacked_runs
else:  # python experiments/<name>.py: this folder is the first entry of sys.path
    from parts import scalar_deq_figure, seed_medians, stacked_runs

MODEL = models.ScalarDEQ(hidden=50)
ADAPTIVE = {
    "lower_ratio": 0.6,
    "increase": 1.01,
    "decrease": 0.995,
    "min_gamma": 0.05,
    "max_gamma": 20.0,
    "smoothing": 0.9,
    "init_gamma": 1.0,
}
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


@dataclasses.dataclass(frozen=True)
class Config:
    """The runs: JR strengths, seeds, training length, data size."""

    num_seeds: harness.PositiveInt = 5  # seeds per setting
    epochs: harness.PositiveInt = 50  # training epochs per run
    lr: harness.PositiveFloat = 1e-2  # peak Adam learning rate
    gammas: tuple[float, ...] = (0.0, 1.0, 2.0, 4.0)  # fixed JR strengths gamma to compare
    no_adaptive: harness.Switch = False  # skip the adaptive-γ run
    nfe_target: float = 8.0  # NFE the adaptive run aims at
    p: float = 0.4  # Bernoulli gate probability of JR
    n_train: harness.PositiveInt = 4096  # training examples
    n_val: harness.PositiveInt = 1000  # validation examples
    run: harness.ResumableRunConfig = harness.ResumableRunConfig()


def setup(c: Config):
    names = [f"gamma={g:g}" for g in c.gammas] + ([] if c.no_adaptive else ["adaptive"])
    extra = {"settings": Settings(), "adaptive_gamma": ADAPTIVE, "runs": names}
    extra |= {"seeds": [c.run.seed + i for i in range(c.num_seeds)], "jax": jax.__version__}
    return (Settings(), stacked_runs.StackedRuns(tuple(names))), extra


def train(c: Config, s: Settings, runs: stacked_runs.StackedRuns, seed: int, ctx):
    """Trains every run of one seed through ``fit``; returns the stacked params and the records."""
    xt, yt, _, _ = models.jr_synthetic_data(seed, c.n_train, c.n_val)
    regularizer = regularization.JacobianRegularizer(0.0, p=c.p, num_samples=s.num_samples)
    adjoint = dq.ImplicitAdjoint(solver=s.backward)
    forward = s.forward.replace(batch_ndim=1)

    def run_loss(params, batch, key, ctrl, step):  # one run's; ctrl: its controller state
        xb, yb = batch["x"], batch["y"]
        z0 = jnp.zeros(xb.shape, jnp.float32)
        z, sol = dq.fixed_point(MODEL.batch_cell, params, xb, z0, solver=forward, adjoint=adjoint)
        mse = jnp.mean((z - yb) ** 2)
        f = lambda zz: MODEL.batch_cell(params, xb, zz)  # noqa: E731
        jr, metrics = regularizer.penalty(f, z, key, gamma=ctrl.gamma)
        mon = MODEL.solve(params, xb, s.monitor)
        slope = jnp.mean(jnp.abs(MODEL.slope(jax.lax.stop_gradient(params), xb, mon.value)))
        metrics |= {"mse": mse, "fwd_residual": jnp.mean(sol.abs_residual), "slope": slope}
        metrics["fwd_nfe"] = jnp.mean(sol.num_steps.astype(jnp.float32))
        metrics["monitor_nfe"] = jnp.mean(mon.num_steps.astype(jnp.float32))
        return mse + jr, metrics

    adaptive = jnp.asarray([n == "adaptive" for n in runs.names])
    controller = regularization.AdaptiveGamma(target=c.nfe_target, **ADAPTIVE)

    def update_ctrl(ctrl, metrics, step):
        nfe = jnp.stack([metrics[f"monitor_nfe/{n}"] for n in runs.names])
        new = jax.vmap(controller.update)(ctrl, nfe)  # the fixed runs track the signal only
        return new._replace(gamma=jnp.where(adaptive, new.gamma, ctrl.gamma))

    gammas = list(c.gammas) + [ADAPTIVE["init_gamma"]] * (not c.no_adaptive)
    ctrl = runs.stack(controller.init())._replace(gamma=jnp.asarray(gammas, jnp.float32))
    it = dq.data.ShuffledBatches({"x": xt, "y": yt}, batch_size=s.batch_size, seed=seed + 1)
    total = it.steps_per_epoch * c.epochs
    name, folder = f"seed{seed}", os.path.abspath(ctx.path(f"ckpt/seed{seed}"))
    schedule = optax.cosine_decay_schedule(c.lr, total)
    # Each run's own gradient; a non-finite update skipped (GuardNonFinite stops a streak).
    loss_fn = runs.summed_loss(run_loss, (0, None, None, 0, None))
    opt = training.skip_nonfinite(optax.adam(schedule))
    pair = training.train_step(loss_fn, opt, update_reg_state=update_ctrl, per_device_rng=False)
    params = runs.stack(MODEL.init(jax.random.fold_in(jax.random.PRNGKey(seed), 0)))
    policy = ctx.policy(name, checkpoint_dir=folder)  # resumed only if this seed had started
    result = training.fit(
        pair,
        pair.init(params, jax.random.PRNGKey(seed), reg_state=ctrl),
        it,
        num_steps=total,
        parallel=ctx.data_parallel,
        actions=c.run.actions(log_every=1),
        checkpoints=training.Checkpoints(folder, config=ctx.config),
        policy=policy,
        writers=c.run.writers(ctx, name),
        say=ctx.print,
        run_dir=ctx.out_dir,
        desc=f"synthetic_1d seed {seed}",
    )
    train = [r for r in result.history if r["split"] == "train"]
    keys = ("monitor_nfe", "slope", "jr/gamma", "mse", "fwd_nfe", "fwd_residual")
    return result.state.params, {k.replace("/", "_"): runs.history(train, k) for k in keys}


def evaluate(
    c: Config, s: Settings, runs: stacked_runs.StackedRuns, seed: int, params
) -> list[dict]:
    """The Fig. 5 table (``dq.models.jr_fig5_metrics``) of every run on the validation set."""
    _, _, xv, yv = map(jnp.asarray, models.jr_synthetic_data(seed, c.n_train, c.n_val))
    fig5 = {k: v for k, v in vars(s).items() if k not in ("batch_size", "num_samples", "monitor")}
    one = jax.jit(lambda p: models.jr_fig5_metrics(MODEL, p, xv, yv, **fig5))
    return [
        {"run": name} | {k: float(v) for k, v in jax.device_get(one(p)).items()}
        for name, p in runs.unstack(params).items()
    ]


def plot(
    c: Config, s: Settings, runs: stacked_runs.StackedRuns, params, history: dict, ctx
) -> None:
    """Fig. 5 per run, and the monitoring NFE, slope (moving averages) and γ per training step."""
    scalar_deq_figure.plot_jr_fig5(
        MODEL, runs.unstack(params), ctx.path("fig5.png"), solver=s.tight
    )
    nfe, slope = "fixed-point NFE to 1e-3\n(moving avg)", "mean |∂f/∂z| at z*"
    panels = {nfe: runs.curves(history["monitor_nfe"]), slope: runs.curves(history["slope"])}
    harness.plot_panels(
        ctx.path("adaptive_gamma.png"),
        panels | {"γ": runs.curves(history["jr_gamma"])},
        xlabel="training step",
        styles={"adaptive": {"lw": 2.0, "color": "k"}},
        hlines={nfe: (c.nfe_target, "NFE target")},
        moving_average={nfe: 64, slope: 64},
    )


def run(c: Config, inputs, ctx) -> dict:
    s, runs = inputs
    per_seed = []
    for seed in ctx.config["seeds"]:
        params, history = train(c, s, runs, seed, ctx)
        rows, final = evaluate(c, s, runs, seed, params), history["jr_gamma"][-1]
        per_seed.append([r | {"seed": seed, "final_gamma": float(g)} for r, g in zip(rows, final)])
        if seed == c.run.seed:
            np.savez(ctx.path("history.npz"), names=np.asarray(runs.names), **history)
            plot(c, s, runs, params, history, ctx)
    every = [r for rows in per_seed for r in rows]
    harness.write_csv(ctx.path("results.csv"), every)
    medians = seed_medians.median_rows(every, by=("run",))
    md = f"Median over seeds {ctx.config['seeds']}:\n\n" + harness.markdown_table(medians)
    ctx.write_text("results.md", md + "\n")
    print(md)
    return {"medians": medians, "per_seed": per_seed}


EXPERIMENT = harness.Experiment(
    name="synthetic_1d",
    doc=__doc__,
    config=Config(),
    setup=setup,
    run=run,
    smoke={"epochs": 2, "n_train": 512, "n_val": 200, "num_seeds": 1},
    safe_on_resume=("num_seeds",),
    outputs=("results.csv", "results.md", "history.npz", "fig5.png", "adaptive_gamma.png"),
)
main = functools.partial(harness.run, EXPERIMENT)  # main(argv=None) -> results

if __name__ == "__main__":
    main()
