"""DEQ-Transformer language model vs explicit transformers (DEQ paper §5 Table 3 / memory claims).

Data: WikiText-103 under ``--data_dir`` (or any ``--corpus`` ``dq.data.load_lm_corpus`` takes);
offline the King James Bible, labelled ``STAND-IN``. A sentencepiece model (``--vocab_size``) is
trained on the training split, cut into contiguous ``--seq_len`` segments (``dq.data.LMBatches``).
Models (``--models``, ``dq.models.SequenceModel``; same width, embeddings and head): ``deq``
(``dq.nn.DEQ(TransformerCell)``, Anderson ``--max_steps``/``--tol``, ``--adjoint`` backward;
``--jr_gamma > 0``: JR Eq. 4, one Hutchinson sample; memory = the previous segment's ``z*``),
``tied`` (the same cell unrolled to the DEQ's mean forward NFE, or ``--depth``), ``untied`` (that
many separate layers; explicit models carry Transformer-XL per-layer memory). With ``--memory``
the memory is ``fit``'s carry along the streams (gradient stopped, reset at each pass's start).

Defaults (KJV, BENCHMARKS.md "Language model"): Adam 5e-3, clip 0.25, 300 steps of 16 x 64 tokens,
``d_model`` 64, Anderson <= 12 steps to 1e-3. ``--pre_ln``: JR paper pre-LN (REPRODUCTION.md 5);
``--ffn_init goe --ffn_scale 2 --d_ff 64``: the init paper's §4.3 ensembles (REPRODUCTION.md 2).
``results.json`` per model: valid perplexity (unigram reference alongside), last-10% train ppl,
forward NFE and relative residual (NaN: explicit), ``||J||²_F / d``, step time, tokens/s, XLA temp
bytes of the step (a PROXY for peak activation memory), carried memory, params; ``loss.png``,
``deq_solver.png``, ``metrics_<model>.jsonl``, checkpoints (``--resume``).

Usage: ``python -m experiments.language_model [--smoke]`` (KJV, 300 steps/model: ~3 min, 2 CPUs)
"""

from __future__ import annotations

import argparse
import math
import time

import haiku as hk
import jax
import numpy as np
import optax

import deqjax as dq
from deqjax import data, training

SMOKE = dict(vocab_size=300, max_train_lines=1500, max_eval_lines=200, d_model=16, num_heads=2,
             seq_len=16, batch_size=4, max_steps=4, steps=3, eval_segments=2)  # fmt: skip


def add_flags(p) -> None:
    add = p.add_argument
    add("--corpus", default="kjv", help="kjv | wikitext-103 | path")
    add("--data_dir", default=None, help="directory with WikiText-103 wiki.*.tokens")
    add("--vocab_size", type=int, default=2000, help="sentencepiece vocabulary size")
    add("--max_train_lines", type=int, default=0, help="0: all")
    add("--max_eval_lines", type=int, default=2000, help="0: all")
    add("--models", default="deq,tied,untied", help="comma-separated: deq, tied, untied")
    add("--d_model", type=int, default=64, help="model width")
    add("--num_heads", type=int, default=4, help="attention heads")
    add("--seq_len", type=int, default=64, help="tokens per segment")
    add("--batch_size", type=int, default=16, help="segments per batch")
    add("--max_steps", type=int, default=12, help="DEQ Anderson steps")
    add("--tol", type=float, default=1e-3, help="forward solver tolerance")
    add("--depth", type=int, default=0, help="explicit depth; 0: the DEQ's NFE")
    add("--pre_ln", action="store_true", help="pre-layer-norm cells (default post-LN)")
    add("--d_ff", type=int, default=0, help="FFN width; 0: 2 d_model")
    add("--ffn_init", choices=("paper", *dq.models.INIT_FAMILIES), default="paper", help="FFN W")
    add("--ffn_scale", type=float, default=1.0, help="ensemble scale of --ffn_init")
    add("--jr_gamma", type=float, default=0.0, help="JR weight (0: off)")
    add("--adjoint", choices=dq.training.GRADIENTS, default="implicit", help="DEQ gradient")
    add("--memory", action=argparse.BooleanOptionalAction, default=True, help="carry memory")
    add("--mem_len", type=int, default=0, help="memory positions M; 0: seq_len")
    add("--steps", type=int, default=300, help="training steps per model")
    add("--eval_segments", type=int, default=20, help="validation segments evaluated")
    add("--learning_rate", type=float, default=5e-3, help="peak learning rate")
    add("--clip", type=float, default=0.25, help="global gradient-norm clip")


