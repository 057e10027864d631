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

``--dtype bfloat16`` (or ``float16``): every model computes in that dtype, float32 parameters and
optimizer state (a jmp policy); bfloat16 runs at ``--tol 1e-2`` unless given one (a ``--tol``
below what the dtype resolves is refused).

Usage: ``python -m experiments.language_model [--smoke]`` (KJV, 300 steps/model: ~3 min, 2 CPUs)
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import ClassVar

import haiku as hk
import jax
import numpy as np
import optax

import deqjax as dq
from deqjax import data, harness, training
from deqjax.harness import NonNegativeInt, PositiveFloat, PositiveInt

if __package__:  # python -m experiments.<name>, or imported as experiments.<name>
    from experiments.parts import corpus_config
else:  # python experiments/<name>.py: this folder is the first entry of sys.path
    from parts import corpus_config

Kinds = harness.choice_list(("deq", "tied", "untied"))  # the models --models may name
SMOKE = {"seq_len": 16, "batch_size": 4, "steps": 3, "eval_segments": 2}


@dataclasses.dataclass(frozen=True)
class Config:
    """The corpus, the models compared and their training."""

    # The batch the devices share (the runner refuses one they do not divide).
    SPLIT_OVER_DEVICES: ClassVar[tuple[str, ...]] = ("batch_size",)

    models: Kinds = ("deq", "tied", "untied")  # comma-separated: deq, tied, untied
    seq_len: PositiveInt = 64  # tokens per segment
    batch_size: PositiveInt = 16  # segments per batch
    depth: NonNegativeInt = 0  # explicit depth; 0: the DEQ's NFE
    memory: bool = True  # carry memory (--no_memory: none)
    mem_len: NonNegativeInt = 0  # memory positions M; 0: seq_len
    steps: PositiveInt = 300  # training steps per model
    eval_segments: PositiveInt = 20  # validation segments evaluated
    learning_rate: PositiveFloat = 5e-3  # peak learning rate
    clip: PositiveFloat = 0.25  # global gradient-norm clip
    data: corpus_config.CorpusConfig = corpus_config.CorpusConfig()
    deq: harness.SequenceModelConfig = harness.SequenceModelConfig()
    compute: harness.DtypeConfig = harness.DtypeConfig()
    run: harness.ResumableRunConfig = harness.ResumableRunConfig()
    multihost: harness.MultiHostConfig = harness.MultiHostConfig()


def check(c: Config) -> str | None:
    return c.compute.check_tol(tol=c.deq.tol)


def setup(c: Config):
    corpus = c.data.load()
    extra = {"data_source": corpus.source, "is_standin": corpus.is_standin}
    return (corpus.vocab_size, corpus.train, corpus.valid), extra | {"tokenizer": corpus.tokenizer}


def memory(kind: str, depth: int, c: Config, batch_size: int):
    """Zero memory, ``[B, M, D]`` or ``[depth, B, M, D]``; None without ``--memory``."""
    kw = dict(batch_size=batch_size, memory_length=c.mem_len or c.seq_len, depth=depth)
    return dq.models.initial_memory(kind, d_model=c.deq.d_model, **kw) if c.memory else None


