"""One optimizer step of a small DEQ per solver and gradient, sharded with ``check_vma=True`` and
without, and with ``jax.pmap``, in a process of its own (fake CPU devices).

    python -m tests.helpers.checked_shard_map_worker OUT.json [--cases anderson,broyden]

Run from the repository root with ``XLA_FLAGS=--xla_force_host_platform_device_count=N``. For
each case (a forward solver and an adjoint) it builds :func:`deqjax.training.train_step`'s update
with a :class:`~deqjax.BackwardStats` probe and the power-method spectral radius of the cell at
``z*`` as metrics, and runs one step on all N devices three ways from the same state and batch:
:meth:`Sharded.map_update` as it is (``jax.shard_map(..., check_vma=True)``), the same with
``check_vma=False`` (the sharded path before it was checked) and ``jax.pmap``. It writes each
way's metrics and new parameters, and the collectives of the checked program (inside solver loops
and outside).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import optax

import deqjax as dq
from benchmarks.collectives import count_collectives
from deqjax._src.training.data_parallel import REPLICATED, SHARDED, STATE_KINDS, data_parallel
from tests.helpers import parallel_worker

BATCH = 16
D, D_IN, CLASSES = parallel_worker.D, parallel_worker.D_IN, parallel_worker.CLASSES
TOL = 1e-5
FPI = dq.solvers.FixedPointIteration
CASES = {
    # A first backward solve of 2 steps fails at this tolerance: every example takes the GMRES
    # fallback.
    "anderson/implicit+gmres_fallback": (
        dq.solvers.Anderson(max_steps=60, tol=TOL, batch_ndim=1),
        dq.ImplicitAdjoint(solver=FPI(max_steps=2, tol=TOL), fallback_factor=1.0),
    ),
    # Three bodies between two reads of the stopping rule (a loop of static trip count on a CPU;
    # the unrolled chunk, with its optimization barriers, is traced for other platforms).
    "anderson_every3/implicit": (
        dq.solvers.Anderson(max_steps=60, tol=TOL, batch_ndim=1, check_every=3),
        dq.ImplicitAdjoint(),
    ),
    "broyden/implicit+bicgstab": (
        dq.solvers.Broyden(max_steps=40, tol=TOL, batch_ndim=1),
        dq.ImplicitAdjoint(solver=dq.solvers.BiCGStab(max_steps=40, tol=TOL)),
    ),
    "fpi/implicit+normalcg": (
        FPI(max_steps=80, tol=TOL, batch_ndim=1),
        dq.ImplicitAdjoint(solver=dq.solvers.NormalCG(max_steps=40, tol=TOL)),
    ),
    "fpi_per_example/implicit": (FPI(max_steps=80, tol=TOL), dq.ImplicitAdjoint()),
    "fpi/unrolled": (FPI(max_steps=30, tol=TOL, batch_ndim=1), dq.UnrolledAdjoint()),
    "anderson/phantom": (
        dq.solvers.Anderson(max_steps=60, tol=TOL, batch_ndim=1),
        dq.PhantomAdjoint(steps=3),
    ),
    "anderson/one_step": (
        dq.solvers.Anderson(max_steps=60, tol=TOL, batch_ndim=1),
        dq.OneStepAdjoint(),
    ),
    "broyden/shine": (dq.solvers.Broyden(max_steps=40, tol=TOL, batch_ndim=1), dq.ShineAdjoint()),
    "reversible/reversible": (
        dq.solvers.Reversible(max_steps=80, tol=TOL, batch_ndim=1),
        dq.ReversibleAdjoint(),
    ),
}


def make_update(solver, adjoint):
    def loss_fn(params, batch, key, reg_state, step, probe):
        x = batch["x"]
        z, sol = dq.fixed_point(
            parallel_worker.cell,
            params,
            x,
            jnp.zeros((x.shape[0], D)),
            solver=solver,
            adjoint=adjoint,
            backward_stats=probe,
        )
        logits = z @ params["head"]
        loss = jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]))
        rho = dq.jacobian.spectral_radius(
            lambda v: parallel_worker.cell(params, x, v), z, key, num_steps=4
        )
        return loss, {"nfe_max": jnp.max(sol.num_steps), "rho_max": rho}

    return dq.training.train_step(loss_fn, optax.sgd(0.05), backward_stats=True)


def problem(n_devices: int):
    """:mod:`parallel_worker`'s parameters (a contraction) and a batch whose shards grow in
    difficulty: each device's loops run for as long as its own shard needs."""
    params, _ = parallel_worker.problem()
    rng = np.random.default_rng(0)
    scale = np.repeat(np.logspace(-2, 0.3, n_devices), BATCH // n_devices)[:, None]
    batch = {
        "x": (rng.normal(size=(BATCH, D_IN)) * scale).astype(np.float32),
        "y": rng.integers(0, CLASSES, size=BATCH).astype(np.int32),
    }
    return params, batch


@contextlib.contextmanager
def unchecked():
    """``jax.shard_map`` with ``check_vma=False`` whatever its caller asks (the old path)."""
    shard_map = jax.shard_map

    def patched(*args, **kwargs):
        return shard_map(*args, **{**kwargs, "check_vma": False})

    with mock.patch.object(jax, "shard_map", patched):
        yield


def one_step(parallel, pair, params, batch, *, count=False):
    step = parallel.map_update(pair.update, donate=False)
    state = parallel.put(pair.init(params, jax.random.PRNGKey(0)), STATE_KINDS)
    placed = parallel.put(batch, SHARDED)
    new_state, metrics = step(state, placed)
    new_params = parallel.get(new_state, STATE_KINDS).params
    out = {
        "metrics": {k: float(v) for k, v in parallel.get(metrics, REPLICATED).items()},
        "params": {k: np.asarray(v).tolist() for k, v in new_params.items()},
    }
    if count:
        hlo = step.lower(state, placed).compile().as_text()
        out["collectives"] = count_collectives(hlo)._asdict()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated case names")
    args = parser.parse_args()
    params, batch = problem(jax.device_count())
    out = {"num_devices": jax.device_count(), "cases": {}}
    for name in args.cases.split(","):
        start = time.perf_counter()
        pair = make_update(*CASES[name])
        case = {"checked": one_step(data_parallel("sharded"), pair, params, batch, count=True)}
        with unchecked():
            case["unchecked"] = one_step(data_parallel("sharded"), pair, params, batch)
        case["pmap"] = one_step(data_parallel("pmap"), pair, params, batch)
        out["cases"][name] = case
        print(f"{name}: {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    with open(args.out, "w") as fh:
        json.dump(out, fh)


if __name__ == "__main__":
    main()
