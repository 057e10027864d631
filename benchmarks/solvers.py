"""Loop cost: each solver's time per evaluation of f against the floor, beside its peers.

    python -m benchmarks.solvers                     # d 128 and 512, batch 128, 3 processes
    python -m benchmarks.solvers --quick             # one process, fewer repeats
    python -m benchmarks.solvers --sizes 512x128 2048x256 --precision highest   # on a GPU
    python -m benchmarks.solvers --rows deqjax naive --modes native vmap
    python -m benchmarks.solvers --emulate_tf32 --dims 512 --rows deqjax naive jaxopt optimistix
    python -m benchmarks.solvers --loop_floor --check_every 1 4 8 --sizes 512x128 2048x256

One problem for every row: ``f(z) = tanh(z Wᵀ + x Uᵀ + b)`` (``benchmarks.common.tanh_layer``),
``ρ(W) = --radius`` (1.0), a batch of ``--batches`` inputs of size ``--dims``, float32, ``z0 = 0``,
per-example relative tolerance ``--tol`` (1e-4) where the library has one, at most
``--max_steps`` (100) evaluations, loss ``mean(z*²)``.

**The floor** is one batched evaluation of ``f`` inside a jitted ``lax.fori_loop`` (no dispatch,
no bookkeeping): ``t_f``; for the backward, one VJP ``u ↦ uᵀ ∂f/∂z`` at the fixed point with the
linearisation held, in the same kind of loop: ``t_vjp``. A row that makes ``n`` evaluations
(``NFE max``: the batch runs until its slowest example is done) has the forward floor
``n · t_f``; its **fwd ratio** is its forward time over that floor (1.0: the loop costs nothing
beyond ``f``). The **fwd+bwd ratio** divides the time of ``value_and_grad`` by
``n · t_f + n_bwd · t_vjp`` (``n_bwd``: the backward solve's evaluations of the VJP, for the rows
whose backward reports them).

Rows (``--rows``):

* ``naive``: a plain ``lax.while_loop`` of ``z ← f(z)`` until every example's relative residual is
  below ``tol`` (no statistics, no best iterate, no per-example freezing), and the same loop on
  ``u ← g + Jᵀu`` in a ``custom_vjp`` for the backward.
* ``deqjax``: ``dq.fixed_point`` with ``FixedPointIteration``, ``Anderson(m=5)`` and
  ``Broyden(memory=10)`` (``--modes``: ``native`` is ``batch_ndim=1``, ``vmap`` is ``jax.vmap``
  of the single-example solve) and ``dq.ImplicitAdjoint()`` (same solver, GMRES fallback).
* ``jaxopt``: ``FixedPointIteration``, ``AndersonAcceleration``, ``Broyden(history_size=10)`` with
  ``implicit_diff=True`` (absolute tolerance on the whole batch, set to ``tol · ‖z*‖``).
* ``optimistix``: ``FixedPointIteration`` (``rtol = atol = tol``), its ``ImplicitAdjoint`` with
  lineax's GMRES (its default linear solver forms the batch's whole Jacobian).
* ``torchdeq``: ``get_deq`` with ``fixed_point_iter``, ``anderson``, ``broyden`` and its IFT
  backward, where TorchDEQ and torch are installed (``pip install -e .[bench]``).

``--emulate_tf32`` rounds the cell's product operands as an NVIDIA GPU does at JAX's default
precision (TF32), unless the run's ``--precision`` is full: on a CPU the "converged" and
"≤ tol (f64)" columns then read as they do on a GPU (its times do not). The deqjax rows at a reduced
precision include the check of each solve at full precision (one more evaluation of ``f``); its
cost is the difference between a CPU run at the default precision and one at ``--precision
highest`` (CPU products are full float32 at both, so nothing else differs).

``--check_every 1 4 8`` gives every deqjax row once per value of ``check_every`` (the steps
between two reads of the stopping rule; ``auto`` by default). ``--loop_floor`` measures instead
what the loop itself costs: µs per evaluation of ``f`` over exactly 24 evaluations of a static
``fori_loop`` (no predicate read), of ``while_loop``s that check the batch's residual every 1, 4
and 8 steps, of deqjax's solvers at each ``--check_every`` (``tol = 0``: the whole budget) and of
jaxopt's ``AndersonAcceleration(5)``, interleaved call by call.

Columns: NFE mean / max over the batch, the fraction the solver reports converged, the fraction
whose relative residual ``‖f(z*) − z*‖ / ‖f(z*)‖`` recomputed in float64 is at most ``tol`` (1 %
slack for float32 rounding) and the largest such residual, forward time and ratio, forward +
backward time and ratio, and for the JAX loops that deqjax and the naive row compile, the
kernels (XLA fusions) in the solver loop's body. Times are medians over ``--repeats`` calls;
each call is timed next to the floor (the ratio is the median of the per-pair ratios, so a load
spike hits both sides of a pair); with ``--processes N`` every number is the median over ``N``
fresh processes (on a 2-core VM, XLA's thread pool has slow and fast processes: BENCHMARKS.md,
"Loop cost").
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import json
import re
import statistics
import subprocess
import sys
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

import deqjax as dq
from benchmarks import common, peers
from deqjax._src.solvers import loop as loop_lib

ROWS = ("naive", "deqjax", "jaxopt", "optimistix", "torchdeq")
DEQJAX = {
    "FixedPointIteration": dq.solvers.FixedPointIteration,
    "Anderson(m=5)": functools.partial(dq.solvers.Anderson, m=5),
    "Broyden(memory=10)": functools.partial(dq.solvers.Broyden, memory=10),
}
PEER_SOLVERS = {"FixedPointIteration": "fixed_point", "Anderson": "anderson", "Broyden": "broyden"}
COLUMNS = (
    "row",
    "NFE mean / max",
    "converged",
    "≤ tol (f64)",
    "max rel. res. (f64)",
    "fwd ms",
    "fwd ratio",
    "fwd+bwd ms",
    "bwd NFE max",
    "fwd+bwd ratio",
    "kernels / step",
)


# --- the floor ------------------------------------------------------------------------------------


def floor_loops(n: int) -> tuple[Callable, Callable]:
    """Jitted ``n`` evaluations of ``f`` and ``n`` held VJPs in a ``fori_loop`` (their floor)."""

    def f_loop(p, x):
        return jax.lax.fori_loop(0, n, lambda _, z: peers.batch_cell(p, x, z), jnp.zeros_like(x))

    def vjp_loop(p, x, z_star):
        _, vjp = jax.vjp(lambda z: peers.batch_cell(p, x, z), z_star)
        return jax.lax.fori_loop(0, n, lambda _, u: vjp(u)[0] + z_star, z_star)

    return jax.jit(f_loop), jax.jit(vjp_loop)


def _seconds(fn: Callable, *args: Any) -> float:
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - t0


# --- the naive row --------------------------------------------------------------------------------


def _naive_fpi(step: Callable, start: jax.Array, max_steps: int, tol: float):
    """``z ← step(z)`` in a bare ``while_loop`` until every example's relative residual is
    ``≤ tol``: ``(z, steps)``."""

    def cond(c):
        k, _, res = c
        return (k < max_steps) & (jnp.max(res) > tol)

    def body(c):
        k, z, _ = c
        fz = step(z)
        res = jnp.linalg.norm(fz - z, axis=-1) / jnp.linalg.norm(fz, axis=-1)
        return k + 1, fz, res

    init = (0, start, jnp.full(start.shape[:1], jnp.inf, start.dtype))
    k, z, _ = jax.lax.while_loop(cond, body, init)
    return z, k


def naive_loss(max_steps: int, tol: float) -> Callable:
    """``loss(p, x) -> (loss, (z*, steps, converged))`` with the naive forward and backward."""

    @jax.custom_vjp
    def solve(p, x):
        return _naive_fpi(lambda z: peers.batch_cell(p, x, z), jnp.zeros_like(x), max_steps, tol)

    def fwd(p, x):
        z, k = solve(p, x)
        return (z, k), (p, x, z)

    def bwd(res, cot):
        p, x, z = res
        _, vjp = jax.vjp(peers.batch_cell, p, x, z)
        g = cot[0]
        u, _ = _naive_fpi(lambda u: g + vjp(u)[2], g, max_steps, tol)
        g_p, g_x, _ = vjp(u)
        return g_p, g_x

    solve.defvjp(fwd, bwd)

    def loss(p, x):
        z, k = solve(p, x)
        steps = jnp.full(x.shape[:1], k, jnp.int32)
        return jnp.mean(z**2), (z, steps, jnp.ones(x.shape[:1], bool))

    return loss


def adjoint_problem(p, x, z_star) -> tuple[jax.Array, Callable]:
    """``(g, u ↦ Jᵀu)`` of every row's backward: ``g = ∂ mean(z*²) / ∂z*`` and the VJP of the
    batched cell at ``z*``."""
    _, vjp = jax.vjp(lambda z: peers.batch_cell(p, x, z), z_star)
    return 2.0 * z_star / z_star.size, lambda u: vjp(u)[0]


def naive_backward_steps(p, x, z_star, max_steps: int, tol: float) -> int:
    """The naive backward's evaluations of the VJP: its loop on ``u = g + Jᵀu`` at ``z*``."""
    g, vjp = adjoint_problem(p, x, z_star)
    steps = jax.jit(lambda g: _naive_fpi(lambda u: g + vjp(u), g, max_steps, tol)[1])(g)
    return int(steps)


