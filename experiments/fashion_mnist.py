"""Main job: a fully connected DEQ on Fashion-MNIST (init paper §4.1) and its init sweep (Fig. 5).

Model: ``dq.models.MLPClassifier`` (flatten → DEQ(``MLPCell``) → dense logits), Anderson forward,
implicit backward (DEQ paper Thm 1), Haar-orthogonal recurrent weights (``--init``). Training: Adam
and the Bernoulli-gated JR ``τ γ ‖J_f(z*)‖²_F / d`` (JR paper Eq. 4), optionally adaptive ``γ``.

Logged every ``--log_every`` steps (JSONL + progress bar): loss, cross entropy, accuracy, the
forward solve's ``dq.solvers.summarize`` (NFE, residuals, ``*_max``, converged fraction), JR term
and ``γ``; every ``--diagnostics_every`` steps the backward-solve residual, a Hutchinson
``‖J_f(z*)‖_F`` and the power-method ``ρ(J_f(z*))``; at every epoch end the test metrics. Outputs
in ``--out_dir`` (default ``runs/fashion_mnist``): ``config.json``, ``metrics.jsonl``, ``ckpt/``,
``curves.png``, ``results.json`` (the shared runner, ``dq.training.run``: ``--resume``,
``--overwrite``, ``--force``; exit 2 on bad flags or data, 3 on a non-finite stop, 143 on SIGTERM).

``--sweep``: the init paper's Fig. 5 at reduced cost (test error vs init scale, Gaussian /
orthogonal / GOE, several seeds): ``sweep.csv``, ``sweep_summary.csv``, ``sweep.png``.

Usage:
  python experiments/fashion_mnist.py                       # the main job (README's first command)
  python experiments/fashion_mnist.py --epochs 1 --no_jr    # quicker, no Jacobian regularisation
  python experiments/fashion_mnist.py --resume              # continue a killed run
  python experiments/fashion_mnist.py --sweep               # Fig. 5 at reduced cost
  python experiments/fashion_mnist.py --smoke --dataset digits   # 1-3 minutes; used by tests
"""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp

import deqjax as dq
from deqjax import data, training
from deqjax.training import nonnegative_float, nonnegative_int, positive_int

CURVES = ("loss", "accuracy", "nfe", "rel_residual", "rel_residual_max", "jr/penalty", "jr/gamma",
          "bwd_rel_residual", "jac_frobenius", "spectral_radius", "skipped_updates")  # fmt: skip
SMOKE = dict(width=32, max_steps=8, bwd_max_steps=8, diag_power_steps=5, batch_size=32, steps=40)
SMOKE |= dict(eval_batch_size=128, lr=1e-2, warmup_steps=0, train_size=640, test_size=128)
SMOKE |= dict(log_every=10, diagnostics_every=20, checkpoint_every=20, sweep_scales="0.5,1.5")
SMOKE |= dict(sweep_seeds="0", sweep_families="gaussian,orthogonal")
SWEEP = dict(jr=False, train_size=20000, test_size=5000, epochs=2, log_every=20)
SAFE_ON_RESUME = ("epochs", "steps", "num_steps", "log_every", "eval_every", "eval_batch_size",
                  "devices", "diagnostics_every", "diag_power_steps", "checkpoint_every",
                  "keep_checkpoints", "max_nonfinite_steps")  # fmt: skip


