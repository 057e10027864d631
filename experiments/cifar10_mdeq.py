"""MDEQ classifier with Jacobian regularisation: a small-scale JR paper Table 3 (γ × inference NFE).

Model: ``dq.models.MDEQClassifier`` (JR App. A.3 / Table 4, scaled down for a CPU): conv stem
(stride ``--stem_stride``), ``MultiscaleCell`` (``--channels``, ``--expansion``, weight norm) solved
per example by ``dq.nn.DEQ``: Anderson with ``--train_budget`` evaluations (``--tol``; JR: 7),
implicit backward with Anderson (``--backward_steps``, ``--backward_tol``; JR: 8); the head reads
the cell output ``f(z*)`` the solver returned (``DEQOutput.f_star``, no extra cell application),
pools every resolution to a ``--head_grid`` grid, one linear layer. Adam, cosine decay, ``--clip``;
JR penalty ``γ ||J_f(z*)||²_F / d`` (Eq. 4, one Hutchinson sample) via
``dq.regularization.JacobianRegularizer`` with its in-graph Bernoulli gate ``--jr_p``. Training
runs through ``dq.training.fit`` (``metrics_gamma<γ>.jsonl``, checkpoints, ``--resume``).

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

import time

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax

import deqjax as dq
from deqjax import data, training

SMOKE = dict(channels="4,8", num_groups=2, expansion=1, train_budget=3, backward_steps=3, steps=2,
             batch_size=4, train_size=64, test_size=16, eval_batch_size=16, gammas="0,1.0",
             budgets="1,3", log_every=0)  # fmt: skip


def add_flags(p) -> None:
    add = p.add_argument
    add("--data_dir", default=None, help="directory holding cifar-10-batches-py")
    add("--channels", default="8,16", help="MultiscaleCell channels per resolution")
    add("--num_groups", type=int, default=4, help="group-norm groups")
    add("--expansion", type=int, default=2, help="residual block channel expansion")
    add("--dropout", type=float, default=0.0, help="recurrent (variational) dropout")
    add("--head_grid", type=int, default=4, help="head pools to a grid × grid grid")
    add("--stem_stride", type=int, default=2, help="stem downsampling (1 or 2)")
    add("--train_budget", type=int, default=6, help="training Anderson max_steps")
    add("--tol", type=float, default=1e-3, help="forward relative tolerance")
    add("--backward_steps", type=int, default=6, help="backward (implicit) solver steps")
    add("--backward_tol", type=float, default=1e-4, help="backward solver tolerance")
    add("--gammas", default="0,0.5", help="JR strengths, one model each")
    add("--jr_p", type=float, default=1.0, help="JR frequency p (Bernoulli gate per step)")
    add("--budgets", default="1,2,4,8,16", help="inference budgets (cell evaluations)")
    add("--steps", type=int, default=300, help="training steps")
    add("--batch_size", type=int, default=64, help="training batch size")
    add("--eval_batch_size", type=int, default=500, help="evaluation batch size")
    add("--train_size", type=int, default=60000, help="training images used")
    add("--test_size", type=int, default=1000, help="test images evaluated")
    add("--learning_rate", type=float, default=3e-3, help="peak learning rate")
    add("--clip", type=float, default=1.0, help="global gradient-norm clip")
    add("--augment", action="store_true", help="random crop + flip (JR App. A.3)")
    add("--log_every", type=int, default=100, help="steps between printed records (0: none)")


def setup(args):
    budgets = [int(b) for b in args.budgets.split(",")]
    if min(budgets) < 1:
        raise training.UsageError(f"--budgets: every budget must be >= 1, got {args.budgets!r}")
    ds = data.load_image_dataset("cifar10", data_dir=args.data_dir, allow_standin=True)
    print(f"data source: {ds.source}")
    sample = ds.train["image"][:10000].astype(np.float32) / 255.0  # standardisation constants
    stats = (float(sample.mean()), float(sample.std()) + 1e-6)
    return (ds, budgets, stats), {"data_source": ds.source, "is_standin": ds.is_standin}


def build(args, gamma: float, budget: int) -> hk.Transformed:
    """``apply(params, rng, images, is_training) -> (logits, aux)`` (float images)."""
    anderson = lambda steps, tol: dq.solvers.Anderson(max_steps=steps, tol=tol, m=5)  # noqa: E731
    reg = dq.regularization.JacobianRegularizer(gamma, p=args.jr_p) if gamma > 0 else None

    def forward(images, is_training):
        return dq.models.MDEQClassifier(
            [int(c) for c in args.channels.split(",")], num_groups=args.num_groups,
            expansion=args.expansion, dropout_rate=args.dropout, stem_stride=args.stem_stride,
            head_grid=args.head_grid, solver=anderson(args.train_budget, args.tol),
            eval_solver=dq.models.budget_solver(budget, tol=args.tol), regularizer=reg,
            adjoint=dq.ImplicitAdjoint(solver=anderson(args.backward_steps, args.backward_tol)),
        )(images, is_training=is_training)  # fmt: skip

    return hk.transform(forward)


def evaluate(model, params, test, stats, args) -> dict:
    """Accuracy, NFE, readout residual and images/s of ``model`` (one inference budget)."""
    (mean, std), batch_size = stats, args.eval_batch_size
    apply = jax.jit(lambda p, x: model.apply(p, None, (x / 255.0 - mean) / std, False))
    n = test["label"].shape[0]
    pad = -n % batch_size  # the last batch padded to the compiled shape
    images = np.concatenate([test["image"], np.zeros((pad,) + test["image"].shape[1:], np.uint8)])
    t0 = time.perf_counter()
    jax.block_until_ready(apply(params, images[:batch_size]))
    compile_s, out, t0 = time.perf_counter() - t0, [], time.perf_counter()
    for s in range(0, n, batch_size):
        logits, aux = apply(params, images[s : s + batch_size])
        out.append((np.argmax(logits, -1), np.asarray(aux["nfe"]), np.asarray(aux["residual"])))
    pred, nfe, res = (np.concatenate(a)[:n] for a in zip(*out))
    return {"test_accuracy": float(np.mean(pred == test["label"])), "nfe_mean": float(nfe.mean()),
            "nfe_max": int(nfe.max()), "residual_mean": float(res.mean()),
            "images_per_s": n / (time.perf_counter() - t0), "compile_s": compile_s}  # fmt: skip


def train_one(gamma: float, args, inputs, ctx) -> dict:
    """Trains one model with JR strength ``gamma``; evaluates it at every budget."""
    ds, budgets, (mean, std) = inputs
    model = build(args, gamma, max(budgets))
    n = min(args.train_size, ds.train["label"].shape[0])
    train = {k: ds.train[k][:n] for k in ("image", "label")}
    batches = data.ShuffledBatches(train, batch_size=args.batch_size, seed=args.seed)
    init = jax.jit(build(args, gamma, 1).init, static_argnums=2)  # no solve at init
    params = init(jax.random.PRNGKey(args.seed), (train["image"][:2] / 255.0 - mean) / std, False)
    schedule = optax.cosine_decay_schedule(args.learning_rate, max(args.steps, 1))
    opt = optax.chain(optax.clip_by_global_norm(args.clip), optax.adam(schedule))

    def loss_fn(params, batch, key, reg_state, step):
        k_aug, k_model = jax.random.split(key)
        images = batch["image"].astype(jnp.float32)
        images = data.random_crop_flip(k_aug, images) if args.augment else images
        logits, aux = model.apply(params, k_model, (images / 255.0 - mean) / std, True)
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()
        acc = jnp.mean((jnp.argmax(logits, -1) == batch["label"]).astype(jnp.float32))
        metrics = {"ce": ce, "acc": acc, "jac": aux["jr/frobenius_sq"], "nfe": aux["solver"]["nfe"]}
        return ce + aux["jr"], metrics | {"residual": jnp.mean(aux["residual"])}

    path = ctx.path(f"metrics_gamma{gamma:g}.jsonl")
    fit = training.fit(
        params=params, loss_fn=loss_fn, optimizer=opt, train_data=batches, num_steps=args.steps,
        rng=jax.random.PRNGKey(args.seed + 1), per_device_rng=False, learning_rate_fn=schedule,
        log_every=1, desc=f"gamma={gamma:g}",
        **ctx.fit_kwargs(checkpoint_dir=ctx.path(f"ckpt_gamma{gamma:g}"), metrics_path=path),
    )  # fmt: skip
    hist = [r for r in training.read_jsonl(path) if r.get("split") == "train"]
    for r in hist[args.log_every - 1 :: args.log_every] if args.log_every else []:
        shown = {k: r[k] for k in ("ce", "acc", "jac", "nfe", "residual")}
        ctx.print(f"  gamma={gamma:g} step {r['step']}: " + training.format_metrics(shown))
    test = {k: ds.test[k][: args.test_size] for k in ("image", "label")}
    ev = lambda b: evaluate(build(args, gamma, b), fit.state.params, test, (mean, std), args)  # noqa: E731
    by_budget = {b: ev(b) for b in budgets}
    tail = lambda k: float(np.mean([h[k] for h in hist[-max(1, len(hist) // 10) :]]))  # noqa: E731
    step_s = float(np.median([args.batch_size / h["examples_per_sec"] for h in hist[1:] or hist]))
    r = {"gamma": gamma, "params": int(sum(x.size for x in jax.tree.leaves(fit.state.params))),
         "train_ce_last": tail("ce"), "train_acc_last": tail("acc"), "train_jac_last": tail("jac"),
         "train_nfe_mean": float(np.mean([h["nfe"] for h in hist])),
         "train_residual_last": tail("residual"), "train_step_s_median": step_s,
         "train_images_per_s": args.batch_size / step_s, "by_budget": by_budget, "history": hist,
         "interrupted": fit.interrupted}  # fmt: skip
    accs = " ".join(f"{b}:{v['test_accuracy']:.3f}" for b, v in by_budget.items())
    ctx.print(f"gamma={gamma:g} train_ce={r['train_ce_last']:.3f} train_acc="
              f"{r['train_acc_last']:.3f} nfe={r['train_nfe_mean']:.2f} acc={accs}")  # fmt: skip
    return r


def run(args, inputs, ctx) -> dict:
    budgets, t0 = inputs[1], time.perf_counter()
    results = [train_one(float(g), args, inputs, ctx) for g in args.gammas.split(",")]
    wall = time.perf_counter() - t0
    acc = [{"γ": r["gamma"], **{f"b={b}": r["by_budget"][b]["test_accuracy"] for b in budgets},
            "train acc": r["train_acc_last"], "train NFE": r["train_nfe_mean"],
            "train img/s": r["train_images_per_s"]} for r in results]  # fmt: skip
    per = [{"γ": r["gamma"], "b": b, "NFE mean": v["nfe_mean"], "NFE max": v["nfe_max"],
            "residual": v["residual_mean"], "test img/s": v["images_per_s"]}
           for r in results for b, v in r["by_budget"].items()]  # fmt: skip
    table = (f"Data: {ctx.config['data_source']}\n\nTest accuracy at inference budget b (the "
             f"prediction depends on ≤ b cell evaluations):\n\n{training.markdown_table(acc)}\n\n"
             "Per budget: NFE, readout residual ||f(z)−z||/||f(z)||, test images/s:\n\n"
             f"{training.markdown_table(per)}\n")  # fmt: skip
    ctx.print(table + f"wall time (training + evaluation): {wall:.0f} s")
    with open(ctx.path("table.md"), "w") as fh:
        fh.write(table)
    accuracy = lambda r: [r["by_budget"][b]["test_accuracy"] for b in budgets]  # noqa: E731
    curves = {f"γ = {r['gamma']:g}": (budgets, accuracy(r)) for r in results}
    training.line_plot(ctx.path("accuracy_vs_budget.png"), curves, logx=2, ylabel="test accuracy",
                       xlabel="inference budget b (cell evaluations)")  # fmt: skip
    return {"data_source": ctx.config["data_source"], "is_standin": ctx.config["is_standin"],
            "wall_s": wall, "results": results,
            "interrupted": any(r["interrupted"] for r in results)}  # fmt: skip


EXPERIMENT = training.Experiment(
    name="cifar10_mdeq", doc=__doc__, add_flags=add_flags, setup=setup, run=run, smoke=SMOKE,
    safe_on_resume=("log_every",), outputs=("table.md", "accuracy_vs_budget.png"),
)  # fmt: skip

if __name__ == "__main__":
    training.run(EXPERIMENT)
