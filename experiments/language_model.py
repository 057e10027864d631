"""DEQ-Transformer language model vs explicit transformers (DEQ paper §5 Table 3 / memory claims).

Data: WikiText-103 ``wiki.{train,valid,test}.tokens`` under ``--data_dir`` when given (or any
corpus name/path ``dq.data.load_lm_corpus`` takes, via ``--corpus``); otherwise (offline) the King
James Bible, labelled ``STAND-IN`` in the log and in every output file. A sentencepiece model is
trained on the training split (``--vocab_size``; cached) and the splits are cut into contiguous
segments of ``--seq_len`` tokens (``dq.data.lm_segments``, init paper App. D uses 128).

Models (``--models``), all at the same width with the same embeddings and head:
  * ``deq``: embeddings -> ``dq.nn.DEQ(TransformerCell)`` (Anderson forward, ``--max_steps``,
    ``--tol``; ``--adjoint`` backward, implicit by default) -> linear head. ``--pre_ln`` switches
    the LayerNorm placement (JR Fig. 2), ``--jr_gamma > 0`` adds the JR paper's Eq. 4 penalty
    ``γ ||J_f(z*)||²_F / d`` (one Hutchinson sample per step). Memory: the previous segment's
    equilibrium ``z*`` (``[B, M, D]``, DEQ paper §3.3/§4).
  * ``tied``: the same weight-tied cell unrolled explicitly to the DEQ's measured mean forward NFE
    (rounded; or ``--depth``), backprop through all layers.
  * ``untied``: an ordinary deep transformer with that many separate layers (same width).
  The explicit models carry Transformer-XL per-layer memory (``[depth, B, M, D]``: layer ``l``
  attends to the previous segment's input to layer ``l``; see ``_seq_common``). With
  ``--memory`` (default) the memory is carried across training steps along the contiguous
  streams, gradient stopped, and reset at the start of each pass over the data.

Defaults (found on the KJV stand-in, see BENCHMARKS.md "Language model"): Adam at lr 5e-3 with
global-norm clipping 0.25, 300 steps of 16 x 64 tokens, ``d_model`` 64, Anderson <= 12 steps to
tol 1e-3. The DEQ is the most learning-rate-sensitive of the three (valid ppl after 300 steps at
lr 1e-3 / 2e-3 / 3e-3 / 5e-3: DEQ 113 / 88 / 80 / 78, tied 88 / 78 / 76 / 74); a tighter solve
(24 steps), the phantom or unrolled gradient did not close the gap at lr 1e-3. Pre-LN does not
train here (``z*`` grows without bound; BENCHMARKS.md "Language model").

Reported per model (log line, ``results.json``): validation perplexity (plus the add-one unigram
perplexity of the validation split as a reference level; an untrained model sits near
``--vocab_size``), last-10% train perplexity, forward NFE and forward relative residual
(``aux["rel_residual"]``, train and eval; NaN for explicit models), the JR estimate
``||J||²_F / d``, median train-step time and tokens/s, the compiled train step's XLA
``memory_analysis()`` (``temp_size_in_bytes``: the scratch memory XLA plans, used as a PROXY for
peak activation memory, not a measured peak; argument and output bytes alongside), the carried
memory's shape and bytes, parameter count, wall time.

Outputs in ``--out_dir`` (default ``runs/language_model``): ``config.json``, ``results.json``,
``loss.png`` (train NLL of every model; the DEQ's forward NFE and relative residual).

Usage:
  python experiments/language_model.py --smoke
  python experiments/language_model.py      # KJV stand-in, 300 steps/model: ~3 min on 2 CPU cores
  python experiments/language_model.py --models deq --pre_ln --jr_gamma 0.1   # one DEQ variant
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
            adjoint=args.adjoint,
        )
        aux = aux | {"z_rms": jnp.sqrt(jnp.mean(jnp.square(z)))}  # pre-LN: watch it grow
        h = hk.LayerNorm(-1, True, True)(z) if args.pre_ln else z
        return hk.Linear(vocab)(h), aux

    return hk.transform(forward)


def initial_mems(kind: str, depth: int, args) -> jax.Array | None:
    """Zero memory before a stream's first segment: ``[B, M, D]`` (DEQ) or ``[depth, B, M, D]``."""
    if not args.memory:
        return None
    shape = (args.batch_size, args.mem_len or args.seq_len, args.d_model)
    return jnp.zeros(shape if kind == "deq" else (depth,) + shape, jnp.float32)


