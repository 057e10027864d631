"""MDEQ classifier throughput (issue 8, Benchmark): train images/s with JR off / on, inference
images/s at a few budgets, and a peak-memory proxy.

The model is ``experiments/cifar10_mdeq.py`` at its default flags (``MultiscaleCell`` channels
(8, 16) on a stride-2 stem, Anderson ``max_steps = --train_budget`` forward, implicit backward
with Anderson, readout ``f(z*)``), on 32×32×3 batches of the offline CIFAR-10 stand-in
(Fashion-MNIST padded; CIFAR-10 itself when present), float32, freshly initialised parameters.

* **Train**: one jitted Adam step (forward solve, readout, CE loss, implicit backward; JR on adds
  one Hutchinson sample of ``||J_f(z*)||²_F`` and its gradient, ``γ = 0.5``). Median over
  ``--repeats`` rounds after a warm-up call; every round runs each case once (train JR off, JR
  on, each budget), so a change of load on the shared CPU hits all cases alike. images/s = batch
  / median.
* **Inference**: the jitted forward at budget ``b`` (the experiment's rule: ``b = 1`` reads
  ``f(z0)`` with no solve; ``b ≥ 2`` runs Anderson with ``max_steps = b`` and reads
  ``f(z_best)``), same timing.
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
import os
import statistics
import sys
import time
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from benchmarks.common import machine

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(_ROOT, "experiments"))

import _seq_common  # noqa: E402
import cifar10_mdeq as cm  # noqa: E402

from deqjax import data  # noqa: E402


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
    compiled, memory = _seq_common.compile_with_memory(fn, *args)
    seconds = time.perf_counter() - t0
    return compiled, None if memory is None else memory["temp_bytes"], seconds


def train_case(cfg, params, images, labels, *, gamma: float) -> Case:
    """One jitted Adam step of the experiment's model (JR on iff ``gamma > 0``)."""
    model = cm.build(cfg, 1)
    opt = optax.chain(optax.clip_by_global_norm(cfg.clip), optax.adam(cfg.learning_rate))
    samples = 1 if gamma > 0 else 0

    def step(params, opt_state, key, x, y):
        def loss_fn(p):
            logits, aux = model.apply(p, key, x, True, samples)
            ce = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
            return ce + gamma * aux["jac"], jnp.mean(aux["nfe"].astype(jnp.float32))

        (_, nfe), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), nfe

    args = (params, opt.init(params), jax.random.PRNGKey(1), images, labels)
    compiled, temp, compile_s = _compile(step, *args)
    jr = f"on (γ={gamma:g}, 1 sample)" if gamma > 0 else "off"
    return Case(f"train, JR {jr}", compiled, args, images.shape[0], temp, compile_s)


def inference_case(cfg, params, images, *, budget: int) -> Case:
    """The jitted forward at inference budget ``budget`` (the experiment's readout rule)."""
    model = cm.build(cfg, budget)

    def predict(params, x):
        logits, aux = model.apply(params, None, x, False, 0)
        return logits, jnp.mean(aux["nfe"].astype(jnp.float32))

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


def markdown(rows: list[dict], cfg, source: str, repeats: int) -> str:
    mib = lambda b: "n/a" if b is None else f"{b / 2**20:.1f}"  # noqa: E731
    lines = [
        f"Machine: {machine()}. Data: {source}. Model: cifar10_mdeq defaults (channels "
        f"{cfg.channels}, expansion {cfg.expansion}, stem stride {cfg.stem_stride}, train "
        f"Anderson ≤{cfg.train_budget} / backward ≤{cfg.backward_steps}), float32, fresh "
        f"parameters; median of {repeats} interleaved rounds after compile. Memory = XLA temp "
        "bytes of the compiled function (proxy for peak, not a measured peak).",
        "",
        "| what | batch | NFE (mean) | ms / call (median / min) | images/s | temp MiB (proxy) "
        "| compile s |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['what']} | {r['batch']} | {r['nfe']:.2f} | {r['step_ms']:.1f} / "
            f"{r['step_ms_min']:.1f} | "
            f"{r['images_per_s']:.0f} | {mib(r['temp_bytes'])} | {r['compile_s']:.1f} |"
        )
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
    cfg = cm.parse_args([])
    ds = data.load_image_dataset("cifar10", allow_standin=True)
    preprocess = cm.Preprocess(ds.train["image"])
    n = max(args.batch_size, args.eval_batch_size)
    images = jnp.asarray(preprocess(ds.train["image"][:n]))
    labels = jnp.asarray(ds.train["label"][:n])
    init = jax.jit(cm.build(cfg, 1).init, static_argnums=(2, 3))
    params = init(jax.random.PRNGKey(0), images[:2], False, 0)
    cases = [
        train_case(cfg, params, images[: args.batch_size], labels[: args.batch_size], gamma=gamma)
        for gamma in (0.0, args.gamma)
    ]
    cases += [
        inference_case(cfg, params, images[: args.eval_batch_size], budget=int(b))
        for b in args.budgets.split(",")
    ]
    rows = time_cases(cases, args.repeats)
    print(markdown(rows, cfg, ds.source, args.repeats))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=2)
    return rows


if __name__ == "__main__":
    main()