def run_model(kind: str, depth: int, c: Config, inputs, ctx) -> dict:
    wall0 = time.perf_counter()
    vocab, train, valid = inputs
    embed_init = hk.initializers.RandomNormal(0.02)
    model = c.deq.transform(vocab, kind, depth=depth, embed_init=embed_init, compute=c.compute)
    b, t, m = c.batch_size, c.seq_len, (c.mem_len or c.seq_len)
    per_device = b // jax.device_count()
    mem0 = memory(kind, depth, c, per_device)  # fit's carry: per device
    # One device's share of a batch: what the step (and the init) sees.
    first = jax.tree.map(
        lambda a: a[:per_device], next(data.LMBatches(train, num_streams=b, segment_length=t))
    )
    params = model.init(jax.random.PRNGKey(c.run.seed), first["inputs"], mem0, True)
    opt = optax.chain(optax.clip_by_global_norm(c.clip), optax.adam(c.learning_rate))
    loss_fn = dq.models.lm_loss(model, memory_length=m if c.memory else None)
    carry = () if mem0 is None else mem0
    scale = c.compute.loss_scale()
    pair = training.train_step(loss_fn, opt, axis_name=None, with_carry=True, loss_scale=scale)
    state = pair.init(params, jax.random.PRNGKey(0), carry=carry)
    _, mem_bytes = training.compile_with_memory(pair.update, state, first)  # the proxy
    # The training's step: non-finite updates skipped (GuardNonFinite stops a streak of them).
    guarded = training.skip_nonfinite(opt)
    pair = training.train_step(loss_fn, guarded, with_carry=True, loss_scale=scale)
    policy = ctx.policy(kind)  # resumed only if this training had started
    t0 = time.perf_counter()
    result = training.fit(
        pair,
        pair.init(params, jax.random.PRNGKey(c.run.seed + 1), carry=carry),
        data.LMBatches(train, num_streams=b, segment_length=t),
        num_steps=c.steps,
        parallel=ctx.data_parallel,
        actions=c.run.actions(log_every=1),
        checkpoints=training.Checkpoints(ctx.checkpoint_dir(kind), config=ctx.config),
        policy=policy,
        writers=c.run.writers(ctx, kind),
        say=ctx.print,
        run_dir=ctx.out_dir,
        desc=kind,
    )
    history = ("nll", "nfe", "rel_residual", "jac_fro_sq", "z_rms")
    seconds = time.perf_counter() - t0
    trained = ctx.trained(kind, result, history=history, batch_size=b, seconds=seconds)
    train_s = time.perf_counter() - wall0
    hist, last = trained.history, trained.tail
    mems = memory(kind, depth, c, b)  # the evaluation's, and the memory a segment carries
    params = trained.result.state.params
    ev = dq.models.evaluate_lm(
        model,
        params,
        valid,
        num_streams=b,
        segment_length=t,
        num_segments=c.eval_segments,
        memory=mems,
    )
    r = {"model": kind, "depth_or_max_steps": c.deq.max_steps if kind == "deq" else depth}
    r |= {"params": trained.num_params}
    r |= {"train_nll_last": last("nll"), "train_ppl_last": math.exp(last("nll"))}
    r |= {"valid_ppl": math.exp(ev["nll"]), "valid_segments": ev["segments"]}
    r |= {"forward_nfe_train": float(np.mean(hist["nfe"])), "forward_nfe_train_last": last("nfe")}
    r |= {"forward_nfe_eval": ev["nfe"], "forward_rel_residual_eval": ev["rel_residual"]}
    r |= {"forward_rel_residual_train_last": last("rel_residual")}
    r |= {"jac_fro_sq_train_last": last("jac_fro_sq"), "z_rms_train_last": last("z_rms")}
    r |= {"train_step_s_median": trained.step_seconds, "tokens_per_s": b * t / trained.step_seconds}
    r |= {
        "compiled_temp_bytes": mem_bytes and mem_bytes["temp_bytes"],
        "compiled_memory": mem_bytes,
    }
    r |= {"carried_memory_shape": None if mems is None else list(mems.shape)}
    r |= {"carried_memory_bytes": 0 if mems is None else int(mems.nbytes)}
    r |= {"wall_s": time.perf_counter() - wall0, "train_wall_s": train_s, "history": hist}
    r |= {"interrupted": trained.result.interrupted}
    ctx.print(
        f"{kind:7s} params={r['params']} valid_ppl={r['valid_ppl']:.2f} train_ppl="
        f"{r['train_ppl_last']:.2f} nfe={r['forward_nfe_train']:.1f} rel_res(eval)="
        f"{r['forward_rel_residual_eval']:.1e} jac={r['jac_fro_sq_train_last']:.3g} "
        f"step={1e3 * trained.step_seconds:.1f}ms temp_bytes={r['compiled_temp_bytes']}"
    )
    return r


def run(c: Config, inputs, ctx) -> dict:
    vocab, train, valid = inputs
    counts = np.bincount(train, minlength=vocab).astype(np.float64) + 1.0  # add-one unigram
    ref = float(np.exp(-np.mean(np.log(counts / counts.sum())[valid])))
    ctx.print(f"reference: uniform ppl = {vocab}, unigram ppl = {ref:.1f}")
    results, deq_nfe = [], None
    for kind in c.models:  # the explicit models' depth: the DEQ's mean NFE (or --depth)
        depth = c.depth or (max(1, round(deq_nfe)) if deq_nfe else c.deq.max_steps)
        results.append(run_model(kind, depth, c, inputs, ctx))
        deq_nfe = results[-1]["forward_nfe_train"] if kind == "deq" else deq_nfe
        if results[-1]["interrupted"]:
            break
    nll = {f"{r['model']} (ppl {r['valid_ppl']:.0f})": r["history"]["nll"] for r in results}
    harness.line_plot(
        ctx.path("loss.png"), nll, per_step=True, xlabel="step", ylabel="train NLL (nats/token)"
    )
    for h in (r["history"] for r in results if r["model"] == "deq"):
        harness.line_plot(
            ctx.path("deq_solver.png"),
            {"forward NFE": h["nfe"], "relative residual": h["rel_residual"]},
            per_step=True,
            xlabel="step",
            logy=True,
            hline=c.deq.tol,
            title="DEQ forward solve",
        )
    out = {"data_source": ctx.config["data_source"], "is_standin": ctx.config["is_standin"]}
    out |= {"vocab_size": vocab, "unigram_valid_ppl": ref, "results": results}
    return out | {"interrupted": any(r["interrupted"] for r in results)}


EXPERIMENT = harness.Experiment(
    name="language_model",
    doc=__doc__,
    config=Config(),
    setup=setup,
    run=run,
    check=check,
    smoke=SMOKE,
    safe_on_resume=("steps", "eval_segments"),
    outputs=("loss.png", "deq_solver.png"),
)
main = functools.partial(harness.run, EXPERIMENT)  # main(argv=None) -> results

if __name__ == "__main__":
    main()
