"""Reversible solver and its reversal adjoint: time, memory, reversal and gradient error.

    python -m benchmarks.reversible [--d 512] [--batch 128] [--err_batch 32] [--repeats 3]
                                    [--tables time memory reversal gradient] [--out FILE]

The standard problem of ``benchmarks.adjoints``: f(z) = tanh(W z + U x + b), d = 512, ρ(W) = 0.9
(``benchmarks.common.tanh_layer``), solved batch-native (``batch_ndim=1``), loss ``Σ c·z*`` with a
fixed random ``c``.

* ``time``: median wall time of ``jit(grad(loss))`` per batch (and of the forward alone), float32,
  for the reversible solver (β = 0.8, tol 1e-4 rel, max 50 evaluations) with
  ``dq.ReversibleAdjoint`` and with ``dq.UnrolledAdjoint`` (backprop through the same steps), and
  for Anderson (m = 5, same tol) with the default ``dq.ImplicitAdjoint``; NFE = mean forward
  evaluations of f per example.
* ``memory``: XLA's temporary memory (``memory_analysis().temp_size_in_bytes``) of the same
  gradient with ``tol = 0`` (every step runs) for 10, 50, 200 steps.
* ``reversal``: ``dq.solvers.reversal_error`` (rebuild (y0, z0) = (0, 0) from the returned pair,
  error relative to ‖z*‖; max and median over the examples) in float32 and float64 against tol, β.
* ``gradient``: max-norm relative error of ∂ℓ/∂(W, U, b) of the reversible adjoint against (a) the
  float64 dense implicit gradient at a tightly converged z* (the exact gradient of the DEQ) and
  (b) float64 backprop through the same iteration (``UnrolledAdjoint``; what reversal should equal).
"""

from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp
import numpy as np

import deqjax as dq
from benchmarks.backward import batch_cell, dense_gradient, rel_err
from benchmarks.common import emit, machine, markdown_header, markdown_row, tanh_layer, time_fn

jax.config.update("jax_enable_x64", True)

RADIUS = 0.9
BETA = 0.8
MEMORY_COLUMNS = (
    "steps",
    "ReversibleAdjoint (MiB)",
    "ReversibleAdjoint(checkpoint_every=8) (MiB)",
    "UnrolledAdjoint, same solver (MiB)",
)
REVERSAL_COLUMNS = (
    "β",
    "tol (rel)",
    "NFE (mean)",
    "float32 max",
    "float32 median",
    "float64 max",
    "float64 median",
)
GRADIENT_COLUMNS = (
    "tol (rel)",
    "NFE (mean)",
    "float32 vs implicit",
    "float64 vs implicit",
    "float32 vs unrolled f64",
    "float64 vs unrolled f64",
    "float32, checkpoint_every=8, vs unrolled f64",
    "float32 UnrolledAdjoint vs unrolled f64",
)


def reversible(**kw):
    return functools.partial(dq.solvers.reversible, batch_ndim=1, **kw)


def make_loss(x, c, solver, adjoint):
    def loss(p):
        z, sol = dq.fixed_point(batch_cell, p, x, jnp.zeros_like(x), solver=solver, adjoint=adjoint)
        return jnp.sum(c * z), sol.num_steps

    return loss


def cast(tree, dtype):
    return jax.tree_util.tree_map(lambda a: jnp.asarray(a, dtype), tree)


