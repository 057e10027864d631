"""Backward solvers: gradient error of each implicit-backward option, and its time.

    python -m benchmarks.backward [--d 512] [--batch 128] [--repeats 3] [--out FILE]

Problems (f(z) = tanh(W z + U x + b), batch-native forward: Anderson with ``batch_ndim=1``, float64,
tol 1e-10 rel, so every option differentiates the same z*):

* ``standard``: the shared layer of ``benchmarks.common.tanh_layer`` with ρ(W) = 1;
* ``hard``: ρ(W) = 1.5 (the hard case of ``benchmarks.solvers`` and ``benchmarks.peers``), so
  ρ(J_f(z*)) is closer to 1;
* ``flip``: W symmetric with eigenvalues uniform in [−1.02, 0.5] and a small input (U x scaled by
  0.1), so J_f(z*) has an eigenvalue near −1 (the d = 512 analogue of z = cos z + π/2);
* ``near+1``: the same with eigenvalues in [−0.5, 1.02]: J_f(z*) has an eigenvalue just below +1,
  so I − J is nearly singular (not run by default: ``--problems near+1``).

For every backward option the loss ``Σ_i c_i · z*_i`` (random fixed c) is differentiated with
``dq.ImplicitAdjoint(solver=option, fallback=None)`` (the raw option), plus the default
``dq.ImplicitAdjoint()`` (first solve with the forward's Anderson, GMRES fallback). Error: max-norm
relative error of ∂ℓ/∂(W, U, b) against the float64 dense implicit gradient (per example, the
(I − J)ᵀ u = c solve by LU). Backward statistics come from the ``dq.BackwardStats`` channel.
Time: median of ``jit(grad)`` minus the median of the jitted forward alone.
"""

from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp
import numpy as np

import deqjax as dq
from benchmarks.common import emit, machine, markdown_row, markdown_section, tanh_layer, time_fn

jax.config.update("jax_enable_x64", True)

BWD_TOL = 1e-8
BWD_STEPS = 400
COLUMNS = ("backward", "grad rel. error", "converged", "mean steps", "backward ms")


def batch_cell(p, x, z):
    """The whole batch at once: z, x of shape [B, d] (one problem per row)."""
    return jnp.tanh(z @ p["W"].T + x @ p["U"].T + p["b"])


def problems(d: int, batch: int) -> dict[str, tuple[dict, jax.Array]]:
    f64 = jnp.float64
    out = {"standard": tanh_layer(d, batch, radius=1.0, dtype=f64)}
    p, x = tanh_layer(d, batch, radius=1.5, seed=1, dtype=f64)
    out["hard"] = (p, x)
    rng = np.random.default_rng(2)
    q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    eig = np.linspace(-1.02, 0.5, d)
    p, x = tanh_layer(d, batch, radius=1.0, seed=2, dtype=f64)
    out["flip"] = ({**p, "W": jnp.asarray((q * eig) @ q.T), "U": 0.1 * p["U"]}, x)
    eig = np.linspace(-0.5, 1.02, d)
    out["near+1"] = ({**p, "W": jnp.asarray((q * eig) @ q.T), "U": 0.1 * p["U"]}, x)
    return out


def options() -> dict[str, dq.ImplicitAdjoint]:
    kw = {"tol": BWD_TOL, "max_steps": BWD_STEPS}
    raw = {
        "fixed-point iteration": functools.partial(dq.solvers.fixed_point_iteration, **kw),
        "Anderson (m=5)": functools.partial(dq.solvers.anderson, **kw),
        "Broyden": functools.partial(dq.solvers.broyden, **kw),
        "GMRES (restart 20)": functools.partial(dq.solvers.gmres, **kw),
        "BiCGStab": functools.partial(dq.solvers.bicgstab, **kw),
        "normal-CG (CGNR)": functools.partial(dq.solvers.normal_cg, **kw),
    }
    out = {name: dq.ImplicitAdjoint(solver=s, fallback=None) for name, s in raw.items()}
    out["default: forward's Anderson + GMRES fallback"] = dq.ImplicitAdjoint()
    return out


def dense_gradient(params, x, z, c):
    """∂(Σ c·z*)/∂params by a float64 dense solve (I − J_i)ᵀ u_i = c_i per example."""
    s = 1.0 - z**2  # tanh' at z*: J_i = diag(s_i) W
    d = z.shape[-1]

    def one(s_i, c_i):
        a = jnp.eye(d) - s_i[:, None] * params["W"]
        return jnp.linalg.solve(a.T, c_i)

    u = jax.vmap(one)(s, c)
    _, vjp = jax.vjp(lambda p: batch_cell(p, x, z), params)
    return vjp(u)[0]


def rel_err(a, b) -> float:
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    num = max(float(jnp.max(jnp.abs(u - v))) for u, v in zip(la, lb))
    return num / max(float(jnp.max(jnp.abs(v))) for v in lb)


def main(argv=None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d", type=int, default=512)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--problems", nargs="+", default=["standard", "hard", "flip"])
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    fwd = functools.partial(dq.solvers.anderson, tol=1e-10, max_steps=300, batch_ndim=1)
    lines = [
        f"Machine: {machine()}. d={args.d}, batch={args.batch}, float64; forward Anderson "
        f"(m=5, tol 1e-10 rel, batch_ndim=1); backward options tol {BWD_TOL:g} rel, "
        f"max {BWD_STEPS} evaluations, fallback=None except the default.",
    ]
    for name, (params, x) in problems(args.d, args.batch).items():
        if name not in args.problems:
            continue
        c = jnp.asarray(np.random.default_rng(9).normal(size=x.shape))
        z0 = jnp.zeros_like(x)

        def forward(p, x=x, z0=z0):
            return dq.fixed_point(batch_cell, p, x, z0, solver=fwd)

        z, sol = jax.jit(forward)(params)
        rho = jax.vmap(
            lambda zi, xi, p=params: dq.jacobian.spectral_radius(
                lambda v: batch_cell(p, xi[None], v[None])[0], zi, jax.random.key(0)
            )
        )(z[:8], x[:8])
        ref = dense_gradient(params, x, z, c)
        t_fwd = time_fn(jax.jit(lambda p: forward(p)[0]), params, repeats=args.repeats)
        title = (
            f"**{name}**: forward {int(jnp.sum(sol.status == 0))}/{args.batch} converged, "
            f"mean {float(jnp.mean(sol.num_steps)):.0f} steps; ρ(J_f(z*)) of 8 examples "
            f"{float(jnp.min(rho)):.3f}–{float(jnp.max(rho)):.3f}; forward {1e3 * t_fwd:.0f} ms."
        )
        lines += markdown_section(title, COLUMNS, "lrrrr")
        for label, adjoint in options().items():

            def loss(p, probe, adjoint=adjoint, x=x, z0=z0, c=c):
                zz, _ = dq.fixed_point(
                    batch_cell, p, x, z0, solver=fwd, adjoint=adjoint, backward_stats=probe
                )
                return jnp.sum(c * zz)

            grad = jax.jit(jax.grad(loss, argnums=(0, 1)))
            probe = dq.BackwardStats.zeros()
            g, stats = grad(params, probe)
            t = time_fn(grad, params, probe, repeats=args.repeats)
            ok = int(stats.count - stats.failures)
            cells = [label, rel_err(g, ref), f"{ok}/{int(stats.count)}"]
            cells += [float(stats.num_steps / stats.count), 1e3 * (t - t_fwd)]
            lines.append(markdown_row(cells, ["", ".1e", "", ".0f", ".0f"]))
            print(lines[-1], flush=True)
    return emit(lines, args.out)


if __name__ == "__main__":
    main()