def next_mems(aux: dict, args) -> jax.Array | None:
    """The next segment's memory: the last ``M`` positions of ``aux["new_mems"]``."""
    if not args.memory:
        return None
    return aux["new_mems"][..., -(args.mem_len or args.seq_len) :, :]


def unigram_ppl(train: np.ndarray, valid: np.ndarray, vocab: int) -> float:
    """Perplexity on ``valid`` of add-one unigram frequencies from ``train`` (a reference level)."""
    counts = np.bincount(train, minlength=vocab).astype(np.float64) + 1.0
    logp = np.log(counts / counts.sum())
    return float(np.exp(-np.mean(logp[valid])))


def make_steps(model: hk.Transformed, args):
    """The optimizer, ``loss_fn(params, key, tokens, targets, mems, is_training)`` and the
    (unjitted) ``train_step(params, opt_state, key, tokens, targets, mems)``."""
    opt = optax.chain(optax.clip_by_global_norm(args.clip), optax.adam(args.learning_rate))

    def loss_fn(params, key, tokens, targets, mems, is_training):
        logits, aux = model.apply(params, key, tokens, mems, is_training)
        logp = jax.nn.log_softmax(logits)
        nll = jnp.mean(-jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0])
        loss = nll + args.jr_gamma * aux["jac_fro_sq"] if is_training else nll
        return loss, (nll, aux)

    def train_step(params, opt_state, key, tokens, targets, mems):
        (_, (nll, aux)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            params, key, tokens, targets, mems, True
        )
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, nll, aux

    return opt, loss_fn, train_step


