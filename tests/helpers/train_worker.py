"""A toy Haiku MLP on scikit-learn digits for the training tests, and a subprocess entry point.

Imported by the tests of ``tests/training/`` (in-process checks, and :func:`run_worker` to start
this file) and run as a script for the checks that need their own process: a fake device count
(``XLA_FLAGS`` is read at JAX start-up), two processes joined by ``jax.distributed``, and runs
killed with SIGKILL / SIGTERM and resumed.

    python tests/helpers/train_worker.py dp OUT.json
    python tests/helpers/train_worker.py fit OUT.json --workdir DIR [--resume] [--kill_at_step K]
    python tests/helpers/train_worker.py dist OUT.json --port P --process_id I --num_processes N
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import subprocess
import sys
import time

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax

from deqjax import data, training
from deqjax._src.training.checkpoint import tree_digest
from deqjax._src.training.metrics import to_python

NUM_CLASSES = 10
WORKER = os.path.abspath(__file__)
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(WORKER)))


def worker_env(num_devices: int = 1) -> dict:
    """The environment of a worker process: ``num_devices`` CPU devices, JAX's default dtypes.

    The CPU backend even on a GPU machine: the fake host devices are CPU devices."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={num_devices}"
    env["JAX_PLATFORMS"] = "cpu"
    env.pop("JAX_ENABLE_X64", None)
    return env


def run_worker(args, *, num_devices=1, timeout=240, check=True) -> subprocess.CompletedProcess:
    """Runs this file with ``args`` in a fresh process; with ``check`` a failure raises."""
    proc = subprocess.run(
        [sys.executable, WORKER, *map(str, args)],
        env=worker_env(num_devices),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"worker {args} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc


def _forward(images: jax.Array) -> jax.Array:
    x = images.reshape(images.shape[0], -1)  # [B, 64]
    x = jax.nn.tanh(hk.Linear(32)(x))  # [B, 32]
    return hk.Linear(NUM_CLASSES)(x)  # [B, 10]


model = hk.without_apply_rng(hk.transform(_forward))


def init_params(seed: int = 0, dtype=jnp.float32):
    params = jax.jit(model.init)(jax.random.PRNGKey(seed), jnp.zeros((1, 8, 8), dtype))
    return jax.tree_util.tree_map(lambda p: p.astype(dtype), params)


def loss_fn(params, batch, key, reg_state, step, *, noise_scale=0.01):
    """Cross entropy of inputs with a little Gaussian noise (so the per-step RNG is exercised)."""
    images = jnp.asarray(batch["image"]).astype(jnp.float32)
    if noise_scale:
        images = images + noise_scale * jax.random.normal(key, images.shape, jnp.float32)
    logits = model.apply(params, images)
    labels = batch["label"]
    loss = jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, labels))
    accuracy = jnp.mean((jnp.argmax(logits, -1) == labels).astype(jnp.float32))
    per_example = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    return loss, {"accuracy": accuracy, "loss_max": jnp.max(per_example)}


def count_steps(reg_state, metrics, step):
    """A regularizer-state update that depends on reduced metrics: counts and sums the loss."""
    return {"count": reg_state["count"] + 1, "loss_sum": reg_state["loss_sum"] + metrics["loss"]}


def init_reg_state():
    return {"count": jnp.zeros((), jnp.int32), "loss_sum": jnp.zeros((), jnp.float32)}


def eval_fn(params, batch):
    logits = model.apply(params, jnp.asarray(batch["image"]).astype(jnp.float32))
    labels = batch["label"]
    return {
        "accuracy": (jnp.argmax(logits, -1) == labels).astype(jnp.float32),
        "loss": optax.softmax_cross_entropy_with_integer_labels(logits, labels),
    }


def make_optimizer(total_steps: int):
    schedule = training.make_schedule(
        learning_rate=3e-2, schedule="cosine", warmup_steps=5, total_steps=total_steps
    )
    return training.make_optimizer(learning_rate=schedule, clip_norm=5.0), schedule


class InterruptibleBatches(data.ShuffledBatches):
    """Batches that can SIGKILL their own process at a given step, or slow down each step.

    ``kill_at_step``: sends SIGKILL when asked for that batch (0-based); ``delay_s``: sleeps before
    each batch (gives a parent time to send SIGTERM mid-run).
    """

    def __init__(self, *args, kill_at_step: int | None = None, delay_s: float = 0.0, **kwargs):
        super().__init__(*args, **kwargs)
        self._kill_at = kill_at_step
        self._delay_s = delay_s

    def __next__(self):
        epoch, index = self.state
        if self._kill_at is not None and epoch * self.steps_per_epoch + index == self._kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        if self._delay_s:
            time.sleep(self._delay_s)
        return super().__next__()


