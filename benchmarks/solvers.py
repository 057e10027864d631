"""Forward-solver benchmark on a batched tanh DEQ layer.

Problem: ``f(z) = tanh(W z + U x + b)`` with ``z, x`` in ``R^d``, ``W`` a Gaussian matrix rescaled
to a given spectral radius, a batch of inputs, float32, solved to a relative residual of ``1e-4``
(``stop_mode="rel"``) with per-example stopping, in two ways (``--modes``):

* ``native``: one batch-native solve (``batch_ndim=1``);
* ``vmap``: ``jax.vmap`` of the single-example solve.

Reported per (d, spectral radius, batch, solver, mode):

* ``NFE mean / max``: evaluations of ``f`` per example (``Solution.num_steps``) over the batch.
* ``conv``: fraction of the batch with status ``CONVERGED``.
* ``time``: wall time of one jitted, warmed batched solve (median of ``--repeats`` runs, each
  ending in ``block_until_ready``).
* ``f time``: time of one batched evaluation of ``f`` *inside a compiled loop* (a ``fori_loop`` of
  ``--f_loop`` evaluations divided by their number), so it carries no dispatch overhead. It is
  timed back to back with each solve (the machine is shared and its load varies).
* ``overhead = time / (NFE_max * f time)``, the median over repeats of the per-pair ratio. Both
  modes run the loop until the slowest example is done, evaluating the whole batch each step, so
  the work is ``NFE_max`` batched evaluations: an overhead of 1.0 means the solver's own bookkeeping
  is free next to ``f``.
* ``fusions``: the number of ``fusion`` instructions in the solver loop's compiled while body
  (XLA's kernels per step; each also costs a dispatch on CPU), and ``ops``: all non-trivial
  instructions there.

Usage::

    python benchmarks/solvers.py --quick     # reduced grid (d 128/512, batch 128, radius .9)
    python benchmarks/solvers.py             # full grid: d 128/512/2048, batch 1/32/128
    python benchmarks/solvers.py --dims 512 --radii 1.5 --batches 128 --solvers broyden
    python benchmarks/solvers.py --out benchmarks/solvers.md
    python benchmarks/solvers.py --quick --precision highest   # full float32 products on a GPU
"""

from __future__ import annotations

import argparse
import datetime
import functools
import platform
import re
import statistics
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common
from deqjax import solvers

DTYPE = jnp.float32
COLUMNS = ("d", "radius", "batch", "solver", "mode", "NFE mean", "NFE max", "conv", "time (ms)")
COLUMNS += ("f time (ms)", "overhead", "fusions", "ops")
ROW_FORMATS = ("", "g", "", "", "", ".1f", "", ".2f", ".2f", ".3f", ".2f", "", "")


def make_problem(d: int, radius: float, batch: int, seed: int):  # noqa: D103
    """``W`` [d, d] with spectral radius ``radius``; the input injection ``U x + b`` [batch, d]."""
    params, x = common.tanh_layer(d, batch, radius, seed, dtype=DTYPE)
    return params["W"], x @ params["U"].T + params["b"]


def cell(w: jax.Array, inj: jax.Array, z: jax.Array) -> jax.Array:
    """One example: ``tanh(W z + U x + b)`` with ``inj = U x + b`` precomputed."""
    return jnp.tanh(w @ z + inj)


def solver_table(memory: int) -> dict[str, Callable]:
    return {
        "fixed_point_iteration": functools.partial(solvers.fixed_point_iteration),
        "anderson(m=5)": functools.partial(solvers.anderson, m=5),
        f"broyden(memory={memory})": functools.partial(solvers.broyden, memory=memory),
        "broyden(memory=None)": functools.partial(solvers.broyden, memory=None),
    }


def make_batched_solve(solver: Callable, max_steps: int, tol: float, mode: str = "vmap"):
    """A jitted ``(w, inj) -> Solution`` for the whole batch, batch-native or vmapped."""
    if mode == "native":

        def solve_native(w, inj):
            return solver(
                lambda z: jnp.tanh(z @ w.T + inj),
                jnp.zeros_like(inj),
                max_steps=max_steps,
                tol=tol,
                stop_mode="rel",
                batch_ndim=1,
            )

        return jax.jit(solve_native)

    def solve_one(w, inj):
        z0 = jnp.zeros_like(inj)
        return solver(lambda z: cell(w, inj, z), z0, max_steps=max_steps, tol=tol, stop_mode="rel")

    return jax.jit(jax.vmap(solve_one, in_axes=(None, 0)))


