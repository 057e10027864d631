"""Shared pieces of the sequence experiments (copy memory, language model).

Three sequence "backbones" over embeddings ``x: [B, T, Dx]``, each with an optional memory of the
previous segment (Transformer-XL style, gradient stopped):

* ``"deq"``: one weight-tied cell solved to its equilibrium with ``dq.nn.DEQ`` (implicit backward).
  Memory ``mems: [B, M, D]``: the previous segment's equilibrium ``z*`` (DEQ paper §3.3/§4: one
  state, whatever the effective depth).
* ``"tied"``: the same weight-tied cell unrolled ``depth`` times from ``z = 0`` (explicit backprop
  through every layer; ``depth`` = the DEQ's forward NFE for a like-for-like comparison).
* ``"untied"``: ``depth`` cells with separate weights (an ordinary deep transformer / TrellisNet).
  For both explicit models the transformer memory is per layer, ``mems: [depth, B, M, D]``: layer
  ``l`` attends to the previous segment's input to layer ``l`` (Transformer-XL, Dai et al. 2019
  §3.2: ``h^{n}_τ = Layer(h^{n-1}_τ, SG(h^{n-1}_{τ-1}))``). Because these models start from
  ``z^[0] = 0`` and inject ``x`` into every layer (as the DEQ does), layer 0's memory is the zero
  state: the previous segment's tokens reach the current one from layer 1 on. A ``[B, M, D]``
  memory is also accepted (every layer attends to the same states).

With a memory, ``aux["new_mems"]`` holds the next segment's memory (this segment's states, last
``M`` positions not cut: ``[B, T, D]`` for the DEQ, ``[depth, B, T, D]`` for the explicit models),
gradient stopped. Carrying it costs ``depth`` times more for the explicit models: the DEQ paper's
memory claim covers the carried state as well as the activations.

Also: the compiled-memory proxy (XLA ``memory_analysis().temp_size_in_bytes`` of a compiled step:
the scratch buffers XLA plans for activations, not a measured peak RSS) and the experiments' common
run flags.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
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


def make_cell(
    cell: str,
    *,
    d_model: int,
    num_heads: int,
    pre_ln: bool,
    trellis_kernel: int = 2,
    name: str | None = None,
):
    """A transformer or trellis cell whose state has ``d_model`` features.

    A trellis cell with kernel size ``k`` moves information ``k - 1`` positions forward per
    evaluation, so ``n`` evaluations (DEQ solver steps or explicit layers) see ``n (k - 1)`` back.
    """
    if cell == "transformer":
        return dqnn.TransformerCell(
            d_model, num_heads=num_heads, d_ff=2 * d_model, pre_ln=pre_ln, name=name
        )
    if cell == "trellis":
        return dqnn.TrellisCell(d_model // 2, kernel_size=trellis_kernel, name=name)
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
    trellis_kernel: int = 2,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Runs a backbone (call inside ``hk.transform``); returns ``(z [B,T,D], aux)``.

    ``aux`` has ``nfe`` (forward cell evaluations; mean over the batch for the DEQ),
    ``rel_residual`` (the DEQ's final ``||f(z) - z|| / ||f(z)||``, batch mean; NaN for explicit
    models),
    ``jac_fro_sq`` (Hutchinson ``||J||_F^2 / d`` for the DEQ when ``jacobian_samples > 0``) and,
    when ``mems`` is given, ``new_mems`` (the next segment's memory, see the module docstring).

    ``mems``: ``None``; ``[B, M, D]`` (the DEQ's memory; for explicit models shared by all layers);
    or ``[depth, B, M, D]`` for explicit models (layer ``l`` attends to ``mems[l]``).
    """
    b, t = x.shape[:2]
    if kind == "deq":
        if mems is not None and mems.ndim != 3:
            raise ValueError(f"mems of the DEQ must be [B, M, D], got shape {mems.shape}.")
        inp = cell_input(cell, x, mems)
        f = make_cell(
            cell, d_model=d_model, num_heads=num_heads, pre_ln=pre_ln, trellis_kernel=trellis_kernel
        )
        solver = functools.partial(solvers.anderson, max_steps=max_steps, tol=tol, m=5)
        deq = dqnn.DEQ(f, solver=solver, adjoint=make_adjoint(adjoint))
        out = deq.solve(inp, is_training=is_training, jacobian_samples=jacobian_samples)
        nfe = jnp.mean(out.solution.num_steps.astype(jnp.float32))
        jac = out.jacobian_frobenius_sq
        aux = {
            "nfe": nfe,
            "rel_residual": jnp.mean(out.solution.rel_residual.astype(jnp.float32)),
            "jac_fro_sq": jnp.zeros((), jnp.float32) if jac is None else jac,
        }
        if mems is not None:
            aux["new_mems"] = jax.lax.stop_gradient(out.z_star)
        return out.z_star, aux
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}.")
    if mems is not None and mems.ndim == 4 and mems.shape[0] != depth:
        raise ValueError(f"per-layer mems must be [depth={depth}, B, M, D], got {mems.shape}.")
    layer_mems = [
        None if mems is None else (mems[i] if mems.ndim == 4 else mems) for i in range(depth)
    ]
    z = jnp.zeros((b, t, d_model), x.dtype)
    if kind == "tied":
        f = make_cell(
            cell, d_model=d_model, num_heads=num_heads, pre_ln=pre_ln, trellis_kernel=trellis_kernel
        )
        cells = [f] * depth
    elif kind == "untied":
        cells = [
            make_cell(
                cell,
                d_model=d_model,
                num_heads=num_heads,
                pre_ln=pre_ln,
                trellis_kernel=trellis_kernel,
                name=f"layer{i}",
            )
            for i in range(depth)
        ]
    layer_inputs = []
    for f, mem in zip(cells, layer_mems):
        layer_inputs.append(z)
        z = f(z, cell_input(cell, x, mem), is_training=is_training)
    aux = {
        "nfe": jnp.asarray(float(depth), jnp.float32),
        "rel_residual": jnp.full((), jnp.nan, jnp.float32),
        "jac_fro_sq": jnp.zeros((), jnp.float32),
    }
    if mems is not None:
        aux["new_mems"] = jax.lax.stop_gradient(jnp.stack(layer_inputs))  # [depth, B, T, D]
    return z, aux