noiseless_loss = functools.partial(loss_fn, noise_scale=0.0)

COUNTING_BATCH = 4


class CountingBatches:
    """An endless stream of batches (a ``Batches`` without epochs): batch ``i`` is
    ``{"x": i + arange(B) / B}``."""

    batch_size = local_batch_size = COUNTING_BATCH
    steps_per_epoch = None

    def __init__(self):
        self.i = 0

    @property
    def state(self):
        return {"i": self.i}

    def restore(self, state):
        self.i = int(state["i"])

    def __next__(self):
        x = (self.i + np.arange(COUNTING_BATCH) / COUNTING_BATCH).astype(np.float32)
        self.i += 1
        return {"x": x}


def carry_loss(params, batch, key, reg_state, step, carry):
    """A loss that reads the carry; the next carry is a decayed running mean of the batches."""
    target = jnp.mean(batch["x"]) + 0.1 * carry
    loss = jnp.sum((params["w"] - target) ** 2)
    return loss, {"carry": carry}, 0.5 * carry + jnp.mean(batch["x"])


def _flat(tree) -> list[float]:
    return np.concatenate([np.ravel(p) for p in jax.tree_util.tree_leaves(tree)]).tolist()


def toy_fit(
    data_: data.Batches,
    num_steps: int,
    *,
    loss=loss_fn,
    optimizer=None,
    actions=(),
    workdir=None,
    checkpoint_every=None,
    keep=3,
    resume=False,
    overwrite=False,
    parallel="sharded",
    say=None,
    skip=True,
    params=None,
    reg_state=(),
    carry=None,
    rng=7,
    **step_kwargs,
) -> training.FitResult:
    """``training.fit`` of ``loss`` (default the toy MLP's; else on ``params``, default
    ``{"w": zeros(3)}``) with checkpoints and a metrics file in ``workdir`` (None: neither); its
    optimizer (default SGD) skips non-finite updates unless ``skip`` is False."""
    if params is None:
        mlp = loss in (loss_fn, noiseless_loss)
        params = init_params() if mlp else {"w": jnp.zeros(3, jnp.float32)}
    optimizer = optimizer or optax.sgd(0.1)
    optimizer = training.skip_nonfinite(optimizer) if skip else optimizer
    pair = training.train_step(loss, optimizer, with_carry=carry is not None, **step_kwargs)
    carry = () if carry is None else carry
    state = pair.init(params, jax.random.PRNGKey(rng), reg_state=reg_state, carry=carry)
    checkpoints, writers = None, []
    if workdir is not None:
        checkpoints = training.Checkpoints(
            os.path.join(workdir, "ckpt"), every_steps=checkpoint_every, keep=keep
        )
        writers = [training.JsonlWriter(os.path.join(workdir, "metrics.jsonl"))]
    if isinstance(parallel, str):
        parallel = training.data_parallel(parallel)
    return training.fit(
        pair,
        state,
        data_,
        num_steps=num_steps,
        parallel=parallel,
        actions=actions,
        checkpoints=checkpoints,
        policy=training.RunPolicy(resume, overwrite),
        writers=writers,
        say=say,
    )


def _fit(workdir: str, args, *, resume: bool, kill_at_step=None, delay_s: float = 0.0):
    train = data.load_digits(split="train")
    it = InterruptibleBatches(
        train, batch_size=args.batch_size, seed=3, kill_at_step=kill_at_step, delay_s=delay_s
    )
    opt, schedule = make_optimizer(args.num_steps)
    return toy_fit(
        it,
        args.num_steps,
        optimizer=opt,
        actions=training.default_actions(log_every=1, progress=False),
        workdir=workdir,
        checkpoint_every=args.checkpoint_every,
        keep=2,
        resume=resume,
        say=print,
        reg_state=init_reg_state(),
        update_reg_state=count_steps,
        learning_rate_fn=schedule,
    )


def run_fit(args, out: dict) -> None:
    """A checkpointed run (maybe killed or slowed), then optionally a fresh reference run."""
    result = _fit(
        args.workdir,
        args,
        resume=args.resume,
        kill_at_step=args.kill_at_step,
        delay_s=args.step_delay_s,
    )
    out["interrupted"] = result.interrupted
    out["restored_step"] = result.restored_step
    out["step"] = int(result.state.step)
    out["digest"] = tree_digest(result.state)
    if args.reference_dir:
        ref = _fit(args.reference_dir, args, resume=False)
        out["reference_digest"] = tree_digest(ref.state)


