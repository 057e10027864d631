"""Compares the three forward solvers on a random-weight DEQ layer over real data (sklearn digits).

For each of the 1797 scikit-learn ``load_digits`` images ``x`` (8x8, scaled to [0, 1]) we solve

    z = tanh(W z + U x + b),   z in R^width,

with ``W`` a Haar-random orthogonal matrix times ``--radius`` (every eigenvalue has modulus
``radius``; near 1 and above, plain iteration struggles) and ``U``, ``b`` Gaussian. Each example is
solved on its own (one batch-native solve, ``batch_ndim=1``): its step count and status are its own.

Outputs in ``--out_dir``: ``config.json``, ``results.json``, ``table.md`` and ``convergence.png``
(median and inter-quartile range over examples of the relative residual after each evaluation of
``f``, log scale; an example that has stopped keeps its last residual).

    python experiments/solver_demo.py                  # full run, well under a minute on CPU
    python experiments/solver_demo.py --smoke          # plumbing check, a few minutes
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import time

import jax
import jax.numpy as jnp
import matplotlib
import numpy as np
from sklearn.datasets import load_digits
from tqdm import tqdm

from deqjax import solvers

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def make_layer(key: jax.Array, width: int, in_dim: int, radius: float):
    """W = radius * Haar orthogonal [width, width]; U [width, in_dim]; b [width]."""
    k_w, k_u, k_b = jax.random.split(key, 3)
    q, r = jnp.linalg.qr(jax.random.normal(k_w, (width, width), jnp.float32))
    q = q * jnp.sign(jnp.diagonal(r))[None, :]  # Haar measure (Mezzadri's sign fix)
    w = radius * q
    u = jax.random.normal(k_u, (width, in_dim), jnp.float32) / jnp.sqrt(jnp.float32(in_dim))
    b = 0.1 * jax.random.normal(k_b, (width,), jnp.float32)
    return w, u, b


def solver_suite(memory: int) -> dict[str, functools.partial]:
    return {
        "fixed_point_iteration": functools.partial(solvers.fixed_point_iteration),
        "anderson(m=5)": functools.partial(solvers.anderson, m=5),
        "broyden(memory=None)": functools.partial(solvers.broyden),
        f"broyden(memory={memory})": functools.partial(solvers.broyden, memory=memory),
    }


def carry_forward(trace: np.ndarray) -> np.ndarray:
    """[N, T] traces with +inf after each example's last evaluation -> last value repeated."""
    out = trace.copy()
    for t in range(1, out.shape[1]):
        stopped = ~np.isfinite(out[:, t])
        out[stopped, t] = out[stopped, t - 1]
    return out


def run(args: argparse.Namespace) -> dict:
    digits = load_digits()
    x = jnp.asarray(digits.data[: args.num_examples] / 16.0, jnp.float32)  # [N, 64]
    w, u, b = make_layer(jax.random.PRNGKey(args.seed), args.width, x.shape[1], args.radius)
    inj = x @ u.T + b  # [N, width]: the input injection U x + b, fixed during the solve

    results, traces = {}, {}
    for name, solver in tqdm(solver_suite(args.memory).items(), desc="solvers"):

        def solve_batch(inj, solver=solver):  # batch-native: each example stops on its own
            f = lambda z: jnp.tanh(z @ w.T + inj)  # noqa: E731
            return solver(
                f, jnp.zeros_like(inj), max_steps=args.max_steps, tol=args.tol, batch_ndim=1
            )

        solve = jax.jit(solve_batch)
        sol = jax.block_until_ready(solve(inj))  # compile + first run
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            jax.block_until_ready(solve(inj))
            times.append(time.perf_counter() - t0)
        nfe = np.asarray(sol.num_steps)
        status = np.asarray(sol.status)
        results[name] = {
            "nfe_mean": float(nfe.mean()),
            "nfe_max": int(nfe.max()),
            "rel_residual_median": float(np.median(np.asarray(sol.rel_residual))),
            "rel_residual_max": float(np.max(np.asarray(sol.rel_residual))),
            "frac_converged": float(np.mean(status == solvers.CONVERGED)),
            "status_counts": {
                solvers.status_name(c): int(np.sum(status == c)) for c in solvers.STATUS_NAMES
            },
            "time_s": statistics.median(times),
        }
        traces[name] = carry_forward(np.asarray(sol.trace, np.float64))
    return {"results": results, "traces": traces, "num_examples": int(x.shape[0])}


