"""The main job's train step: throughput on 1 and several devices; NFE and accuracy with/without JR.

Two parts:

* **Throughput**: the data-parallel train step (``--parallel``) of ``experiments/fashion_mnist.py``
  at its default model and batch (DEQ width 128, Anderson 20 steps / tol 1e-3 forward, implicit
  Anderson backward, JR ``γ = 1``, ``p = 0.5``), on Fashion-MNIST batches. Median step time over
  ``--repeats`` steps after a warm-up (compile), examples/s = global batch / step time. Every row
  runs in a fresh subprocess: the 1-device row on the default backend (the GPU where there is
  one), rows of several devices with ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` and
  ``JAX_PLATFORMS=cpu`` (read at JAX start-up): the same global batch split over N CPU "devices"
  that share the machine's cores. The ``platform`` column says which.
* **JR on/off**: short runs of the main job (``--epochs``, default 1 epoch of the full training
  set) without JR, with JR at a fixed ``γ`` and with the adaptive ``γ``: final test accuracy, mean
  train / test forward NFE, test relative residual, backward residual and spectral radius at the
  last diagnostics step, and wall time.
* **Compute dtype** (``--dtypes float32,bfloat16,float16``): a throughput row per ``--dtype`` of
  the main job (with XLA's temporary memory of the step), and short runs of each instead of the
  JR variants (bfloat16 with ``--tol 1e-2 --bwd_tol 1e-2``, the tolerance it resolves).

Usage (from the repository root)::

    python -m benchmarks.training                    # both parts, markdown to stdout
    python -m benchmarks.training --skip_jr --repeats 20
    python -m benchmarks.training --skip_jr --devices 1 --deq_modes native,vmap,whole_batch
    python -m benchmarks.training --devices 1 --dtypes float32,bfloat16,float16  # --dtype rows
    python -m benchmarks.training --skip_jr --devices 1,2,4 --parallel sharded,pmap,jit
    python -m benchmarks.training --worker OUT.json  # one throughput measurement (internal)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

DEQ_MODES = {"native": True, "vmap": True, "whole_batch": False}


def dtype_flags(dtype: str) -> list[str]:
    """The main job's flags for ``--dtype dtype``: the tolerances bfloat16 resolves with it."""
    flags = ["--dtype", dtype]
    return flags + (["--tol", "1e-2", "--bwd_tol", "1e-2"] if dtype == "bfloat16" else [])


def throughput_table(rows: list[dict]) -> list[str]:
    """The Markdown table of :func:`measure_throughput`'s results."""
    from benchmarks.common import markdown_table

    cells = [
        {
            "DEQ mode": r["deq_mode"],
            "dtype": r["dtype"],
            "platform": r["platform"],
            "devices": r["devices"],
            "parallel": r["parallel"],
            "collectives in loops / outside": (
                f"{r['collectives_in_loops']} / {r['collectives_outside']}"
            ),
            "step (ms, median)": r["step_ms_median"],
            "step (ms, min)": r["step_ms_min"],
            "examples/s": r["examples_per_s"],
            "forward NFE": r["nfe_mean"],
            "first step incl. compile (s)": r["first_step_s_incl_compile"],
            "XLA temp (MiB)": r["temp_mib"],
        }
        for r in rows
    ]
    formats = {"step (ms, median)": ".1f", "step (ms, min)": ".1f", "examples/s": ".0f"}
    formats |= {"forward NFE": ".1f", "first step incl. compile (s)": ".1f"}
    formats |= {"XLA temp (MiB)": lambda v: "–" if v is None else f"{v:.1f}"}
    return markdown_table(cells, list(cells[0]), formats, "l")


def jr_table(rows: list[dict]) -> list[str]:
    """The Markdown table of :func:`jr_comparison`'s results."""
    from benchmarks.common import markdown_table

    cells = [
        {
            "variant": r["variant"],
            "test acc": r["test_accuracy"],
            "test NFE": r["test_nfe"],
            "test rel res": r["test_rel_residual"],
            "train NFE mean / last": f"{r['train_nfe_mean']:.2f} / {r['train_nfe_last']:.2f}",
            "γ last": r["gamma_last"],
            "bwd rel res": r["bwd_rel_residual_last"],
            "ρ(J)": r["spectral_radius_last"],
            "‖J‖_F": r["jac_frobenius_last"],
            "wall (s)": r["wall_s"],
        }
        for r in rows
    ]
    formats = {"test acc": ".4f", "test NFE": ".2f", "test rel res": ".1e", "γ last": ".3g"}
    formats |= {"bwd rel res": ".1e", "ρ(J)": ".3f", "‖J‖_F": ".2f", "wall (s)": ".0f"}
    return markdown_table(cells, list(cells[0]), formats, "l")


