"""MDEQ classifier with Jacobian regularisation: a small-scale JR paper Table 3 (γ × inference NFE).

Recipe (JR paper App. A.3 / Table 4, scaled down for a CPU):

* a stem (3×3 conv with stride ``--stem_stride``, GroupNorm, ReLU; stride 2 is MDEQ's input
  downsampling, used here to cut the cost 4×: the cell runs at 16×16 and 8×8);
* ``dq.nn.MultiscaleCell`` (default 2 resolutions, channels (8, 16), expansion 2, weight norm, no
  recurrent dropout: the runs are far shorter than one epoch) solved by ``dq.nn.DEQ`` per example:
  Anderson forward (``--train_budget`` = 6 evaluations, tol 1e-3; JR Table 4: 7), implicit
  backward with Anderson (6 steps, tol 1e-4; JR: 8);
* a head: ReLU, average-pool every resolution to a 4×4 grid, concatenate, one linear layer;
* Adam, cosine decay, gradient-norm clip 1; the JR penalty ``γ ||J_f(z*)||²_F / d`` (JR Eq. 4;
  one Hutchinson sample at ``stop_gradient(z*)``, ``DEQ.solve(..., jacobian_samples=1)``) under
  the JR paper's Bernoulli gate ``--jr_p`` (default 1: every step; the paper's CIFAR runs use 0.05
  over 200 epochs, far more steps than here).

For every ``γ`` in ``--gammas`` one model is trained and then evaluated at every inference budget
in ``--budgets``: a ``γ × budget`` table of test accuracy (JR Table 3: with JR, accuracy holds up
at small inference budgets).

Inference budget and readout (the rule of this experiment)
-----------------------------------------------------------
The head always reads a **cell output** ``f(z)``, never a raw solver iterate, in training and at
every budget. "Budget ``b``" = the prediction depends on at most ``b`` evaluations of the cell:

* ``b = 1``: no solve; the head reads ``f(z0)`` (one cell application; ``z0 = 0``).
* ``b ≥ 2``: Anderson with ``max_steps = b`` evaluates ``f`` at iterates ``x_0 … x_{k-1}``
  (``k ≤ b``; fewer when it converges to ``--tol`` first) and returns ``z_best``, the evaluated
  iterate with the lowest residual; the head reads ``f(z_best)``, one of those ``k`` evaluations.

The NFE reported per example is ``k`` (1 for ``b = 1``), always ``≤ b``. ``dq.solvers.Solution``
returns ``z_best`` but not ``f(z_best)``, so the readout re-applies the cell once
(``DEQOutput.cell_fn``): the *executed* cell applications are ``k + 1`` for ``b ≥ 2`` (reported
as ``executed``; the images/s include it). The tempting alternative, ``max_steps = b - 1`` plus
the readout as the ``b``-th evaluation, wastes one evaluation: ``f(z_best)`` was already computed
inside the solve, so its budget 2 would be identical to budget 1 by construction.

**Training reads ``f(z*)`` too** (``z*`` the lowest-residual iterate of the training solve,
``max_steps = --train_budget``; gradient by the implicit adjoint through ``z*`` plus ordinary
backprop through the readout application). Why: at an exact fixed point ``f(z*) = z*`` and the
gradient is the plain implicit gradient (DEQ Theorem 1), so the choice only matters when the solve
is inexact, which is the normal case with a 6-step budget (train residual 0.1–0.3). There, a head
trained on ``z*`` would be fed a different kind of feature (a mixed Anderson iterate) from what it
reads at inference (a cell output) — and at ``b = 1`` the only cell-output readout is ``f(z0)``.
One readout rule everywhere keeps train and test consistent; the cost is one cell application and
its VJP per step. The train NFE reported is the solve's ``k``, like the test NFE.

The table also reports the readout residual ``||f(z) - z|| / ||f(z)||`` at the point read (``= 1``
at ``b = 1`` since ``z0 = 0``), the mean / max NFE, the train NFE and images/s (train: median
step after compile; test: one pass over the test set after compile, at each budget).

Data: CIFAR-10 (``cifar-10-batches-py`` under ``--data_dir`` or TFDS) when present; offline the
Fashion-MNIST stand-in padded to 32×32×3, labelled ``STAND-IN`` in the log and outputs.

Outputs in ``--out_dir`` (default ``runs/cifar10_mdeq``): ``config.json``, ``results.json``,
``table.md`` (γ × budget accuracy + NFE + residual + images/s), ``accuracy_vs_budget.png``.

Usage:
  python experiments/cifar10_mdeq.py --smoke
  python experiments/cifar10_mdeq.py           # default: γ ∈ {0, 0.5}, ~6–12 min on 2 CPU cores
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax
import tqdm

import deqjax as dq
import deqjax.nn as dqnn
from deqjax import data, solvers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _seq_common as common  # noqa: E402

NUM_CLASSES = 10


def no_solve(f, z0) -> solvers.Solution:
    """A "solver" that evaluates nothing: ``value = z0``, 0 steps (the budget-1 readout)."""
    del f
    z0 = jax.tree_util.tree_map(jnp.asarray, z0)
    dtype = jax.tree_util.tree_leaves(z0)[0].dtype
    inf = jnp.asarray(jnp.inf, dtype)
    return solvers.Solution(
        value=z0,
        num_steps=jnp.zeros((), jnp.int32),
        abs_residual=inf,
        rel_residual=inf,
        trace=jnp.full((1,), jnp.inf, dtype),
        status=jnp.asarray(solvers.MAX_STEPS, jnp.int32),
    )


def eval_solver_for(budget: int, *, tol: float):
    """The inference solver of budget ``budget`` (see the module docstring)."""
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise ValueError(f"budget must be an int >= 1, got {budget!r}.")
    if budget == 1:
        return no_solve
    return functools.partial(solvers.anderson, max_steps=budget, tol=tol, m=5)


def _tree_norm(tree: Any) -> jax.Array:
    """Per-example L2 norm of a pytree of ``[B, ...]`` arrays: ``[B]``."""
    sq = [jnp.sum(jnp.square(a.reshape(a.shape[0], -1)), axis=1) for a in jax.tree.leaves(tree)]
    return jnp.sqrt(functools.reduce(jnp.add, sq))


def stem(images: jax.Array, *, channels: int, stride: int, num_groups: int) -> jax.Array:
    """``[B, 32, 32, 3]`` -> ``[B, 32/stride, 32/stride, channels]``: conv, GroupNorm, ReLU."""
    x = hk.Conv2D(channels, 3, stride=stride, with_bias=False, name="stem_conv")(images)
    return jax.nn.relu(dqnn.GroupNorm(num_groups, name="stem_gn")(x))


def grid_pool(z: jax.Array, grid: int) -> jax.Array:
    """Average-pools ``[B, H, W, C]`` to a ``grid × grid`` grid and flattens: ``[B, grid²·C]``."""
    b, h, w, c = z.shape
    g = min(grid, h, w)
    z = z.reshape(b, g, h // g, g, w // g, c).mean(axis=(2, 4))
    return z.reshape(b, -1)


def head(zs: Sequence[jax.Array], *, grid: int) -> jax.Array:
    """ReLU, average-pool every resolution to a ``grid × grid`` grid (1: global pooling),
    concatenate, one linear layer -> logits."""
    pooled = jnp.concatenate([grid_pool(jax.nn.relu(z), grid) for z in zs], axis=-1)
    return hk.Linear(NUM_CLASSES, name="classifier")(pooled)


def make_cell(cfg: argparse.Namespace) -> dqnn.MultiscaleCell:
    channels = tuple(int(c) for c in cfg.channels.split(","))
    return dqnn.MultiscaleCell(
        channels,
        num_groups=cfg.num_groups,
        expansion=cfg.expansion,
        dropout_rate=cfg.dropout,
        name="mdeq_cell",
    )


def build(cfg: argparse.Namespace, budget: int) -> hk.Transformed:
    """The classifier; ``budget`` is the inference budget (``is_training=False``).

    ``apply(params, rng, images, is_training, jacobian_samples)`` returns ``(logits, aux)`` with
    per-example ``aux["nfe"]`` (evaluations the prediction depends on), ``aux["executed"]`` (cell
    applications run, readout included), ``aux["residual"]`` (``||f(z)-z||/||f(z)||`` at the
    point read), and the batch-mean JR term ``aux["jac"]``; ``aux["readout"]`` is the state read.
    """
    channels0 = int(cfg.channels.split(",")[0])
    train_solver = functools.partial(solvers.anderson, max_steps=cfg.train_budget, tol=cfg.tol, m=5)
    backward = functools.partial(
        solvers.anderson, max_steps=cfg.backward_steps, tol=cfg.backward_tol, m=5
    )
    eval_solver = eval_solver_for(budget, tol=cfg.tol)

    def forward(images, is_training: bool, jacobian_samples: int = 0):
        x = stem(images, channels=channels0, stride=cfg.stem_stride, num_groups=cfg.num_groups)
        deq = dqnn.DEQ(
            make_cell(cfg),
            solver=train_solver,
            eval_solver=eval_solver,
            adjoint=dq.ImplicitAdjoint(solver=backward),
            name="deq",
        )
        out = deq.solve(x, is_training=is_training, jacobian_samples=jacobian_samples)
        z_read = out.cell_fn(out.z_star)  # the readout: a cell output (module docstring)
        steps = out.solution.num_steps
        residual = _tree_norm(jax.tree.map(jnp.subtract, z_read, out.z_star)) / (
            _tree_norm(z_read) + 1e-12
        )
        jac = out.jacobian_frobenius_sq
        aux = {
            "nfe": jnp.maximum(steps, 1),
            "executed": steps + 1,
            "residual": jax.lax.stop_gradient(residual),
            "jac": jnp.zeros((), jnp.float32) if jac is None else jac,
            "readout": z_read,
        }
        return head(z_read, grid=cfg.head_grid), aux

    return hk.transform(forward)


class Preprocess:
    """uint8 images -> float32, standardised with the training set's mean and std."""

    def __init__(self, train_images: np.ndarray):
        sample = train_images[:10000].astype(np.float32) / 255.0
        self.mean = float(sample.mean())
        self.std = float(sample.std()) + 1e-6

    def __call__(self, images: np.ndarray) -> np.ndarray:
        return ((images.astype(np.float32) / 255.0 - self.mean) / self.std).astype(np.float32)