def setup(args):
    name = args.corpus if args.data_dir is None or args.corpus != "kjv" else "wikitext-103"
    corpus = data.load_lm_corpus(name, data_dir=args.data_dir, allow_standin=True)
    print(f"data source: {corpus.source}")
    lines = corpus.train[: args.max_train_lines] if args.max_train_lines else corpus.train
    tok = data.train_sentencepiece(lines, vocab_size=args.vocab_size)
    train = np.asarray(tok.encode_lines(lines), np.int32)
    lines = corpus.valid[: args.max_eval_lines] if args.max_eval_lines else corpus.valid
    valid = np.asarray(tok.encode_lines(lines), np.int32)
    print(f"tokens: train={train.size} valid={valid.size} vocab={tok.vocab_size}")
    extra = {"data_source": corpus.source, "is_standin": corpus.is_standin}
    return (tok.vocab_size, train, valid), extra | {"tokenizer": str(tok.model_path)}


def build(kind: str, args, vocab: int, depth: int) -> hk.Transformed:
    """``apply(params, rng, tokens, mems, is_training) -> (logits, aux)``."""
    solver, adjoint = dq.training.solver_and_adjoint(
        args.adjoint, max_steps=args.max_steps, tol=args.tol, tau=0.8)  # fmt: skip
    reg = dq.regularization.JacobianRegularizer(args.jr_gamma) if args.jr_gamma > 0 else None
    ffn = None if (f := args.ffn_init) == "paper" else dq.models.recurrent_init(f, args.ffn_scale)

    def forward(tokens, mems, is_training):
        return dq.models.SequenceModel(
            vocab, kind, d_model=args.d_model, num_heads=args.num_heads, depth=depth,
            pre_ln=args.pre_ln, solver=solver, adjoint=adjoint, d_ff=args.d_ff or None,
            ffn_init=ffn, regularizer=reg, embed_init=hk.initializers.RandomNormal(0.02),
        )(tokens, mems, is_training=is_training)  # fmt: skip

    return hk.transform(forward)


def memory(kind: str, depth: int, args, batch_size: int):
    """Zero memory, ``[B, M, D]`` or ``[depth, B, M, D]``; None without ``--memory``."""
    m, d = args.mem_len or args.seq_len, args.d_model
    kw = dict(batch_size=batch_size, memory_length=m, d_model=d, depth=depth)
    return dq.models.initial_memory(kind, **kw) if args.memory else None


