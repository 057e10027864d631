"""MDEQ classifier with Jacobian regularisation: a small-scale JR paper Table 3 (γ × inference NFE).

Model: ``dq.models.MDEQClassifier`` (JR App. A.3 / Table 4, scaled down for a CPU; its options
below: ``parts/mdeq_config.py``). Adam, cosine decay, ``--clip``; the JR penalty ``γ ||J_f(z*)||²_F
/ d`` (Eq. 4, one Hutchinson sample, Bernoulli gate ``--jr_p``). Training runs through
``dq.training.fit`` (``metrics_gamma<γ>.jsonl``, checkpoints, ``--resume``).

One model per ``γ`` in ``--gammas``, evaluated at every budget in ``--budgets``
(``dq.models.budget_solver``: Anderson with ``max_steps = b``; the head reads ``f(z_best)``, so a
prediction depends on ``≤ b`` cell evaluations; ``b = 1`` reads ``f(z0)``): test accuracy, NFE
(``≤ b``), readout residual ``||f(z) - z|| / ||f(z)||`` (1 at ``b = 1``), images/s: ``table.md``,
``accuracy_vs_budget.png``, ``results.json``. Data: CIFAR-10 (``--data_dir`` or TFDS); offline
Fashion-MNIST padded to 32×32×3 (``STAND-IN``).

Usage:
  python -m experiments.cifar10_mdeq --smoke
  python -m experiments.cifar10_mdeq           # default: γ ∈ {0, 0.5}, ~6–12 min on 2 CPU cores
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import optax

from deqjax import data, harness, training
from deqjax.harness import NonNegativeInt, PositiveFloat, PositiveInt

if __package__:  # python -m experiments.<name>, or imported as experiments.<name>
    from experiments.parts import mdeq_config
else:  # python experiments/<name>.py: this folder is the first entry of sys.path
    from parts import mdeq_config

KEYS = ("ce", "acc", "jac", "nfe", "residual")  # the training metrics reported
SMOKE = {
    "steps": 2,
    "batch_size": 4,
    "train_size": 64,
    "test_size": 16,
    "eval_batch_size": 16,
    "gammas": (0.0, 1.0),
    "budgets": (1, 3),
    "log_every": 0,
}


@dataclasses.dataclass(frozen=True)
class Config:
    """The JR strengths and inference budgets compared, the training, the model."""

    # The batch the devices share (the runner refuses one they do not divide).
    SPLIT_OVER_DEVICES: ClassVar[tuple[str, ...]] = ("batch_size",)

    data_dir: str | None = None  # directory holding cifar-10-batches-py
    gammas: harness.FloatList = (0.0, 0.5)  # JR strengths, one model each
    budgets: harness.IntList = (1, 2, 4, 8, 16)  # inference budgets (cell evaluations)
    steps: PositiveInt = 300  # training steps
    batch_size: PositiveInt = 64  # training batch size
    eval_batch_size: PositiveInt = 500  # evaluation batch size
    train_size: PositiveInt = 60000  # training images used
    test_size: PositiveInt = 1000  # test images evaluated
    learning_rate: PositiveFloat = 3e-3  # peak learning rate
    clip: PositiveFloat = 1.0  # global gradient-norm clip
    augment: bool = False  # random crop + flip (JR App. A.3)
    log_every: NonNegativeInt = 100  # steps between printed records (0: none)
    model: mdeq_config.MDEQConfig = mdeq_config.MDEQConfig()
    run: harness.ResumableRunConfig = harness.ResumableRunConfig()


def setup(c: Config):
    if min(c.budgets) < 1:
        raise harness.UsageError(f"--budgets: every budget must be >= 1, got {c.budgets}")
    ds = data.load_image_dataset("cifar10", data_dir=c.data_dir, allow_standin=True)
    print(f"data source: {ds.source}")
    sample = ds.train["image"][:10000].astype(np.float32) / 255.0  # standardisation constants
    stats = (float(sample.mean()), float(sample.std()) + 1e-6)
    return (ds, stats), {"data_source": ds.source, "is_standin": ds.is_standin}


def train_one(gamma: float, c: Config, inputs, ctx) -> dict:
    """Trains one model with JR strength ``gamma``; evaluates it at every budget."""
    ds, (mean, std) = inputs
    model = c.model.transform(gamma, max(c.budgets))
    n = min(c.train_size, ds.train["label"].shape[0])
    train = {k: ds.train[k][:n] for k in ("image", "label")}
    init = jax.jit(c.model.transform(gamma, 1).init, static_argnums=2)  # no solve at init
    standardised = (train["image"][:2] / 255.0 - mean) / std  # the images init sees
    schedule = optax.cosine_decay_schedule(c.learning_rate, max(c.steps, 1))

    def loss_fn(params, batch, key, reg_state, step):
        k_aug, k_model = jax.random.split(key)
        images = batch["image"].astype(jnp.float32)
        images = data.random_crop_flip(k_aug, images) if c.augment else images
        logits, aux = model.apply(params, k_model, (images / 255.0 - mean) / std, True)
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()
        acc = jnp.mean((jnp.argmax(logits, -1) == batch["label"]).astype(jnp.float32))
        metrics = {"ce": ce, "acc": acc, "jac": aux["jr/frobenius_sq"], "nfe": aux["solver"]["nfe"]}
        return ce + aux["jr"], metrics | {"residual": jnp.mean(aux["residual"])}

    name = f"gamma{gamma:g}"
    opt = optax.chain(optax.clip_by_global_norm(c.clip), optax.adam(schedule))
    pair = training.train_step(
        loss_fn, training.skip_nonfinite(opt), learning_rate_fn=schedule, per_device_rng=False
    )
    params = init(jax.random.PRNGKey(c.run.seed), standardised, False)
    policy = ctx.policy(name)  # resumed only if this training had started
    t0 = time.perf_counter()
    result = training.fit(
        pair,
        pair.init(params, jax.random.PRNGKey(c.run.seed + 1)),
        data.ShuffledBatches(train, batch_size=c.batch_size, seed=c.run.seed),
        num_steps=c.steps,
        parallel=ctx.data_parallel,
        actions=c.run.actions(log_every=1),
        checkpoints=training.Checkpoints(ctx.checkpoint_dir(name), config=ctx.config),
        policy=policy,
        writers=c.run.writers(ctx, name),
        say=ctx.print,
        run_dir=ctx.out_dir,
        desc=f"gamma={gamma:g}",
    )
    seconds = time.perf_counter() - t0
    trained = ctx.trained(name, result, history=KEYS, batch_size=c.batch_size, seconds=seconds)
    hist = ctx.train_records(name)
    for r in hist[c.log_every - 1 :: c.log_every] if c.log_every else []:
        ctx.print(f"  gamma={gamma:g} step {r['step']}: " + harness.format_metrics(r, keys=KEYS))
    test = {k: ds.test[k][: c.test_size] for k in ("image", "label")}
    by_budget, params = {}, trained.result.state.params
    for b in c.budgets:  # the model as inference at budget b sees it
        at_b = c.model.transform(gamma, b)
        by_budget[b] = mdeq_config.evaluate_classifier(
            at_b, params, test, (mean, std), c.eval_batch_size
        )
    tail, step_s = trained.tail, trained.step_seconds
    r = {"gamma": gamma, "params": trained.num_params, "train_ce_last": tail("ce")}
    r |= {"train_acc_last": tail("acc"), "train_jac_last": tail("jac")}
    r |= {"train_nfe_mean": float(np.mean(trained.history["nfe"]))}
    r |= {"train_residual_last": tail("residual"), "train_step_s_median": step_s}
    r |= {"train_images_per_s": c.batch_size / step_s, "by_budget": by_budget, "history": hist}
    r |= {"interrupted": trained.result.interrupted}
    accs = " ".join(f"{b}:{v['test_accuracy']:.3f}" for b, v in by_budget.items())
    ctx.print(
        f"gamma={gamma:g} train_ce={r['train_ce_last']:.3f} train_acc="
        f"{r['train_acc_last']:.3f} nfe={r['train_nfe_mean']:.2f} acc={accs}"
    )
    return r


def run(c: Config, inputs, ctx) -> dict:
    t0 = time.perf_counter()
    results = harness.run_until_interrupted(c.gammas, lambda g: train_one(g, c, inputs, ctx))
    wall = time.perf_counter() - t0
    acc = []
    for r in results:
        row = {"γ": r["gamma"]} | {f"b={b}": r["by_budget"][b]["test_accuracy"] for b in c.budgets}
        row |= {"train acc": r["train_acc_last"], "train NFE": r["train_nfe_mean"]}
        acc.append(row | {"train img/s": r["train_images_per_s"]})
    per = []
    for r in results:
        for b, v in r["by_budget"].items():
            row = {"γ": r["gamma"], "b": b, "NFE mean": v["nfe_mean"], "NFE max": v["nfe_max"]}
            per.append(row | {"residual": v["residual_mean"], "test img/s": v["images_per_s"]})
    table = (
        f"Data: {ctx.config['data_source']}\n\nTest accuracy at inference budget b (the "
        f"prediction depends on ≤ b cell evaluations):\n\n{harness.markdown_table(acc)}\n\n"
        "Per budget: NFE, readout residual ||f(z)−z||/||f(z)||, test images/s:\n\n"
        f"{harness.markdown_table(per)}\n"
    )
    ctx.print(table + f"wall time (training + evaluation): {wall:.0f} s")
    ctx.write_text("table.md", table)
    curves = {
        f"γ = {r['gamma']:g}": (c.budgets, [r["by_budget"][b]["test_accuracy"] for b in c.budgets])
        for r in results
    }
    harness.line_plot(
        ctx.path("accuracy_vs_budget.png"),
        curves,
        logx=2,
        ylabel="test accuracy",
        xlabel="inference budget b (cell evaluations)",
    )
    out = {"data_source": ctx.config["data_source"], "is_standin": ctx.config["is_standin"]}
    out |= {"wall_s": wall, "results": results}
    return out | {"interrupted": any(r["interrupted"] for r in results)}


EXPERIMENT = harness.Experiment(
    name="cifar10_mdeq",
    doc=__doc__,
    config=Config(),
    setup=setup,
    run=run,
    smoke=SMOKE,
    safe_on_resume=("log_every",),
    outputs=("table.md", "accuracy_vs_budget.png"),
)
main = functools.partial(harness.run, EXPERIMENT)  # main(argv=None) -> results

if __name__ == "__main__":
    main()
