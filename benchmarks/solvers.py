"""Forward-solver benchmark on a batched tanh DEQ layer (issue 2).

Problem: ``f(z) = tanh(W z + U x + b)`` with ``z, x`` in ``R^d``, ``W`` a Gaussian matrix rescaled
to a given spectral radius, a batch of 128 inputs, float32. Each solver is run per example under
``jax.vmap`` to a relative residual of ``1e-4`` (``stop_mode="rel"``).

Reported per (d, spectral radius, solver):

* ``NFE mean / max``: evaluations of ``f`` per example (``Solution.num_steps``) over the batch.
* ``conv``: fraction of the batch with status ``CONVERGED``.
* ``time``: wall time of one jitted, warmed batched solve (median of ``--repeats`` runs, each
  ending in ``block_until_ready``).
* ``f time``: time of one batched evaluation of ``f`` *inside a compiled loop* (a ``fori_loop`` of
  ``--f_loop`` evaluations divided by their number), so it carries no dispatch overhead. It is
  timed back to back with each solve (the machine is shared and its load varies).
* ``overhead = time / (NFE_max * f time)``, the median over repeats of the per-pair ratio.
  Under ``vmap`` a ``while_loop`` with a batched
  predicate keeps running the (batched) body until the *slowest* example is done; finished examples
  are frozen by a select but still pay for the body. So the work of a batched solve is
  ``NFE_max`` batched evaluations, and that is the denominator. An overhead of 1.0 means the
  solver's own bookkeeping is free next to ``f``.

Usage::

    python benchmarks/solvers.py                      # full grid (d 128/512/2048, radius .5/.9/1.5)
    python benchmarks/solvers.py --dims 128 --radii 0.9 --repeats 3   # quick check
    python benchmarks/solvers.py --out benchmarks/solvers.md
"""

from __future__ import annotations

import argparse
import datetime
import functools
import platform
import statistics
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common
from deqjax import solvers

DTYPE = jnp.float32


def make_problem(d: int, radius: float, batch: int, seed: int):
    """``W`` [d, d] with spectral radius ``radius``; the input injection ``U x + b`` [batch, d]."""
    params, x = common.tanh_layer(d, batch, radius, seed, dtype=DTYPE)
    return params["W"], x @ params["U"].T + params["b"]


def cell(w: jax.Array, inj: jax.Array, z: jax.Array) -> jax.Array:
    """One example: ``tanh(W z + U x + b)`` with ``inj = U x + b`` precomputed."""
    return jnp.tanh(w @ z + inj)


def solver_table(max_steps: int, memory: int) -> dict[str, Callable]:
    return {
        "fixed_point_iteration": functools.partial(solvers.fixed_point_iteration),
        "anderson(m=5)": functools.partial(solvers.anderson, m=5),
        "broyden(memory=None)": functools.partial(solvers.broyden, memory=None),
        f"broyden(memory={memory})": functools.partial(solvers.broyden, memory=memory),
    }


def make_batched_solve(solver: Callable, max_steps: int, tol: float):
    def solve_one(w, inj):
        z0 = jnp.zeros_like(inj)
        return solver(lambda z: cell(w, inj, z), z0, max_steps=max_steps, tol=tol, stop_mode="rel")

    return jax.jit(jax.vmap(solve_one, in_axes=(None, 0)))


def make_f_loop(n: int):
    def run(w, inj):
        z0 = jnp.zeros_like(inj)
        batched = jax.vmap(cell, in_axes=(None, 0, 0))
        return jax.lax.fori_loop(0, n, lambda _, z: batched(w, inj, z), z0)

    return jax.jit(run)


def _timed(fn: Callable, *args) -> float:
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - t0


def paired_times(solve: Callable, f_loop: Callable, n_f: int, *args, repeats: int):
    """Median solve time, median time per f evaluation, and median of the per-pair ratio.

    The machine is shared, so each repeat times the solve and the f loop back to back and the
    overhead is the median over repeats of their ratio (load spikes hit both sides of a pair).
    """
    jax.block_until_ready(solve(*args))  # compile + warm
    jax.block_until_ready(f_loop(*args))
    t_solve, t_f = [], []
    for _ in range(repeats):
        t_solve.append(_timed(solve, *args))
        t_f.append(_timed(f_loop, *args) / n_f)
    return statistics.median(t_solve), statistics.median(t_f), [a / b for a, b in zip(t_solve, t_f)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", type=int, nargs="+", default=[128, 512, 2048])
    parser.add_argument("--radii", type=float, nargs="+", default=[0.5, 0.9, 1.5])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--max_steps", type=int, default=50)
    parser.add_argument("--tol", type=float, default=1e-4)
    parser.add_argument("--memory", type=int, default=10, help="limited Broyden memory")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--f_loop", type=int, default=20, help="evaluations timed for f time")
    parser.add_argument("--solvers", nargs="+", default=None, help="subset of solver names")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=str, default=None, help="write the markdown table here")
    args = parser.parse_args()

    table = solver_table(args.max_steps, args.memory)
    if args.solvers:
        table = {
            k: v for k, v in table.items() if k.split("(")[0] in args.solvers or k in args.solvers
        }
    header = (
        "| d | radius | solver | NFE mean | NFE max | conv | rel res (median) | time (ms) "
        "| f time (ms) | overhead |\n|---|---|---|---|---|---|---|---|---|---|"
    )
    rows = []
    print(header, flush=True)
    for d in args.dims:
        for radius in args.radii:
            w, inj = make_problem(d, radius, args.batch, args.seed)
            f_loop = make_f_loop(args.f_loop)
            for name, solver in table.items():
                solve = make_batched_solve(solver, args.max_steps, args.tol)
                sol = jax.block_until_ready(solve(w, inj))
                t, t_f, ratios = paired_times(
                    solve, f_loop, args.f_loop, w, inj, repeats=args.repeats
                )
                nfe = np.asarray(sol.num_steps)
                conv = float(np.mean(np.asarray(sol.status) == solvers.CONVERGED))
                res = float(np.median(np.asarray(sol.rel_residual)))
                overhead = statistics.median(ratios) / nfe.max()
                row = (
                    f"| {d} | {radius:g} | {name} | {nfe.mean():.1f} | {nfe.max()} | {conv:.2f} "
                    f"| {res:.1e} | {1e3 * t:.2f} | {1e3 * t_f:.3f} | {overhead:.2f} |"
                )
                rows.append(row)
                print(row, flush=True)
    meta = (
        f"\n{datetime.date.today().isoformat()}, jax {jax.__version__}, "
        f"backend {jax.default_backend()}, {platform.processor() or platform.machine()}, "
        f"batch {args.batch}, float32, max_steps {args.max_steps}, tol {args.tol:g} (rel), "
        f"repeats {args.repeats}"
    )
    print(meta)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(header + "\n" + "\n".join(rows) + "\n" + meta + "\n")


if __name__ == "__main__":
    main()
