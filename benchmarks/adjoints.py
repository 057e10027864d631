"""Forward+backward cost of each gradient strategy, and backward memory versus forward steps.

    python -m benchmarks.adjoints [--d 512] [--batch 128] [--repeats 10] [--out FILE]
    python -m benchmarks.adjoints --tables comparison shine_k [--batch 32] [--radii 0.5 0.9]

Table 1: time of ``jit(grad(loss))`` per batch for every adjoint (forward Anderson, per-example
solves by ``vmap``, f(z) = tanh(W z + U x + b), spectral radius of W 0.9, tol 1e-4).
Table 2 (``--whole_batch``): implicit and unrolled with ONE solve for the whole batch (the batch
is part of the state; batch-level residuals). Under ``vmap`` the unrolled adjoint is pathological:
JAX transposes the batched scan with a per-example ``[B, d, d]`` cotangent accumulator for the
loop-invariant weights, so use per-example unrolled solves only as a small-scale reference.
Table 3: XLA's compiled temporary memory (``memory_analysis().temp_size_in_bytes``) of the same
gradient for the implicit and unrolled adjoints with a fixed number of forward steps (tol = 0).
Table 4 (``--tables comparison``): every adjoint on one batch-native forward Broyden solve
(reversible: its own solver) — fwd+bwd time, XLA temp memory, and the relative error of the
parameter gradient against the exact implicit gradient (float64 fixed point, dense float64 adjoint
solve per example). Table 5 (``--tables shine_k``): SHINE's gradient error against its refinement
steps.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import deqjax as dq
from benchmarks.common import (
    emit,
    machine,
    markdown_row,
    markdown_section,
    tanh_cell,
    tanh_layer,
    time_fn,
)

ADJOINTS = {
    "implicit": dq.ImplicitAdjoint(),
    "phantom(5, 0.5)": dq.PhantomAdjoint(steps=5, tau=0.5),
    "one-step": dq.OneStepAdjoint(),
    # Backprop through the Anderson steps as computed (timing and memory; not a gradient of z*).
    "unrolled": dq.UnrolledAdjoint(accelerated=True),
}

COMPARISON_COLUMNS = (
    "adjoint",
    "fwd+bwd time / batch (ms)",
    "forward NFE (mean / max)",
    "XLA temp memory (MiB)",
    "gradient rel. error",
    "bwd rel. residual (mean)",
    "fallbacks",
)


def make_grad(params, x, solver, adjoint):
    def loss(p):
        def one(xi):
            z, sol = dq.fixed_point(
                tanh_cell, p, xi, jnp.zeros_like(xi), solver=solver, adjoint=adjoint
            )
            return jnp.sum(z**2), sol.num_steps

        losses, steps = jax.vmap(one)(x)
        return jnp.mean(losses), steps

    return jax.jit(jax.grad(loss, has_aux=True))


def batch_cell(p, x, z):
    """The whole batch at once: z, x of shape [B, d]."""
    return jnp.tanh(z @ p["W"].T + x @ p["U"].T + p["b"])


def make_whole_batch_grad(params, x, solver, adjoint):
    def loss(p):
        z, sol = dq.fixed_point(batch_cell, p, x, jnp.zeros_like(x), solver=solver, adjoint=adjoint)
        return jnp.mean(jnp.sum(z**2, -1)), sol.num_steps

    return jax.jit(jax.grad(loss, has_aux=True))


def comparison_adjoints() -> dict:
    """Every gradient strategy (SHINE in four variants): name -> (adjoint, forward solver kind)."""
    return {
        "implicit": (dq.ImplicitAdjoint(), "broyden"),
        "phantom(5, 0.5)": (dq.PhantomAdjoint(steps=5, tau=0.5), "broyden"),
        "one-step": (dq.OneStepAdjoint(), "broyden"),
        "SHINE (no fallback)": (dq.ShineAdjoint(fallback=None), "broyden"),
        "SHINE+2 (no fallback)": (dq.ShineAdjoint(refine_steps=2, fallback=None), "broyden"),
        "SHINE+5 (no fallback)": (dq.ShineAdjoint(refine_steps=5, fallback=None), "broyden"),
        "SHINE (fallback_tol 0.1)": (dq.ShineAdjoint(fallback_tol=0.1), "broyden"),
        "reversible": (dq.ReversibleAdjoint(checkpoint_every=None), "reversible"),
    }


def exact_implicit_grad(params, x):
    """The gradient of ``mean_b sum(z_b^2)`` at the exact fixed point, in float64.

    z* by Broyden to 1e-13 (abs), then per example ``u = (I - J)^{-T} g`` by a dense solve,
    ``J = diag(1 - z^2) W``.
    """
    with jax.enable_x64(True):
        p64 = jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float64), params)
        x64 = jnp.asarray(x, jnp.float64)
        sol = dq.solvers.broyden(
            lambda z: batch_cell(p64, x64, z),
            jnp.zeros_like(x64),
            max_steps=300,
            tol=1e-13,
            stop_mode="abs",
            batch_ndim=1,
        )
        z = sol.value
        batch, d = z.shape
        jac = (1.0 - z**2)[:, :, None] * p64["W"][None]  # [B, d, d]
        g = 2.0 * z / batch
        eye = jnp.eye(d, dtype=jnp.float64)
        u = jnp.linalg.solve(jnp.swapaxes(eye[None] - jac, 1, 2), g[..., None])[..., 0]
        _, vjp = jax.vjp(lambda p: batch_cell(p, x64, z), p64)
        (grad,) = vjp(u)
        return jax.tree_util.tree_map(np.asarray, grad), int(jnp.max(sol.num_steps))


def rel_error(grad, exact) -> float:
    num = sum(np.sum((np.asarray(grad[k], np.float64) - exact[k]) ** 2) for k in exact)
    return float(np.sqrt(num / sum(np.sum(exact[k] ** 2) for k in exact)))


def comparison_table(args) -> list[str]:
    """Table 4: the adjoint comparison at each spectral radius in ``--radii``."""
    lines = [
        "",
        f"Adjoint comparison: d={args.d}, batch={args.batch}, float32, one batch-native "
        f"forward solve (max {args.max_steps} steps, tol {args.tol:g} rel): Broyden (memory "
        "None) for all but reversible (dq.solvers.reversible, beta 0.8, same budget). Loss "
        "mean_b sum(z_b^2); error = relative L2 error of the (W, U, b) gradient against the exact "
        "float64 implicit gradient. bwd rel. residual / fallbacks: the BackwardStats probe "
        "(SHINE: the checked adjoint residual; reversible: its reversal error). Times: median "
        f"of {args.repeats} round-robin rounds (one call of each adjoint per round).",
    ]
    for radius in args.radii:
        params, x = tanh_layer(args.d, args.batch, radius=radius)
        exact, exact_steps = exact_implicit_grad(params, x)
        title = f"Spectral radius of W {radius} (exact z*: {exact_steps} float64 Broyden steps):"
        lines += markdown_section(title, COMPARISON_COLUMNS, "lrrrrrr")
        grads = {}
        for name, (adjoint, kind) in comparison_adjoints().items():
            base_solver = dq.solvers.broyden if kind == "broyden" else dq.solvers.reversible
            solver = functools.partial(
                base_solver, max_steps=args.max_steps, tol=args.tol, batch_ndim=1
            )

            def loss(p, probe, solver=solver, adjoint=adjoint, x=x):
                z, sol = dq.fixed_point(
                    batch_cell,
                    p,
                    x,
                    jnp.zeros_like(x),
                    solver=solver,
                    adjoint=adjoint,
                    backward_stats=probe,
                )
                return jnp.mean(jnp.sum(z**2, -1)), sol.num_steps

            grads[name] = jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True))
        probe = dq.BackwardStats.zeros()
        for grad in grads.values():  # compile and warm up every variant first
            jax.block_until_ready(grad(params, probe))
        # Timed round-robin (one call of each variant per round, median over rounds), so that the
        # load of a shared machine drifting over the run affects every variant alike.
        times = {name: [] for name in grads}
        for _ in range(args.repeats):
            for name, grad in grads.items():
                start = time.perf_counter()
                jax.block_until_ready(grad(params, probe))
                times[name].append(time.perf_counter() - start)
        for name, grad in grads.items():
            seconds = statistics.median(times[name])
            mem = grad.lower(params, probe).compile().memory_analysis().temp_size_in_bytes
            (g, stats), steps = grad(params, probe)
            count = max(float(stats.count), 1.0)
            nfe = f"{float(jnp.mean(steps)):.1f} / {int(jnp.max(steps))}"
            cells = [name, 1e3 * seconds, nfe, mem / 2**20, rel_error(g, exact)]
            cells += [float(stats.rel_residual) / count, int(stats.fallbacks)]
            lines.append(markdown_row(cells, ["", ".1f", "", ".1f", ".2e", ".2e", ""]))
            print(lines[-1], flush=True)
    return lines


def shine_refinement_table(args) -> list[str]:
    """Table 5: SHINE's gradient error against refinement steps k (no fallback), per radius."""
    title = (
        "SHINE gradient error vs refinement steps k (no fallback; same problem and forward solve "
        "as the comparison; the implicit row for reference):"
    )
    columns = ["radius", *(f"k={k}" for k in args.shine_k), "implicit", "one-step"]
    lines = markdown_section(title, columns, "r")
    for radius in args.radii:
        params, x = tanh_layer(args.d, args.batch, radius=radius)
        exact, _ = exact_implicit_grad(params, x)
        solver = functools.partial(
            dq.solvers.broyden, max_steps=args.max_steps, tol=args.tol, batch_ndim=1
        )
        adjoints = [dq.ShineAdjoint(refine_steps=k, fallback=None) for k in args.shine_k]
        adjoints += [dq.ImplicitAdjoint(), dq.OneStepAdjoint()]
        errors = []
        for adjoint in adjoints:

            def loss(p, adjoint=adjoint, x=x, solver=solver):
                z, _ = dq.fixed_point(
                    batch_cell, p, x, jnp.zeros_like(x), solver=solver, adjoint=adjoint
                )
                return jnp.mean(jnp.sum(z**2, -1))

            errors.append(rel_error(jax.jit(jax.grad(loss))(params), exact))
        lines.append(markdown_row([radius, *errors], ["", *([".2e"] * len(errors))]))
        print(lines[-1], flush=True)
    return lines