def compile_with_memory(fn: Callable, *example_args) -> tuple[Any, dict[str, int] | None]:
    """``jit(fn)`` compiled once for ``example_args`` and XLA's memory analysis of it.

    The analysis (``temp_bytes``: the scratch buffers XLA plans, a PROXY for peak activation
    memory, not a measured peak; ``argument_bytes``; ``output_bytes``) is ``None`` on backends
    without one.
    """
    compiled = jax.jit(fn).lower(*example_args).compile()
    try:
        analysis = compiled.memory_analysis()
    except Exception:  # noqa: BLE001 - backends without memory analysis
        analysis = None
    if analysis is None:
        return compiled, None
    return compiled, {
        "temp_bytes": int(analysis.temp_size_in_bytes),
        "argument_bytes": int(analysis.argument_size_in_bytes),
        "output_bytes": int(analysis.output_size_in_bytes),
    }


def param_count(params: hk.Params) -> int:
    return int(sum(p.size for p in jax.tree_util.tree_leaves(params)))


def write_json(path: str, obj: Any) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as fh:
        json.dump(obj, fh, indent=2, default=str)


def add_run_flags(parser: argparse.ArgumentParser, *, out_dir: str) -> None:
    """Adds the flags every sequence/vision experiment takes: seed, out_dir, smoke, no_progress."""
    parser.add_argument("--seed", type=int, default=0, help="seed of init, data and order")
    parser.add_argument(
        "--out_dir", default=out_dir, help=f"output folder (--smoke: {out_dir}_smoke)"
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny sizes, a few steps: a plumbing check (under 4 minutes on 2 CPU\n"
        "cores), written to <out_dir>_smoke so it never overwrites a full run",
    )
    parser.add_argument("--no_progress", dest="progress", action="store_false", help="no bar")


def parse_with_smoke_defaults(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None, smoke_defaults: dict[str, Any]
) -> argparse.Namespace:
    """Parses ``argv``; with ``--smoke`` the parser's defaults become ``smoke_defaults`` first.

    ``--smoke`` changes the defaults only: flags given explicitly still win. Its default
    ``--out_dir`` is the full run's with ``_smoke`` appended.
    """
    known, _ = parser.parse_known_args(argv)
    if known.smoke:
        out_dir = parser.get_default("out_dir")
        parser.set_defaults(**({"out_dir": f"{out_dir}_smoke"} if out_dir else {}))
        parser.set_defaults(**smoke_defaults)
    return parser.parse_args(argv)