def format_table(results: dict) -> str:
    lines = [
        "| solver | NFE mean | NFE max | rel res (median) | rel res (max) | converged "
        "| time (ms) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        lines.append(
            f"| {name} | {r['nfe_mean']:.1f} | {r['nfe_max']} | {r['rel_residual_median']:.1e} "
            f"| {r['rel_residual_max']:.1e} | {r['frac_converged']:.3f} | {1e3 * r['time_s']:.1f} |"
        )
    return "\n".join(lines)


def plot(traces: dict, tol: float, path: str, title: str) -> None:
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name, tr in traces.items():
        steps = np.arange(1, tr.shape[1] + 1)
        q25, q50, q75 = np.percentile(tr, [25, 50, 75], axis=0)
        (line,) = ax.plot(steps, q50, label=name)
        ax.fill_between(steps, q25, q75, color=line.get_color(), alpha=0.2)
    ax.axhline(tol, color="k", ls=":", lw=1, label=f"tol {tol:g}")
    ax.set_yscale("log")
    ax.set_xlabel("evaluations of f")
    ax.set_ylabel("relative residual  ||f(z) - z|| / ||f(z)||")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0, help="seed of the random layer")
    parser.add_argument(
        "--out_dir", type=str, default="runs/solver_demo", help="output folder (--smoke: ..._smoke)"
    )
    parser.add_argument("--width", type=int, default=256, help="state size of the layer")
    parser.add_argument("--radius", type=float, default=1.1, help="|eigenvalues| of W")
    parser.add_argument("--max_steps", type=int, default=60, help="solver step budget")
    parser.add_argument("--tol", type=float, default=1e-4, help="relative residual")
    parser.add_argument("--memory", type=int, default=10, help="limited Broyden memory")
    parser.add_argument(
        "--num_examples", type=int, default=1797, help="digits images solved (max 1797)"
    )
    parser.add_argument("--repeats", type=int, default=2, help="timed runs (median)")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny run for tests (under 4 minutes on 2 CPU cores); into runs/solver_demo_smoke",
    )
    if parser.parse_known_args()[0].smoke:  # a smoke run never overwrites the full run
        parser.set_defaults(out_dir="runs/solver_demo_smoke")
    args = parser.parse_args()
    if args.smoke:
        args.width, args.num_examples, args.max_steps, args.repeats = 32, 64, 20, 1

    config = dict(vars(args), data="sklearn.datasets.load_digits", jax_version=jax.__version__)
    print(json.dumps(config, indent=2))
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "config.json"), "w") as fh:
        json.dump(config, fh, indent=2)

    out = run(args)
    table = format_table(out["results"])
    header = (
        f"z = tanh(W z + U x + b) on {out['num_examples']} sklearn digits, width {args.width}, "
        f"|eig W| = {args.radius:g}, tol {args.tol:g} (rel), max_steps {args.max_steps}, float32"
    )
    print(header + "\n\n" + table)
    with open(os.path.join(args.out_dir, "table.md"), "w") as fh:
        fh.write(header + "\n\n" + table + "\n")
    with open(os.path.join(args.out_dir, "results.json"), "w") as fh:
        json.dump(out["results"], fh, indent=2)
    png = os.path.join(args.out_dir, "convergence.png")
    plot(out["traces"], args.tol, png, header.replace(", width", ",\nwidth"))
    print(f"wrote {png}")


if __name__ == "__main__":
    main()
