"""DEQ cells vs the same cell unrolled as a weight-tied deep network.

For every cell in ``CELLS`` (a dict of factories: adding a cell is one entry), at a realistic
small size on CPU, float32:

* **DEQ**: ``dq.nn.DEQ`` with Anderson forward (per example, the papers' step budgets) and the
  implicit backward (Anderson on ``uᵀ = uᵀJ + g``). One training step = forward + backward of
  ``loss = mean(z*²)`` w.r.t. all parameters.
* **Unrolled**: the same cell (same module instance, so weight-tied) applied ``depth`` times from
  ``z0``, with ``depth`` = the DEQ's mean forward NFE rounded up, differentiated by ordinary
  backprop.

Reported: median wall time of the jitted step (``--repeats`` runs after a warm-up), forward NFE
(mean / max over the batch) for the DEQ, and "peak memory" — XLA's compiled
``memory_analysis().temp_size_in_bytes`` of the step (the scratch buffers the compiled program
needs at once, excluding arguments/outputs): a proxy for peak activation memory, not a measured
process peak.

Usage::

    python benchmarks/cells.py                      # all cells
    python benchmarks/cells.py --cells mlp --repeats 3
"""

from __future__ import annotations

import argparse
import functools
import math
from typing import Any, Callable, NamedTuple

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

import deqjax as dq
from benchmarks.common import emit, machine, markdown_table, time_fn
from deqjax import initializers, nn


class CellSpec(NamedTuple):
    """How to benchmark one cell."""

    description: str
    make_cell: Callable[[], Any]  # called inside a Haiku transform
    make_input: Callable[[np.random.Generator], jax.Array]  # x with a batch axis
    initial_state: Callable[[Any, jax.Array], Any]  # (cell, x) -> z0
    solver: Callable[..., Any]
    backward_solver: Callable[..., Any]


def _anderson(max_steps, tol):
    return functools.partial(dq.solvers.anderson, max_steps=max_steps, tol=tol)


CELLS: dict[str, CellSpec] = {
    # init paper §4.1: flattened 28x28 images -> ResNet-style fully connected DEQ layer.
    "mlp": CellSpec(
        description="MLPCell resnet, x [64, 784] -> z [64, 256], hidden 256",
        make_cell=lambda: nn.MLPCell(256, w_init=initializers.HaarOrthogonal(0.9)),
        make_input=lambda rng: jnp.asarray(rng.normal(size=(64, 784)), jnp.float32),
        initial_state=lambda cell, x: jnp.zeros((x.shape[0], 256), x.dtype),
        solver=_anderson(30, 1e-3),
        backward_solver=_anderson(30, 1e-4),
    ),
    # JR App. A.3-A.5 MDEQ, scaled down: 4 resolutions of a 32x32 stem output, JR thresholds
    # (7 forward / 8 backward NFEs, eps 1e-3 / 1e-4).
    "multiscale": CellSpec(
        description="MultiscaleCell 4 res. (8,16,32,64), x [8, 32, 32, 8], E=5, drop 0.25, WN",
        make_cell=lambda: nn.MultiscaleCell((8, 16, 32, 64), num_groups=4),
        make_input=lambda rng: jnp.asarray(rng.normal(size=(8, 32, 32, 8)), jnp.float32),
        initial_state=lambda cell, x: cell.initial_state(x),
        solver=_anderson(7, 1e-3),
        backward_solver=_anderson(8, 1e-4),
    ),
    # DEQ paper §4 / JR Table 4 DEQ-Transformer (post-LN, weight norm, recurrent dropout 0.06,
    # 12 forward / 12 backward NFEs at eps 1e-3 / 1e-4), scaled down: width 64, 4 heads, T = 32.
    "transformer": CellSpec(
        description="TransformerCell post-LN, x [8, 32, 64] -> z [8, 32, 64], 4 heads, FFN 128, "
        "drop 0.06, WN",
        make_cell=lambda: nn.TransformerCell(64, num_heads=4, d_ff=128, dropout=0.06),
        make_input=lambda rng: jnp.asarray(rng.normal(size=(8, 32, 64)), jnp.float32),
        initial_state=lambda cell, x: cell.initial_state(x),
        solver=_anderson(12, 1e-3),
        backward_solver=_anderson(12, 1e-4),
    ),
    # DEQ paper §4 DEQ-TrellisNet (kernel 2, LSTM gating, weight norm), scaled down: H = 64,
    # state [h ; c] of 128 features, T = 32.
    "trellis": CellSpec(
        description="TrellisCell k=2, x [8, 32, 64] -> z [8, 32, 128] (H=64), drop 0.1, WN",
        make_cell=lambda: nn.TrellisCell(64, kernel_size=2, dropout=0.1),
        make_input=lambda rng: jnp.asarray(rng.normal(size=(8, 32, 64)), jnp.float32),
        initial_state=lambda cell, x: cell.initial_state(x),
        solver=_anderson(30, 1e-3),
        backward_solver=_anderson(30, 1e-4),
    ),
}