# --- deqjax and optimistix rows -------------------------------------------------------------------


def deqjax_loss(
    make: Callable, mode: str, max_steps: int, tol: float, check_every: Any = "auto"
) -> Callable:
    """A deqjax row: ``dq.fixed_point`` with the solver ``make(...)`` and ``ImplicitAdjoint``."""
    bn = 1 if mode == "native" else 0
    solver = make(max_steps=max_steps, tol=tol, batch_ndim=bn, check_every=check_every)
    adjoint = dq.ImplicitAdjoint()

    def loss(p, x):
        z0 = jnp.zeros_like(x)
        if mode == "vmap":
            z, sol = jax.vmap(
                lambda xi, zi: dq.fixed_point(
                    peers.one_cell, p, xi, zi, solver=solver, adjoint=adjoint
                )
            )(x, z0)
        else:
            z, sol = dq.fixed_point(peers.batch_cell, p, x, z0, solver=solver, adjoint=adjoint)
        return jnp.mean(z**2), (z, sol.num_steps, sol.status == dq.solvers.CONVERGED)

    return loss


def deqjax_backward_steps(
    make: Callable, mode: str, p, x, z_star, max_steps, tol, check_every: Any = "auto"
) -> int:
    """The implicit backward's evaluations of the VJP (the slowest example), for its floor: the
    forward solver on ``u = g + Jᵀu`` at ``z*``, ``g = ∂ mean(z*²) / ∂z*`` (the fallback is not
    counted: it runs only where this solve fails)."""
    solver = make(
        max_steps=max_steps,
        tol=tol,
        batch_ndim=1 if mode == "native" else 0,
        check_every=check_every,
    )
    g, vjp = adjoint_problem(p, x, z_star)

    def one(gi, vjp_i):
        return solver(lambda u: gi + vjp_i(u), gi).num_steps

    if mode == "native":
        steps = jax.jit(lambda g: one(g, vjp))(g)
    else:

        def per_example(xi, zi, gi):
            _, vjp_i = jax.vjp(lambda z: peers.one_cell(p, xi, z), zi)
            return one(gi, lambda u: vjp_i(u)[0])

        steps = jax.jit(jax.vmap(per_example))(x, z_star, g)
    return int(np.max(np.asarray(steps)))


