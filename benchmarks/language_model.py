"""Train-step throughput and a peak-memory proxy of the LM: DEQ vs explicit transformers.

The models of ``experiments/language_model.py`` (``dq.models.SequenceModel``; the train step is
``dq.training.train_step`` over ``dq.models.lm_loss``, memory carried) at one width (defaults:
``d_model`` 64, 4 heads, ``d_ff`` 128, vocabulary 2000, batch 16, Transformer-XL memory of one
segment, post-LN, float32):

* ``deq``: the DEQ-Transformer; the forward Anderson solve runs exactly ``L`` steps (``tol = 0``),
  so its forward NFE equals the explicit models' depth; implicit backward with the same solver
  (``L`` Anderson steps on the adjoint system). Carried memory: one ``[B, M, D]`` state.
* ``deq+jr``: the same with the JR penalty (one Hutchinson sample, JR paper Eq. 4).
* ``tied``: the same weight-tied cell unrolled ``L`` times, backprop through all layers.
* ``untied``: ``L`` separate layers (an ordinary deep transformer of the same width).
  Both explicit models carry a per-layer memory ``[L, B, M, D]`` (Transformer-XL).

For each segment length ``T`` in ``--seq_lens`` and depth/NFE ``L`` in ``--depths``: tokens/s of
the jitted train step (``B T`` / median step time over ``--repeats`` steps after compile and one
warm-up step) and XLA's ``compiled.memory_analysis()``: ``temp_size_in_bytes`` (the scratch buffers
XLA plans for the step: activations kept for the backward pass, solver buffers; a PROXY for peak
activation memory, not a measured peak RSS) and the argument bytes (parameters, optimizer state,
batch and carried memory). Random tokens: throughput and memory do not depend on the data, and the
DEQ's NFE is fixed by ``tol = 0``.

Usage (from the repository root)::

    python -m benchmarks.language_model                       # markdown table to stdout
    python -m benchmarks.language_model --depths 8 --seq_lens 32,128 --repeats 5
"""

from __future__ import annotations

import argparse
import sys
import time

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax

import deqjax as dq
from benchmarks import common
from deqjax import training

MODELS = ("deq", "deq+jr", "tied", "untied")


def build(kind: str, *, depth: int, gamma: float, args) -> hk.Transformed:
    """``experiments/language_model.py``'s model: ``apply(params, rng, tokens, mems, train)``."""
    solver = dq.solvers.Anderson(max_steps=depth, tol=0.0, m=5)  # exactly `depth` evaluations
    # The implicit backward's GMRES fallback ("gmres", the default) or none: the fallback's share
    # of the compile time.
    adjoint = dq.ImplicitAdjoint(fallback=None if args.fallback == "none" else "gmres")
    reg = dq.regularization.JacobianRegularizer(gamma) if gamma > 0 else None
    deq = dq.models.DEQSettings(solver, adjoint=adjoint, regularizer=reg)

    def forward(tokens, mems, is_training):
        model = dq.models.SequenceModel(
            args.vocab_size,
            kind,
            d_model=args.d_model,
            num_heads=args.num_heads,
            depth=depth,
            pre_ln=args.pre_ln,
            deq=deq,
            embed_init=hk.initializers.RandomNormal(0.02),
        )
        return model(tokens, mems, is_training=is_training)

    return hk.transform(forward)