def loop_body_counts(solve: Callable, *args) -> tuple[int, int]:
    """(fusions, non-trivial instructions) in the largest while body of the compiled solve."""
    text = solve.lower(*args).compile().as_text()
    bodies = set(re.findall(r"body=%?([\w.\-]+)", text))
    trivial = {"parameter", "get-tuple-element", "tuple", "constant", "bitcast", "copy"}
    best = (0, 0)
    for name in bodies:
        m = re.search(r"^%?" + re.escape(name) + r" [^\n]*\{\n(.*?)^\}", text, re.M | re.S)
        if not m:
            continue
        ops = re.findall(r"= \S+ ([\w\-]+)\(", m.group(1))
        counts = (sum(op == "fusion" for op in ops), sum(op not in trivial for op in ops))
        best = max(best, counts, key=lambda c: c[1])
    return best


def make_f_loop(n: int):
    def run(w, inj):
        z0 = jnp.zeros_like(inj)
        return jax.lax.fori_loop(0, n, lambda _, z: jnp.tanh(z @ w.T + inj), z0)

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
    parser.add_argument("--radii", type=float, nargs="+", default=[0.9])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32, 128])
    parser.add_argument("--modes", nargs="+", default=["native", "vmap"])
    parser.add_argument("--max_steps", type=int, default=50)
    parser.add_argument("--tol", type=float, default=1e-4)
    parser.add_argument("--memory", type=int, default=10, help="limited Broyden memory")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--f_loop", type=int, default=20, help="evaluations timed for f time")
    parser.add_argument(
        "--solvers",
        nargs="+",
        default=["fixed_point_iteration", "anderson(m=5)", "broyden(memory=10)"],
        help="solver names (prefixes such as 'broyden' match every variant)",
    )
    parser.add_argument("--quick", action="store_true", help="d 128/512, batch 128, 3 repeats")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=str, default=None, help="write the markdown table here")
    parser.add_argument(
        "--precision",
        default=None,
        help="matmul precision of the whole run (jax.default_matmul_precision), e.g. 'highest'; "
        "default: JAX's (TF32-class products for float32 on NVIDIA GPUs)",
    )
    args = parser.parse_args()
    if args.quick:
        args.dims, args.batches, args.repeats = [128, 512], [128], 3
    if args.precision is not None:
        with jax.default_matmul_precision(args.precision):
            run(args)
    else:
        run(args)


def run(args: argparse.Namespace) -> None:
    """The benchmark's table for the parsed ``args``."""

    table = {
        k: v
        for k, v in solver_table(args.memory).items()
        if any(k == name or k.split("(")[0] == name for name in args.solvers)
    }
    header = "\n".join(common.markdown_header(COLUMNS))
    rows = []
    print(header, flush=True)
    for d in args.dims:
        for radius in args.radii:
            for batch in args.batches:
                w, inj = make_problem(d, radius, batch, args.seed)
                f_loop = make_f_loop(args.f_loop)
                for name, solver in table.items():
                    for mode in args.modes:
                        solve = make_batched_solve(solver, args.max_steps, args.tol, mode)
                        sol = jax.block_until_ready(solve(w, inj))
                        fusions, ops = loop_body_counts(solve, w, inj)
                        t, t_f, ratios = paired_times(
                            solve, f_loop, args.f_loop, w, inj, repeats=args.repeats
                        )
                        nfe = np.asarray(sol.num_steps)
                        conv = float(np.mean(np.asarray(sol.status) == solvers.CONVERGED))
                        overhead = statistics.median(ratios) / nfe.max()
                        cells = [d, radius, batch, name, mode, nfe.mean(), nfe.max(), conv]
                        cells += [1e3 * t, 1e3 * t_f, overhead, fusions, ops]
                        row = common.markdown_row(cells, ROW_FORMATS)
                        rows.append(row)
                        print(row, flush=True)
    meta = (
        f"\n{datetime.date.today().isoformat()}, jax {jax.__version__}, "
        f"backend {jax.default_backend()}, {platform.processor() or platform.machine()}, "
        f"float32, matmul precision {args.precision or 'default'}, max_steps {args.max_steps}, "
        f"tol {args.tol:g} (rel), repeats {args.repeats}"
    )
    print(meta)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(header + "\n" + "\n".join(rows) + "\n" + meta + "\n")


if __name__ == "__main__":
    main()
