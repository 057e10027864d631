"""Eager calls and compile time: deqjax side by side with optimistix and jaxopt.

    python -m benchmarks.eager_and_compile [--d 32] [--calls 20] [--fresh_calls 4]
    python -m benchmarks.eager_and_compile --smoke     # tiny counts (checks the script)
    python -m benchmarks.eager_and_compile --long 10000   # one long eager gradient loop
    python -m benchmarks.eager_and_compile --breakdown 7  # what the first jitted gradient compiles

Every library is handed the same function object on repeated calls (the peers key their
compiled code by it). One problem for every row: ``z = tanh(W z + x)``, one example of size
``--d``, ``||W||_2 = 0.5``, float32, ``z0 = 0``, tolerance 1e-4, loss ``sum(z*²)``, gradient in
``W`` (implicit differentiation in every library). No ``jax.jit`` of the user's around the eager
rows.

Columns, per eager call after three warm-up calls (``--calls`` calls, the same function object):

* ``fwd``: the forward solve; ``grad``: ``jax.grad`` of the loss. Each gives the wall time per
  call (ms), XLA compilations per call (JAX's backend-compile event) and new memory mappings per
  call (lines of ``/proc/self/maps``: compiled code that is kept).
* ``new fn``: the gradient of a loss that writes its cell as an inline ``lambda`` closing over
  a new matrix each call (a new function object every call, ``--fresh_calls`` calls): ms,
  compilations and new mappings per call.
* ``first jit grad (s)``: trace + compile + first run of ``jax.jit(jax.grad(loss))``, the median
  over three sizes (``d``, ``d + 1``, ``d + 2``: every cache misses), after one unrelated jitted
  gradient has warmed JAX up (so the first row does not pay for it); ``HLO lines``: the size of
  that program's StableHLO text at ``d``.

``--breakdown R``: where the first jitted gradient's compile time goes (``d = 64``). For
deqjax's fixed-point iteration and Anderson: the forward solve alone, the gradient without the
GMRES fallback (``ImplicitAdjoint(fallback=None)``), the gradient with GMRES as the only backward
solve (what a backward that ran its fallback in the same loop could at best cost), and the
default gradient; beside optimistix's fixed-point gradient and jaxopt's Anderson gradient.
Each program is traced, compiled and run once per round at a new size (``d + round``: every
cache misses), the programs interleaved within a round; the table gives the median and the
lowest over ``R`` rounds, the kernels (XLA fusions) of the compiled program and its StableHLO
lines. On XLA:CPU compile time grows with the number of kernels (LLVM compiles each), roughly.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

import deqjax as dq
from benchmarks.common import count_fusions, emit, machine, markdown_table

TOL = 1e-4
COLUMNS = (
    "row",
    "fwd ms",
    "fwd compiles",
    "fwd maps",
    "grad ms",
    "grad compiles",
    "grad maps",
    "new fn ms",
    "new fn compiles",
    "new fn maps",
    "first jit grad (s)",
    "HLO lines",
)
FORMATS = {c: ".2f" for c in COLUMNS[1:]} | {"HLO lines": "d", "row": ""}

_compiles = [0]


def _count(event: str, *args: Any, **kwargs: Any) -> None:
    if event == "/jax/core/compile/backend_compile_duration":
        _compiles[0] += 1


def maps() -> int:
    with open("/proc/self/maps") as fh:
        return sum(1 for _ in fh)


def per_call(call: Callable[[int], Any], n: int, warmup: int = 3) -> tuple[float, float, float]:
    """(ms, compilations, new maps) per call of ``call(i)`` over ``n`` calls after ``warmup``."""
    for i in range(warmup):
        jax.block_until_ready(call(i))
    c0, m0, t0 = _compiles[0], maps(), time.perf_counter()
    for i in range(n):
        jax.block_until_ready(call(warmup + i))
    ms = (time.perf_counter() - t0) / n * 1e3
    return ms, (_compiles[0] - c0) / n, (maps() - m0) / n


# --- the rows: solve(cell, W, x) -> z*, with cell(W, x, z) -------------------------------------


def _deqjax(solver: Any, adjoint: Any = None) -> Callable:
    def solve(cell, w, x):
        return dq.fixed_point(cell, w, x, jnp.zeros_like(x), solver=solver, adjoint=adjoint)[0]

    return solve


def _last(make: Callable[[Callable], Any]) -> Callable[[Callable], Any]:
    """``make(cell)`` made once per cell (the last one kept): the peers key their compiled code by
    the function object they are given, so a repeated call must hand them the same one."""
    memo: list = [None, None]

    def get(cell: Callable) -> Any:
        if memo[0] is not cell:
            memo[:] = [cell, make(cell)]
        return memo[1]

    return get


def _optimistix(gmres: bool = False) -> Callable:
    """optimistix's fixed-point iteration; its default adjoint (a dense LU solve of the Jacobian,
    formed column by column), or with ``gmres`` lineax's GMRES (the choice that scales: see
    ``benchmarks/solvers.py``)."""
    import lineax as lx
    import optimistix as optx

    fpi = optx.FixedPointIteration(rtol=TOL, atol=TOL)
    fn_of = _last(lambda cell: lambda z, args: cell(args[0], args[1], z))
    adjoint = optx.ImplicitAdjoint()
    if gmres:
        adjoint = optx.ImplicitAdjoint(linear_solver=lx.GMRES(rtol=TOL, atol=TOL, restart=20))

    def solve(cell, w, x):
        z0 = jnp.zeros_like(x)
        return optx.fixed_point(fn_of(cell), fpi, z0, (w, x), max_steps=256, adjoint=adjoint).value

    return solve


def _jaxopt(kind: str) -> Callable:
    import jaxopt

    def make(cell):
        fn = lambda z, w, x: cell(w, x, z)  # noqa: E731
        return getattr(jaxopt, kind)(fixed_point_fun=fn, tol=TOL, maxiter=100)

    solver_of = _last(make)

    def solve(cell, w, x):
        return solver_of(cell).run(jnp.zeros_like(x), w, x).params

    return solve


ROWS = {
    "deqjax Anderson (default)": lambda: _deqjax(dq.solvers.anderson),
    "deqjax FixedPointIteration": lambda: _deqjax(dq.solvers.FixedPointIteration(max_steps=256)),
    "optimistix FixedPointIteration": _optimistix,
    "jaxopt FixedPointIteration": lambda: _jaxopt("FixedPointIteration"),
    "jaxopt AndersonAcceleration": lambda: _jaxopt("AndersonAcceleration"),
}


def cell(w, x, z):
    return jnp.tanh(w @ z + x)


def problem(d: int) -> tuple[jax.Array, jax.Array]:
    """``(W, x)`` with ``||W||_2 = 0.5``."""
    rng = np.random.default_rng(0)
    w0 = rng.normal(size=(d, d))
    w = jnp.asarray(0.5 * w0 / np.linalg.norm(w0, 2), jnp.float32)
    return w, jnp.asarray(rng.normal(size=d), jnp.float32)


def first_jit_grad(solve: Callable, d: int) -> float:
    """Seconds to trace, compile and run ``jax.jit(jax.grad(loss))`` once at size ``d``."""
    w, x = problem(d)
    t0 = time.perf_counter()
    jax.block_until_ready(jax.jit(jax.grad(lambda w: jnp.sum(solve(cell, w, x) ** 2)))(w))
    return time.perf_counter() - t0


def warm_up() -> None:
    """One jitted gradient through a ``while_loop``, so that JAX's own first-use costs are paid
    before the first row."""

    def loss(w):
        z = jax.lax.fori_loop(0, 3, lambda _, z: jnp.tanh(w @ z), jnp.ones(3))
        return jnp.sum(z**2)

    jax.block_until_ready(jax.jit(jax.grad(loss))(jnp.eye(3)))


def measure(name: str, solve: Callable, d: int, calls: int, fresh_calls: int) -> dict:
    w, x = problem(d)

    def loss(w):
        return jnp.sum(solve(cell, w, x) ** 2)

    first_jit = float(np.median([first_jit_grad(solve, d + k) for k in range(3)]))
    hlo_lines = jax.jit(jax.grad(loss)).lower(w).as_text().count("\n")

    fwd = per_call(lambda i: solve(cell, w, x), calls)
    grad_fn = jax.grad(loss)
    grad = per_call(lambda i: grad_fn(w), calls)

    def fresh(i):
        m = w * (1.0 + 1e-3 * i)  # a new matrix, closed over by a new lambda
        fresh_loss = lambda u: jnp.sum(solve(lambda a, b, z: jnp.tanh(m @ z + a), u, x) ** 2)  # noqa: E731
        return jax.grad(fresh_loss)(x)

    new = per_call(fresh, fresh_calls, warmup=1)
    row = {"row": name, "first jit grad (s)": first_jit, "HLO lines": hlo_lines}
    for prefix, values in (("fwd", fwd), ("grad", grad), ("new fn", new)):
        ms, compiles, new_maps = values
        row[f"{prefix} ms"] = ms
        row[f"{prefix} compiles"] = compiles
        row[f"{prefix} maps"] = new_maps
    return row


def long_loop(n: int, d: int) -> list[str]:
    """``n`` eager gradients of the deqjax default row in this process: compilations, memory
    mappings and resident memory at the start and after every tenth of the loop."""
    w, x = problem(d)
    solve = ROWS["deqjax Anderson (default)"]()
    grad = jax.grad(lambda w: jnp.sum(solve(cell, w, x) ** 2))
    ws = [w * (1.0 + 1e-6 * k) for k in range(7)]  # new values, same shapes, made beforehand
    jax.block_until_ready(grad(w))
    lines = [
        "| calls | compilations | memory mappings | resident MiB | ms per call |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    c0, t0, done = _compiles[0], time.perf_counter(), 0
    for mark in range(11):
        while done < n * mark // 10:
            jax.block_until_ready(grad(ws[done % 7]))
            done += 1
        ms = (time.perf_counter() - t0) / max(done, 1) * 1e3
        lines.append(f"| {done} | {_compiles[0] - c0} | {maps()} | {_rss_mib():.0f} | {ms:.2f} |")
        print(lines[-1], file=sys.stderr, flush=True)
    return lines


def _rss_mib() -> float:
    with open("/proc/self/status") as fh:
        kib = next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))
    return kib / 1024


def _gradient(solve: Callable) -> Callable:
    return jax.grad(lambda w, x: jnp.sum(solve(cell, w, x) ** 2))


def _forward(solve: Callable) -> Callable:
    return lambda w, x: solve(cell, w, x)


def breakdown_programs() -> dict[str, Callable[[], Callable]]:
    """The programs of ``--breakdown``: name -> a maker of ``program(w, x)``."""
    programs: dict[str, Callable[[], Callable]] = {}
    for name, solver in (
        ("FixedPointIteration", dq.solvers.FixedPointIteration(max_steps=256)),
        ("Anderson", dq.solvers.anderson),
    ):
        no_fallback = dq.ImplicitAdjoint(fallback=None)
        gmres_only = dq.ImplicitAdjoint(solver=dq.solvers.GMRES(), fallback=None)
        programs |= {
            f"deqjax {name}: forward only": lambda s=solver: _forward(_deqjax(s)),
            f"deqjax {name}: gradient, no fallback": lambda s=solver, a=no_fallback: _gradient(
                _deqjax(s, a)
            ),
            f"deqjax {name}: gradient, GMRES backward only": lambda s=solver, a=gmres_only: (
                _gradient(_deqjax(s, a))
            ),
            f"deqjax {name}: gradient, default": lambda s=solver: _gradient(_deqjax(s)),
        }
    programs["optimistix FixedPointIteration: gradient"] = lambda: _gradient(_optimistix())
    programs["optimistix FixedPointIteration: gradient, lineax GMRES backward"] = lambda: _gradient(
        _optimistix(gmres=True)
    )
    programs["jaxopt AndersonAcceleration: gradient"] = lambda: _gradient(
        _jaxopt("AndersonAcceleration")
    )
    return programs


def breakdown(rounds: int, d: int = 64) -> list[str]:
    """``--breakdown``: first-jit seconds (median and lowest over ``rounds``), kernels and
    StableHLO lines of each program of :func:`breakdown_programs`."""
    programs = breakdown_programs()
    times: dict[str, list[float]] = {name: [] for name in programs}
    sizes: dict[str, tuple[int, int]] = {}
    for r in range(rounds):
        for name, make in programs.items():
            w, x = problem(d + r)
            t0 = time.perf_counter()
            lowered = jax.jit(make()).lower(w, x)
            compiled = lowered.compile()
            jax.block_until_ready(compiled(w, x))
            times[name].append(time.perf_counter() - t0)
            sizes[name] = (count_fusions(compiled.as_text()), lowered.as_text().count("\n"))
        print(f"# round {r + 1} of {rounds} done", file=sys.stderr, flush=True)
    rows = [
        {
            "program": name,
            "first jit (s), median": float(np.median(times[name])),
            "lowest (s)": min(times[name]),
            "kernels": sizes[name][0],
            "HLO lines": sizes[name][1],
        }
        for name in programs
    ]
    columns = ("program", "first jit (s), median", "lowest (s)", "kernels", "HLO lines")
    formats = {"program": "", "first jit (s), median": ".2f", "lowest (s)": ".2f"}
    formats |= {"kernels": "d", "HLO lines": "d"}
    return markdown_table(rows, columns, formats, align="lrrrr")


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d", type=int, default=32)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--fresh_calls", type=int, default=4)
    parser.add_argument("--rows", nargs="*", default=list(ROWS), choices=list(ROWS))
    parser.add_argument("--smoke", action="store_true", help="tiny counts: checks the script")
    parser.add_argument(
        "--long", type=int, default=0, help="run one loop of this many eager gradients"
    )
    parser.add_argument(
        "--breakdown", type=int, default=0, help="rounds of the compile-time breakdown (d = 64)"
    )
    parser.add_argument("--out", default=None, help="also write the table to this file")
    args = parser.parse_args(argv)
    if args.smoke:
        args.d, args.calls, args.fresh_calls = 8, 2, 1
    jax.monitoring.register_event_duration_secs_listener(_count)
    if args.long:
        head = (
            f"{args.long} eager gradients (deqjax default, d = {args.d}), one process. {machine()}"
        )
        return emit([head, "", *long_loop(args.long, args.d)], args.out)
    warm_up()
    if args.breakdown:
        head = f"First jitted gradient, d = 64, {args.breakdown} rounds. {machine()}"
        return emit([head, "", *breakdown(args.breakdown)], args.out)
    rows = []
    for name in args.rows:
        rows.append(measure(name, ROWS[name](), args.d, args.calls, args.fresh_calls))
        print(f"# {name} done", file=sys.stderr, flush=True)
    lines = [
        f"Eager calls and compile time, z = tanh(W z + x), d = {args.d}, float32 "
        f"({args.calls} calls after 3 warm-up; new fn: {args.fresh_calls} calls). {machine()}",
        "",
        *markdown_table(rows, COLUMNS, FORMATS, align="l" + "r" * (len(COLUMNS) - 1)),
    ]
    return emit(lines, args.out)


if __name__ == "__main__":
    main()
