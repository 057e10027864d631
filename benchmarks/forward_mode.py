"""Forward mode through the implicit layer: grad, jvp, jacfwd and Hessian-vector products.

    python -m benchmarks.forward_mode                     # d 512, batch 128 (the loop-cost problem)
    python -m benchmarks.forward_mode --d 128 --repeats 5 --rounds 3
    python -m benchmarks.forward_mode --smoke             # tiny sizes (checks the script)

The problem of ``benchmarks.solvers`` ("Loop cost"): ``f(z) = tanh(z Wᵀ + x Uᵀ + b)`` for a
batch of ``--batch`` inputs of size ``--d``, ``ρ(W) = --radius`` (1.0), float32, ``z0 = 0``,
batch-native solvers (``batch_ndim=1``) with per-example relative tolerance ``--tol`` (1e-4) and
at most ``--max_steps`` (100) evaluations, loss ``mean(z*²)``.

Rows, each under ``jax.jit``, for ``dq.ImplicitAdjoint()`` (the ``custom_vjp`` path; reverse
mode only) and ``dq.ImplicitAdjoint(forward_mode=True)`` (the ``custom_jvp`` path):

* ``fwd``: the forward solve alone (the value of the loss);
* ``grad``: ``jax.grad`` of the loss in the parameters (forward + backward);
* ``jvp``: ``jax.jvp`` of ``z*`` in ``x`` along one tangent;
* ``jacfwd (8)``: ``jax.jacfwd`` of ``z*`` with respect to an 8-dimensional input ``s`` that
  moves ``x`` along 8 fixed directions (``x + s V``): 8 tangents in one batched solve;
* ``hvp fwd-over-rev``: ``jax.jvp`` of ``jax.grad`` of the loss (parameters, one direction);
* ``hvp rev-over-fwd``: ``jax.grad`` of the loss's ``jvp`` (the same product).

A second table times ``grad`` on both paths call by call, interleaved (``--pairs`` pairs): the
median of the per-pair ratios is robust to a loaded machine.

Columns: the median wall time of ``--repeats`` calls after the first (ms); the first call's
time split into trace + lowering (``jax.jit(...).lower``) and XLA compilation (``.compile()``),
each the median over ``--rounds`` fresh programs (the batch grows by one per round, so every
cache misses).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

import deqjax as dq
from benchmarks import peers
from benchmarks.common import emit, machine, markdown_table, tanh_layer

ADJOINTS = {
    "ImplicitAdjoint()": dq.ImplicitAdjoint(),
    "ImplicitAdjoint(forward_mode=True)": dq.ImplicitAdjoint(forward_mode=True),
}
SOLVERS = {
    "FixedPointIteration": dq.solvers.FixedPointIteration,
    "Anderson(m=5)": dq.solvers.Anderson,
}


def programs(solver: Any, adjoint: Any, directions: jax.Array) -> dict[str, Callable]:
    """The un-jitted functions of every row, each ``(p, x, tangents) -> arrays``."""

    def z_star(p, x):
        return dq.fixed_point(
            peers.batch_cell, p, x, jnp.zeros_like(x), solver=solver, adjoint=adjoint
        )[0]

    def loss(p, x):
        return jnp.mean(z_star(p, x) ** 2)

    def fwd(p, x, t):
        return loss(p, x)

    def grad(p, x, t):
        return jax.grad(loss)(p, x)

    def jvp(p, x, t):
        return jax.jvp(lambda xx: z_star(p, xx), (x,), (t["x"],))[1]

    def jacfwd(p, x, t):
        return jax.jacfwd(lambda s: z_star(p, x + jnp.tensordot(s, directions, 1)))(
            jnp.zeros(directions.shape[0])
        )

    def hvp_fwd_rev(p, x, t):
        return jax.jvp(lambda q: jax.grad(loss)(q, x), (p,), (t["p"],))[1]

    def hvp_rev_fwd(p, x, t):
        return jax.grad(lambda q: jax.jvp(lambda r: loss(r, x), (q,), (t["p"],))[1])(p)

    return {
        "fwd": fwd,
        "grad": grad,
        "jvp": jvp,
        "jacfwd (8)": jacfwd,
        "hvp fwd-over-rev": hvp_fwd_rev,
        "hvp rev-over-fwd": hvp_rev_fwd,
    }


def inputs(d: int, batch: int, radius: float, seed: int = 0):
    """Parameters, input, tangents and the 8 input directions of one problem size."""
    p, x = tanh_layer(d, batch, radius, seed=seed)
    rng = np.random.default_rng(seed + 1)
    t = {
        "x": jnp.asarray(rng.normal(size=x.shape), x.dtype),
        "p": jax.tree_util.tree_map(lambda a: jnp.asarray(rng.normal(size=a.shape), a.dtype), p),
    }
    directions = jnp.asarray(rng.normal(size=(8,) + x.shape) / np.sqrt(d), x.dtype)
    return p, x, t, directions


def first_call(make: Callable, args: Any, rounds: int, d: int, batch: int) -> tuple[float, float]:
    """Median ``(trace + lowering, XLA compile)`` seconds of fresh programs, batch + r each."""
    lowers, compiles = [], []
    for r in range(rounds):
        p, x, t, directions = inputs(d, batch + 1 + r, args.radius)
        fn = make(directions)
        start = time.perf_counter()
        lowered = jax.jit(fn).lower(p, x, t)
        mid = time.perf_counter()
        lowered.compile()
        lowers.append(mid - start)
        compiles.append(time.perf_counter() - mid)
    return statistics.median(lowers), statistics.median(compiles)


def run_time(fn: Callable, call_args: tuple, repeats: int) -> float:
    """Median wall time (s) of ``fn(*call_args)`` over ``repeats`` calls after the first."""
    jax.block_until_ready(fn(*call_args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*call_args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def grad_pairs(args) -> list[dict[str, Any]]:
    """``grad`` of both paths timed call by call, interleaved: the median of the per-pair ratios
    (forward_mode / default), so that a load spike hits both sides of a pair."""
    out = []
    p, x, t, directions = inputs(args.d, args.batch, args.radius)
    for sname, make_solver in SOLVERS.items():
        solver = make_solver(max_steps=args.max_steps, tol=args.tol, batch_ndim=1)
        fns = [
            jax.jit(programs(solver, adjoint, directions)["grad"]) for adjoint in ADJOINTS.values()
        ]
        for fn in fns:
            jax.block_until_ready(fn(p, x, t))
        times: list[list[float]] = [[], []]
        for _ in range(args.pairs):
            for k, fn in enumerate(fns):
                start = time.perf_counter()
                jax.block_until_ready(fn(p, x, t))
                times[k].append(time.perf_counter() - start)
        ratios = [b / a for a, b in zip(*times)]
        out.append(
            {
                "solver": sname,
                "default ms": 1e3 * statistics.median(times[0]),
                "forward_mode ms": 1e3 * statistics.median(times[1]),
                "ratio (median of pairs)": statistics.median(ratios),
            }
        )
        print(out[-1], flush=True)
    return out


def rows(args) -> list[dict[str, Any]]:
    out = []
    p, x, t, directions = inputs(args.d, args.batch, args.radius)
    for sname, make_solver in SOLVERS.items():
        solver = make_solver(max_steps=args.max_steps, tol=args.tol, batch_ndim=1)
        for aname, adjoint in ADJOINTS.items():
            fns = programs(solver, adjoint, directions)
            for row, fn in fns.items():
                if not adjoint.forward_mode and row not in ("fwd", "grad"):
                    continue  # the custom_vjp path refuses forward mode
                seconds = run_time(jax.jit(fn), (p, x, t), args.repeats)

                def make(dirs, row=row, solver=solver, adjoint=adjoint):
                    return programs(solver, adjoint, dirs)[row]

                lower_s, compile_s = first_call(make, args, args.rounds, args.d, args.batch)
                out.append(
                    {
                        "solver": sname,
                        "adjoint": aname,
                        "program": row,
                        "ms": 1e3 * seconds,
                        "trace+lower s": lower_s,
                        "compile s": compile_s,
                    }
                )
                print(out[-1], flush=True)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--d", type=int, default=512)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--radius", type=float, default=1.0)
    parser.add_argument("--tol", type=float, default=1e-4)
    parser.add_argument("--max_steps", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=30, help="interleaved grad calls per path")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks the script")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.smoke:
        args.d, args.batch, args.repeats, args.rounds, args.pairs = 16, 4, 1, 1, 2
    pairs = markdown_table(
        grad_pairs(args),
        ["solver", "default ms", "forward_mode ms", "ratio (median of pairs)"],
        {"default ms": ".2f", "forward_mode ms": ".2f", "ratio (median of pairs)": ".3f"},
        align="lrrr",
    )
    table = markdown_table(
        rows(args),
        ["solver", "adjoint", "program", "ms", "trace+lower s", "compile s"],
        {"ms": ".2f", "trace+lower s": ".3f", "compile s": ".3f"},
        align="lllrrr",
    )
    title = (
        f"d = {args.d}, batch {args.batch}, ρ(W) = {args.radius}, float32, tol {args.tol}, "
        f"max_steps {args.max_steps}, median of {args.repeats} calls, {args.rounds} fresh "
        f"program(s) for the first-call split; {machine()}"
    )
    emit(["", title, "", *table, "", "grad, the two paths interleaved:", "", *pairs], args.out)


if __name__ == "__main__":
    main()