def measure_throughput(
    repeats: int,
    batch_size: int,
    jr: bool,
    dataset: str,
    deq_mode: str = "native",
    dtype: str = "float32",
    parallel: str = "sharded",
) -> dict:
    """Times the main job's train step on every local device (run in a fresh process).

    ``deq_mode`` selects ``dq.nn.DEQ``'s ``per_example`` for this process: ``native`` (the
    default, batch-native per-example stopping), ``vmap`` (the per-example mode before batch-native
    solves: vmap of batch-1 solves) or ``whole_batch`` (one stop for the batch). ``dtype`` is the
    main job's ``--dtype`` (its tolerances raised to 1e-2 where the dtype needs it); the row also
    reports XLA's temporary memory of the compiled step (a proxy for activation memory).
    ``parallel``: ``sharded`` (the default: ``jax.jit`` of ``jax.shard_map``), ``pmap``, or
    ``jit`` (a sharded ``jax.jit`` without ``shard_map``, for comparison only: the loops' stopping
    rules then read the whole batch); the row counts the compiled step's collectives inside
    while loops (run once per solver iteration) and outside.
    """
    import dataclasses
    import functools

    import jax
    import jax.numpy as jnp

    import deqjax as dq
    from benchmarks.collectives import count_collectives
    from deqjax import data, models, training
    from experiments import fashion_mnist as fm

    argv = ["--dataset", dataset, "--batch_size", str(batch_size)] + ([] if jr else ["--no_jr"])
    c = fm.EXPERIMENT.parse(argv + dtype_flags(dtype))  # the main job's defaults
    train_set, _, source = data.load_classification(dataset, train_size=20 * batch_size, seed=0)
    mode, _, fallback = deq_mode.partition("+")
    solver, adjoint = c.solver.solver_and_adjoint()
    if fallback == "no_fallback":  # ImplicitAdjoint without the GMRES fallback solve
        adjoint = dataclasses.replace(adjoint, fallback=None)
    if mode == "vmap":  # a solver that is not batch-native: the DEQ vmaps single-example solves
        if isinstance(adjoint, dq.ImplicitAdjoint) and adjoint.solver is None:
            adjoint = dataclasses.replace(adjoint, solver=solver)  # the same backward as native
        solver = functools.partial(lambda f, z0, s: s(f, z0), s=solver)
    make = functools.partial(
        models.MLPClassifier,
        c.model.width,
        solver=solver,
        adjoint=adjoint,
        per_example=DEQ_MODES[mode],
    )
    reg, _ = c.regularization.build(c.solver.tol)
    fns = models.classifier_fns(make, regularizer=reg, backward_solver=c.solver.backward())
    fns = c.compute.apply_each(models.MLPClassifier, fns)
    gamma = jnp.asarray(c.regularization.gamma, jnp.float32)

    def loss_fn(params, batch, key, reg_state, step):
        return fns.loss(params, batch["image"], batch["label"], key, gamma, step)

    devices = jax.devices()
    _, opt = c.optimization.optimizer(1000)
    scale = c.compute.loss_scale()
    params = fns.init(jax.random.PRNGKey(0), jnp.asarray(train_set["image"][:1]))
    it = data.ShuffledBatches(train_set, batch_size=batch_size, seed=0)
    one = training.train_step(loss_fn, opt, per_device_rng=False, axis_name=None, loss_scale=scale)
    _, memory = training.compile_with_memory(
        one.update, one.init(params, jax.random.PRNGKey(0)), jax.tree.map(jnp.asarray, next(it))
    )
    step_fn, put_state, put_batch, read = _placed_step(parallel, devices, loss_fn, opt, scale)
    state = put_state(params)
    batch = put_batch(next(it))
    t0 = time.perf_counter()
    collectives = count_collectives(step_fn.lower(state, batch).compile().as_text())
    state, metrics = step_fn(state, batch)
    jax.block_until_ready(metrics)
    compile_s = time.perf_counter() - t0
    times, nfes = [], []
    for _ in range(repeats):
        batch = put_batch(next(it))
        t0 = time.perf_counter()
        state, metrics = step_fn(state, batch)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - t0)
        nfes.append(float(read(metrics)["nfe"]))
    step_s = statistics.median(times)
    return {
        "devices": len(devices),
        "parallel": parallel,
        "collectives_in_loops": collectives.in_loops,
        "collectives_outside": collectives.outside,
        "deq_mode": deq_mode,
        "dtype": dtype,
        "temp_mib": None if memory is None else memory["temp_bytes"] / 2**20,
        "batch_size": batch_size,
        "jr": jr,
        "data": source,
        "step_ms_median": 1e3 * step_s,
        "step_ms_min": 1e3 * min(times),
        "examples_per_s": batch_size / step_s,
        "first_step_s_incl_compile": compile_s,
        "nfe_mean": statistics.mean(nfes),
        "jax": jax.__version__,
        "platform": jax.devices()[0].platform,
    }


