"""Step-0 diagnosis of the pre-LN vs post-LN DEQ-Transformer cell (REPRODUCTION.md claim 5).

For each LayerNorm placement, at initialisation (paper init N(0, 0.01), weight norm, d_ff = 2d as
``experiments/language_model.py``), on random embeddings ``x`` (RMS ``--x_scale``: 0.02 as the LM's
``hk.Embed``, 1 as Transformer-XL's embeddings scaled by ``sqrt(d)``) with a zero memory: the
forward Anderson solve (NFE, relative residual, RMS of ``z*``), the exact Jacobian ``J = ∂f/∂z`` at
``z*`` of one example (``‖J‖²_F / d`` — the JR paper's Eq. 2 quantity — and the spectral radius
``ρ(J)``), the implicit backward ``u = g + Jᵀu`` solved by the same Anderson budget (its relative
residual), and the gradient norm of a readout loss with respect to the cell parameters.

Usage: python experiments/repro_preln.py [--seeds 3] [--d_model 64] [--seq_len 32]
"""

from __future__ import annotations

import dataclasses
import functools
import json

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

import deqjax.nn as dqnn
from deqjax import harness, solvers


def diagnose(
    pre_ln: bool, seed: int, d: int, t: int, b: int, steps: int, x_scale: float
) -> dict[str, float]:
    def cell_fn(z, x):
        cell = dqnn.TransformerCell(d, num_heads=4, d_ff=2 * d, pre_ln=pre_ln, name="cell")
        return cell(z, dqnn.TransformerInput(x, jnp.zeros((x.shape[0], t, d), x.dtype)))

    f = hk.without_apply_rng(hk.transform(cell_fn))
    kx, kp = jax.random.split(jax.random.PRNGKey(seed))
    x = x_scale * jax.random.normal(kx, (b, t, d))
    z0 = jnp.zeros((b, t, d))
    params = f.init(kp, z0, x)
    solve = functools.partial(solvers.anderson, max_steps=steps, tol=1e-3, m=5)
    sol = solve(lambda z: f.apply(params, z, x), z0)
    z_star = sol.value
    # exact Jacobian of example 0 at z*
    fz = lambda z1: f.apply(params, z1.reshape(1, t, d), x[:1]).reshape(-1)  # noqa: E731
    jac = np.asarray(jax.jacfwd(fz)(z_star[:1].reshape(-1)), np.float64)  # [T*D, T*D]
    eig = np.linalg.eigvals(jac)
    # implicit backward for the readout loss L = mean(LN(z*)·w): g = ∂L/∂z*
    w = jax.random.normal(jax.random.PRNGKey(seed + 100), (d,))

    def loss_of_z(z):
        zn = (z - z.mean(-1, keepdims=True)) / jnp.sqrt(z.var(-1, keepdims=True) + 1e-5)
        return jnp.mean(zn @ w)

    g = jax.grad(loss_of_z)(z_star[:1].reshape(1, t, d)).reshape(-1)
    jt = jnp.asarray(jac.T, jnp.float32)
    bwd = solve(lambda u: g + jt @ u, jnp.zeros_like(g))
    u = bwd.value
    # d loss / d params through the implicit function theorem: u^T ∂f/∂θ
    _, vjp = jax.vjp(lambda p: f.apply(p, z_star[:1], x[:1]).reshape(-1), params)
    (gp,) = vjp(u)
    grad_norm = float(jnp.sqrt(sum(jnp.sum(v**2) for v in jax.tree_util.tree_leaves(gp))))
    return {
        "pre_ln": pre_ln,
        "seed": seed,
        "x_scale": x_scale,
        "fwd_nfe": float(jnp.mean(sol.num_steps)),
        "fwd_rel_residual": float(jnp.mean(sol.rel_residual)),
        "z_rms": float(jnp.sqrt(jnp.mean(z_star**2))),
        "jac_fro_sq_per_d": float(np.sum(jac**2) / jac.shape[0]),
        "spectral_radius": float(np.max(np.abs(eig))),
        "bwd_nfe": float(bwd.num_steps),
        "bwd_rel_residual": float(bwd.rel_residual),
        "grad_norm": grad_norm,
    }


Placements = harness.choice_list(("post", "pre"))  # the LayerNorm placements --ln names


@dataclasses.dataclass(frozen=True)
class Config:
    """The cells diagnosed: LayerNorm placements, input scales, seeds, sizes."""

    seeds: harness.PositiveInt = 2  # seeds per (x_scale, placement)
    d_model: harness.PositiveInt = 64  # model width
    seq_len: harness.PositiveInt = 8  # tokens
    batch_size: harness.PositiveInt = 4  # examples (the Jacobian is example 0's)
    max_steps: harness.PositiveInt = 12  # Anderson budget of the forward and backward solves
    x_scale: tuple[float, ...] = (0.02, 1.0)  # RMS of x
    ln: Placements = ("post", "pre")  # LayerNorm placements
    out: str | None = None  # JSON file for the rows


def main(argv: list[str] | None = None) -> None:
    c = harness.parse_config(Config(), argv, description=__doc__)
    rows = []
    for xs in c.x_scale:
        for pre_ln in [v == "pre" for v in c.ln]:
            for s in range(c.seeds):
                r = diagnose(pre_ln, s, c.d_model, c.seq_len, c.batch_size, c.max_steps, xs)
                rows.append(r)
                print(json.dumps(r))
    if c.out:
        with open(c.out, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