def optimistix_loss(max_steps: int, tol: float) -> Callable:
    import lineax as lx
    import optimistix as optx

    solver = optx.FixedPointIteration(rtol=tol, atol=tol)
    # Its default linear solver materialises the Jacobian of the whole batch ([B d, B d]: 16 s
    # at d = 128, out of memory at d = 512); GMRES is the Jacobian-free choice, as in the others.
    adjoint = optx.ImplicitAdjoint(linear_solver=lx.GMRES(rtol=tol, atol=tol, restart=20))

    def loss(p, x):
        sol = optx.fixed_point(
            lambda z, args: peers.batch_cell(args[0], args[1], z),
            solver,
            jnp.zeros_like(x),
            (p, x),
            max_steps=max_steps,
            adjoint=adjoint,
            throw=False,
        )
        steps = jnp.full(x.shape[:1], sol.stats["num_steps"], jnp.int32)
        done = jnp.full(x.shape[:1], sol.result == optx.RESULTS.successful)
        return jnp.mean(sol.value**2), (sol.value, steps, done)

    return loss


# --- measuring one row ----------------------------------------------------------------------------


def loop_kernels(fn: Callable, *args: Any) -> int:
    """XLA fusions in the largest while body of ``fn``'s compiled program (a solver step's
    kernels)."""
    text = jax.jit(fn).lower(*args).compile().as_text()
    best = 0
    for name in set(re.findall(r"body=%?([\w.\-]+)", text)):
        m = re.search(r"^%?" + re.escape(name) + r" [^\n]*\{\n(.*?)^\}", text, re.M | re.S)
        if m:
            best = max(best, common.count_fusions(m.group(1)))
    return best