def _placed_step(parallel: str, devices, loss_fn, opt, scale):
    """``(step_fn, put_state(params), put_batch(host batch), read(metrics))`` of the main job's
    step over ``devices`` (see :func:`measure_throughput`'s ``parallel``)."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from deqjax import training
    from deqjax._src.training.data_parallel import (
        REPLICATED,
        SHARDED,
        STATE_KINDS,
        data_parallel,
    )

    rng = jax.random.PRNGKey(0)
    par = data_parallel("sharded" if parallel == "jit" else parallel, devices)
    if parallel == "jit":
        pair = training.train_step(
            loss_fn, opt, per_device_rng=False, axis_name=None, loss_scale=scale
        )
        mesh = par.mesh
        return (
            jax.jit(pair.update, donate_argnums=0),
            lambda p: jax.device_put(pair.init(p, rng), NamedSharding(mesh, P())),
            lambda b: jax.device_put(b, NamedSharding(mesh, P("batch"))),
            lambda m: jax.tree.map(float, m),
        )
    pair = training.train_step(loss_fn, opt, per_device_rng=False, loss_scale=scale)
    return (
        par.map_update(pair.update),
        lambda p: par.put(pair.init(p, rng), STATE_KINDS),
        lambda b: par.put(b, SHARDED),
        lambda m: par.get(m, REPLICATED),
    )


def worker_env(devices: int, environ: dict[str, str]) -> dict[str, str]:
    """The environment of a throughput worker: one device is the default backend's (the GPU
    where there is one, as the caller's ``JAX_PLATFORMS`` allows); several are fake CPU devices
    (``--xla_force_host_platform_device_count``), sharing the host's cores."""
    env = dict(environ)
    if devices > 1:
        flags = env.get("XLA_FLAGS", "")
        env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={devices}".strip()
        env["JAX_PLATFORMS"] = "cpu"
    return env


def run_worker(
    devices: int,
    args,
    deq_mode: str = "native",
    dtype: str = "float32",
    parallel: str = "sharded",
) -> dict:
    """Runs :func:`measure_throughput` in a subprocess on ``devices`` devices
    (:func:`worker_env`)."""
    env = worker_env(devices, os.environ)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.json")
        cmd = [sys.executable, "-m", "benchmarks.training", "--worker", out]
        cmd += ["--repeats", str(args.repeats), "--batch_size", str(args.batch_size)]
        cmd += ["--dataset", args.dataset] + ([] if args.jr else ["--no_jr"])
        cmd += ["--deq_modes", deq_mode, "--dtypes", dtype, "--parallel", parallel]
        subprocess.run(cmd, check=True, env=env, cwd=_ROOT, timeout=1800)
        with open(out) as f:
            return json.load(f)


JR_VARIANTS = [
    ("no JR", ["--no_jr"]),
    ("JR γ=1, p=0.5", ["--gamma", "1.0", "--jr_p", "0.5"]),
    ("JR adaptive γ (init 1, target = tol)", ["--gamma", "1.0", "--adaptive_gamma"]),
]