def run_model(kind: str, depth: int, args, inputs, ctx) -> dict:
    wall0 = time.perf_counter()
    vocab, train, valid = inputs
    model = build(kind, args, vocab, depth)
    b, t, m = args.batch_size, args.seq_len, (args.mem_len or args.seq_len)
    mem0 = memory(kind, depth, args, b // jax.device_count())  # fit's carry: per device
    first = next(data.LMBatches(train, num_streams=b, segment_length=t))
    params = model.init(jax.random.PRNGKey(args.seed), first["inputs"], mem0, True)
    opt = optax.chain(optax.clip_by_global_norm(args.clip), optax.adam(args.learning_rate))
    loss_fn = dq.models.lm_loss(model, memory_length=m if args.memory else None)
    carry = () if mem0 is None else mem0
    pair = training.train_step(loss_fn, opt, axis_name=None, with_carry=True)
    state = pair.init(params, jax.random.PRNGKey(0), carry=carry)
    _, mem_bytes = training.compile_with_memory(pair.update, state, first)  # the proxy
    path = ctx.path(f"metrics_{kind}.jsonl")
    kw = ctx.fit_kwargs(checkpoint_dir=ctx.path(f"ckpt_{kind}"), metrics_path=path)
    batches = data.LMBatches(train, num_streams=b, segment_length=t)
    fit = training.fit(
        params=params, loss_fn=loss_fn, optimizer=opt, train_data=batches, num_steps=args.steps,
        rng=jax.random.PRNGKey(args.seed + 1), carry=carry, log_every=1, desc=kind, **kw,
    )  # fmt: skip
    train_s = time.perf_counter() - wall0
    recs = [r for r in training.read_jsonl(path) if r.get("split") == "train"]
    hist = {k: [r[k] for r in recs] for k in ("nll", "nfe", "rel_residual", "jac_fro_sq", "z_rms")}
    step_s = float(np.median([b / r["examples_per_sec"] for r in recs[1:] or recs]))
    ev = dq.models.evaluate_lm(
        model, fit.state.params, valid, num_streams=b, segment_length=t,
        num_segments=args.eval_segments, memory=memory(kind, depth, args, b),
    )  # fmt: skip
    last = lambda k: float(np.mean(hist[k][-max(1, len(hist[k]) // 10) :]))  # noqa: E731
    carried = memory(kind, depth, args, b)
    r = {
        "model": kind, "depth_or_max_steps": args.max_steps if kind == "deq" else depth,
        "params": int(sum(x.size for x in jax.tree.leaves(fit.state.params))),
        "train_nll_last": last("nll"), "train_ppl_last": math.exp(last("nll")),
        "valid_ppl": math.exp(ev["nll"]), "valid_segments": ev["segments"],
        "forward_nfe_train": float(np.mean(hist["nfe"])), "forward_nfe_train_last": last("nfe"),
        "forward_nfe_eval": ev["nfe"], "forward_rel_residual_eval": ev["rel_residual"],
        "forward_rel_residual_train_last": last("rel_residual"),
        "jac_fro_sq_train_last": last("jac_fro_sq"), "z_rms_train_last": last("z_rms"),
        "train_step_s_median": step_s, "tokens_per_s": b * t / step_s,
        "compiled_temp_bytes": mem_bytes and mem_bytes["temp_bytes"], "compiled_memory": mem_bytes,
        "carried_memory_shape": None if carried is None else list(carried.shape),
        "carried_memory_bytes": 0 if carried is None else int(carried.nbytes),
        "wall_s": time.perf_counter() - wall0, "train_wall_s": train_s, "history": hist,
        "interrupted": fit.interrupted,
    }  # fmt: skip
    ctx.print(
        f"{kind:7s} params={r['params']} valid_ppl={r['valid_ppl']:.2f} train_ppl="
        f"{r['train_ppl_last']:.2f} nfe={r['forward_nfe_train']:.1f} rel_res(eval)="
        f"{r['forward_rel_residual_eval']:.1e} jac={r['jac_fro_sq_train_last']:.3g} "
        f"step={1e3 * step_s:.1f}ms temp_bytes={r['compiled_temp_bytes']}"
    )
    return r


def run(args, inputs, ctx) -> dict:
    vocab, train, valid = inputs
    counts = np.bincount(train, minlength=vocab).astype(np.float64) + 1.0  # add-one unigram
    ref = float(np.exp(-np.mean(np.log(counts / counts.sum())[valid])))
    ctx.print(f"reference: uniform ppl = {vocab}, unigram ppl = {ref:.1f}")
    results, deq_nfe = [], None
    for kind in args.models.split(","):
        depth = args.depth or (max(1, round(deq_nfe)) if deq_nfe else args.max_steps)
        results.append(run_model(kind, depth, args, inputs, ctx))
        deq_nfe = results[-1]["forward_nfe_train"] if kind == "deq" else deq_nfe
        if results[-1]["interrupted"]:
            break
    curve = lambda ys: (range(1, len(ys) + 1), ys)  # noqa: E731
    nll = {f"{r['model']} (ppl {r['valid_ppl']:.0f})": curve(r["history"]["nll"]) for r in results}
    training.line_plot(ctx.path("loss.png"), nll, xlabel="step", ylabel="train NLL (nats/token)")
    for h in (r["history"] for r in results if r["model"] == "deq"):
        training.line_plot(
            ctx.path("deq_solver.png"),
            {"forward NFE": curve(h["nfe"]), "relative residual": curve(h["rel_residual"])},
            xlabel="step", logy=True, hline=args.tol, title="DEQ forward solve",
        )  # fmt: skip
    return {
        "data_source": ctx.config["data_source"], "is_standin": ctx.config["is_standin"],
        "vocab_size": vocab, "unigram_valid_ppl": ref, "results": results,
        "interrupted": any(r["interrupted"] for r in results),
    }  # fmt: skip


EXPERIMENT = training.Experiment(
    name="language_model", doc=__doc__, add_flags=add_flags, setup=setup, run=run, smoke=SMOKE,
    safe_on_resume=("steps", "eval_segments"), outputs=("loss.png", "deq_solver.png"),
)  # fmt: skip

if __name__ == "__main__":
    training.run(EXPERIMENT)
