"""deqjax side by side with jaxopt and TorchDEQ, and deqjax's three batching modes.

    python -m benchmarks.peers [--radius 1.0 1.5] [--repeats 5] [--rows deqjax jaxopt torchdeq]
    python -m benchmarks.peers --smoke        # tiny sizes, every row once (checks the script)

One problem for every row: ``f(z) = tanh(W z + U x + b)`` (``benchmarks.common.tanh_layer``),
d = 512, batch 128, ``ρ(W) = --radius``, float32, ``z0 = 0``, at most ``--max_steps`` forward
steps, loss ``mean(z*²)``. Each row times ``value_and_grad`` of that loss in ``(W, U, b)`` per
batch (forward solve + implicit backward; median of ``--repeats`` after one warm-up call that
compiles), and the forward solve alone.

Rows:

* ``deqjax <solver> batch-native``: ``dq.fixed_point`` on the ``[B, d]`` batch with
  ``batch_ndim=1`` — one loop, each example stopping on its own at relative residual
  ``||f(z) - z|| / ||f(z)|| <= tol``; the implicit backward (``dq.ImplicitAdjoint()``: same
  solver kind, GMRES fallback) solves every example's adjoint in one batched loop.
* ``deqjax <solver> vmap``: ``jax.vmap`` of the single-problem ``dq.fixed_point`` (per example).
* ``deqjax <solver> whole-batch``: one problem of size ``B·d`` (``batch_ndim=0``), one stopping
  test on the batch's norms.
* ``jaxopt`` ``AndersonAcceleration`` / ``FixedPointIteration`` / ``Broyden`` (root of
  ``f(z) - z``) on the ``[B, d]`` batch with ``implicit_diff=True`` (its default linear solver).
  jaxopt's tolerance is absolute (``||f(z) - z||``, whole batch): it is set to
  ``tol · ||z*||`` with ``z*`` the batch-native Anderson solution, i.e. the whole-batch relative
  rule at the solution.
* ``TorchDEQ`` ``get_deq(f_solver=..., b_solver=..., ift=True, f_stop_mode="rel",
  b_stop_mode="rel")``: its implicit (IFT) backward; its solvers run on the batch, with per-example
  residuals but one stop when every example is below ``tol``.

Columns: forward+backward and forward time (ms), forward steps (mean / max over examples; the
shared loop count for whole-batch rows), examples the solver reports converged (whole-batch
rows: all or none), examples whose relative residual ``||f(z*) - z*|| / ||f(z*)||``, recomputed
in float64 for every row the same way, is at most ``tol`` (1 % slack for float32 rounding), the
largest such residual, and XLA's compiled temporary memory of the forward+backward
(``jax.jit(fn).lower(...).compile().memory_analysis().temp_size_in_bytes``) for JAX rows.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

import deqjax as dq
from benchmarks import common
from benchmarks.common import machine, markdown_table, tanh_layer, time_fn

SOLVERS = ("anderson", "broyden", "fixed_point")
_TORCH_DEFAULT_THREADS = None  # torch's own thread count, read before the first change
# The float64 recheck of a float32 solver's residual: 1 % slack for rounding.
_SLACK = 1.01
COLUMNS = (
    "row",
    "fwd+bwd (ms)",
    "fwd (ms)",
    "fwd steps mean / max",
    "solver: converged",
    "examples ≤ tol",
    "max rel. residual",
    "XLA temp (MiB)",
)


def batch_cell(p, x, z):
    """``tanh(W z + U x + b)`` for the whole batch: z, x of shape [B, d]."""
    r = common.product_operand
    return jnp.tanh(r(z) @ r(p["W"]).T + r(x) @ r(p["U"]).T + p["b"])


def one_cell(p, x, z):
    """One example: z, x of shape [d]."""
    r = common.product_operand
    return jnp.tanh(r(p["W"]) @ r(z) + r(p["U"]) @ r(x) + p["b"])


def per_example_rel_residual(params, x, z) -> np.ndarray:
    """``||f(z) - z|| / ||f(z)||`` per example, in float64 numpy (the same check for every row)."""
    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    x, z = np.asarray(x, np.float64), np.asarray(z, np.float64)
    fz = np.tanh(z @ p["W"].T + x @ p["U"].T + p["b"])
    return np.linalg.norm(fz - z, axis=-1) / np.linalg.norm(fz, axis=-1)


def deqjax_solver(name: str, max_steps: int, tol: float) -> Callable:
    if name == "anderson":
        return functools.partial(dq.solvers.anderson, max_steps=max_steps, tol=tol)
    if name == "broyden":
        return functools.partial(dq.solvers.broyden, max_steps=max_steps, tol=tol, memory=10)
    return functools.partial(dq.solvers.fixed_point_iteration, max_steps=max_steps, tol=tol)


def deqjax_loss(name: str, mode: str, max_steps: int, tol: float) -> Callable:
    """``loss(params, x) -> (loss, (z*, num_steps, status))`` for one deqjax row."""
    solver = deqjax_solver(name, max_steps, tol)
    adjoint = dq.ImplicitAdjoint()
    if mode == "batch-native":
        solver = functools.partial(solver, batch_ndim=1)

    def loss(p, x):
        z0 = jnp.zeros_like(x)
        if mode == "vmap":
            z, sol = jax.vmap(
                lambda xi, zi: dq.fixed_point(one_cell, p, xi, zi, solver=solver, adjoint=adjoint)
            )(x, z0)
        else:
            z, sol = dq.fixed_point(batch_cell, p, x, z0, solver=solver, adjoint=adjoint)
        done = jnp.broadcast_to(sol.status == dq.solvers.CONVERGED, x.shape[:1])
        return jnp.mean(z**2), (z, jnp.broadcast_to(sol.num_steps, x.shape[:1]), done)

    return loss


def jaxopt_loss(name: str, max_steps: int, abs_tol: float) -> Callable:
    import jaxopt

    fixed = lambda z, p, x: batch_cell(p, x, z)  # noqa: E731
    if name == "anderson":
        solver = jaxopt.AndersonAcceleration(fixed, maxiter=max_steps, tol=abs_tol)
    elif name == "broyden":
        # z - f(z), not f(z) - z: its initial inverse Jacobian is +I (first step = f(z)).
        root = lambda z, p, x: z - batch_cell(p, x, z)  # noqa: E731
        solver = jaxopt.Broyden(root, maxiter=max_steps, tol=abs_tol, history_size=10)
    else:
        solver = jaxopt.FixedPointIteration(fixed, maxiter=max_steps, tol=abs_tol)

    def loss(p, x):
        z, state = solver.run(jnp.zeros_like(x), p, x)
        steps = jnp.full(x.shape[:1], state.iter_num, jnp.int32)
        return jnp.mean(z**2), (z, steps, jnp.full(x.shape[:1], state.error <= abs_tol))

    return loss


def measure_jax(loss: Callable, params, x, repeats: int, tol: float) -> dict[str, Any]:
    grad = jax.jit(jax.value_and_grad(loss, has_aux=True))
    fwd = jax.jit(loss)
    compiled = grad.lower(params, x).compile()
    temp = compiled.memory_analysis().temp_size_in_bytes
    t0 = time.perf_counter()
    (_, (z, steps, converged)), _ = jax.block_until_ready(grad(params, x))
    first = time.perf_counter() - t0
    steps = np.asarray(steps)
    rel = per_example_rel_residual(params, x, z)
    return {
        "fwd_bwd_ms": 1e3 * time_fn(grad, params, x, repeats=repeats),
        "fwd_ms": 1e3 * time_fn(fwd, params, x, repeats=repeats),
        "steps_mean": float(steps.mean()),
        "steps_max": int(steps.max()),
        "solver_converged": int(np.sum(np.asarray(converged))),
        "below_tol": int(np.sum(rel <= _SLACK * tol)),
        "max_rel_residual": float(rel.max()),
        "temp_mib": temp / 2**20,
        "first_call_s": first,
    }


def measure_torchdeq(
    name: str, params, x, max_steps: int, tol: float, repeats: int, threads: int = 0
) -> dict[str, Any]:
    import torch
    from torchdeq import get_deq

    global _TORCH_DEFAULT_THREADS
    if _TORCH_DEFAULT_THREADS is None:
        _TORCH_DEFAULT_THREADS = torch.get_num_threads()
    torch.set_num_threads(threads or _TORCH_DEFAULT_THREADS)

    solver = {"anderson": "anderson", "broyden": "broyden", "fixed_point": "fixed_point_iter"}[name]
    tp = {k: torch.tensor(np.asarray(v), requires_grad=True) for k, v in params.items()}
    tx = torch.tensor(np.asarray(x))
    deq = get_deq(
        f_solver=solver,
        b_solver=solver,
        f_max_iter=max_steps,
        b_max_iter=max_steps,
        f_tol=tol,
        b_tol=tol,
        f_stop_mode="rel",
        b_stop_mode="rel",
        ift=True,
    )

    def f(z):
        return torch.tanh(z @ tp["W"].T + tx @ tp["U"].T + tp["b"])

    def step():
        for v in tp.values():
            v.grad = None
        deq.train()
        z_out, info = deq(f, torch.zeros_like(tx))
        loss = torch.mean(z_out[-1] ** 2)
        loss.backward()
        return z_out[-1], info

    def forward():
        deq.eval()
        with torch.no_grad():
            return deq(f, torch.zeros_like(tx))

    def timed(fn):
        fn()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return 1e3 * statistics.median(times)

    z, info = step()
    steps = info["nstep"].detach().numpy()
    rel = per_example_rel_residual(params, x, z.detach().numpy())
    return {
        "fwd_bwd_ms": timed(step),
        "fwd_ms": timed(forward),
        "steps_mean": float(steps.mean()),
        "steps_max": int(steps.max()),
        "solver_converged": int(np.sum(info["rel_lowest"].detach().numpy() <= tol)),
        "below_tol": int(np.sum(rel <= _SLACK * tol)),
        "max_rel_residual": float(rel.max()),
        "temp_mib": float("nan"),
        "first_call_s": float("nan"),
    }


def f_eval_ms(params, x, repeats: int) -> tuple[float, float]:
    """Median ms of one batched f evaluation, and of one ``u ↦ uᵀ ∂f/∂z`` at a fixed point with
    the linearisation held (the implicit backward's per-step work), to read the rows' times as
    steps × these + loop overhead."""
    solve = deqjax_solver("anderson", 100, 1e-4)
    z = jax.jit(lambda p, xx: solve(lambda zz: batch_cell(p, xx, zz), jnp.zeros_like(xx)).value)(
        params, x
    )
    _, vjp_fn = jax.vjp(lambda zz: batch_cell(params, x, zz), z)
    f = jax.jit(batch_cell)
    vjp = jax.jit(lambda u: vjp_fn(u)[0])
    reps = max(repeats, 20)
    return 1e3 * time_fn(f, params, x, z, repeats=reps), 1e3 * time_fn(vjp, z, repeats=reps)


def run_table(args, radius: float) -> list[tuple[str, dict]]:
    params, x = tanh_layer(args.d, args.batch, radius, seed=0)
    rows = []

    def add(name, fn, *fn_args):
        try:
            result = fn(*fn_args)
        except Exception as e:  # noqa: BLE001 -- a peer that fails is reported, not fatal
            print(f"{name}: FAILED {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            return
        rows.append((name, result))
        print(f"ρ={radius} {name}: {result}", file=sys.stderr, flush=True)

    timing = (params, x, args.repeats, args.tol)
    if "deqjax" in args.rows:
        for solver in args.solvers:
            for mode in args.modes:
                loss = deqjax_loss(solver, mode, args.max_steps, args.tol)
                add(f"deqjax {solver} {mode}", measure_jax, loss, *timing)
    if "jaxopt" in args.rows:
        native = deqjax_loss("anderson", "batch-native", args.max_steps, args.tol)
        ref = float(jnp.linalg.norm(jax.jit(native)(params, x)[1][0]))
        for solver in args.solvers:
            loss = jaxopt_loss(solver, args.max_steps, args.tol * ref)
            add(f"jaxopt {solver}", measure_jax, loss, *timing)
    if "torchdeq" in args.rows:
        torch_solvers = [s for s in args.solvers if s != "fixed_point" or args.torch_fixed_point]
        for solver in torch_solvers:
            for threads in args.torch_threads:
                add(
                    f"TorchDEQ {solver} ({threads or 'default'} torch threads)",
                    measure_torchdeq,
                    solver,
                    params,
                    x,
                    args.max_steps,
                    args.tol,
                    args.repeats,
                    threads,
                )
    return rows


def markdown(rows: list[tuple[str, dict]], batch: int) -> list[str]:
    cells = [
        {
            "row": name,
            "fwd+bwd (ms)": r["fwd_bwd_ms"],
            "fwd (ms)": r["fwd_ms"],
            "fwd steps mean / max": f"{r['steps_mean']:.1f} / {r['steps_max']}",
            "solver: converged": f"{r['solver_converged']}/{batch}",
            "examples ≤ tol": f"{r['below_tol']}/{batch}",
            "max rel. residual": r["max_rel_residual"],
            "XLA temp (MiB)": "–" if np.isnan(r["temp_mib"]) else f"{r['temp_mib']:.1f}",
        }
        for name, r in rows
    ]
    formats = {"fwd+bwd (ms)": ".1f", "fwd (ms)": ".1f", "max rel. residual": ".1e"}
    return markdown_table(cells, COLUMNS, formats, "l")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--d", type=int, default=512)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--radius", type=float, nargs="+", default=[1.0, 1.5])
    p.add_argument("--tol", type=float, default=1e-4)
    p.add_argument("--max_steps", type=int, default=100)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--rows", nargs="+", default=["deqjax", "jaxopt", "torchdeq"])
    p.add_argument("--solvers", nargs="+", default=list(SOLVERS), choices=SOLVERS)
    p.add_argument(
        "--modes",
        nargs="+",
        default=["batch-native", "vmap", "whole-batch"],
        choices=["batch-native", "vmap", "whole-batch"],
    )
    p.add_argument(
        "--torch_fixed_point",
        action="store_true",
        help="also run TorchDEQ's fixed_point_iter (off by default: not asked for)",
    )
    p.add_argument(
        "--torch_threads",
        type=int,
        nargs="+",
        default=[0],
        help="torch.set_num_threads for the TorchDEQ rows, one row each (0: torch's default). "
        "On a loaded machine torch's spinning OpenMP threads are 5-10x slower than 1 thread.",
    )
    p.add_argument("--smoke", action="store_true", help="d=32, batch 8, 1 repeat: a quick check")
    args = p.parse_args(argv)
    if args.smoke:
        args.d, args.batch, args.repeats, args.radius = 32, 8, 1, [1.0]
    print(f"Machine: {machine()}\n")
    for radius in args.radius:
        rows = run_table(args, radius)
        f_ms, vjp_ms = f_eval_ms(*tanh_layer(args.d, args.batch, radius, seed=0), args.repeats)
        print(
            f"ρ(W) = {radius}, d = {args.d}, batch {args.batch}, tol {args.tol} (relative), "
            f"max {args.max_steps} steps, median of {args.repeats}; one batched f evaluation "
            f"{f_ms:.2f} ms, one held VJP uᵀ∂f/∂z {vjp_ms:.2f} ms (jit, XLA):\n"
        )
        print("\n".join(markdown(rows, args.batch)) + "\n")


if __name__ == "__main__":
    main()
