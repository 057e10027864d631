"""MDEQ classifier throughput: train images/s with JR off / on, inference images/s at a few
budgets, and a peak-memory proxy.

The model is ``dq.models.MDEQClassifier`` at ``experiments/cifar10_mdeq.py``'s default flags
(``MultiscaleCell`` channels (8, 16) on a stride-2 stem, expansion 2, Anderson ``max_steps = 6``
forward, implicit backward with Anderson (6 steps), readout ``f(z*)`` as the solver returned it),
on 32×32×3 batches of the offline CIFAR-10 stand-in (Fashion-MNIST padded; CIFAR-10 itself when
present), standardised, float32, freshly initialised parameters.

* **Train**: one jitted Adam step (forward solve, readout, CE loss, implicit backward; JR on adds
  one Hutchinson sample of ``||J_f(z*)||²_F`` and its gradient, ``γ = 0.5``). Median over
  ``--repeats`` rounds after a warm-up call; every round runs each case once (train JR off, JR
  on, each budget), so a change of load on the shared CPU hits all cases alike. images/s = batch
  / median.
* **Inference**: the jitted forward at budget ``b`` (``dq.models.budget_solver``: Anderson with
  ``max_steps = b``, the head reads ``f(z_best)``; ``b = 1`` evaluates only ``f(z0)``), same
  timing.
* **Memory proxy**: XLA's ``compiled.memory_analysis().temp_size_in_bytes`` of each compiled
  function: the scratch buffers the program plans (activations, solver buffers), not a measured
  process peak.

Usage (from the repository root)::

    python -m benchmarks.mdeq                        # markdown table to stdout
    python -m benchmarks.mdeq --repeats 5 --budgets 1,2,8 --batch_size 32
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any, Callable, NamedTuple

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax

import deqjax as dq
from benchmarks.common import machine, markdown_table
from deqjax import data, training

# experiments/cifar10_mdeq.py's defaults
CONFIG = dict(channels=(8, 16), num_groups=4, expansion=2, stem_stride=2, head_grid=4)
TRAIN_BUDGET, BACKWARD_STEPS, TOL, BACKWARD_TOL, LR, CLIP = 6, 6, 1e-3, 1e-4, 3e-3, 1.0


def build(*, gamma: float = 0.0, budget: int = 1) -> hk.Transformed:
    """``apply(params, rng, images, is_training) -> (logits, aux)``."""
    anderson = lambda steps, tol: dq.solvers.Anderson(max_steps=steps, tol=tol, m=5)  # noqa: E731
    deq = dq.models.DEQSettings(
        anderson(TRAIN_BUDGET, TOL),
        eval_solver=dq.models.budget_solver(budget, tol=TOL),
        adjoint=dq.ImplicitAdjoint(solver=anderson(BACKWARD_STEPS, BACKWARD_TOL)),
        regularizer=dq.regularization.JacobianRegularizer(gamma) if gamma > 0 else None,
    )

    def forward(images, is_training):
        model = dq.models.MDEQClassifier(**CONFIG, deq=deq)
        return model(images, is_training=is_training)

    return hk.transform(forward)


class Case(NamedTuple):
    """One compiled function to time."""

    what: str
    fn: Callable[..., Any]  # compiled; returns (something, mean NFE)
    args: tuple
    batch: int
    temp_bytes: int | None
    compile_s: float


def _compile(fn, *args):
    """``(compiled, temp bytes or None, compile seconds)`` of ``jax.jit(fn)`` at ``args``."""
    t0 = time.perf_counter()
    compiled, memory = training.compile_with_memory(fn, *args)
    seconds = time.perf_counter() - t0
    return compiled, None if memory is None else memory["temp_bytes"], seconds


def train_case(params, images, labels, *, gamma: float) -> Case:
    """One jitted Adam step of the experiment's model (JR on iff ``gamma > 0``)."""
    model = build(gamma=gamma)
    opt = optax.chain(optax.clip_by_global_norm(CLIP), optax.adam(LR))

    def step(params, opt_state, key, x, y):
        def loss_fn(p):
            logits, aux = model.apply(p, key, x, True)
            ce = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
            return ce + aux["jr"], aux["solver"]["nfe"]

        (_, nfe), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), nfe

    args = (params, opt.init(params), jax.random.PRNGKey(1), images, labels)
    compiled, temp, compile_s = _compile(step, *args)
    jr = f"on (γ={gamma:g}, 1 sample)" if gamma > 0 else "off"
    return Case(f"train, JR {jr}", compiled, args, images.shape[0], temp, compile_s)