def run_model(kind: str, depth: int, args, vocab, train, valid, log) -> dict:
    wall0 = time.perf_counter()
    model = build(kind, args, vocab, depth)
    b, t = args.batch_size, args.seq_len
    mem0 = initial_mems(kind, depth, args)
    seg0 = next(data.lm_segments(train, num_streams=b, segment_length=t, memory_length=0))
    params = model.init(jax.random.PRNGKey(args.seed), seg0.inputs, mem0, True)
    opt, loss_fn, train_step = make_steps(model, args)
    opt_state = opt.init(params)

    key = jax.random.PRNGKey(args.seed + 1)
    train_step, memory = common.compile_with_memory(
        train_step, params, opt_state, key, seg0.inputs, seg0.targets, mem0
    )
    eval_step = jax.jit(functools.partial(loss_fn, is_training=False))

    history: dict[str, list[float]] = {
        "nll": [],
        "nfe": [],
        "rel_residual": [],
        "jac_fro_sq": [],
        "z_rms": [],
    }
    times = []
    step = 0
    bar = tqdm.tqdm(total=args.steps, desc=kind, disable=not args.progress)
    while step < args.steps:
        mems = mem0  # every pass over the training streams starts with an empty memory
        for seg in data.lm_segments(train, num_streams=b, segment_length=t, memory_length=0):
            if step >= args.steps:
                break
            key, sub = jax.random.split(key)
            t0 = time.perf_counter()
            params, opt_state, nll, aux = train_step(
                params, opt_state, sub, seg.inputs, seg.targets, mems
            )
            nll = float(nll)  # blocks
            times.append(time.perf_counter() - t0)
            history["nll"].append(nll)
            history["nfe"].append(float(aux["nfe"]))
            history["rel_residual"].append(float(aux["rel_residual"]))
            history["jac_fro_sq"].append(float(aux["jac_fro_sq"]))
            history["z_rms"].append(float(aux["z_rms"]))
            mems = next_mems(aux, args)
            step += 1
            bar.update()
            if step % 25 == 0:
                bar.set_postfix(nll=f"{nll:.3f}", res=f"{history['rel_residual'][-1]:.1e}")
    bar.close()
    train_s = time.perf_counter() - wall0

    total, count = 0.0, 0
    mems = mem0
    eval_nfe, eval_res = [], []
    for i, seg in enumerate(
        data.lm_segments(valid, num_streams=b, segment_length=t, memory_length=0)
    ):
        if i >= args.eval_segments:
            break
        nll, (_, aux) = eval_step(params, None, seg.inputs, seg.targets, mems)
        total, count = total + float(nll), count + 1
        eval_nfe.append(float(aux["nfe"]))
        eval_res.append(float(aux["rel_residual"]))
        mems = next_mems(aux, args)
    step_times = times[1:] if len(times) > 1 else times
    tail = max(1, len(history["nll"]) // 10)
    is_deq = kind == "deq"
    result = {
        "model": kind,
        "depth_or_max_steps": args.max_steps if is_deq else depth,
        "params": common.param_count(params),
        "train_nll_last": float(np.mean(history["nll"][-tail:])),
        "train_ppl_last": math.exp(float(np.mean(history["nll"][-tail:]))),
        "valid_ppl": math.exp(total / max(count, 1)),
        "valid_segments": count,
        "forward_nfe_train": float(np.mean(history["nfe"])),
        "forward_nfe_train_last": float(np.mean(history["nfe"][-tail:])),
        "forward_nfe_eval": float(np.mean(eval_nfe)) if eval_nfe else None,
        "forward_rel_residual_train_last": float(np.mean(history["rel_residual"][-tail:])),
        "forward_rel_residual_eval": float(np.mean(eval_res)) if eval_res else None,
        "jac_fro_sq_train_last": float(np.mean(history["jac_fro_sq"][-tail:])),
        "z_rms_train_last": float(np.mean(history["z_rms"][-tail:])),
        "train_step_s_median": float(np.median(step_times)),
        "tokens_per_s": b * t / float(np.median(step_times)),
        "compiled_temp_bytes": None if memory is None else memory["temp_bytes"],
        "compiled_memory": memory,
        "carried_memory_shape": None if mem0 is None else list(mem0.shape),
        "carried_memory_bytes": 0 if mem0 is None else int(mem0.nbytes),
        "wall_s": time.perf_counter() - wall0,
        "train_wall_s": train_s,
        "history": history,
    }
    res = result["forward_rel_residual_eval"]
    log(
        f"{kind:7s} params={result['params']:8d} valid_ppl={result['valid_ppl']:9.2f} "
        f"train_ppl={result['train_ppl_last']:8.2f} nfe={result['forward_nfe_train']:.1f} "
        f"rel_res(eval)={res if res is None else f'{res:.1e}'} "
        f"z_rms={result['z_rms_train_last']:.3g} jac={result['jac_fro_sq_train_last']:.3g} "
        f"step={1e3 * result['train_step_s_median']:.1f}ms tok/s={result['tokens_per_s']:.0f} "
        f"temp_bytes={result['compiled_temp_bytes']} mem_bytes={result['carried_memory_bytes']} "
        f"wall={result['wall_s']:.0f}s"
    )
    return result


def parse_args(argv: Sequence[str] | None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--corpus", default="kjv", help="kjv | wikitext-103 | path")
    p.add_argument("--data_dir", default=None, help="directory with WikiText-103 wiki.*.tokens")
    p.add_argument("--vocab_size", type=int, default=2000, help="sentencepiece vocabulary size")
    p.add_argument("--max_train_lines", type=int, default=0, help="0: all")
    p.add_argument("--max_eval_lines", type=int, default=2000, help="0: all")
    p.add_argument(
        "--models",
        default="deq,tied,untied",
        help="comma-separated models to train: deq, tied, untied",
    )
    p.add_argument("--d_model", type=int, default=64, help="model width")
    p.add_argument("--num_heads", type=int, default=4, help="attention heads")
    p.add_argument("--seq_len", type=int, default=64, help="tokens per segment")
    p.add_argument("--batch_size", type=int, default=16, help="segments per batch")
    p.add_argument("--max_steps", type=int, default=12, help="DEQ Anderson steps")
    p.add_argument("--tol", type=float, default=1e-3, help="forward solver tolerance")
    p.add_argument("--depth", type=int, default=0, help="explicit depth; 0: the DEQ's NFE")
    p.add_argument("--pre_ln", action="store_true", help="pre-layer-norm cells (default post-LN)")
    p.add_argument("--jr_gamma", type=float, default=0.0, help="JR weight (0: off)")
    p.add_argument("--adjoint", choices=common.ADJOINTS, default="implicit", help="DEQ gradient")
    p.add_argument(
        "--memory",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="measure compiled memory of each model",
    )
    p.add_argument("--mem_len", type=int, default=0, help="memory positions M; 0: seq_len")
    p.add_argument("--steps", type=int, default=300, help="training steps per model")
    p.add_argument("--eval_segments", type=int, default=20, help="validation segments evaluated")
    p.add_argument("--learning_rate", type=float, default=5e-3, help="peak learning rate")
    p.add_argument("--clip", type=float, default=0.25, help="global gradient-norm clip")
    common.add_run_flags(p, out_dir="runs/language_model")
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
    ref_ppl = unigram_ppl(train, valid, tok.vocab_size)
    print(f"reference: uniform ppl = {tok.vocab_size}, unigram ppl = {ref_ppl:.1f}")
    results = []
    deq_nfe = None
    for kind in args.models.split(","):
        depth = args.depth or (max(1, round(deq_nfe)) if deq_nfe else args.max_steps)
        r = run_model(kind, depth, args, tok.vocab_size, train, valid, print)
        if kind == "deq":
            deq_nfe = r["forward_nfe_train"]
        results.append(r)
    summary = {
        "data_source": corpus.source,
        "is_standin": corpus.is_standin,
        "vocab_size": tok.vocab_size,
        "unigram_valid_ppl": ref_ppl,
        "results": results,
    }
    common.write_json(os.path.join(args.out_dir, "results.json"), summary)
    plot(results, args, corpus.source, os.path.join(args.out_dir, "loss.png"))
    return summary


def plot(results: list[dict], args, source: str, path: str) -> None:
    """Train NLL of every model (left); the DEQ's forward NFE and relative residual (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax_nfe) = plt.subplots(1, 2, figsize=(11, 4))
    for r in results:
        depth = (
            f"NFE {r['forward_nfe_train']:.1f}"
            if r["model"] == "deq"
            else f"depth {r['depth_or_max_steps']}"
        )
        label = f"{r['model']} ({depth}, valid ppl {r['valid_ppl']:.0f})"
        ax.plot(r["history"]["nll"], label=label, lw=0.8)
    title = source.split(" (")[0][:60]  # e.g. "STAND-IN: King James Bible"
    ax.set(
        xlabel="step", ylabel="train NLL (nats/token)", title=f"{title}, lr {args.learning_rate:g}"
    )
    ax.legend(fontsize=8)
    ax_res = ax_nfe.twinx()
    for r in results:
        if r["model"] == "deq":
            ax_nfe.plot(r["history"]["nfe"], color="C0", lw=0.8, label="forward NFE")
            ax_res.plot(r["history"]["rel_residual"], color="C3", lw=0.8, label="rel. residual")
    ax_res.axhline(args.tol, color="C3", ls=":", lw=0.8, label=f"tol {args.tol:g}")
    ax_nfe.set(
        xlabel="step",
        ylabel="forward NFE",
        ylim=(0, args.max_steps + 1),
        title=f"DEQ forward solve (Anderson <= {args.max_steps} steps)",
    )
    ax_res.set(yscale="log", ylabel="forward relative residual")
    lines = ax_nfe.get_lines() + ax_res.get_lines()
    ax_nfe.legend(lines, [ln.get_label() for ln in lines], fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
