"""Main job: a fully connected DEQ on Fashion-MNIST (init paper §4.1) and its init sweep (Fig. 5).

Model: ``dq.models.MLPClassifier`` (flatten → DEQ(``MLPCell``) → dense logits), Anderson forward,
implicit backward (DEQ paper Thm 1), Haar-orthogonal recurrent weights (``--init``). Training: Adam
and the Bernoulli-gated JR ``τ γ ‖J_f(z*)‖²_F / d`` (JR paper Eq. 4), optionally adaptive ``γ``.

Logged every ``--log_every`` steps (JSONL, TensorBoard, progress bar): loss, cross entropy,
accuracy, the forward solve's ``dq.solvers.summarize`` (NFE, residuals, ``*_max``, converged
fraction), JR term and ``γ``; every ``--diagnostics_every`` steps the backward-solve residual, a
Hutchinson ``‖J_f(z*)‖_F`` and the power-method ``ρ(J_f(z*))``; at every epoch end the test
metrics. Outputs in ``--out_dir`` (default ``runs/fashion_mnist``): ``config.json``,
``metrics.jsonl``, ``tensorboard/`` (``--no_tensorboard``: none), ``ckpt/``, ``curves.png``,
``results.json``, with ``--profile_steps A:B`` a profiler trace in ``profile/`` (the shared runner,
``dq.harness.run``: ``--resume``, ``--overwrite``, ``--force``; exit 2 on bad flags or data, 3 on a
non-finite stop, 143 on SIGTERM). ``--input grain`` reads the same batches through grain.
``--framework nnx`` (or ``equinox``) trains the same classifier written in Flax NNX
(``dq.nnx.MLPClassifier``) or Equinox (``dq.equinox.MLPClassifier``) instead of Haiku.

``--sweep``: the init paper's Fig. 5 at reduced cost (test error vs init scale, Gaussian /
orthogonal / GOE, several seeds): ``sweep.csv``, ``sweep_summary.csv``, ``sweep.png``.

``--dtype bfloat16`` (or ``float16``) computes the model in that dtype with float32 parameters and
optimizer state (a jmp policy; float16 with a static loss scale); ``--tol`` and ``--bwd_tol``
not given take a tolerance the dtype resolves (bfloat16: 0.01; said at the start, recorded in
``config.json``), and one given below it is refused.

Usage:
  python experiments/fashion_mnist.py                       # the main job (README's first command)
  python experiments/fashion_mnist.py --dtype bfloat16      # at --tol 1e-2 --bwd_tol 1e-2
  python experiments/fashion_mnist.py --epochs 1 --no_jr    # quicker, no Jacobian regularisation
  python experiments/fashion_mnist.py --resume              # continue a killed run
  python experiments/fashion_mnist.py --input grain --profile_steps 100:102
  python experiments/fashion_mnist.py --framework nnx       # or equinox: the same model
  python experiments/fashion_mnist.py --sweep               # Fig. 5 at reduced cost
  python experiments/fashion_mnist.py --smoke --dataset digits   # 1-3 minutes; used by tests
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import time
from typing import Literal

import jax
import jax.numpy as jnp

from deqjax import data, harness, training

if __package__:  # python -m experiments.<name>, or imported as experiments.<name>
    from experiments.parts import init_sweep, mlp_classifier_config, short_runs
else:  # python experiments/<name>.py: this folder is the first entry of sys.path
    from parts import init_sweep, mlp_classifier_config, short_runs

SMOKE = {
    "width": 32,
    "max_steps": 8,
    "bwd_max_steps": 8,
    "diag_power_steps": 5,
    "batch_size": 32,
    "steps": 40,
    "eval_batch_size": 128,
    "lr": 1e-2,
    "warmup_steps": 0,
    "train_size": 640,
    "test_size": 128,
    "log_every": 10,
    "diagnostics_every": 20,
    "checkpoint_every": 20,
    "sweep_scales": (0.5, 1.5),
    "sweep_seeds": (0,),
    "sweep_families": ("gaussian", "orthogonal"),
}
SWEEP = {"jr": False, "train_size": 20000, "test_size": 5000, "epochs": 2, "log_every": 20}


@dataclasses.dataclass(frozen=True)
class Config:
    """The main job: data, model, solvers, JR, optimisation, logging, the init sweep."""

    dataset: Literal["fashion_mnist", "digits"] = "fashion_mnist"  # or sklearn's 8x8 digits
    data_dir: str | None = None  # idx folder (default /usr/share/datasets/fashion-mnist)
    train_size: harness.NonNegativeInt = 0  # training subset (0: all)
    test_size: harness.NonNegativeInt = 0  # test subset (0: all)
    input: Literal["arrays", "grain"] = "arrays"
    """training batches from the arrays in memory, or the same batches read through grain"""
    device_resident: bool = True
    """train (--input arrays) and test sets placed on the devices once where they fit
    (--no_device_resident: batch by batch)"""
    model: mlp_classifier_config.MLPClassifierConfig = mlp_classifier_config.MLPClassifierConfig()
    solver: harness.SolverConfig = harness.SolverConfig()
    compute: harness.DtypeConfig = harness.DtypeConfig()
    regularization: harness.JRConfig = harness.JRConfig()
    optimization: harness.OptimizationConfig = harness.OptimizationConfig(
        epochs=4, lr=2e-3, warmup_steps=100
    )
    logging: harness.LoggingConfig = harness.LoggingConfig()
    init_sweep: init_sweep.InitSweepConfig = init_sweep.InitSweepConfig()
    run: harness.ResumableRunConfig = harness.ResumableRunConfig()
    multihost: harness.MultiHostConfig = harness.MultiHostConfig()


def check(c: Config) -> str | None:
    if c.dataset == "digits" and c.data_dir is not None:
        return "--data_dir is only read with --dataset fashion_mnist (digits are bundled)."
    if c.init_sweep.sweep and (c.run.resume or c.regularization.adaptive_gamma):
        return "--resume and --adaptive_gamma are not supported with --sweep."
    refusal = c.model.dtype_refusal(c.compute)
    return refusal or c.compute.check_tol(tol=c.solver.tol, bwd_tol=c.solver.bwd_tol)


def setup(c: Config):
    sizes = {"train_size": c.train_size, "test_size": c.test_size, "seed": c.run.seed}
    train, test, source = data.load_classification(c.dataset, data_dir=c.data_dir, **sizes)
    num_steps = c.optimization.num_steps(train["label"].shape[0] // c.optimization.batch_size)
    solver, adjoint = c.solver.solver_and_adjoint()
    extra = {"data_source": source, "devices": jax.device_count(), "num_steps": num_steps}
    return (train, test, source), extra | {"solver": solver, "adjoint": adjoint}


@contextlib.contextmanager
def train_batches(c: Config, train, parallel, say):
    """The training batches of ``--input``: the arrays shuffled per epoch (on the devices with
    ``--device_resident`` where they fit), or the same batches read through grain (its reading
    threads stopped on exit)."""
    batch_size, seed = c.optimization.batch_size, c.run.seed
    if c.input == "grain":
        batches = data.grain_shuffled_batches(train, batch_size=batch_size, seed=seed)
        with contextlib.closing(batches):
            yield batches
        return
    batches = data.ShuffledBatches(train, batch_size=batch_size, seed=seed)
    yield training.resident_if_fits(batches, parallel, say) if c.device_resident else batches


def run(c: Config, inputs, ctx):
    if c.init_sweep.sweep:
        return sweep(c, inputs, ctx)
    (train, test, source), num_steps = inputs, ctx.config["num_steps"]
    fns = c.model.fns(c.solver, c.regularization, compute=c.compute)
    _, ctrl = c.regularization.build(c.solver.tol)
    on_batches = mlp_classifier_config.batch_fns(fns, c.regularization.gamma, ctrl)
    schedule, opt = c.optimization.optimizer(num_steps)
    sizes = f"train {train['label'].shape[0]}, test {test['label'].shape[0]}"
    batch_size, parallel = c.optimization.batch_size, ctx.data_parallel
    ctx.print(
        f"data: {source}; {sizes}; {num_steps} steps of batch {batch_size} on "
        f"{jax.device_count()} device(s)"
    )
    t0 = time.perf_counter()
    pair = training.train_step(
        on_batches.loss,
        training.skip_nonfinite(opt),  # a non-finite update is skipped (GuardNonFinite stops)
        update_reg_state=(lambda rs, m, s: ctrl.update(rs, m["rel_residual"])) if ctrl else None,
        learning_rate_fn=schedule,
        per_device_rng=False,  # one JR coin per global batch
        loss_scale=c.compute.loss_scale(),
    )
    # One compiled program (an eager init compiles each of its operations on its own).
    params = jax.jit(fns.init)(jax.random.PRNGKey(c.run.seed), jnp.asarray(train["image"][:1]))
    state = pair.init(params, jax.random.PRNGKey(c.run.seed), reg_state=ctrl.init() if ctrl else ())
    evaluate = c.logging.evaluate(
        on_batches.evaluate,
        test,
        batch_size=c.optimization.eval_batch_size,
        resident=c.device_resident,
    )
    actions = c.run.actions(  # records, non-finite guard, ..., SIGTERM, progress bar
        *c.logging.diagnostics(on_batches.diagnostics),
        evaluate,
        log_every=c.logging.log_every,
        max_nonfinite_steps=c.optimization.max_nonfinite_steps,
    )
    with train_batches(c, train, parallel, ctx.print) as batches:
        result = training.fit(
            pair,
            state,
            batches,
            num_steps=num_steps,
            parallel=parallel,
            actions=actions,
            checkpoints=c.logging.checkpoints(ctx.checkpoint_dir(), config=ctx.config),
            policy=ctx.policy(),
            writers=c.run.writers(ctx),  # metrics.jsonl, TensorBoard, W&B
            say=ctx.print,
            run_dir=ctx.out_dir,
            desc=c.dataset,
        )
    final = last_eval(result, ctx)
    out = {"data_source": source, "num_steps": num_steps, "final_step": int(result.state.step)}
    out |= {"interrupted": result.interrupted, "restored_step": result.restored_step}
    out |= {"test": final, "wall_seconds": time.perf_counter() - t0}
    out["curves_png"] = ctx.plot_metrics(
        metrics=c.model.CURVES, title=f"DEQ on {c.dataset} ({source})"
    )
    if final and not result.interrupted:  # the runner reports an interrupted run
        f = lambda k, spec: harness.format_value(final.get(k, float("nan")), spec)  # noqa: E731
        ctx.print(
            f"final test accuracy {f('accuracy', '.4f')}, NFE {f('nfe', '.2f')}, rel residual "
            f"{f('rel_residual', '.2e')} (max {f('rel_residual_max', '.2e')}); wall "
            f"{out['wall_seconds']:.1f} s; outputs in {ctx.out_dir}"
        )
    return out


def last_eval(result: training.FitResult, ctx) -> dict:
    """The run's last evaluation: this call's, or (a finished run resumed, which did nothing
    more) the one its metrics file holds; ``{}`` if none."""
    evals = [r for r in result.history if r["split"] == "eval"]
    if not evals and ctx.is_main and os.path.exists(ctx.metrics_path()):
        evals = [r for r in training.read_jsonl(ctx.metrics_path()) if r["split"] == "eval"]
    return evals[-1] if evals else {}


def sweep(c: Config, inputs, ctx):
    """Test error vs init scale per family and seed; one compiled step reused by every run."""
    (train, test, source), num_steps = inputs, ctx.config["num_steps"]
    fns = c.model.fns(c.solver, c.regularization, compute=c.compute)
    on_batches = mlp_classifier_config.batch_fns(fns, c.regularization.gamma)
    first = jnp.asarray(train["image"][:1])

    def init(family, scale, seed):
        kw = {"family": family, "scale": scale, "compute": c.compute}
        run_fns = c.model.fns(c.solver, c.regularization, **kw)
        return run_fns.init(jax.random.PRNGKey(seed), first)

    rows = short_runs.short_runs(
        c.init_sweep.runs(),
        init=init,
        loss_fn=on_batches.loss,
        optimizer=c.optimization.optimizer(num_steps)[1],
        train=train,
        test=test,
        eval_fn=on_batches.evaluate,
        num_steps=num_steps,
        batch_size=c.optimization.batch_size,
        eval_batch_size=c.optimization.eval_batch_size,
        log_every=c.logging.log_every,
        progress=c.run.progress,
        parallel=ctx.data_parallel,
        device_resident=c.device_resident,
        print_fn=ctx.print,
    )
    title = f"{source}: {num_steps} steps, {len(c.init_sweep.sweep_seeds)} seed(s)"
    summary = init_sweep.report_sweep(rows, ctx.out_dir, title=title)
    out = {"data_source": source, "num_steps": num_steps, "runs": rows, "summary": summary}
    return out | {"png": ctx.path("sweep.png")}


EXPERIMENT = harness.Experiment(
    name="fashion_mnist",
    doc=__doc__,
    config=Config(),
    setup=setup,
    run=run,
    check=check,
    smoke=SMOKE,
    modes={"sweep": SWEEP},
    # and the sections' (logging, steps, ...); where the data lives changes no number
    safe_on_resume=("num_steps", "devices", "device_resident"),
    outputs=("curves.png", "sweep.csv", "sweep_summary.csv", "sweep.png", "sweep.json"),
)
main = functools.partial(harness.run, EXPERIMENT)  # main(argv=None) -> results

if __name__ == "__main__":
    main()