def inference_case(params, images, *, budget: int) -> Case:
    """The jitted forward at inference budget ``budget`` (the experiment's readout rule)."""
    model = build(budget=budget)

    def predict(params, x):
        logits, aux = model.apply(params, None, x, False)
        return logits, aux["solver"]["nfe"]

    compiled, temp, compile_s = _compile(predict, params, images)
    what = f"inference, budget b={budget}"
    return Case(what, compiled, (params, images), images.shape[0], temp, compile_s)


def time_cases(cases: list[Case], repeats: int) -> list[dict]:
    """Median seconds per case over ``repeats`` rounds; each round runs every case once, so a
    change of machine load hits all cases alike (the CPU is shared)."""
    nfes = [float(jax.block_until_ready(c.fn(*c.args))[1]) for c in cases]  # warm-up
    times: list[list[float]] = [[] for _ in cases]
    for _ in range(repeats):
        for c, ts in zip(cases, times):
            t0 = time.perf_counter()
            jax.block_until_ready(c.fn(*c.args))
            ts.append(time.perf_counter() - t0)
    rows = []
    for c, ts, nfe in zip(cases, times, nfes):
        seconds = statistics.median(ts)
        rows.append(
            {
                "what": c.what,
                "batch": c.batch,
                "nfe": nfe,
                "step_ms": 1e3 * seconds,
                "step_ms_min": 1e3 * min(ts),
                "images_per_s": c.batch / seconds,
                "temp_bytes": c.temp_bytes,
                "compile_s": c.compile_s,
            }
        )
    return rows


COLUMNS = (
    "what",
    "batch",
    "NFE (mean)",
    "ms / call (median / min)",
    "images/s",
    "temp MiB (proxy)",
    "compile s",
)


def markdown(rows: list[dict], source: str, repeats: int) -> str:
    mib = lambda b: "n/a" if b is None else f"{b / 2**20:.1f}"  # noqa: E731
    lines = [
        f"Machine: {machine()}. Data: {source}. Model: cifar10_mdeq defaults (channels "
        f"{CONFIG['channels']}, expansion {CONFIG['expansion']}, stem stride "
        f"{CONFIG['stem_stride']}, train Anderson ≤{TRAIN_BUDGET} / backward ≤{BACKWARD_STEPS}), "
        "float32, fresh "
        f"parameters; median of {repeats} interleaved rounds after compile. Memory = XLA temp "
        "bytes of the compiled function (proxy for peak, not a measured peak).",
        "",
    ]
    cells = [
        {
            "what": r["what"],
            "batch": r["batch"],
            "NFE (mean)": r["nfe"],
            "ms / call (median / min)": f"{r['step_ms']:.1f} / {r['step_ms_min']:.1f}",
            "images/s": r["images_per_s"],
            "temp MiB (proxy)": r["temp_bytes"],
            "compile s": r["compile_s"],
        }
        for r in rows
    ]
    formats = {"NFE (mean)": ".2f", "images/s": ".0f", "temp MiB (proxy)": mib, "compile s": ".1f"}
    lines += markdown_table(cells, COLUMNS, formats, "l")
    lines += ["", "GPU: not run (no device lent to this task)."]
    return "\n".join(lines)


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--batch_size", type=int, default=64, help="train batch")
    p.add_argument("--eval_batch_size", type=int, default=250, help="inference batch")
    p.add_argument("--budgets", default="1,4,8", help="inference budgets")
    p.add_argument("--gamma", type=float, default=0.5, help="JR strength of the JR-on row")
    p.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = p.parse_args(argv)
    ds = data.load_image_dataset("cifar10", allow_standin=True)
    sample = ds.train["image"][:10000].astype(np.float32) / 255.0
    mean, std = float(sample.mean()), float(sample.std()) + 1e-6
    n = max(args.batch_size, args.eval_batch_size)
    images = jnp.asarray((ds.train["image"][:n].astype(np.float32) / 255.0 - mean) / std)
    labels = jnp.asarray(ds.train["label"][:n])
    init = jax.jit(build().init, static_argnums=2)
    params = init(jax.random.PRNGKey(0), images[:2], False)
    cases = [
        train_case(params, images[: args.batch_size], labels[: args.batch_size], gamma=gamma)
        for gamma in (0.0, args.gamma)
    ]
    cases += [
        inference_case(params, images[: args.eval_batch_size], budget=int(b))
        for b in args.budgets.split(",")
    ]
    rows = time_cases(cases, args.repeats)
    print(markdown(rows, ds.source, args.repeats))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=2)
    return rows


if __name__ == "__main__":
    main()
