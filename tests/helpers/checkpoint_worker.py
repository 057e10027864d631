"""Checkpoints in a process of their own: killed mid-save, exiting without close, on several
(fake CPU) devices, and as one of two processes joined by ``jax.distributed``.

    python -m tests.helpers.checkpoint_worker kill DIR --at after_save|before_commit
    python -m tests.helpers.checkpoint_worker exit DIR
    python -m tests.helpers.checkpoint_worker layout DIR OUT.json --parallel sharded|pmap --save
    python -m tests.helpers.checkpoint_worker layout DIR OUT.json --parallel sharded|pmap
    python -m tests.helpers.checkpoint_worker dist DIR OUT.json --port P --process_id I

Run from the repository root with ``JAX_PLATFORMS=cpu`` (``tests.helpers.train_worker.worker_env``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time

import jax
import numpy as np

from deqjax import training
from deqjax._src.training import checkpoints as checkpoints_module
from deqjax._src.training.checkpoint_contents import tree_digest
from deqjax._src.training.data_parallel import STATE_KINDS
from deqjax._src.training.run_policy import RunPolicy

FRESH, RESUME = RunPolicy(), RunPolicy(resume=True)


class Position:
    """The smallest data iterator a checkpoint needs: a position that restores."""

    def __init__(self, i: int = 0):
        self.i = i

    @property
    def state(self) -> dict:
        return {"i": self.i}

    def restore(self, state: dict) -> None:
        self.i = int(state["i"])


def host_state(seed: int, *, width: int = 64, carry_devices: int = 1) -> training.TrainState:
    """A state of ``width x width`` float32 weights (random, so it does not compress), an
    int32 step, a uint32 key and a carry of one row per local device (or none)."""
    rng = np.random.default_rng(seed)
    params = {"w": rng.normal(size=(width, width)).astype(np.float32)}
    carry = [np.full(3, seed + d, np.float32) for d in range(carry_devices)]
    carry = np.stack(carry) if carry else ()  # none: restores onto any number of devices
    return training.TrainState(
        params, {"m": np.zeros_like(params["w"])}, np.zeros(2, np.uint32), np.int32(seed), (), carry
    )


def _kill_before_commit(root, items):
    os.kill(os.getpid(), signal.SIGKILL)  # every file written, the folder not renamed yet


def run_kill(args) -> None:
    """Saves step 1 (committed), starts an asynchronous save of step 2, and SIGKILLs itself
    right after ``save`` returns or just before orbax commits step 2."""
    ckpt = training.Checkpoints(args.dir)
    data = Position(1)
    ckpt.save(1, host_state(1), data, force=True)
    ckpt.wait()
    if args.at == "before_commit":
        checkpoints_module.write_manifest = _kill_before_commit
    data.i = 2
    ckpt.save(2, host_state(2, width=2048), data, force=True)  # 16 MiB: still being written
    if args.at == "after_save":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)  # the callback kills the process


def run_exit(args) -> None:
    """Starts a slow asynchronous save and exits without closing: the save still commits."""
    real = checkpoints_module.write_manifest

    def slow(root, items):
        time.sleep(1.0)
        real(root, items)

    checkpoints_module.write_manifest = slow
    ckpt = training.Checkpoints(args.dir)
    ckpt.save(3, host_state(3), Position(3), force=True)
    print("exiting with a save in flight:", ckpt.all_steps())


def run_layout(args, out: dict) -> None:
    """Saves (``--save``) or restores the placed state of ``--parallel`` on this process's
    devices: a sharded state (no carry) onto any number of devices, a pmap state with one carry
    per device."""
    parallel = training.data_parallel(args.parallel)
    n = len(parallel.local_devices)
    carry_devices = n if args.parallel == "pmap" else 0
    fresh = host_state(0, carry_devices=carry_devices)
    ckpt = training.Checkpoints(args.dir)
    data = Position()
    state, restored = ckpt.restore_or_claim(
        fresh, data, RESUME if not args.save else FRESH, parallel
    )
    placed = parallel.put(state, STATE_KINDS)
    if args.save:
        saved = host_state(5, carry_devices=carry_devices)
        data.i = 5
        ckpt.save(5, parallel.put(saved, STATE_KINDS), data, force=True)
    ckpt.close()
    host = parallel.get(placed, STATE_KINDS)
    out.update(
        devices=n,
        restored_step=restored,
        position=data.i,
        params_digest=tree_digest(host.params),
        carry=np.asarray(host.carry).tolist(),
        placed_on=len(placed.params["w"].sharding.device_set),
        expected_digest=tree_digest(host_state(5).params),
    )


def run_dist(args, out: dict) -> None:
    """Two processes: an asynchronous save of a state sharded over both, a SIGTERM to process 1
    only (both agree to save and stop at the same step), then both restore it."""
    training.initialize_distributed(f"localhost:{args.port}", 2, args.process_id, timeout_s=60)
    parallel = training.data_parallel("sharded")
    ckpt = training.Checkpoints(args.dir, every_steps=4)
    data = Position()
    fresh = host_state(0, carry_devices=1)
    state, _ = ckpt.restore_or_claim(fresh, data, FRESH, parallel)
    placed = parallel.put(host_state(7, carry_devices=1), STATE_KINDS)
    saved_at, stopped_at = [], None
    for step in range(1, 10):
        data.i = step
        if step == 6 and args.process_id == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        if ckpt.save(step, placed, data):
            saved_at.append(step)
        if ckpt.preemption_requested:
            stopped_at = step
            break
    ckpt.close()
    again = training.Checkpoints(args.dir)
    data = Position()
    state, restored = again.restore_or_claim(fresh, data, RESUME, parallel)
    again.close()
    host = parallel.get(parallel.put(state, STATE_KINDS), STATE_KINDS)
    out.update(
        process_index=jax.process_index(),
        saved_at=saved_at,
        stopped_at=stopped_at,
        restored_step=restored,
        position=data.i,
        params_digest=tree_digest(host.params),
        expected_digest=tree_digest(host_state(7).params),
        steps=sorted(os.listdir(args.dir)),
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("kill", "exit", "layout", "dist"))
    parser.add_argument("dir")
    parser.add_argument("out", nargs="?")
    parser.add_argument("--at", default="after_save", choices=("after_save", "before_commit"))
    parser.add_argument("--parallel", default="sharded", choices=("sharded", "pmap"))
    parser.add_argument("--save", action="store_true")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--process_id", type=int, default=0)
    args = parser.parse_args()
    out: dict = {}
    if args.mode == "kill":
        run_kill(args)
    elif args.mode == "exit":
        run_exit(args)
    else:
        (run_layout if args.mode == "layout" else run_dist)(args, out)
        with open(args.out, "w") as f:
            json.dump(out, f)


if __name__ == "__main__":
    main()
