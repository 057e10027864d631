"""Forward+backward cost of each gradient strategy, and backward memory versus forward steps.

    python -m benchmarks.adjoints [--d 512] [--batch 128] [--repeats 10] [--out FILE]

Table 1: time of ``jit(grad(loss))`` per batch for every adjoint (forward Anderson, per-example
solves by ``vmap``, f(z) = tanh(W z + U x + b), spectral radius of W 0.9, tol 1e-4).
Table 2 (``--whole_batch``): implicit and unrolled with ONE solve for the whole batch (the batch
is part of the state; batch-level residuals). Under ``vmap`` the unrolled adjoint is pathological:
JAX transposes the batched scan with a per-example ``[B, d, d]`` cotangent accumulator for the
loop-invariant weights, so use per-example unrolled solves only as a small-scale reference.
Table 3: XLA's compiled temporary memory (``memory_analysis().temp_size_in_bytes``) of the same
gradient for the implicit and unrolled adjoints with a fixed number of forward steps (tol = 0).
"""

from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp

import deqjax as dq
from benchmarks.common import machine, tanh_cell, tanh_layer, time_fn

ADJOINTS = {
    "implicit": dq.ImplicitAdjoint(),
    "phantom(5, 0.5)": dq.PhantomAdjoint(steps=5, tau=0.5),
    "one-step": dq.OneStepAdjoint(),
    "unrolled": dq.UnrolledAdjoint(),
}


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


def main(argv=None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d", type=int, default=512)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--mem_steps", type=int, nargs="+", default=[10, 50, 200])
    parser.add_argument("--tables", nargs="+", default=["per_example", "whole_batch", "memory"])
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
        lines += [
            "",
            "Per-example solves (`vmap`):",
            "",
            "| adjoint | fwd+bwd time / batch (ms) | forward NFE (mean / max) |",
            "| --- | ---: | ---: |",
        ]
    for name, adjoint in ADJOINTS.items() if "per_example" in args.tables else ():
        grad = make_grad(params, x, solver, adjoint)
        seconds = time_fn(grad, params, repeats=args.repeats)
        _, steps = grad(params)
        nfe = f"{float(jnp.mean(steps)):.1f} / {int(jnp.max(steps))}"
        lines.append(f"| {name} | {1e3 * seconds:.1f} | {nfe} |")

    if "whole_batch" in args.tables:
        lines += [
            "",
            "One solve for the whole batch:",
            "",
            "| adjoint | fwd+bwd time / batch (ms) | forward NFE | temp memory (MiB) |",
            "| --- | ---: | ---: | ---: |",
        ]
        for name in ("implicit", "unrolled"):
            grad = make_whole_batch_grad(params, x, solver, ADJOINTS[name])
            seconds = time_fn(grad, params, repeats=args.repeats)
            mem = grad.lower(params).compile().memory_analysis().temp_size_in_bytes / 2**20
            nfe = int(grad(params)[1])
            lines.append(f"| {name} | {1e3 * seconds:.1f} | {nfe} | {mem:.1f} |")

    if "memory" in args.tables:
        lines += [
            "",
            "Per-example solves, backward temporary memory vs forward steps (tol = 0):",
            "",
            "| forward steps | implicit temp memory (MiB) | unrolled temp memory (MiB) |",
            "| ---: | ---: | ---: |",
        ]
    for steps in args.mem_steps if "memory" in args.tables else ():
        fixed = functools.partial(dq.solvers.anderson, max_steps=steps, tol=0.0)
        row = []
        for adjoint in (dq.ImplicitAdjoint(), dq.UnrolledAdjoint()):
            compiled = make_grad(params, x, fixed, adjoint).lower(params).compile()
            row.append(compiled.memory_analysis().temp_size_in_bytes / 2**20)
        lines.append(f"| {steps} | {row[0]:.2f} | {row[1]:.2f} |")

    table = "\n".join(lines)
    print(table)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(table + "\n")
    return table


if __name__ == "__main__":
    main()
