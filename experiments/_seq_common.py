"""Shared pieces of the sequence experiments (copy memory, language model).

Three sequence "backbones" over embeddings ``x: [B, T, Dx]`` (with an optional memory
``mems: [B, M, D]`` of the previous segment's last-layer states for the transformer):

* ``"deq"``: one weight-tied cell solved to its equilibrium with ``dq.nn.DEQ`` (implicit backward).
* ``"tied"``: the same weight-tied cell unrolled ``depth`` times from ``z = 0`` (explicit backprop
  through every layer; ``depth`` = the DEQ's forward NFE for a like-for-like comparison).
* ``"untied"``: ``depth`` cells with separate weights (an ordinary deep transformer / TrellisNet).

Also: the compiled-memory proxy (XLA ``memory_analysis().temp_size_in_bytes`` of a compiled step:
the scratch buffers XLA plans for activations, not a measured peak RSS) and a step timer.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import time
from collections.abc import Sequence
from typing import Any, Callable

import haiku as hk
import jax
import jax.numpy as jnp

import deqjax as dq
import deqjax.nn as dqnn
from deqjax import solvers

KINDS = ("deq", "tied", "untied")
CELLS = ("transformer", "trellis")


def make_cell(cell: str, *, d_model: int, num_heads: int, pre_ln: bool, name: str | None = None):
    """A transformer or trellis cell whose state has ``d_model`` features."""
    if cell == "transformer":
        return dqnn.TransformerCell(
            d_model, num_heads=num_heads, d_ff=2 * d_model, pre_ln=pre_ln, name=name
        )
    if cell == "trellis":
        return dqnn.TrellisCell(d_model // 2, kernel_size=2, name=name)
    raise ValueError(f"cell must be one of {CELLS}, got {cell!r}.")


def cell_input(cell: str, x: jax.Array, mems: jax.Array | None):
    if cell == "transformer":
        return dqnn.TransformerInput(x, mems)
    return dqnn.TrellisInput(x) if mems is None else dqnn.TrellisInput(x, history=mems[:, -1:])


ADJOINTS = ("implicit", "phantom", "unrolled")


def make_adjoint(name: str):
    """The DEQ gradient strategy named ``name`` (one of :data:`ADJOINTS`)."""
    if name == "implicit":
        return dq.ImplicitAdjoint()
    if name == "phantom":
        return dq.PhantomAdjoint(steps=5, tau=0.8)
    if name == "unrolled":
        return dq.UnrolledAdjoint()
    raise ValueError(f"adjoint must be one of {ADJOINTS}, got {name!r}.")


def backbone(
    x: jax.Array,
    mems: jax.Array | None,
    *,
    kind: str,
    cell: str,
    d_model: int,
    num_heads: int,
    depth: int,
    pre_ln: bool,
    max_steps: int,
    tol: float,
    is_training: bool,
    jacobian_samples: int = 0,
    adjoint: str = "implicit",
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Runs a backbone (call inside ``hk.transform``); returns ``(z [B,T,D], aux)``.

    ``aux`` has ``nfe`` (forward cell evaluations; mean over the batch for the DEQ),
    ``rel_residual`` (the DEQ's final ``||f(z) - z|| / ||f(z)||``, batch mean; NaN for explicit
    models) and
    ``jac_fro_sq`` (Hutchinson ``||J||_F^2 / d`` for the DEQ when ``jacobian_samples > 0``).
    """
    inp = cell_input(cell, x, mems)
    b, t = x.shape[:2]
    if kind == "deq":
        f = make_cell(cell, d_model=d_model, num_heads=num_heads, pre_ln=pre_ln)
        solver = functools.partial(solvers.anderson, max_steps=max_steps, tol=tol, m=5)
        deq = dqnn.DEQ(f, solver=solver, adjoint=make_adjoint(adjoint))
        out = deq.solve(inp, is_training=is_training, jacobian_samples=jacobian_samples)
        nfe = jnp.mean(out.solution.num_steps.astype(jnp.float32))
        jac = out.jacobian_frobenius_sq
        return out.z_star, {
            "nfe": nfe,
            "rel_residual": jnp.mean(out.solution.rel_residual.astype(jnp.float32)),
            "jac_fro_sq": jnp.zeros((), jnp.float32) if jac is None else jac,
        }
    z = jnp.zeros((b, t, d_model), x.dtype)
    if kind == "tied":
        f = make_cell(cell, d_model=d_model, num_heads=num_heads, pre_ln=pre_ln)
        cells = [f] * depth
    elif kind == "untied":
        cells = [
            make_cell(cell, d_model=d_model, num_heads=num_heads, pre_ln=pre_ln, name=f"layer{i}")
            for i in range(depth)
        ]
    else:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}.")
    for f in cells:
        z = f(z, inp, is_training=is_training)
    zero = jnp.zeros((), jnp.float32)
    return z, {
        "nfe": jnp.asarray(float(depth), jnp.float32),
        "rel_residual": jnp.full((), jnp.nan, jnp.float32),
        "jac_fro_sq": zero,
    }


def compiled_temp_bytes(fn: Callable, *args) -> int | None:
    """XLA's planned temporary buffer bytes of ``jit(fn)(*args)`` (peak-memory proxy)."""
    try:
        analysis = jax.jit(fn).lower(*args).compile().memory_analysis()
        return int(analysis.temp_size_in_bytes) if analysis is not None else None
    except Exception:  # noqa: BLE001 - backends without memory analysis
        return None


def time_steps(step: Callable[[], Any], *, repeats: int) -> float:
    """Median wall seconds of ``step()`` (already compiled), blocking on the result."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(step())
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def param_count(params: hk.Params) -> int:
    return int(sum(p.size for p in jax.tree_util.tree_leaves(params)))


def write_json(path: str, obj: Any) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as fh:
        json.dump(obj, fh, indent=2, default=str)


def parse_with_smoke_defaults(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None, smoke_defaults: dict[str, Any]
) -> argparse.Namespace:
    """Parses ``argv``; with ``--smoke`` the parser's defaults become ``smoke_defaults`` first.

    ``--smoke`` changes the defaults only: flags given explicitly still win.
    """
    known, _ = parser.parse_known_args(argv)
    if known.smoke:
        parser.set_defaults(**smoke_defaults)
    return parser.parse_args(argv)