def time_table(args, lines):
    params, x = tanh_layer(args.d, args.batch, radius=RADIUS, dtype=jnp.float32)
    c = jnp.asarray(np.random.default_rng(1).normal(size=x.shape), jnp.float32)
    rows = {
        "reversible (β 0.8) + ReversibleAdjoint(checkpoint_every=None)": (
            reversible(beta=BETA, max_steps=50, tol=1e-4),
            dq.ReversibleAdjoint(checkpoint_every=None),
        ),
        "reversible (β 0.8) + ReversibleAdjoint(checkpoint_every=8)": (
            reversible(beta=BETA, max_steps=50, tol=1e-4),
            dq.ReversibleAdjoint(checkpoint_every=8),
        ),
        "reversible (β 0.8) + UnrolledAdjoint": (
            reversible(beta=BETA, max_steps=50, tol=1e-4),
            dq.UnrolledAdjoint(),
        ),
        "Anderson (m 5) + ImplicitAdjoint": (
            functools.partial(dq.solvers.anderson, batch_ndim=1, max_steps=50, tol=1e-4),
            dq.ImplicitAdjoint(),
        ),
    }
    lines += [
        f"Forward+backward, float32, d={args.d}, batch={args.batch}, tol 1e-4 rel, max 50 "
        f"evaluations, batch-native; median of {args.repeats}.",
        "",
        *markdown_header(
            ["forward + adjoint", "NFE (mean)", "forward ms", "forward+backward ms"], "l"
        ),
    ]
    for name, (solver, adjoint) in rows.items():
        loss = make_loss(x, c, solver, adjoint)
        fwd = jax.jit(loss)
        grad = jax.jit(jax.grad(loss, has_aux=True))
        steps = np.asarray(fwd(params)[1])
        t_fwd = time_fn(fwd, params, repeats=args.repeats)
        t_all = time_fn(grad, params, repeats=args.repeats)
        lines.append(
            markdown_row([name, steps.mean(), 1e3 * t_fwd, 1e3 * t_all], ["", *[".1f"] * 3])
        )
        print(lines[-1], flush=True)
    lines.append("")


def memory_table(args, lines):
    params, x = tanh_layer(args.d, args.batch, radius=RADIUS, dtype=jnp.float32)
    c = jnp.zeros_like(x)
    state_kib = x.size * 4 / 1024
    lines += [
        f"XLA temporary memory of jit(grad(loss)), float32, d={args.d}, batch={args.batch} "
        f"(one state = {state_kib:.0f} KiB), tol = 0 so every step runs.",
        "",
        *markdown_header(MEMORY_COLUMNS, "l"),
    ]
    for steps in args.mem_steps:
        row = []
        for adjoint in (
            dq.ReversibleAdjoint(checkpoint_every=None),
            dq.ReversibleAdjoint(checkpoint_every=8),
            dq.UnrolledAdjoint(),
        ):
            solver = reversible(beta=BETA, max_steps=steps, tol=0.0, stop_mode="abs")
            loss = make_loss(x, c, solver, adjoint)
            compiled = jax.jit(jax.grad(loss, has_aux=True)).lower(params).compile()
            row.append(compiled.memory_analysis().temp_size_in_bytes / 2**20)
        lines.append(markdown_row([steps, *row], ["", ".2f", ".2f", ".2f"]))
        print(lines[-1], flush=True)
    lines.append("")


def reversal_table(args, lines):
    p64, x64 = tanh_layer(args.d, args.err_batch, radius=RADIUS, dtype=jnp.float64)
    lines += [
        f"Reversal error: rebuild (y0, z0) = (0, 0) from the returned pair, ‖error‖ / ‖z*‖ per "
        f"example (max / median over {args.err_batch}), d={args.d}, max 400 evaluations.",
        "",
        *markdown_header(REVERSAL_COLUMNS, "l"),
    ]
    for beta in args.betas:
        for tol in args.tols:
            row, nfe = [], None
            for dtype in (jnp.float32, jnp.float64):
                p, x = cast(p64, dtype), jnp.asarray(x64, dtype)
                kw = dict(beta=beta, tol=tol, max_steps=400, batch_ndim=1)

                @jax.jit
                def run(p, x, kw=kw):
                    f = lambda z: batch_cell(p, x, z)  # noqa: E731
                    err = dq.solvers.reversal_error(f, jnp.zeros_like(x), **kw)
                    return err, dq.solvers.reversible(f, jnp.zeros_like(x), **kw).num_steps

                err, steps = (np.asarray(a) for a in run(p, x))
                nfe = steps.mean() if nfe is None else nfe
                row += [np.max(err), np.median(err)]
            lines.append(markdown_row([beta, tol, nfe, *row], ["", "g", ".1f", *[".1e"] * 4]))
            print(lines[-1], flush=True)
    lines.append("")


