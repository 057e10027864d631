"""The JR paper's Fig. 5 for trained scalar DEQs: the surface f(z; x) and a cobweb of iterates.

Drawn by ``experiments/synthetic_1d.py`` for its trained runs.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import deqjax as dq
from deqjax.harness import pyplot, save_figure


def plot_jr_fig5(
    model: dq.models.ScalarDEQ,
    params: dict[str, dict[str, jax.Array]],
    path: str,
    *,
    solver: Any,
    x_range: tuple[float, float] = (-2.0, 2.0),
    x_slice: float = -1.0,
    linear_sign: int = -1,
) -> str:
    """The JR paper's Fig. 5 for each run: top, the surface ``f(z; x)`` with ``z*(x)`` (solved by
    ``solver``); bottom, the slice at ``x = x_slice`` with the fixed-point iterates from ``z = 0``
    (a cobweb) and the target ``h(x_slice)``. ``params``: ``{run name: params}``.

    Returns:
      ``path``.
    """
    num = len(params)
    fig = pyplot().figure(figsize=(4.0 * num, 8.0))
    xs = np.linspace(*x_range, 60, dtype=np.float32)
    zs = np.linspace(-6.0, 6.0, 60, dtype=np.float32)
    xx, zz = np.meshgrid(xs, zs)
    x0 = jnp.asarray(x_slice, jnp.float32)
    for i, (name, p) in enumerate(params.items()):
        surf = np.asarray(model.batch_cell(p, jnp.asarray(xx.ravel()), jnp.asarray(zz.ravel())))
        z_star = np.asarray(model.solve(p, jnp.asarray(xs), solver).value)
        ax = fig.add_subplot(2, num, i + 1, projection="3d")
        ax.plot_surface(xx, zz, surf.reshape(xx.shape), cmap="viridis", alpha=0.7, linewidth=0)
        ax.plot(xs, z_star, z_star, "r--", lw=2, label="z*(x)")
        ax.set(xlabel="x", ylabel="z", zlabel="f(z; x)", title=name)
        ax2 = fig.add_subplot(2, num, num + i + 1)
        f_slice = np.asarray(jax.vmap(lambda z, p=p: model.cell(p, x0, z))(jnp.asarray(zs)))
        ax2.plot(zs, f_slice, color="tab:blue", label=f"f(z; x={x_slice:g})")
        ax2.plot(zs, zs, color="gray", ls=":", label="z_out = z")
        z, path_z, path_f = 0.0, [], []
        for _ in range(15):
            fz = float(model.cell(p, x0, jnp.asarray(z, jnp.float32)))
            path_z += [z, z]
            path_f += [z, fz]
            z = fz
        ax2.plot(path_z, path_f, color="tab:red", lw=0.8, label="fixed-point iterates")
        target = float(dq.models.jr_synthetic_target(np.float32(x_slice), linear_sign))
        ax2.axhline(target, color="k", lw=0.5)
        ax2.set(xlim=(-6, 6), ylim=(-6, 6), xlabel="z")
        if i == 0:
            ax2.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, path)