def augment(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """JR App. A.3 augmentation: random crop (4-pixel zero padding) and horizontal flip."""
    b, h, w, _ = images.shape
    padded = np.pad(images, ((0, 0), (4, 4), (4, 4), (0, 0)))
    dy, dx = rng.integers(0, 9, size=b), rng.integers(0, 9, size=b)
    out = np.stack([padded[i, dy[i] : dy[i] + h, dx[i] : dx[i] + w] for i in range(b)])
    flip = rng.random(b) < 0.5
    out[flip] = out[flip, :, ::-1]
    return out


def evaluate(params, cfg, budget: int, test_x: np.ndarray, test_y: np.ndarray) -> dict:
    """Test accuracy, NFE, readout residual and images/s at inference budget ``budget``."""
    model = build(cfg, budget)

    def predict(p, x):
        logits, aux = model.apply(p, None, x, False, 0)
        return logits, {k: aux[k] for k in ("nfe", "executed", "residual")}

    apply = jax.jit(predict)
    bs = cfg.eval_batch_size
    t0 = time.perf_counter()
    jax.block_until_ready(apply(params, test_x[:bs]))  # compile
    compile_s = time.perf_counter() - t0
    correct, nfe, executed, residual = [], [], [], []
    t0 = time.perf_counter()
    for s in range(0, test_x.shape[0], bs):
        xb = test_x[s : s + bs]
        if xb.shape[0] < bs:  # pad the last batch to the compiled shape
            xb = np.concatenate([xb, np.zeros((bs - xb.shape[0],) + xb.shape[1:], xb.dtype)])
        logits, aux = apply(params, xb)
        n = min(bs, test_x.shape[0] - s)
        correct.append(np.argmax(np.asarray(logits)[:n], -1) == test_y[s : s + n])
        nfe.append(np.asarray(aux["nfe"])[:n])
        executed.append(np.asarray(aux["executed"])[:n])
        residual.append(np.asarray(aux["residual"])[:n])
    seconds = time.perf_counter() - t0
    nfe, executed = np.concatenate(nfe), np.concatenate(executed)
    return {
        "test_accuracy": float(np.mean(np.concatenate(correct))),
        "nfe_mean": float(nfe.mean()),
        "nfe_max": int(nfe.max()),
        "executed_mean": float(executed.mean()),
        "residual_mean": float(np.mean(np.concatenate(residual))),
        "images_per_s": test_x.shape[0] / seconds,
        "compile_s": compile_s,
    }


def train_one(gamma: float, args, ds, preprocess: Preprocess, log) -> dict:
    """Trains one model with JR strength ``gamma``; evaluates it at every budget."""
    budgets = [int(b) for b in args.budgets.split(",")]
    model = build(args, max(budgets))
    n = min(args.train_size, ds.train["label"].shape[0])
    batches = data.ShuffledBatches(
        {"image": ds.train["image"][:n], "label": ds.train["label"][:n]},
        batch_size=args.batch_size,
        seed=args.seed,
        process_index=0,
        process_count=1,
    )
    aug_rng = np.random.default_rng(args.seed + 2)
    # Parameters do not depend on the budget: init the cheapest variant (budget 1, no solve), jitted
    # (one compile instead of one per primitive in eager mode).
    init = jax.jit(build(args, 1).init, static_argnums=(2, 3))
    params = init(jax.random.PRNGKey(args.seed), preprocess(ds.train["image"][:2]), False, 0)
    schedule = optax.cosine_decay_schedule(args.learning_rate, max(args.steps, 1))
    opt = optax.chain(optax.clip_by_global_norm(args.clip), optax.adam(schedule))
    opt_state = opt.init(params)
    # JR's Bernoulli gate (JR App. A.4): the penalty is computed on a step with probability p.
    jr_rng = np.random.default_rng(args.seed + 3)

    @functools.partial(jax.jit, static_argnums=5)
    def train_step(params, opt_state, key, x, y, samples):
        def loss_fn(p):
            logits, aux = model.apply(p, key, x, True, samples)
            ce = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
            acc = jnp.mean((jnp.argmax(logits, -1) == y).astype(jnp.float32))
            stats = {
                "ce": ce,
                "acc": acc,
                "jac": aux["jac"],
                "nfe": jnp.mean(aux["nfe"].astype(jnp.float32)),
                "residual": jnp.mean(aux["residual"]),
            }
            return ce + gamma * aux["jac"], stats

        (_, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, stats

    key = jax.random.PRNGKey(args.seed + 1)
    history, times = [], []
    t_train = time.perf_counter()
    bar = tqdm.trange(args.steps, desc=f"gamma={gamma:g}", disable=not args.progress)
    for step in bar:
        batch = next(batches)
        images = augment(batch["image"], aug_rng) if args.augment else batch["image"]
        key, sub = jax.random.split(key)
        t0 = time.perf_counter()
        samples = int(gamma > 0 and jr_rng.random() < args.jr_p)
        params, opt_state, stats = train_step(
            params, opt_state, sub, preprocess(images), batch["label"], samples
        )
        stats = {k: float(v) for k, v in stats.items()}
        times.append(time.perf_counter() - t0)
        history.append(stats)
        if args.progress:
            bar.set_postfix(ce=f"{stats['ce']:.3f}", nfe=f"{stats['nfe']:.1f}")
        if args.log_every and (step + 1) % args.log_every == 0:
            recent = history[-args.log_every :]
            log(
                f"  gamma={gamma:g} step {step + 1}: "
                + " ".join(f"{k}={np.mean([h[k] for h in recent]):.4g}" for k in stats)
            )
    train_s = time.perf_counter() - t_train

    test_x = preprocess(ds.test["image"][: args.test_size])
    test_y = ds.test["label"][: args.test_size]
    by_budget = {b: evaluate(params, args, b, test_x, test_y) for b in budgets}
    tail = history[-max(1, len(history) // 10) :]
    step_s = float(np.median(times[1:] if len(times) > 1 else times))
    result = {
        "gamma": gamma,
        "params": common.param_count(params),
        "train_ce_last": float(np.mean([h["ce"] for h in tail])),
        "train_acc_last": float(np.mean([h["acc"] for h in tail])),
        "train_jac_last": float(np.mean([h["jac"] for h in tail])),
        "train_nfe_mean": float(np.mean([h["nfe"] for h in history])),
        "train_residual_last": float(np.mean([h["residual"] for h in tail])),
        "train_step_s_median": step_s,
        "train_images_per_s": args.batch_size / step_s,
        "train_wall_s": train_s,
        "first_step_s_incl_compile": times[0],
        "by_budget": by_budget,
        "history": history,
    }
    log(
        f"gamma={gamma:g} train_ce={result['train_ce_last']:.3f} "
        f"train_acc={result['train_acc_last']:.3f} nfe={result['train_nfe_mean']:.2f} "
        f"img/s={result['train_images_per_s']:.1f} acc="
        + " ".join(f"{b}:{v['test_accuracy']:.3f}" for b, v in by_budget.items())
    )
    return result


def table_markdown(source: str, results: list[dict], budgets: list[int], args) -> str:
    """The γ × budget accuracy table and the per-budget NFE / residual / images/s table."""
    lines = [
        f"Data: {source}",
        "",
        "Test accuracy at inference budget b (the prediction depends on ≤ b cell evaluations):",
        "",
        "| γ | " + " | ".join(f"b={b}" for b in budgets) + " | train acc | train NFE "
        "| train img/s |",
        "|---|" + "---|" * (len(budgets) + 3),
    ]
    for r in results:
        accs = " | ".join(f"{r['by_budget'][b]['test_accuracy']:.3f}" for b in budgets)
        lines.append(
            f"| {r['gamma']:g} | {accs} | {r['train_acc_last']:.3f} | "
            f"{r['train_nfe_mean']:.2f} | {r['train_images_per_s']:.1f} |"
        )
    lines += [
        "",
        "Per budget: NFE mean / max, executed cell applications (mean), readout residual "
        "||f(z)−z||/||f(z)||, test images/s:",
        "",
        "| γ | b | NFE mean / max | executed | residual | test img/s |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        for b in budgets:
            v = r["by_budget"][b]
            lines.append(
                f"| {r['gamma']:g} | {b} | {v['nfe_mean']:.2f} / {v['nfe_max']} | "
                f"{v['executed_mean']:.2f} | {v['residual_mean']:.2e} | "
                f"{v['images_per_s']:.0f} |"
            )
    return "\n".join(lines) + "\n"


def plot(results: list[dict], budgets: list[int], source: str, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for r in results:
        accs = [r["by_budget"][b]["test_accuracy"] for b in budgets]
        res = [r["by_budget"][b]["residual_mean"] for b in budgets]
        ax1.plot(budgets, accs, marker="o", label=f"γ = {r['gamma']:g}")
        ax2.semilogy(budgets, res, marker="o", label=f"γ = {r['gamma']:g}")
    ax1.set(xlabel="inference budget b (cell evaluations)", ylabel="test accuracy")
    ax2.set(xlabel="inference budget b (cell evaluations)", ylabel="readout residual")
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(budgets, [str(b) for b in budgets])
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"MDEQ + JR: accuracy vs inference budget ({source.split(' (')[0]})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_args(argv: Sequence[str] | None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data_dir", default=None, help="directory holding cifar-10-batches-py")
    p.add_argument("--channels", default="8,16", help="MultiscaleCell channels per resolution")
    p.add_argument("--num_groups", type=int, default=4, help="group-norm groups")
    p.add_argument("--expansion", type=int, default=2, help="residual block channel expansion")
    p.add_argument("--dropout", type=float, default=0.0, help="recurrent (variational) dropout")
    p.add_argument("--head_grid", type=int, default=4, help="head pools to a grid × grid grid")
    p.add_argument("--stem_stride", type=int, default=2, help="stem downsampling (1 or 2)")
    p.add_argument("--train_budget", type=int, default=6, help="training Anderson max_steps")
    p.add_argument("--tol", type=float, default=1e-3, help="forward relative tolerance")
    p.add_argument("--backward_steps", type=int, default=6, help="backward (implicit) solver steps")
    p.add_argument("--backward_tol", type=float, default=1e-4, help="backward solver tolerance")
    p.add_argument("--gammas", default="0,0.5", help="JR strengths, one model each")
    p.add_argument(
        "--jr_p", type=float, default=1.0, help="JR frequency p (Bernoulli gate per step)"
    )
    p.add_argument("--budgets", default="1,2,4,8,16", help="inference budgets (cell evaluations)")
    p.add_argument("--steps", type=int, default=300, help="training steps")
    p.add_argument("--batch_size", type=int, default=64, help="training batch size")
    p.add_argument("--eval_batch_size", type=int, default=500, help="evaluation batch size")
    p.add_argument("--train_size", type=int, default=60000, help="training images used")
    p.add_argument("--test_size", type=int, default=1000, help="test images evaluated")
    p.add_argument("--learning_rate", type=float, default=3e-3, help="peak learning rate")
    p.add_argument("--clip", type=float, default=1.0, help="global gradient-norm clip")
    p.add_argument("--augment", action="store_true", help="random crop + flip (JR App. A.3)")
    p.add_argument("--log_every", type=int, default=100, help="steps between logged records")
    common.add_run_flags(p, out_dir="runs/cifar10_mdeq")
    return common.parse_with_smoke_defaults(
        p,
        argv,
        {
            "channels": "4,8",
            "num_groups": 2,
            "expansion": 1,
            "train_budget": 3,
            "backward_steps": 3,
            "steps": 2,
            "batch_size": 4,
            "train_size": 64,
            "test_size": 16,
            "eval_batch_size": 16,
            "gammas": "0,1.0",
            "budgets": "1,3",
            "log_every": 0,
        },
    )


def main(argv: Sequence[str] | None = None) -> dict:
    args = parse_args(argv)
    budgets = [int(b) for b in args.budgets.split(",")]
    eval_solver_for(min(budgets), tol=args.tol)  # validates the budgets eagerly
    os.makedirs(args.out_dir, exist_ok=True)
    print("config:", vars(args))
    ds = data.load_image_dataset("cifar10", data_dir=args.data_dir, allow_standin=True)
    print(f"data source: {ds.source}")
    config = vars(args) | {"data_source": ds.source, "is_standin": ds.is_standin}
    common.write_json(os.path.join(args.out_dir, "config.json"), config)
    preprocess = Preprocess(ds.train["image"])
    t0 = time.perf_counter()
    results = [train_one(float(g), args, ds, preprocess, print) for g in args.gammas.split(",")]
    wall = time.perf_counter() - t0
    table = table_markdown(ds.source, results, budgets, args)
    print(table)
    print(f"wall time (training + evaluation): {wall:.0f} s")
    with open(os.path.join(args.out_dir, "table.md"), "w") as fh:
        fh.write(table)
    plot(results, budgets, ds.source, os.path.join(args.out_dir, "accuracy_vs_budget.png"))
    summary = {
        "data_source": ds.source,
        "is_standin": ds.is_standin,
        "wall_s": wall,
        "results": results,
    }
    common.write_json(os.path.join(args.out_dir, "results.json"), summary)
    return summary


if __name__ == "__main__":
    main()