def add_flags(p) -> None:
    g = p.add_argument_group("data")
    g.add_argument("--dataset", default="fashion_mnist", choices=("fashion_mnist", "digits"),
                   help="Fashion-MNIST idx files, or sklearn's 8x8 digits")  # fmt: skip
    g.add_argument("--data_dir", help="idx folder (default /usr/share/datasets/fashion-mnist/)")
    g.add_argument("--train_size", type=nonnegative_int, default=0, help="subset (0: all)")
    g.add_argument("--test_size", type=nonnegative_int, default=0, help="subset (0: all)")
    g = p.add_argument_group("model")
    g.add_argument("--width", type=positive_int, default=128, help="DEQ state size D")
    g.add_argument("--hidden", type=nonnegative_int, default=0, help="cell hidden size (0: D)")
    g.add_argument("--cell_form", default="resnet", choices=("resnet", "single"),
                   help="resnet: init paper 4.1; single: phi(W z + U x)")  # fmt: skip
    g.add_argument("--init", default="orthogonal", choices=sorted(dq.models.INIT_FAMILIES),
                   help="family of the recurrent weights")  # fmt: skip
    g.add_argument("--init_scale", type=nonnegative_float, default=1.0, help="recurrent sigma")
    g.add_argument("--diag_power_steps", type=positive_int, default=30, help="rho(J) iterations")
    training.add_solver_flags(p)
    training.add_jr_flags(p)
    training.add_optimization_flags(p, epochs=4, lr=2e-3, warmup_steps=100)
    training.add_logging_flags(p)
    g = p.add_argument_group("init sweep (init paper Fig. 5)")
    g.add_argument("--sweep", action="store_true", help="the Fig. 5 sweep instead of one run")
    g.add_argument("--sweep_families", default="gaussian,orthogonal,goe", help="comma-separated")
    g.add_argument("--sweep_scales", default="0.25,0.5,1,2,4,8", help="comma-separated scales")
    g.add_argument("--sweep_seeds", default="0,1,2", help="comma-separated seeds per point")


def check(args) -> str | None:
    if args.dataset == "digits" and args.data_dir is not None:
        return "--data_dir is only read with --dataset fashion_mnist (digits are bundled)."
    if args.sweep and (args.resume or args.adaptive_gamma):
        return "--resume and --adaptive_gamma are not supported with --sweep."
    bad = set(args.sweep_families.split(",")) - set(dq.models.INIT_FAMILIES)
    return f"--sweep_families: unknown {sorted(bad)}" if args.sweep and bad else None


def model_fns(args, family: str, scale: float) -> dq.models.ClassifierFns:
    """The classifier's pure functions; only ``init`` depends on ``family`` and ``scale``."""
    solver, adjoint = training.solvers_from_flags(args)
    w_init = dq.models.recurrent_init(family, scale)
    model = functools.partial(dq.models.MLPClassifier, args.width, hidden=args.hidden or None,
                              cell_form=args.cell_form, w_init=w_init, solver=solver,
                              adjoint=adjoint)  # fmt: skip
    reg, _ = training.jr_from_flags(args)
    return dq.models.classifier_fns(
        model, regularizer=reg, backward_solver=training.backward_solver_from_flags(args),
        diag_power_steps=args.diag_power_steps)  # fmt: skip