def run_dp(args, out: dict) -> None:
    """Same global batches on 1 device and on all local devices: final params must agree."""
    train = data.load_digits(split="train")
    results = {}
    for name, devices in (("one", jax.local_devices()[:1]), ("all", jax.local_devices())):
        t0 = time.perf_counter()
        opt, schedule = make_optimizer(args.num_steps)
        it = data.ShuffledBatches(train, batch_size=args.batch_size, seed=3)
        pair = training.train_step(
            noiseless_loss,  # the noise would depend on the shard shape
            opt,
            update_reg_state=count_steps,
        )
        step_fn = jax.pmap(pair.update, axis_name="batch", donate_argnums=0, devices=devices)
        state = pair.init(init_params(), jax.random.PRNGKey(7), reg_state=init_reg_state())
        state = training.replicate(state, devices)
        losses, loss_max = [], []
        for _ in range(args.num_steps):
            state, metrics = step_fn(state, training.shard(next(it), devices))
            m = training.unreplicate(metrics)
            losses.append(float(m["loss"]))
            loss_max.append(float(m["loss_max"]))
        host = training.unreplicate(state)
        results[name] = {
            "params": _flat(host.params),
            "reg_state": to_python(host.reg_state),
            "losses": losses,
            "loss_max": loss_max,
            "num_devices": len(devices),
            "seconds": time.perf_counter() - t0,
        }
    out.update(results)


def run_dist(args, out: dict) -> None:
    training.initialize_distributed(
        f"localhost:{args.port}", args.num_processes, args.process_id, timeout_s=60
    )
    out["process_index"] = jax.process_index()
    out["process_count"] = jax.process_count()
    out["device_count"] = jax.device_count()
    train = data.load_digits(split="train")
    it = data.ShuffledBatches(train, batch_size=args.batch_size, seed=3)
    out["local_batch_size"] = it.local_batch_size
    opt, schedule = make_optimizer(args.num_steps)
    parallel = training.data_parallel(args.parallel)
    test = data.load_digits(split="test")

    def fit(batches, workdir=None):
        actions = [training.LogMetrics(every_steps=1), training.Evaluate(eval_fn, test)]
        if workdir is None:  # the resident run: the test set on the devices too
            actions[1] = training.Evaluate(eval_fn, test, resident=True)
        return toy_fit(
            batches,
            args.num_steps,
            loss=noiseless_loss,
            optimizer=opt,
            actions=actions,
            workdir=workdir,
            parallel=parallel,
            per_device_rng=False,
        )

    result = fit(it, args.workdir)
    out["losses"] = [r["loss"] for r in result.history if r["split"] == "train"]
    out["eval"] = [r for r in result.history if r["split"] == "eval"]
    out["params"] = _flat(result.state.params)
    out["digest"] = tree_digest(result.state.params)
    # The same run with the training and test sets on the devices (each process's copy).
    host = data.ShuffledBatches(train, batch_size=args.batch_size, seed=3)
    resident = fit(training.ResidentBatches(host, parallel))
    out["resident_losses"] = [r["loss"] for r in resident.history if r["split"] == "train"]
    out["resident_eval"] = [r for r in resident.history if r["split"] == "eval"]
    out["resident_digest"] = tree_digest(resident.state.params)
    if args.process_id == 0:
        # Reference: the same global batches on this process's devices alone, no collectives.
        ref_it = data.ShuffledBatches(
            train, batch_size=args.batch_size, seed=3, process_index=0, process_count=1
        )
        devices = jax.local_devices()[:1]
        pair = training.train_step(noiseless_loss, opt, per_device_rng=False)
        step_fn = jax.pmap(pair.update, axis_name="batch", donate_argnums=0, devices=devices)
        state = training.replicate(pair.init(init_params(), jax.random.PRNGKey(7)), devices)
        for _ in range(args.num_steps):
            state, _ = step_fn(state, training.shard(next(ref_it), devices))
        host = training.unreplicate(state)
        out["ref_params"] = _flat(host.params)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("dp", "fit", "dist"))
    parser.add_argument("out")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--num_steps", type=int, default=12)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--checkpoint_every", type=int, default=None)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--kill_at_step", type=int, default=None)
    parser.add_argument("--step_delay_s", type=float, default=0.0)
    parser.add_argument("--reference_dir", default=None)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--process_id", type=int, default=0)
    parser.add_argument("--num_processes", type=int, default=1)
    parser.add_argument("--parallel", default="sharded", choices=("sharded", "pmap"))
    args = parser.parse_args()
    out: dict = {}
    {"dp": run_dp, "fit": run_fit, "dist": run_dist}[args.mode](args, out)
    with open(args.out + ".tmp", "w") as f:
        json.dump(out, f)
    os.replace(args.out + ".tmp", args.out)
    if out.get("interrupted"):
        sys.exit(128 + signal.SIGTERM)


if __name__ == "__main__":
    main()
