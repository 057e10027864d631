"""A DEQ train step run data-parallel three ways, in a process of its own (fake CPU devices).

    python -m tests.helpers.parallel_worker OUT.json [--steps 3]
    python -m tests.helpers.parallel_worker OUT.json --save DIR --steps 2     # sharded, saved
    python -m tests.helpers.parallel_worker OUT.json --resume DIR --steps 3   # on these devices

Run from the repository root (``-m`` puts it first on ``sys.path``, so ``tests`` and
``benchmarks`` import as packages; this file edits no ``sys.path``).

With N devices (``XLA_FLAGS=--xla_force_host_platform_device_count=N``) it takes ``--steps``
optimizer steps of a small DEQ classifier, whose implicit backward always falls back to GMRES (a
first backward solve of 2 steps), on 1 device and on all N, sharded (``jax.jit`` +
``jax.shard_map``) and with ``jax.pmap``, from the same state on the same global batches, and
writes the losses, gradient norms, fallback rates and final parameters of each; the collectives of
the sharded and pmapped steps' compiled programs (inside solver loops and outside); and each
device's forward NFE on a batch whose shards differ in difficulty, with each shard's NFE solved
alone. With ``--save``/``--resume`` it trains sharded, checkpoints the placed state with
:class:`~deqjax.training.Checkpoints` (orbax writes the global arrays), or restores it onto this
process's devices (another number of them, say) and trains on to ``--steps``.
"""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax

import deqjax as dq
from benchmarks.collectives import count_collectives
from deqjax._src.training.data_parallel import (
    PER_DEVICE,
    REPLICATED,
    SHARDED,
    STATE_KINDS,
    data_parallel,
)

D_IN, D, CLASSES, BATCH = 5, 8, 3, 32
SOLVER = dq.solvers.Anderson(max_steps=80, tol=1e-6, batch_ndim=1)
# A first backward solve of 2 steps fails at this tolerance: every example takes the fallback.
ADJOINT = dq.ImplicitAdjoint(
    solver=dq.solvers.FixedPointIteration(max_steps=2, tol=1e-6), fallback_factor=1.0
)


def cell(params, x, z):
    return jnp.tanh(z @ params["w"].T + x @ params["u"])


def solve(params, x):
    return dq.fixed_point(
        cell, params, x, jnp.zeros((x.shape[0], D)), solver=SOLVER, adjoint=ADJOINT
    )


def loss_fn(params, batch, key, reg_state, step, probe):
    z, sol = dq.fixed_point(
        cell,
        params,
        batch["x"],
        jnp.zeros((batch["x"].shape[0], D)),
        solver=SOLVER,
        adjoint=ADJOINT,
        backward_stats=probe,
    )
    logits = z @ params["head"]
    loss = jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]))
    return loss, {"nfe_max": jnp.max(sol.num_steps)}


def problem(seed: int = 0):
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(D, D))
    w *= 0.9 / np.max(np.abs(np.linalg.eigvals(w)))
    params = {
        "w": w.astype(np.float32),
        "u": rng.normal(size=(D_IN, D)).astype(np.float32),
        "head": rng.normal(size=(D, CLASSES)).astype(np.float32),
    }
    batches = [
        {
            "x": rng.normal(size=(BATCH, D_IN)).astype(np.float32),
            "y": rng.integers(0, CLASSES, size=BATCH).astype(np.int32),
        }
        for _ in range(8)
    ]
    return params, batches


PAIR = dq.training.train_step(loss_fn, optax.sgd(0.05), backward_stats=True)


class _NoData:
    state: dict = {}


def train(parallel, params, batches, steps, *, save=None, resume=None):
    step = parallel.map_update(PAIR.update)
    state = parallel.put(PAIR.init(params, jax.random.PRNGKey(0)), STATE_KINDS)
    if resume is not None:
        with dq.training.Checkpoints(resume) as ckpt:
            restored = ckpt.restore(template=parallel.saveable(state, STATE_KINDS))
        state = parallel.put(restored.state, STATE_KINDS)
    hlo = step.lower(state, parallel.put(batches[0], SHARDED)).compile().as_text()
    records = []
    for batch in batches[int(parallel.get(state.step, REPLICATED)) : steps]:
        state, metrics = step(state, parallel.put(batch, SHARDED))
        records.append({k: float(v) for k, v in parallel.get(metrics, REPLICATED).items()})
    if save is not None:
        with dq.training.Checkpoints(save) as ckpt:  # no data position: an empty one
            ckpt.save(steps, parallel.saveable(state, STATE_KINDS), _NoData(), force=True)
    final = parallel.get(state, STATE_KINDS).params
    return {
        "losses": [r["loss"] for r in records],
        "grad_norms": [r["grad_norm"] for r in records],
        "fallback_rates": [r["bwd_fallback_rate"] for r in records],
        "nfe_max": [r["nfe_max"] for r in records],
        "params": {k: np.asarray(v).tolist() for k, v in final.items()},
        "collectives": count_collectives(hlo)._asdict(),
    }


def per_device_nfe(parallel, params):
    """Each device's forward NFE (the most of its examples') on shards of growing difficulty."""
    n = len(parallel.devices)
    rows = BATCH // n * n
    scale = np.repeat(np.logspace(-3, 0.5, n), rows // n)[:, None].astype(np.float32)
    x = np.random.default_rng(1).normal(size=(rows, D_IN)).astype(np.float32) * scale

    def nfe(params, x):
        return jnp.max(solve(params, x)[1].num_steps)

    mapped = parallel.map(nfe, (REPLICATED, SHARDED), PER_DEVICE)
    got = parallel.get(
        mapped(parallel.put(params, REPLICATED), parallel.put(x, SHARDED)), PER_DEVICE
    )
    alone = [int(nfe(params, part)) for part in np.split(x, n)]
    return {"per_device": np.asarray(got).tolist(), "alone": alone}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--save", default=None, help="train sharded, checkpoint to this folder")
    parser.add_argument("--resume", default=None, help="restore from this folder, train on")
    args = parser.parse_args()
    params, batches = problem()
    devices = jax.devices()
    out = {"num_devices": len(devices)}
    if args.save or args.resume:
        run = train(
            data_parallel(), params, batches, args.steps, save=args.save, resume=args.resume
        )
        with open(args.out, "w") as fh:
            json.dump(out | run, fh)
        return
    out["one"] = train(data_parallel("sharded", devices[:1]), params, batches, args.steps)
    for mode in ("sharded", "pmap"):
        out[mode] = train(data_parallel(mode), params, batches, args.steps)
        out[mode]["nfe"] = per_device_nfe(data_parallel(mode), params)
    with open(args.out, "w") as fh:
        json.dump(out, fh)


if __name__ == "__main__":
    main()