def jr_comparison(args, variants=JR_VARIANTS) -> list[dict]:
    """Short main-job runs: without JR, with fixed γ, with adaptive γ (or other ``variants``:
    ``(name, flags)`` pairs)."""
    from deqjax import training
    from experiments import fashion_mnist as fm

    rows = []
    for name, extra in variants:
        with tempfile.TemporaryDirectory() as out:
            argv = ["--dataset", args.dataset, "--epochs", str(args.epochs), "--out_dir", out]
            argv += ["--no_progress", "--diagnostics_every", "100", "--checkpoint_every", "0"]
            t0 = time.perf_counter()
            summary = fm.main(argv + extra)
            wall = time.perf_counter() - t0
            records = training.read_jsonl(os.path.join(out, "metrics.jsonl"))
        train = [r for r in records if r["split"] == "train"]
        diag = [r for r in records if r["split"] == "diagnostics"]
        test = summary["test"]
        rows.append(
            {
                "variant": name,
                "test_accuracy": test["accuracy"],
                "test_nfe": test["nfe"],
                "test_rel_residual": test["rel_residual"],
                "train_nfe_mean": statistics.mean(r["nfe"] for r in train),
                "train_nfe_last": train[-1]["nfe"],
                "gamma_last": train[-1].get("jr/gamma", 0.0),
                "bwd_rel_residual_last": diag[-1]["bwd_rel_residual"] if diag else float("nan"),
                "spectral_radius_last": diag[-1]["spectral_radius"] if diag else float("nan"),
                "jac_frobenius_last": diag[-1]["jac_frobenius"] if diag else float("nan"),
                "steps": summary["num_steps"],
                "wall_s": wall,
            }
        )
        print(f"{name}: {rows[-1]}", file=sys.stderr, flush=True)
    return rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--worker", default=None, help="internal: write one measurement to this JSON")
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--batch_size", type=int, default=128)
    p.add_argument("--dataset", default="fashion_mnist", choices=("fashion_mnist", "digits"))
    p.add_argument("--no_jr", dest="jr", action="store_false")
    p.add_argument("--devices", default="1,2", help="device counts for the throughput table")
    p.add_argument(
        "--parallel",
        default="sharded",
        help="comma-separated: sharded (jax.jit + shard_map; default), pmap, jit (a sharded "
        "jax.jit without shard_map, for comparison): a throughput row each",
    )
    p.add_argument("--epochs", type=int, default=1, help="epochs of the JR on/off runs")
    p.add_argument("--skip_jr", action="store_true", help="skip the JR on/off runs")
    p.add_argument("--skip_throughput", action="store_true")
    p.add_argument(
        "--dtypes",
        default="float32",
        help="comma-separated --dtype values of the main job (float32, bfloat16, float16): one "
        "throughput row each and, with several, short runs of each instead of the JR on/off "
        "runs (bfloat16 with --tol 1e-2 --bwd_tol 1e-2)",
    )
    p.add_argument(
        "--deq_modes",
        default="native",
        help="comma-separated dq.nn.DEQ modes for the throughput table: native (default, "
        "batch-native per-example), vmap (per-example by vmap of single-example solves), "
        "whole_batch; a suffix +no_fallback (e.g. native+no_fallback) builds the implicit "
        "adjoint with fallback=None (no GMRES fallback solve)",
    )
    args = p.parse_args(argv)
    if args.worker:
        result = measure_throughput(
            args.repeats,
            args.batch_size,
            args.jr,
            args.dataset,
            args.deq_modes,
            args.dtypes,
            args.parallel,
        )
        with open(args.worker, "w") as f:
            json.dump(result, f)
        return
    lines = []
    if not args.skip_throughput:
        rows = [
            run_worker(int(n), args, mode, dtype, parallel)
            for mode in args.deq_modes.split(",")
            for dtype in args.dtypes.split(",")
            for parallel in args.parallel.split(",")
            for n in args.devices.split(",")
        ]
        lines += [
            f"Train step of the main job ({rows[0]['data']}; jax {rows[0]['jax']}; "
            f"global batch {args.batch_size}, "
            f"JR {'on' if args.jr else 'off'}; median of {args.repeats} steps after compile).",
            "",
            *throughput_table(rows),
            "",
        ]
    if not args.skip_jr:
        dtypes = args.dtypes.split(",")
        variants = JR_VARIANTS
        if len(dtypes) > 1:
            variants = [
                (f"--dtype {d}", dtype_flags(d) + ([] if args.jr else ["--no_jr"])) for d in dtypes
            ]
        rows = jr_comparison(args, variants)
        lines += [
            f"Short runs of the main job ({args.epochs} epoch(s), default flags otherwise):",
            "",
            *jr_table(rows),
        ]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
