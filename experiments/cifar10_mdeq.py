"""MDEQ classifier on CIFAR-10 with Jacobian regularisation: a small-scale JR paper Table 3.

Recipe (JR paper App. A.3, scaled way down for CPU): a conv stem, ``dq.nn.MultiscaleCell`` solved
by ``dq.nn.DEQ`` (Anderson forward, implicit backward), a head that average-pools every resolution
and classifies with one linear layer; Adam with cosine decay; the JR penalty
``γ ||J_f(z*)||²_F / d`` (JR Eq. 4; one Hutchinson sample per step, ``DEQ.solve(...,
jacobian_samples=1)``). For every ``γ`` in ``--gammas`` one model is trained and then evaluated
with every inference NFE budget in ``--budgets`` (Anderson ``max_steps``): a ``γ × budget`` table
of test accuracy (JR Table 3: with JR, accuracy holds up at small inference budgets).

Data: CIFAR-10 (``cifar-10-batches-py`` under ``--data_dir`` or TFDS) when present; offline the
Fashion-MNIST stand-in padded to 32×32×3, labelled ``STAND-IN`` in the log and outputs.

Outputs in ``--out_dir`` (default ``runs/cifar10_mdeq``): ``config.json``, ``results.json``,
``table.md`` (the γ × budget accuracy table, plus the mean forward NFE and images/s).

Usage:
  python experiments/cifar10_mdeq.py --smoke
  python experiments/cifar10_mdeq.py --steps 400 --train_size 10000
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from collections.abc import Sequence

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax
import tqdm

import deqjax.nn as dqnn
from deqjax import data, solvers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _seq_common as common  # noqa: E402


def build(args, max_steps: int) -> hk.Transformed:
    channels = tuple(int(c) for c in args.channels.split(","))

    def forward(images, is_training, jacobian_samples):
        x = hk.Conv2D(channels[0], 3, with_bias=False)(images)
        x = dqnn.GroupNorm(args.num_groups)(x) if hasattr(dqnn, "GroupNorm") else x
        cell = dqnn.MultiscaleCell(
            channels, num_groups=args.num_groups, expansion=args.expansion, dropout_rate=0.0
        )
        solver = functools.partial(solvers.anderson, max_steps=max_steps, tol=args.tol, m=5)
        out = dqnn.DEQ(cell, solver=solver).solve(
            x, is_training=is_training, jacobian_samples=jacobian_samples
        )
        pooled = jnp.concatenate([jnp.mean(z, axis=(1, 2)) for z in out.z_star], axis=-1)
        logits = hk.Linear(10)(jax.nn.relu(pooled))
        jac = out.jacobian_frobenius_sq
        jac = jnp.zeros((), logits.dtype) if jac is None else jac
        nfe = jnp.mean(out.solution.num_steps.astype(jnp.float32))
        return logits, jac, nfe

    return hk.transform(forward)


def preprocess(images: np.ndarray) -> np.ndarray:
    x = images.astype(np.float32) / 255.0
    return (x - x.mean()) / (x.std() + 1e-6)


def train_one(gamma: float, args, ds, log) -> dict:
    model = build(args, args.max_steps)
    rng = np.random.default_rng(args.seed)
    n = min(args.train_size, ds.train["label"].shape[0])
    train_x = preprocess(ds.train["image"][:n])
    train_y = ds.train["label"][:n]
    params = model.init(jax.random.PRNGKey(args.seed), train_x[: args.batch_size], True, 0)
    schedule = optax.cosine_decay_schedule(args.learning_rate, max(args.steps, 1))
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(schedule))
    opt_state = opt.init(params)
    samples = 1 if gamma > 0 else 0

    @jax.jit
    def train_step(params, opt_state, key, x, y):
        def loss_fn(p):
            logits, jac, nfe = model.apply(p, key, x, True, samples)
            ce = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
            return ce + gamma * jac, (ce, jac, nfe)

        (_, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, aux

    key = jax.random.PRNGKey(args.seed + 1)
    history, times, nfes = [], [], []
    for _ in tqdm.trange(args.steps, desc=f"gamma={gamma}", disable=not args.progress):
        idx = rng.integers(0, n, size=args.batch_size)
        key, sub = jax.random.split(key)
        t0 = time.perf_counter()
        params, opt_state, (ce, jac, nfe) = train_step(
            params, opt_state, sub, train_x[idx], train_y[idx]
        )
        history.append(float(ce))
        times.append(time.perf_counter() - t0)
        nfes.append(float(nfe))

    test_x = preprocess(ds.test["image"][: args.test_size])
    test_y = ds.test["label"][: args.test_size]
    row = {}
    for budget in [int(b) for b in args.budgets.split(",")]:
        eval_model = build(args, budget)
        apply = jax.jit(lambda p, x, m=eval_model: m.apply(p, None, x, False, 0))
        correct, nfe_sum, batches = 0, 0.0, 0
        t0 = time.perf_counter()
        for s in range(0, test_x.shape[0], args.eval_batch_size):
            logits, _, nfe = apply(params, test_x[s : s + args.eval_batch_size])
            correct += int(
                np.sum(np.argmax(np.asarray(logits), -1) == test_y[s : s + args.eval_batch_size])
            )
            nfe_sum, batches = nfe_sum + float(nfe), batches + 1
        row[budget] = {
            "test_accuracy": correct / test_x.shape[0],
            "mean_nfe": nfe_sum / max(batches, 1),
            "eval_seconds_incl_compile": time.perf_counter() - t0,
        }
    step_s = float(np.median(times[1:] if len(times) > 1 else times))
    result = {
        "gamma": gamma,
        "params": common.param_count(params),
        "train_ce_last": float(np.mean(history[-max(1, len(history) // 10) :])),
        "train_nfe_mean": float(np.mean(nfes)),
        "train_step_s_median": step_s,
        "train_images_per_s": args.batch_size / step_s,
        "by_budget": row,
        "history": history,
    }
    log(
        f"gamma={gamma:g} train_ce={result['train_ce_last']:.3f} "
        f"nfe={result['train_nfe_mean']:.1f} "
        f"img/s={result['train_images_per_s']:.1f} acc="
        + " ".join(f"{b}:{v['test_accuracy']:.3f}" for b, v in row.items())
    )
    return result


def parse_args(argv: Sequence[str] | None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data_dir", default=None, help="directory holding cifar-10-batches-py")
    p.add_argument("--channels", default="8,16")
    p.add_argument("--num_groups", type=int, default=4)
    p.add_argument("--expansion", type=int, default=2)
    p.add_argument("--max_steps", type=int, default=8, help="training Anderson steps")
    p.add_argument("--tol", type=float, default=1e-3)
    p.add_argument("--gammas", default="0,1.0")
    p.add_argument("--budgets", default="2,4,8")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--eval_batch_size", type=int, default=250)
    p.add_argument("--train_size", type=int, default=10000)
    p.add_argument("--test_size", type=int, default=1000)
    p.add_argument("--learning_rate", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out_dir", default="runs/cifar10_mdeq")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--no_progress", dest="progress", action="store_false")
    return common.parse_with_smoke_defaults(
        p,
        argv,
        {
            "channels": "4,8",
            "num_groups": 2,
            "expansion": 1,
            "max_steps": 3,
            "steps": 2,
            "batch_size": 4,
            "train_size": 64,
            "test_size": 16,
            "eval_batch_size": 16,
            "gammas": "0,1.0",
            "budgets": "1,3",
        },
    )


def main(argv: Sequence[str] | None = None) -> dict:
    args = parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    print("config:", vars(args))
    ds = data.load_image_dataset("cifar10", data_dir=args.data_dir, allow_standin=True)
    print(f"data source: {ds.source}")
    config = vars(args) | {"data_source": ds.source, "is_standin": ds.is_standin}
    common.write_json(os.path.join(args.out_dir, "config.json"), config)
    results = [train_one(float(g), args, ds, print) for g in args.gammas.split(",")]
    budgets = [int(b) for b in args.budgets.split(",")]
    lines = [
        f"Data: {ds.source}",
        "",
        "| γ | " + " | ".join(f"acc @ NFE≤{b}" for b in budgets) + " | train NFE | train img/s |",
        "|---|" + "---|" * (len(budgets) + 2),
    ]
    for r in results:
        accs = " | ".join(f"{r['by_budget'][b]['test_accuracy']:.3f}" for b in budgets)
        lines.append(
            f"| {r['gamma']:g} | {accs} | {r['train_nfe_mean']:.1f} "
            f"| {r['train_images_per_s']:.1f} |"
        )
    table = "\n".join(lines) + "\n"
    print(table)
    with open(os.path.join(args.out_dir, "table.md"), "w") as fh:
        fh.write(table)
    summary = {"data_source": ds.source, "is_standin": ds.is_standin, "results": results}
    common.write_json(os.path.join(args.out_dir, "results.json"), summary)
    return summary


if __name__ == "__main__":
    main()
