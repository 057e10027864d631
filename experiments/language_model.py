"""DEQ-Transformer language model vs explicit transformers (DEQ paper §5 Table 3 / memory claims).

Data: WikiText-103 ``wiki.{train,valid,test}.tokens`` under ``--data_dir`` when given (or any
corpus name/path ``dq.data.load_lm_corpus`` takes, via ``--corpus``); otherwise (offline) the King
James Bible, labelled ``STAND-IN`` in the log and in every output file. A sentencepiece model is
trained on the training split (``--vocab_size``; cached) and the splits are cut into contiguous
segments of ``--seq_len`` tokens (``dq.data.lm_segments``, init paper App. D uses 128).

Models (``--models``):
  * ``deq``: embeddings -> ``dq.nn.DEQ(TransformerCell)`` (Anderson forward, implicit backward)
    -> tied-free linear head. ``--pre_ln`` switches the LayerNorm placement (JR Fig. 2),
    ``--jr_gamma > 0`` adds the JR paper's Eq. 4 penalty ``γ ||J_f(z*)||²_F / d`` (one Hutchinson
    sample per step), ``--memory`` feeds the previous segment's equilibrium as Transformer-XL
    memory (the stored state is carried across training steps, gradient stopped).
  * ``tied``: the same weight-tied cell unrolled explicitly to the DEQ's measured forward NFE
    (rounded; or ``--depth``), backprop through all layers.
  * ``untied``: an ordinary deep transformer with that many separate layers (same width).
  With ``--memory`` the explicit models attend to their previous segment's LAST-layer output (a
  simplification of Transformer-XL's per-layer memory).

Reported per model: validation perplexity, forward NFE, median train-step time, and the compiled
train step's ``memory_analysis().temp_size_in_bytes`` (XLA's planned scratch memory, used as a
PROXY for peak activation memory; not a measured peak), parameter count.

Outputs in ``--out_dir`` (default ``runs/language_model``): ``config.json``, ``results.json``,
``loss.png``.

Usage:
  python experiments/language_model.py --smoke
  python experiments/language_model.py --steps 300                      # KJV stand-in, CPU
  python experiments/language_model.py --data_dir ~/data/wikitext-103 --steps 20000 --d_model 256
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import sys
import time
from collections.abc import Sequence

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax
import tqdm

from deqjax import data

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _seq_common as common  # noqa: E402


def load_tokens(args, log):
    name = args.corpus if args.data_dir is None or args.corpus != "kjv" else "wikitext-103"
    corpus = data.load_lm_corpus(name, data_dir=args.data_dir, allow_standin=True)
    log(f"data source: {corpus.source}")
    train_lines = corpus.train[: args.max_train_lines] if args.max_train_lines else corpus.train
    tok = data.train_sentencepiece(train_lines, vocab_size=args.vocab_size)
    enc = tok.encode_lines
    train = np.asarray(enc(train_lines), np.int32)
    valid_lines = corpus.valid[: args.max_eval_lines] if args.max_eval_lines else corpus.valid
    valid = np.asarray(enc(valid_lines), np.int32)
    log(f"tokens: train={train.size} valid={valid.size} vocab={tok.vocab_size}")
    return corpus, tok, train, valid


def build(kind: str, args, vocab: int, depth: int) -> hk.Transformed:
    def forward(tokens, mems, is_training):
        x = hk.Embed(vocab, args.d_model, w_init=hk.initializers.RandomNormal(0.02))(tokens)
        z, aux = common.backbone(
            x,
            mems,
            kind=kind,
            cell="transformer",
            d_model=args.d_model,
            num_heads=args.num_heads,
            depth=depth,
            pre_ln=args.pre_ln,
            max_steps=args.max_steps,
            tol=args.tol,
            is_training=is_training,
            jacobian_samples=1 if (kind == "deq" and args.jr_gamma > 0 and is_training) else 0,
        )
        h = hk.LayerNorm(-1, True, True)(z) if args.pre_ln else z
        return hk.Linear(vocab)(h), z, aux

    return hk.transform(forward)


def run_model(kind: str, depth: int, args, vocab, train, valid, log) -> dict:
    model = build(kind, args, vocab, depth)
    b, t = args.batch_size, args.seq_len
    mem0 = jnp.zeros((b, t, args.d_model), jnp.float32) if args.memory else None
    seg0 = next(data.lm_segments(train, num_streams=b, segment_length=t, memory_length=0))
    params = model.init(jax.random.PRNGKey(args.seed), seg0.inputs, mem0, True)
    opt = optax.chain(optax.clip_by_global_norm(0.25), optax.adam(args.learning_rate))
    opt_state = opt.init(params)

    def loss_fn(params, key, tokens, targets, mems, is_training):
        logits, z, aux = model.apply(params, key, tokens, mems, is_training)
        logp = jax.nn.log_softmax(logits)
        nll = jnp.mean(-jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0])
        jac = aux["jac_fro_sq"]
        loss = nll + args.jr_gamma * jac if (is_training and jac is not None) else nll
        return loss, (nll, aux, jax.lax.stop_gradient(z))

    def train_step(params, opt_state, key, tokens, targets, mems):
        (_, (nll, aux, z)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            params, key, tokens, targets, mems, True
        )
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, nll, aux, z

    key = jax.random.PRNGKey(args.seed + 1)
    temp_bytes = common.compiled_temp_bytes(
        train_step, params, opt_state, key, seg0.inputs, seg0.targets, mem0
    )
    train_step = jax.jit(train_step)
    eval_step = jax.jit(functools.partial(loss_fn, is_training=False))

    history, nfes, times = [], [], []
    step = 0
    mems = mem0
    bar = tqdm.tqdm(total=args.steps, desc=kind, disable=not args.progress)
    while step < args.steps:
        mems = mem0
        for seg in data.lm_segments(train, num_streams=b, segment_length=t, memory_length=0):
            if step >= args.steps:
                break
            key, sub = jax.random.split(key)
            t0 = time.perf_counter()
            params, opt_state, nll, aux, z = train_step(
                params, opt_state, sub, seg.inputs, seg.targets, mems
            )
            nll = float(nll)  # blocks
            times.append(time.perf_counter() - t0)
            history.append(nll)
            nfes.append(float(aux["nfe"]))
            if args.memory:
                mems = z
            step += 1
            bar.update()
    bar.close()

    total, count = 0.0, 0
    mems = mem0
    eval_nfe = []
    for i, seg in enumerate(
        data.lm_segments(valid, num_streams=b, segment_length=t, memory_length=0)
    ):
        if i >= args.eval_segments:
            break
        nll, (_, aux, z) = eval_step(params, None, seg.inputs, seg.targets, mems)
        total, count = total + float(nll), count + 1
        eval_nfe.append(float(aux["nfe"]))
        if args.memory:
            mems = z
    step_times = times[1:] if len(times) > 1 else times
    result = {
        "model": kind,
        "depth_or_max_steps": depth if kind != "deq" else args.max_steps,
        "params": common.param_count(params),
        "train_nll_last": float(np.mean(history[-max(1, len(history) // 10) :])),
        "valid_ppl": math.exp(total / max(count, 1)),
        "valid_segments": count,
        "forward_nfe_train": float(np.mean(nfes)),
        "forward_nfe_eval": float(np.mean(eval_nfe)) if eval_nfe else None,
        "train_step_s_median": float(np.median(step_times)),
        "tokens_per_s": b * t / float(np.median(step_times)),
        "compiled_temp_bytes": temp_bytes,
        "history": history,
    }
    log(
        f"{kind:7s} params={result['params']:8d} valid_ppl={result['valid_ppl']:9.2f} "
        f"nfe={result['forward_nfe_train']:.1f} step={1e3 * result['train_step_s_median']:.1f}ms "
        f"tok/s={result['tokens_per_s']:.0f} temp_bytes={temp_bytes}"
    )
    return result


def parse_args(argv: Sequence[str] | None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--corpus", default="kjv", help="kjv | wikitext-103 | path")
    p.add_argument("--data_dir", default=None, help="directory with WikiText-103 wiki.*.tokens")
    p.add_argument("--vocab_size", type=int, default=2000)
    p.add_argument("--max_train_lines", type=int, default=0, help="0: all")
    p.add_argument("--max_eval_lines", type=int, default=2000, help="0: all")
    p.add_argument("--models", default="deq,tied,untied")
    p.add_argument("--d_model", type=int, default=64)
    p.add_argument("--num_heads", type=int, default=4)
    p.add_argument("--seq_len", type=int, default=64)
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--max_steps", type=int, default=12, help="DEQ Anderson steps")
    p.add_argument("--tol", type=float, default=1e-3)
    p.add_argument("--depth", type=int, default=0, help="explicit depth; 0: the DEQ's NFE")
    p.add_argument("--pre_ln", action="store_true")
    p.add_argument("--jr_gamma", type=float, default=0.0, help="JR weight (0: off)")
    p.add_argument("--memory", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--eval_segments", type=int, default=20)
    p.add_argument("--learning_rate", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out_dir", default="runs/language_model")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--no_progress", dest="progress", action="store_false")
    return common.parse_with_smoke_defaults(
        p,
        argv,
        {
            "vocab_size": 300,
            "max_train_lines": 1500,
            "max_eval_lines": 200,
            "d_model": 16,
            "num_heads": 2,
            "seq_len": 16,
            "batch_size": 4,
            "max_steps": 4,
            "steps": 3,
            "eval_segments": 2,
        },
    )


def main(argv: Sequence[str] | None = None) -> dict:
    args = parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    print("config:", vars(args))
    corpus, tok, train, valid = load_tokens(args, print)
    config = vars(args) | {
        "data_source": corpus.source,
        "is_standin": corpus.is_standin,
        "tokenizer": str(tok.model_path),
        "memory_proxy": "XLA compiled memory_analysis().temp_size_in_bytes of the train step",
    }
    common.write_json(os.path.join(args.out_dir, "config.json"), config)
    results = []
    deq_nfe = None
    for kind in args.models.split(","):
        depth = args.depth or (max(1, round(deq_nfe)) if deq_nfe else args.max_steps)
        r = run_model(kind, depth, args, tok.vocab_size, train, valid, print)
        if kind == "deq":
            deq_nfe = r["forward_nfe_train"]
        results.append(r)
    summary = {"data_source": corpus.source, "is_standin": corpus.is_standin, "results": results}
    common.write_json(os.path.join(args.out_dir, "results.json"), summary)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for r in results:
        ax.plot(r["history"], label=f"{r['model']} (ppl {r['valid_ppl']:.0f})")
    ax.set(xlabel="step", ylabel="train NLL (nats/token)", title=corpus.source[:70])
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(args.out_dir, "loss.png"), dpi=100)
    plt.close(fig)
    return summary


if __name__ == "__main__":
    main()
