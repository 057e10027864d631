"""A training step's time while a checkpoint is written: synchronous against asynchronous saves.

The DEQ-Transformer LM of ``benchmarks/language_model.py`` (``dq.models.SequenceModel``, the
train step ``dq.training.train_step`` over ``dq.models.lm_loss``, its state donated to the next
step as ``fit`` does) at a width whose training state (parameters, Adam's two moments, the carried
memory) is large enough for a save to matter (defaults: ``d_model`` 256, vocabulary 16000, about
100 MiB). Each trial saves the state with :class:`~deqjax.training.Checkpoints` at one step and
trains ``--steps_after`` more steps, timing each one (``block_until_ready``), then waits for the
save to commit:

* ``save() blocks``: how long ``save`` held the training loop (synchronous: the whole write,
  manifest and commit; asynchronous: the copy off the device and the set-up);
* ``step during the write``: the median step time of the steps that ran while the save was still
  being written (asynchronous only: a synchronous save has finished before the next step);
* ``save + steps``: from the call to ``save`` to the end of the steps and the commit, against the
  same steps without a save (``steps alone``); their difference is what the save cost the run.

Synchronous and asynchronous trials alternate (``--repeats`` each, medians reported), with a trial
of the steps alone between them, so a loaded machine drifts both alike.

Usage (from the repository root)::

    python -m benchmarks.checkpoint_save                      # markdown table to stdout
    python -m benchmarks.checkpoint_save --repeats 7 --steps_after 8
    python -m benchmarks.checkpoint_save --d_model 32 --vocab_size 100 --repeats 1  # smoke
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax

import deqjax as dq
from benchmarks import common
from deqjax import training

MODES = ("sync", "async")


class _Position:
    """The data position saved with each checkpoint (a stand-in iterator's)."""

    def __init__(self):
        self.i = 0

    @property
    def state(self) -> dict:
        return {"i": self.i}

    def restore(self, state: dict) -> None:
        self.i = int(state["i"])


def build_step(args):
    """The jitted, donating LM train step, its first state and batch."""
    # language_model.build's model with the default (implicit) adjoint: the state is the same.
    settings = dq.models.DEQSettings(dq.solvers.Anderson(max_steps=args.depth, tol=0.0, m=5))

    def forward(tokens, mems, is_training):
        model = dq.models.SequenceModel(
            args.vocab_size,
            "deq",
            d_model=args.d_model,
            num_heads=args.num_heads,
            depth=args.depth,
            deq=settings,
            embed_init=hk.initializers.RandomNormal(0.02),
        )
        return model(tokens, mems, is_training=is_training)

    transformed = hk.transform(forward)
    rng = np.random.default_rng(0)
    shape = (args.batch_size, args.seq_len)
    tokens = jnp.asarray(rng.integers(0, args.vocab_size, shape), jnp.int32)
    batch = {
        "inputs": tokens,
        "targets": jnp.asarray(rng.integers(0, args.vocab_size, shape), jnp.int32),
        "reset": jnp.zeros((args.batch_size,), bool),
    }
    mems = dq.models.initial_memory(
        "deq",
        batch_size=args.batch_size,
        memory_length=args.seq_len,
        d_model=args.d_model,
        depth=args.depth,
    )
    params = transformed.init(jax.random.PRNGKey(0), tokens, mems, True)
    opt = optax.chain(optax.clip_by_global_norm(0.25), optax.adam(5e-3))
    loss_fn = dq.models.lm_loss(transformed, memory_length=args.seq_len)
    pair = training.train_step(loss_fn, opt, axis_name=None, with_carry=True)
    state = pair.init(params, jax.random.PRNGKey(1), carry=mems)
    return jax.jit(pair.update, donate_argnums=0), state, batch


def _timed_steps(step_fn, state, batch, n, committed=lambda: True):
    """``n`` steps, each timed to its end; also which of them started before ``committed()``."""
    times, during = [], []
    for _ in range(n):
        writing = not committed()
        t0 = time.perf_counter()
        state, metrics = step_fn(state, batch)
        jax.block_until_ready((state, metrics))
        times.append(time.perf_counter() - t0)
        if writing:
            during.append(times[-1])
    return state, times, during


def trial(mode: str, ckpt: training.Checkpoints, step_fn, state, batch, step: int, args):
    """One save at ``step`` and ``--steps_after`` steps; returns the state and the timings."""
    data = _Position()
    data.i = step
    t0 = time.perf_counter()
    ckpt.save(step, state, data, force=True)
    blocked = time.perf_counter() - t0
    committed = lambda: os.path.isdir(ckpt.path(step))  # noqa: E731 - renamed in at commit
    state, times, during = _timed_steps(step_fn, state, batch, args.steps_after, committed)
    ckpt.wait()
    total = time.perf_counter() - t0
    return state, {"blocked": blocked, "steps": times, "during": during, "total": total}


def measure(args) -> dict:
    """Alternating synchronous, asynchronous and save-free trials; medians of each."""
    step_fn, state, batch = build_step(args)
    size = sum(x.nbytes for x in jax.tree_util.tree_leaves(state))
    state, _, _ = _timed_steps(step_fn, state, batch, 2)  # compile and warm up
    results = {mode: [] for mode in MODES}
    alone = []
    with tempfile.TemporaryDirectory() as root:
        ckpts = {
            mode: training.Checkpoints(
                os.path.join(root, mode), keep=2, on_preemption=False, asynchronous=mode == "async"
            )
            for mode in MODES
        }
        step = 0
        for mode in MODES:  # first saves: compile the finiteness check, start orbax's threads
            step += 1
            state, _ = trial(mode, ckpts[mode], step_fn, state, batch, step, args)
        for r in range(args.repeats):
            for mode in MODES if r % 2 == 0 else MODES[::-1]:
                step += 1
                state, result = trial(mode, ckpts[mode], step_fn, state, batch, step, args)
                results[mode].append(result)
                t0 = time.perf_counter()
                state, times, _ = _timed_steps(step_fn, state, batch, args.steps_after)
                alone.append({"steps": times, "total": time.perf_counter() - t0})
            print(f"repeat {r + 1}/{args.repeats} done", file=sys.stderr, flush=True)
        for ckpt in ckpts.values():
            ckpt.close()
    return {"state_bytes": size, "results": results, "alone": alone}


def table(measured: dict, args) -> list[str]:
    median = statistics.median
    alone_total = median(a["total"] for a in measured["alone"])
    alone_step = median(t for a in measured["alone"] for t in a["steps"])
    rows = [
        {
            "save": "none",
            "save() blocks (ms)": None,
            "step during the write (ms)": None,
            "step, all (ms)": 1e3 * alone_step,
            f"save + {args.steps_after} steps (s)": alone_total,
            "cost of the save (s)": 0.0,
        }
    ]
    for mode in MODES:
        res = measured["results"][mode]
        during = [t for r in res for t in r["during"]]
        total = median(r["total"] for r in res)
        rows.append(
            {
                "save": "synchronous" if mode == "sync" else "asynchronous",
                "save() blocks (ms)": 1e3 * median(r["blocked"] for r in res),
                "step during the write (ms)": 1e3 * median(during) if during else None,
                "step, all (ms)": 1e3 * median(t for r in res for t in r["steps"]),
                f"save + {args.steps_after} steps (s)": total,
                "cost of the save (s)": total - alone_total,
            }
        )
    ms = lambda v: "–" if v is None else f"{v:.0f}"  # noqa: E731
    formats = {"save() blocks (ms)": ms, "step during the write (ms)": ms, "step, all (ms)": ms}
    formats |= {f"save + {args.steps_after} steps (s)": ".2f", "cost of the save (s)": "+.2f"}
    return common.markdown_table(rows, list(rows[0]), formats, "l")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--d_model", type=int, default=256)
    p.add_argument("--num_heads", type=int, default=4)
    p.add_argument("--vocab_size", type=int, default=16000)
    p.add_argument("--depth", type=int, default=4, help="forward Anderson steps (NFE)")
    p.add_argument("--seq_len", type=int, default=32)
    p.add_argument("--batch_size", type=int, default=8)
    p.add_argument("--steps_after", type=int, default=5, help="steps timed after each save")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default=None, help="also write the table here")
    args = p.parse_args(argv)
    measured = measure(args)
    header = (
        f"Checkpoint save of the DEQ-Transformer LM's training state "
        f"({measured['state_bytes'] / 2**20:.0f} MiB: d_model {args.d_model}, vocabulary "
        f"{args.vocab_size}, {args.depth} Anderson steps, batch {args.batch_size} x "
        f"{args.seq_len}; {common.machine()}); medians of {args.repeats} trials each, "
        f"`uptime` load {os.getloadavg()[0]:.1f} at the end.\n"
    )
    common.emit([header, *table(measured, args)], args.out)


if __name__ == "__main__":
    main()