def main(argv=None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d", type=int, default=512)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--mem_steps", type=int, nargs="+", default=[10, 50, 200])
    parser.add_argument(
        "--tables",
        nargs="+",
        default=["per_example", "whole_batch", "memory"],
        help="per_example, whole_batch, memory, comparison, shine_k (the last two are not "
        "run by default)",
    )
    parser.add_argument("--radii", type=float, nargs="+", default=[0.5, 0.9])
    parser.add_argument("--shine_k", type=int, nargs="+", default=[0, 1, 2, 5, 10, 20])
    parser.add_argument("--max_steps", type=int, default=50)
    parser.add_argument("--tol", type=float, default=1e-4)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    params, x = tanh_layer(args.d, args.batch, radius=0.9)
    solver = functools.partial(dq.solvers.anderson, max_steps=50, tol=1e-4)
    lines = [
        f"Machine: {machine()}. d={args.d}, batch={args.batch}, float32, forward Anderson "
        "(m=5, tol 1e-4 rel, max 50), backward default (same solver).",
        "",
    ]
    if "per_example" in args.tables:
        columns = ["adjoint", "fwd+bwd time / batch (ms)", "forward NFE (mean / max)"]
        lines += markdown_section("Per-example solves (`vmap`):", columns, "lrr")
    for name, adjoint in ADJOINTS.items() if "per_example" in args.tables else ():
        grad = make_grad(params, x, solver, adjoint)
        seconds = time_fn(grad, params, repeats=args.repeats)
        _, steps = grad(params)
        nfe = f"{float(jnp.mean(steps)):.1f} / {int(jnp.max(steps))}"
        lines.append(markdown_row([name, 1e3 * seconds, nfe], ["", ".1f", ""]))

    if "whole_batch" in args.tables:
        columns = ["adjoint", "fwd+bwd time / batch (ms)", "forward NFE", "temp memory (MiB)"]
        lines += markdown_section("One solve for the whole batch:", columns, "lrrr")
        for name in ("implicit", "unrolled"):
            grad = make_whole_batch_grad(params, x, solver, ADJOINTS[name])
            seconds = time_fn(grad, params, repeats=args.repeats)
            mem = grad.lower(params).compile().memory_analysis().temp_size_in_bytes / 2**20
            nfe = int(grad(params)[1])
            lines.append(markdown_row([name, 1e3 * seconds, nfe, mem], ["", ".1f", "", ".1f"]))

    if "memory" in args.tables:
        title = "Per-example solves, backward temporary memory vs forward steps (tol = 0):"
        columns = ["forward steps", "implicit temp memory (MiB)", "unrolled temp memory (MiB)"]
        lines += markdown_section(title, columns, "rrr")
    for steps in args.mem_steps if "memory" in args.tables else ():
        fixed = functools.partial(dq.solvers.anderson, max_steps=steps, tol=0.0)
        row = []
        for adjoint in (dq.ImplicitAdjoint(), ADJOINTS["unrolled"]):
            compiled = make_grad(params, x, fixed, adjoint).lower(params).compile()
            row.append(compiled.memory_analysis().temp_size_in_bytes / 2**20)
        lines.append(markdown_row([steps, *row], ["", ".2f", ".2f"]))

    if "comparison" in args.tables:
        lines += comparison_table(args)
    if "shine_k" in args.tables:
        lines += shine_refinement_table(args)

    return emit(lines, args.out)


if __name__ == "__main__":
    main()