def setup(args):
    sizes = {"train_size": args.train_size, "test_size": args.test_size, "seed": args.seed}
    train, test, source = data.load_classification(args.dataset, data_dir=args.data_dir, **sizes)
    num_steps = training.num_steps_from_flags(args, train["label"].shape[0] // args.batch_size)
    solver, adjoint = training.solvers_from_flags(args)
    extra = {"data_source": source, "devices": jax.device_count(), "num_steps": num_steps}
    return (train, test, source), extra | {"solver": solver, "adjoint": adjoint}


def run(args, inputs, ctx):
    if args.sweep:
        return sweep(args, inputs, ctx)
    (train, test, source), num_steps = inputs, ctx.config["num_steps"]
    fns = model_fns(args, args.init, args.init_scale)
    _, ctrl = training.jr_from_flags(args)
    schedule, opt = training.optimizer_from_flags(args, num_steps)

    def loss_fn(params, batch, key, reg_state, step):
        gamma = reg_state.gamma if ctrl is not None else jnp.asarray(args.gamma, jnp.float32)
        return fns.loss(params, batch["image"], batch["label"], key, gamma, step)

    def diagnostics_fn(params, batch, key, reg_state):
        return fns.diagnostics(params, batch["image"], batch["label"], key)

    sizes = f"train {train['label'].shape[0]}, test {test['label'].shape[0]}"
    ctx.print(f"data: {source}; {sizes}; {num_steps} steps of batch {args.batch_size} on "
              f"{jax.device_count()} device(s)")  # fmt: skip
    t0 = time.perf_counter()
    result = training.fit(
        params=fns.init(jax.random.PRNGKey(args.seed), jnp.asarray(train["image"][:1])),
        loss_fn=loss_fn, optimizer=opt, learning_rate_fn=schedule, num_steps=num_steps,
        train_data=data.ShuffledBatches(train, batch_size=args.batch_size, seed=args.seed),
        rng=jax.random.PRNGKey(args.seed), per_device_rng=False,  # one JR coin per global batch
        reg_state=ctrl.init() if ctrl else (),
        update_reg_state=(lambda rs, m, s: ctrl.update(rs, m["rel_residual"])) if ctrl else None,
        eval_fn=lambda p, b: fns.evaluate(p, b["image"], b["label"]), eval_data=test,
        diagnostics_fn=diagnostics_fn if args.diagnostics_every else None, desc=args.dataset,
        **training.fit_kwargs_from_flags(args), **ctx.fit_kwargs())  # fmt: skip
    final = ([{}] + [r for r in result.history if r["split"] == "eval"])[-1]
    out = {"data_source": source, "num_steps": num_steps, "final_step": int(result.state.step),
           "interrupted": result.interrupted, "restored_step": result.restored_step,
           "test": final, "wall_seconds": time.perf_counter() - t0}  # fmt: skip
    out["curves_png"] = ctx.plot_metrics(metrics=CURVES, title=f"DEQ on {args.dataset} ({source})")
    if result.interrupted:
        ctx.print(f"interrupted by SIGTERM at step {out['final_step']} of {num_steps}: checkpoint "
                  f"saved; continue with --resume. Outputs so far in {ctx.out_dir}")  # fmt: skip
    elif final:
        f = lambda k, spec: training.format_value(final.get(k, float("nan")), spec)  # noqa: E731
        ctx.print(f"final test accuracy {f('accuracy', '.4f')}, NFE {f('nfe', '.2f')}, rel "
                  f"residual {f('rel_residual', '.2e')} (max {f('rel_residual_max', '.2e')}); "
                  f"wall {out['wall_seconds']:.1f} s; outputs in {ctx.out_dir}")  # fmt: skip
    return out


def sweep(args, inputs, ctx):
    """Test error vs init scale per family and seed; one compiled step reused by every run."""
    (train, test, source), num_steps = inputs, ctx.config["num_steps"]
    split = lambda text, kind: [kind(v) for v in text.split(",") if v.strip()]  # noqa: E731
    seeds = split(args.sweep_seeds, int)
    runs = [dict(family=f, scale=s, seed=seed) for f in split(args.sweep_families, str)
            for s in split(args.sweep_scales, float) for seed in seeds]  # fmt: skip
    fns, gamma = model_fns(args, "orthogonal", 1.0), jnp.asarray(args.gamma, jnp.float32)
    first = jnp.asarray(train["image"][:1])
    rows = training.short_runs(
        runs, init=lambda family, scale, seed: model_fns(args, family, scale).init(
            jax.random.PRNGKey(seed), first),
        loss_fn=lambda p, b, k, rs, s: fns.loss(p, b["image"], b["label"], k, gamma, s),
        optimizer=training.optimizer_from_flags(args, num_steps)[1], train=train, test=test,
        eval_fn=lambda p, b: fns.evaluate(p, b["image"], b["label"]), num_steps=num_steps,
        batch_size=args.batch_size, eval_batch_size=args.eval_batch_size,
        log_every=args.log_every, progress=args.progress, print_fn=ctx.print)  # fmt: skip
    summary = training.summarize_runs(rows, ("family", "scale"), "test_error")
    training.write_csv(ctx.path("sweep.csv"), rows)
    training.write_csv(ctx.path("sweep_summary.csv"), summary)
    title = f"{source}: {num_steps} steps, {len(seeds)} seed(s)"
    png = training.plot_sweep(summary, ctx.path("sweep.png"), title=title)
    print(training.markdown_table(summary))
    return {"data_source": source, "num_steps": num_steps, "runs": rows, "summary": summary,
            "png": png}  # fmt: skip


EXPERIMENT = training.Experiment(
    name="fashion_mnist",
    doc=__doc__,
    add_flags=add_flags,
    setup=setup,
    run=run,
    check=check,
    smoke=SMOKE,
    modes={"sweep": SWEEP},
    safe_on_resume=SAFE_ON_RESUME,
    distributed=True,
    outputs=("curves.png", "sweep.csv", "sweep_summary.csv", "sweep.png", "sweep.json"),
)


main = functools.partial(training.run, EXPERIMENT)  # main(argv=None) -> results


if __name__ == "__main__":
    main()