def measure(
    loss: Callable, p, x, floors, args, bwd_steps: Callable | None, steps_per_body: int = 1
) -> dict[str, Any]:
    """One JAX row: statistics, float64 residuals, paired times and ratios (the loop body runs
    ``steps_per_body`` solver steps: its kernels are divided by it)."""
    f_loop, vjp_loop, n_floor = floors
    fwd = jax.jit(loss)
    grad = jax.jit(jax.value_and_grad(loss, has_aux=True))
    _, (z, steps, converged) = jax.block_until_ready(fwd(p, x))
    jax.block_until_ready(grad(p, x))
    steps = np.asarray(steps)
    n_max = int(steps.max())
    n_bwd = bwd_steps(z) if bwd_steps is not None else None
    rel = peers.per_example_rel_residual(p, x, z)
    fwd_ratios, both_ratios, t_fwd, t_both = [], [], [], []
    for _ in range(args.repeats):
        # The floor of each pair: the faster of two calls (the first after another program can
        # pay for cold caches).
        t_f = min(_seconds(f_loop, p, x) for _ in range(2)) / n_floor
        t_vjp = min(_seconds(vjp_loop, p, x, z) for _ in range(2)) / n_floor
        t_fwd.append(_seconds(fwd, p, x))
        t_both.append(_seconds(grad, p, x))
        fwd_ratios.append(t_fwd[-1] / (n_max * t_f))
        if n_bwd is not None:
            both_ratios.append(t_both[-1] / (n_max * t_f + n_bwd * t_vjp))
    return {
        "nfe_mean": float(steps.mean()),
        "nfe_max": n_max,
        "converged": float(np.mean(np.asarray(converged))),
        "below_tol": float(np.mean(rel <= 1.01 * args.tol)),
        "max_rel": float(rel.max()),
        "fwd_ms": 1e3 * statistics.median(t_fwd),
        "fwd_ratio": statistics.median(fwd_ratios),
        "both_ms": 1e3 * statistics.median(t_both),
        "bwd_nfe": n_bwd,
        "both_ratio": statistics.median(both_ratios) if both_ratios else None,
        "kernels": loop_kernels(lambda p, x: loss(p, x)[1][0], p, x) / steps_per_body,
    }


def measure_torch(solver: str, p, x, floors, args) -> dict[str, Any]:
    """A TorchDEQ row (its own timing; the ratio against this process's median floor)."""
    f_loop, _, n_floor = floors
    r = peers.measure_torchdeq(solver, p, x, args.max_steps, args.tol, args.repeats)
    t_f = statistics.median(_seconds(f_loop, p, x) / n_floor for _ in range(args.repeats))
    return {
        "nfe_mean": r["steps_mean"],
        "nfe_max": r["steps_max"],
        "converged": r["solver_converged"] / x.shape[0],
        "below_tol": r["below_tol"] / x.shape[0],
        "max_rel": r["max_rel_residual"],
        "fwd_ms": r["fwd_ms"],
        "fwd_ratio": r["fwd_ms"] / 1e3 / (r["steps_max"] * t_f),
        "both_ms": r["fwd_bwd_ms"],
        "bwd_nfe": None,
        "both_ratio": None,
        "kernels": None,
    }