def measure(model: str, *, depth: int, seq_len: int, args) -> dict:
    """Compiles one train step and times it; returns the row of the table."""
    kind = "deq" if model.startswith("deq") else model
    gamma = args.jr_gamma if model == "deq+jr" else 0.0
    transformed = build(kind, depth=depth, gamma=gamma, args=args)
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, args.vocab_size, (args.batch_size, seq_len)), jnp.int32)
    targets = jnp.asarray(rng.integers(0, args.vocab_size, (args.batch_size, seq_len)), jnp.int32)
    mems = None
    if args.memory:
        mems = dq.models.initial_memory(
            kind,
            batch_size=args.batch_size,
            memory_length=seq_len,
            d_model=args.d_model,
            depth=depth,
        )
    params = transformed.init(jax.random.PRNGKey(0), tokens, mems, True)
    opt = optax.chain(optax.clip_by_global_norm(0.25), optax.adam(5e-3))  # the experiment's
    loss_fn = dq.models.lm_loss(transformed, memory_length=seq_len if args.memory else None)
    pair = training.train_step(loss_fn, opt, axis_name=None, with_carry=True)
    batch = {"inputs": tokens, "targets": targets, "reset": jnp.zeros((args.batch_size,), bool)}
    carry = () if mems is None else mems
    t0 = time.perf_counter()
    step, memory = training.compile_with_memory(
        pair.update, pair.init(params, jax.random.PRNGKey(1), carry=carry), batch
    )
    compile_s = time.perf_counter() - t0
    state = [pair.init(params, jax.random.PRNGKey(1), carry=carry)]

    def one_step():
        state[0], metrics = step(state[0], batch)
        return metrics

    step_s = common.time_fn(one_step, repeats=args.repeats)  # median after one warm-up step
    nfe = float(one_step()["nfe"])  # tol = 0: every step runs exactly `depth` evaluations
    return {
        "model": model,
        "seq_len": seq_len,
        "depth": depth,
        "params": int(sum(x.size for x in jax.tree.leaves(params))),
        "nfe": nfe,
        "step_ms": 1e3 * step_s,
        "tokens_per_s": args.batch_size * seq_len / step_s,
        "temp_bytes": None if memory is None else memory["temp_bytes"],
        "argument_bytes": None if memory is None else memory["argument_bytes"],
        "carried_memory_bytes": 0 if mems is None else int(mems.nbytes),
        "compile_s": compile_s,
    }


def _mb(value: int | None) -> str:
    return "n/a" if value is None else f"{value / 2**20:.2f}"


FORMATS = {
    "params": ",",
    "forward NFE": ".0f",
    "step (ms, median)": ".1f",
    "tokens/s": ",.0f",
    "temp MiB (proxy)": _mb,
    "argument MiB": _mb,
    "carried memory KiB": ".0f",
    "compile (s)": ".1f",
}


def table(rows: list[dict]) -> list[str]:
    deqs = {(r["seq_len"], r["depth"]): r for r in rows if r["model"] == "deq"}
    cells = []
    for r in rows:
        deq = deqs.get((r["seq_len"], r["depth"]))
        ratio = (
            f"{r['temp_bytes'] / deq['temp_bytes']:.2f}×"
            if deq and r["temp_bytes"] and deq["temp_bytes"]
            else "n/a"
        )
        cells.append(
            {
                "T": r["seq_len"],
                "L": r["depth"],
                "model": r["model"],
                "params": r["params"],
                "forward NFE": r["nfe"],
                "step (ms, median)": r["step_ms"],
                "tokens/s": r["tokens_per_s"],
                "temp MiB (proxy)": r["temp_bytes"],
                "temp vs DEQ": ratio,
                "argument MiB": r["argument_bytes"],
                "carried memory KiB": r["carried_memory_bytes"] / 1024,
                "compile (s)": r["compile_s"],
            }
        )
    return common.markdown_table(cells, list(cells[0]), FORMATS, "l")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--depths", default="4,8,16", help="explicit depth = DEQ forward NFE")
    p.add_argument("--seq_lens", default="64,128", help="segment lengths T (memory M = T)")
    p.add_argument("--d_model", type=int, default=64)
    p.add_argument("--num_heads", type=int, default=4)
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--vocab_size", type=int, default=2000)
    p.add_argument("--jr_gamma", type=float, default=0.5, help="γ of the deq+jr row")
    p.add_argument("--pre_ln", action="store_true")
    p.add_argument("--memory", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument(
        "--fallback",
        default="gmres",
        choices=("gmres", "none"),
        help="the DEQ's implicit backward fallback (none: to measure its share of compile time)",
    )
    args = p.parse_args(argv)
    rows = []
    for seq_len in (int(s) for s in args.seq_lens.split(",")):
        for depth in (int(d) for d in args.depths.split(",")):
            for model in args.models.split(","):
                if model not in MODELS:
                    raise ValueError(f"--models: {model!r} is not one of {MODELS}.")
                rows.append(measure(model, depth=depth, seq_len=seq_len, args=args))
                print(rows[-1], file=sys.stderr, flush=True)
    print(
        f"LM train step ({common.machine()}; d_model {args.d_model}, {args.num_heads} heads, "
        f"d_ff {2 * args.d_model}, vocab {args.vocab_size}, batch {args.batch_size}, "
        f"{'pre' if args.pre_ln else 'post'}-LN, memory M = T {'on' if args.memory else 'off'}, "
        f"float32; median of {args.repeats} steps after compile + 1 warm-up). temp = XLA "
        "compiled memory_analysis().temp_size_in_bytes: a PROXY for peak activation memory, "
        "not a measured peak.\n"
    )
    print("\n".join(table(rows)))


if __name__ == "__main__":
    main()