def gradient_table(args, lines):
    p64, x64 = tanh_layer(args.d, args.err_batch, radius=RADIUS, dtype=jnp.float64)
    c64 = jnp.asarray(np.random.default_rng(1).normal(size=x64.shape))
    z_star = dq.solvers.anderson(
        lambda z: batch_cell(p64, x64, z),
        jnp.zeros_like(x64),
        tol=1e-14,
        max_steps=200,
        batch_ndim=1,
    ).value
    exact = dense_gradient(p64, x64, z_star, c64)
    lines += [
        "Gradient error of ReversibleAdjoint (max-norm relative, ∂ℓ/∂(W, U, b)): vs the float64 "
        "dense implicit gradient (exact DEQ gradient), and vs float64 backprop through the same "
        f"iteration (UnrolledAdjoint). d={args.d}, batch={args.err_batch}, β={BETA}.",
        "",
        *markdown_header(GRADIENT_COLUMNS, "l"),
    ]
    settings = [(tol, 400) for tol in args.tols] + [(0.0, n) for n in args.fixed_steps]
    for tol, max_steps in settings:
        solver = reversible(beta=BETA, tol=tol, max_steps=max_steps, stop_mode="rel")
        label = f"{tol:g}" if tol else f"0 ({max_steps} evaluations)"
        unrolled_loss = make_loss(x64, c64, solver, dq.UnrolledAdjoint())
        g_unrolled, steps = jax.jit(jax.grad(unrolled_loss, has_aux=True))(p64)
        errs = {}
        for dtype in (jnp.float32, jnp.float64):
            loss = make_loss(
                jnp.asarray(x64, dtype),
                jnp.asarray(c64, dtype),
                solver,
                dq.ReversibleAdjoint(checkpoint_every=None),
            )
            g, _ = jax.jit(jax.grad(loss, has_aux=True))(cast(p64, dtype))
            g = cast(g, jnp.float64)
            errs[dtype] = (rel_err(g, exact), rel_err(g, g_unrolled))
        x32, c32, p32 = (
            jnp.asarray(x64, jnp.float32),
            jnp.asarray(c64, jnp.float32),
            cast(p64, jnp.float32),
        )
        extra = []
        for adjoint in (dq.ReversibleAdjoint(checkpoint_every=8), dq.UnrolledAdjoint()):
            g, _ = jax.jit(jax.grad(make_loss(x32, c32, solver, adjoint), has_aux=True))(p32)
            extra.append(rel_err(cast(g, jnp.float64), g_unrolled))
        cells = [label, np.asarray(steps).mean(), errs[jnp.float32][0], errs[jnp.float64][0]]
        cells += [errs[jnp.float32][1], errs[jnp.float64][1], *extra]
        lines.append(markdown_row(cells, ["", ".1f", *[".1e"] * 6]))
        print(lines[-1], flush=True)
    lines.append("")


def main(argv=None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d", type=int, default=512)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--err_batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--mem_steps", type=int, nargs="+", default=[10, 50, 200])
    parser.add_argument("--tols", type=float, nargs="*", default=[1e-2, 1e-3, 1e-4, 1e-6])
    parser.add_argument("--betas", type=float, nargs="+", default=[0.5, 0.8])
    parser.add_argument(
        "--fixed_steps",
        type=int,
        nargs="*",
        default=[4, 8],
        help="gradient table: extra rows, tol = 0 and this many evaluations (the paper regime)",
    )
    parser.add_argument("--tables", nargs="+", default=["time", "memory", "reversal", "gradient"])
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    lines = [f"Machine: {machine()}.", ""]
    tables = {
        "time": time_table,
        "memory": memory_table,
        "reversal": reversal_table,
        "gradient": gradient_table,
    }
    for name in args.tables:
        tables[name](args, lines)
    return emit(lines, args.out)


if __name__ == "__main__":
    main()