def rows_for(d: int, batch: int, args) -> dict[str, dict]:
    """Every row of one problem size, measured in this process."""
    p, x = common.tanh_layer(d, batch, args.radius, seed=args.seed)
    f_loop, vjp_loop = floor_loops(args.floor_steps)
    z_ref = jax.jit(
        lambda p, x: (
            dq.solvers.Anderson(max_steps=args.max_steps, tol=args.tol, batch_ndim=1)(
                lambda z: peers.batch_cell(p, x, z), jnp.zeros_like(x)
            ).value
        )
    )(p, x)
    jax.block_until_ready((f_loop(p, x), vjp_loop(p, x, z_ref)))
    floors = (f_loop, vjp_loop, args.floor_steps)
    out: dict[str, dict] = {}

    def add(name: str, fn: Callable[..., dict], *fn_args: Any) -> None:
        try:
            out[name] = fn(*fn_args)
        except Exception as e:  # noqa: BLE001 -- a peer that fails is reported, not fatal
            print(f"{name}: FAILED {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            return
        print(f"d={d} B={batch} {name}: {out[name]}", file=sys.stderr, flush=True)

    if "naive" in args.rows:
        loss = naive_loss(args.max_steps, args.tol)
        bwd = functools.partial(naive_backward_steps, p, x, max_steps=args.max_steps, tol=args.tol)
        add("naive while_loop FPI", measure, loss, p, x, floors, args, bwd)
    if "deqjax" in args.rows:
        for name, make in DEQJAX.items():
            for mode in args.modes:
                for k in args.check_every:
                    loss = deqjax_loss(make, mode, args.max_steps, args.tol, k)
                    steps = functools.partial(
                        deqjax_backward_steps,
                        make,
                        mode,
                        p,
                        x,
                        max_steps=args.max_steps,
                        tol=args.tol,
                        check_every=k,
                    )
                    label = f"deqjax {name}" + ("" if mode == "native" else f" ({mode})")
                    label += "" if len(args.check_every) == 1 else f" k={k}"
                    per_body = loop_lib.resolve_check_every(k)
                    add(label, measure, loss, p, x, floors, args, steps, per_body)
    if "jaxopt" in args.rows:
        abs_tol = args.tol * float(jnp.linalg.norm(z_ref))
        for name, solver in PEER_SOLVERS.items():
            loss = peers.jaxopt_loss(solver, args.max_steps, abs_tol)
            add(f"jaxopt {name}", measure, loss, p, x, floors, args, None)
    if "optimistix" in args.rows:
        loss = optimistix_loss(args.max_steps, args.tol)
        add("optimistix FixedPointIteration", measure, loss, p, x, floors, args, None)
    if "torchdeq" in args.rows:
        for name, solver in PEER_SOLVERS.items():
            add(f"TorchDEQ {name}", measure_torch, solver, p, x, floors, args)
    t_f = statistics.median(_seconds(f_loop, p, x) / args.floor_steps for _ in range(5))
    t_vjp = statistics.median(_seconds(vjp_loop, p, x, z_ref) / args.floor_steps for _ in range(5))
    out["floor"] = {"t_f_ms": 1e3 * t_f, "t_vjp_ms": 1e3 * t_vjp}
    return out


# --- the loop floor: what a loop itself costs ----------------------------------------------------


FLOOR_STEPS = 24  # evaluations every row of the loop-floor table makes


def checked_loop(k: int, n: int) -> Callable:
    """``z ← f(z)`` for ``n`` evaluations in a ``while_loop`` whose body runs ``k`` of them
    (unrolled) and then computes the batch's largest relative residual, the quantity a stopping
    rule reads (with ``tol = 0`` it never stops early)."""

    def run(p, x):
        def cond(c):
            i, _, res = c
            return (i < n) & (res > 0.0)

        def body(c):
            i, z, _ = c
            for _ in range(k):
                fz = peers.batch_cell(p, x, z)
                z, prev = fz, z
            res = jnp.max(jnp.linalg.norm(z - prev, axis=-1) / jnp.linalg.norm(z, axis=-1))
            return i + k, z, res

        _, z, _ = jax.lax.while_loop(cond, body, (0, jnp.zeros_like(x), jnp.inf))
        return z

    return jax.jit(run)


def floor_table_rows(d: int, batch: int, args) -> dict[str, dict]:
    """µs per evaluation of every loop over ``FLOOR_STEPS`` evaluations: the static
    ``fori_loop``, ``while_loop``s checked every k steps, deqjax's solvers at each k (``tol = 0``,
    the whole budget) and jaxopt's Anderson, in this process."""
    p, x = common.tanh_layer(d, batch, args.radius, seed=args.seed)
    n = FLOOR_STEPS
    loops: dict[str, Callable] = {"fori_loop, static trip count": floor_loops(n)[0]}
    for k in (1, 4, 8):
        loops[f"while_loop, checked every {k}"] = checked_loop(k, n)
    for name, make in DEQJAX.items():
        for k in args.check_every:
            solver = make(max_steps=n, tol=0.0, batch_ndim=1, check_every=k)

            def forward(p, x, solver=solver):
                return solver(lambda z: peers.batch_cell(p, x, z), jnp.zeros_like(x)).value

            loops[f"deqjax {name} k={k}"] = jax.jit(forward)
    if "jaxopt" in args.rows:
        import jaxopt

        anderson = jaxopt.AndersonAcceleration(
            lambda z, p, x: peers.batch_cell(p, x, z), maxiter=n, tol=0.0, history_size=5
        )
        loops["jaxopt AndersonAcceleration(5)"] = jax.jit(
            lambda p, x: anderson.run(jnp.zeros_like(x), p, x)[0]
        )
    for fn in loops.values():
        jax.block_until_ready(fn(p, x))
    times: dict[str, list[float]] = {name: [] for name in loops}
    for _ in range(args.repeats):  # interleaved: a load spike hits every row alike
        for name, fn in loops.items():
            times[name].append(_seconds(fn, p, x) / n)
    base = statistics.median(times["fori_loop, static trip count"])
    out = {}
    for name, ts in times.items():
        t = statistics.median(ts)
        out[name] = {"us": 1e6 * t, "ratio": t / base}
        print(f"d={d} B={batch} {name}: {out[name]}", file=sys.stderr, flush=True)
    return out


def floor_table(merged: dict, args, processes: int) -> list[str]:
    lines = []
    for size, rows in merged.items():
        lines += ["", f"{size}: {FLOOR_STEPS} evaluations per row", ""]
        lines += common.markdown_header(("loop", "µs per evaluation", "÷ static loop"), "lrr")
        for name, r in rows.items():
            lines.append(common.markdown_row([name, f"{r['us']:.1f}", f"{r['ratio']:.2f}"]))
    lines += [
        "",
        f"{datetime.date.today().isoformat()}, {common.machine()}, float32, matmul precision "
        f"{args.precision or 'default'}, median of {args.repeats} calls per process, "
        f"{processes} process(es)",
    ]
    return lines


# --- tables ---------------------------------------------------------------------------------------


def _median(values: list) -> Any:
    values = [v for v in values if v is not None]
    if not values:
        return None
    return statistics.median(values)


def merge(runs: list[dict]) -> dict:
    """Per size and row, the median of every number over the processes."""
    merged: dict = {}
    for size in runs[0]:
        merged[size] = {}
        for row in runs[0][size]:
            keys = runs[0][size][row].keys()
            merged[size][row] = {
                k: _median([r[size][row].get(k) for r in runs if row in r[size]]) for k in keys
            }
    return merged


def _fmt(v: Any, spec: str) -> str:
    return "–" if v is None else format(v, spec)


def table(merged: dict, args, processes: int) -> list[str]:
    lines = []
    for size, rows in merged.items():
        floor = rows.pop("floor")
        lines += [
            "",
            f"{size}: floor t_f = {floor['t_f_ms']:.3f} ms per evaluation of f, "
            f"t_vjp = {floor['t_vjp_ms']:.3f} ms per held VJP",
            "",
            *common.markdown_header(COLUMNS, "l" + "r" * (len(COLUMNS) - 1)),
        ]
        for name, r in rows.items():
            nfe_max = "–" if r["nfe_max"] is None else f"{r['nfe_max']:.0f}"
            cells = [
                name,
                f"{r['nfe_mean']:.1f} / {nfe_max}",
                _fmt(r["converged"], ".2f"),
                _fmt(r["below_tol"], ".2f"),
                _fmt(r["max_rel"], ".1e"),
                _fmt(r["fwd_ms"], ".2f"),
                _fmt(r["fwd_ratio"], ".2f"),
                _fmt(r["both_ms"], ".2f"),
                _fmt(r["bwd_nfe"], ".0f"),
                _fmt(r["both_ratio"], ".2f"),
                _fmt(r["kernels"], ".3g"),
            ]
            lines.append(common.markdown_row(cells))
    lines += [
        "",
        f"{datetime.date.today().isoformat()}, {common.machine()}, float32, matmul precision "
        f"{args.precision or 'default'}{' (TF32 emulated)' if args.emulate_tf32 else ''}, "
        f"ρ(W) = {args.radius}, tol {args.tol:g} (relative), "
        f"max_steps {args.max_steps}, median of {args.repeats} calls per process, "
        f"{processes} process(es)",
    ]
    return lines


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--dims", type=int, nargs="+", default=[128, 512])
    p.add_argument("--batches", type=int, nargs="+", default=[128])
    p.add_argument(
        "--sizes",
        nargs="+",
        default=None,
        metavar="DxB",
        help="problem sizes as d x batch pairs (e.g. 512x128 2048x256) instead of every "
        "--dims x --batches combination",
    )
    p.add_argument("--radius", type=float, default=1.0)
    p.add_argument("--tol", type=float, default=1e-4)
    p.add_argument("--max_steps", type=int, default=100)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--floor_steps", type=int, default=20, help="evaluations in the floor's loop")
    p.add_argument("--rows", nargs="+", default=list(ROWS), choices=ROWS)
    p.add_argument("--modes", nargs="+", default=["native"], choices=["native", "vmap"])
    p.add_argument(
        "--check_every",
        nargs="+",
        default=["auto"],
        type=lambda v: v if v == "auto" else int(v),
        help="check_every values of the deqjax rows (one row per value), e.g. 1 4 8",
    )
    p.add_argument(
        "--loop_floor",
        action="store_true",
        help=f"the loop-floor table instead: µs per evaluation over {FLOOR_STEPS} evaluations of "
        "a static fori_loop, while_loops checked every 1/4/8 steps, deqjax at each "
        "--check_every (tol 0) and jaxopt's Anderson",
    )
    p.add_argument("--processes", type=int, default=3, help="fresh processes, medians over them")
    p.add_argument("--quick", action="store_true", help="one process, 5 repeats")
    p.add_argument("--smoke", action="store_true", help="d 16, batch 4, 1 repeat (a check)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--precision",
        default=None,
        help="matmul precision of the whole run (jax.default_matmul_precision), e.g. 'highest'; "
        "default: JAX's (TF32-class products for float32 on NVIDIA GPUs)",
    )
    p.add_argument(
        "--emulate_tf32",
        action="store_true",
        help="round the cell's product operands to TF32 unless --precision is full (a GPU's "
        "default-precision numbers on a CPU)",
    )
    p.add_argument("--out", default=None, help="also write the tables to this file")
    p.add_argument("--json", default=None, help=argparse.SUPPRESS)  # a worker's output file
    args = p.parse_args(argv)
    if args.quick:
        args.processes, args.repeats = 1, 5
    if args.smoke:
        args.dims, args.batches, args.repeats, args.processes = [16], [4], 1, 1
        args.sizes = None
    return args


def run(args) -> dict:
    """Every size's rows, measured in this process."""
    common.emulate_tf32(args.emulate_tf32)
    precision = (
        jax.default_matmul_precision(args.precision) if args.precision else contextlib.nullcontext()
    )
    measure_size = floor_table_rows if args.loop_floor else rows_for
    with precision:
        return {f"d = {d}, batch {b}": measure_size(d, b, args) for d, b in sizes(args)}


def sizes(args) -> list[tuple[int, int]]:
    """The ``(d, batch)`` problems of a run: ``--sizes``, else every ``--dims x --batches``."""
    if args.sizes:
        pairs = [tuple(int(v) for v in size.lower().split("x")) for size in args.sizes]
        if any(len(pair) != 2 for pair in pairs):
            raise SystemExit(f"--sizes takes DxB pairs such as 512x128, got {args.sizes}")
        return pairs
    return [(d, b) for d in args.dims for b in args.batches]


def main(argv=None) -> str:
    args = parse(argv)
    if args.json:  # a worker: measure, write the numbers, exit
        with open(args.json, "w") as fh:
            json.dump(run(args), fh)
        return ""
    if args.processes <= 1:
        runs = [run(args)]
    else:
        import tempfile

        runs = []
        argv = list(sys.argv[1:] if argv is None else argv)
        for i in range(args.processes):
            with tempfile.NamedTemporaryFile(suffix=".json") as fh:
                cmd = [sys.executable, "-m", "benchmarks.solvers", *argv, "--json", fh.name]
                subprocess.run(cmd, check=True)
                with open(fh.name) as res:
                    runs.append(json.load(res))
            print(f"# process {i + 1}/{args.processes} done", file=sys.stderr, flush=True)
    make_table = floor_table if args.loop_floor else table
    return common.emit(make_table(merge(runs), args, len(runs)), args.out)


if __name__ == "__main__":
    main()