FORMATS = {
    "DEQ step (ms)": ".1f",
    "unrolled step (ms)": ".1f",
    "DEQ temp MiB": ".2f",
    "unrolled temp MiB": ".2f",
}


def _loss(z) -> jax.Array:
    leaves = jax.tree_util.tree_leaves(z)
    return sum(jnp.mean(jnp.square(a)) for a in leaves) / len(leaves)


def _deq_step(spec: CellSpec):
    def forward(x):
        cell = spec.make_cell()
        deq = nn.DEQ(
            cell,
            solver=spec.solver,
            adjoint=dq.ImplicitAdjoint(solver=spec.backward_solver),
            init_state=lambda x: spec.initial_state(cell, x),
        )
        z, sol = deq(x, is_training=True)
        return _loss(z), sol.num_steps

    return hk.transform(forward)


def _unrolled_step(spec: CellSpec, depth: int):
    def forward(x):
        cell = spec.make_cell()
        z = spec.initial_state(cell, x)
        for _ in range(depth):  # one module instance: weight-tied layers
            z = cell(z, x, is_training=True)
        return _loss(z), jnp.full((x.shape[0],), depth, jnp.int32)

    return hk.transform(forward)


def _measure(t: hk.Transformed, x: jax.Array, repeats: int) -> dict[str, Any]:
    params = jax.jit(t.init)(jax.random.PRNGKey(0), x)
    key = jax.random.PRNGKey(1)

    def step(params, key, x):
        (loss, nfe), grads = jax.value_and_grad(t.apply, has_aux=True)(params, key, x)
        return loss, nfe, grads

    jitted = jax.jit(step)
    compiled = jitted.lower(params, key, x).compile()
    temp = compiled.memory_analysis().temp_size_in_bytes
    seconds = time_fn(compiled, params, key, x, repeats=repeats)
    _, nfe, _ = compiled(params, key, x)
    nfe = np.asarray(nfe)
    return dict(seconds=seconds, temp=temp, nfe_mean=float(nfe.mean()), nfe_max=int(nfe.max()))


def run(names: list[str], repeats: int) -> str:
    rows = []
    for name in names:
        spec = CELLS[name]
        x = spec.make_input(np.random.default_rng(0))
        deq = _measure(_deq_step(spec), x, repeats)
        depth = max(1, math.ceil(deq["nfe_mean"]))
        unrolled = _measure(_unrolled_step(spec, depth), x, repeats)
        rows.append(
            {
                "cell": name,
                "size": spec.description,
                "DEQ NFE mean / max": f"{deq['nfe_mean']:.1f} / {deq['nfe_max']}",
                "DEQ step (ms)": 1e3 * deq["seconds"],
                "unrolled depth": depth,
                "unrolled step (ms)": 1e3 * unrolled["seconds"],
                "DEQ temp MiB": deq["temp"] / 2**20,
                "unrolled temp MiB": unrolled["temp"] / 2**20,
            }
        )
    lines = [
        f"Machine: {machine()}. float32, step = forward + backward of mean(z*²), median of "
        f"{repeats} runs. Memory = XLA temp buffer bytes of the compiled step (proxy for peak).",
        "",
    ]
    return "\n".join(lines + markdown_table(rows, list(rows[0]), FORMATS, "l"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cells", nargs="+", default=list(CELLS), choices=list(CELLS))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=None, help="also write the table to this file")
    args = parser.parse_args()
    emit([run(args.cells, args.repeats)], args.out)


if __name__ == "__main__":
    main()
