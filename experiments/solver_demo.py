"""Compares the three forward solvers on a random-weight DEQ layer over real data (sklearn digits).

For each of the 1797 scikit-learn ``load_digits`` images ``x`` (8x8, scaled to [0, 1]) we solve

    z = tanh(W z + U x + b),   z in R^width,

with ``W`` a Haar-random orthogonal matrix times ``--radius`` (every eigenvalue has modulus
``radius``; near 1 and above, plain iteration struggles) and ``U``, ``b`` Gaussian. Each example is
solved on its own (one batch-native solve, ``batch_ndim=1``): its step count and status are its own.

Outputs in ``--out_dir`` (the shared runner, ``dq.harness.run``): ``config.json`` (with every
solver object's fields), ``results.json``, ``table.md`` and ``convergence.png`` (median and
inter-quartile range over examples of the relative residual after each evaluation of ``f``, log
scale; an example that has stopped keeps its last residual).

    python experiments/solver_demo.py                  # full run, well under a minute on CPU
    python experiments/solver_demo.py --smoke          # plumbing check, a few minutes
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from sklearn.datasets import load_digits
from tqdm import tqdm

from deqjax import harness, solvers
from deqjax.harness import PositiveFloat, PositiveInt

STATUSES = (solvers.CONVERGED, solvers.MAX_STEPS, solvers.DIVERGED, solvers.NONFINITE)
SMOKE = {"width": 32, "num_examples": 64, "max_steps": 20, "repeats": 1}


@dataclasses.dataclass(frozen=True)
class Config:
    """The layer and the solvers compared."""

    width: PositiveInt = 256  # state size of the layer
    radius: PositiveFloat = 1.1  # |eigenvalues| of W
    max_steps: PositiveInt = 60  # solver step budget
    tol: PositiveFloat = 1e-4  # relative residual
    memory: PositiveInt = 10  # limited Broyden memory
    num_examples: PositiveInt = 1797  # images (max 1797)
    repeats: PositiveInt = 2  # timed runs (median)
    run: harness.RunConfig = harness.RunConfig()


def make_layer(key: jax.Array, width: int, in_dim: int, radius: float):
    """W = radius * Haar orthogonal [width, width]; U [width, in_dim]; b [width]."""
    k_w, k_u, k_b = jax.random.split(key, 3)
    q, r = jnp.linalg.qr(jax.random.normal(k_w, (width, width), jnp.float32))
    q = q * jnp.sign(jnp.diagonal(r))[None, :]  # Haar measure (Mezzadri's sign fix)
    w = radius * q
    u = jax.random.normal(k_u, (width, in_dim), jnp.float32) / jnp.sqrt(jnp.float32(in_dim))
    b = 0.1 * jax.random.normal(k_b, (width,), jnp.float32)
    return w, u, b


def solver_suite(c: Config) -> dict[str, solvers.Solver]:
    """The compared solvers, as objects (their fields go to config.json)."""
    budget = {"max_steps": c.max_steps, "tol": c.tol}
    return {
        "fixed_point_iteration": solvers.FixedPointIteration(**budget),
        "anderson(m=5)": solvers.Anderson(m=5, **budget),
        "broyden(memory=None)": solvers.Broyden(**budget),
        f"broyden(memory={c.memory})": solvers.Broyden(memory=c.memory, **budget),
    }


def carry_forward(trace: np.ndarray) -> np.ndarray:
    """[N, T] traces with +inf after each example's last evaluation -> last value repeated."""
    out = trace.copy()
    for t in range(1, out.shape[1]):
        stopped = ~np.isfinite(out[:, t])
        out[stopped, t] = out[stopped, t - 1]
    return out


def setup(c: Config):
    x = load_digits().data[: c.num_examples] / 16.0  # [N, 64]
    extra = {"data": "sklearn.datasets.load_digits", "jax_version": jax.__version__}
    return np.asarray(x, np.float32), extra | {"solvers": solver_suite(c)}


def run(c: Config, x, ctx) -> dict:
    w, u, b = make_layer(jax.random.PRNGKey(c.run.seed), c.width, x.shape[1], c.radius)
    inj = jnp.asarray(x) @ u.T + b  # [N, width]: the input injection U x + b, fixed in the solve
    results, traces = {}, {}
    suite = solver_suite(c).items()
    for name, solver in tqdm(suite, desc="solvers", disable=not c.run.progress):
        batched = solver.replace(batch_ndim=1)  # batch-native: each example stops on its own

        def solve_batch(inj, solver=batched):
            f = lambda z: jnp.tanh(z @ w.T + inj)  # noqa: E731
            return solver(f, jnp.zeros_like(inj))

        solve = jax.jit(solve_batch)
        sol = jax.block_until_ready(solve(inj))  # compile + first run
        times = []
        for _ in range(c.repeats):
            t0 = time.perf_counter()
            jax.block_until_ready(solve(inj))
            times.append(time.perf_counter() - t0)
        nfe, status = np.asarray(sol.num_steps), np.asarray(sol.status)
        rel = np.asarray(sol.rel_residual)
        results[name] = {
            "nfe_mean": float(nfe.mean()),
            "nfe_max": int(nfe.max()),
            "rel_residual_median": float(np.median(rel)),
            "rel_residual_max": float(np.max(rel)),
            "frac_converged": float(np.mean(status == solvers.CONVERGED)),
            "status_counts": {solvers.status_name(c): int(np.sum(status == c)) for c in STATUSES},
            "time_s": statistics.median(times),
        }
        traces[name] = carry_forward(np.asarray(sol.trace, np.float64))
    header = (
        f"z = tanh(W z + U x + b) on {x.shape[0]} sklearn digits, width {c.width}, "
        f"|eig W| = {c.radius:g}, tol {c.tol:g} (rel), max_steps {c.max_steps}, float32"
    )
    table = header + "\n\n" + format_table(results)
    print(table)
    with open(ctx.path("table.md"), "w") as fh:
        fh.write(table + "\n")
    plot(traces, c.tol, ctx.path("convergence.png"), header.replace(", width", ",\nwidth"))
    print(f"wrote {ctx.path('convergence.png')}")
    return results


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
    """Median and inter-quartile band of the residual traces per solver (log scale)."""
    fig, ax = harness.pyplot().subplots(figsize=(6.4, 4.2))
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
    harness.save_figure(fig, path, dpi=120)


EXPERIMENT = harness.Experiment(
    name="solver_demo",
    doc=__doc__,
    config=Config(),
    setup=setup,
    run=run,
    smoke=SMOKE,
    outputs=("table.md", "convergence.png"),
)


def main(argv=None) -> dict:
    return harness.run(EXPERIMENT, argv)


if __name__ == "__main__":
    main()
