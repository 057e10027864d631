"""Copy-memory task (DEQ paper §5, Table 1) with DEQ-Transformer / DEQ-Trellis vs explicit stacks.

Task (``dq.data.copy_memory_batch``): 10 digits from ``1..8``, ``T - 1`` blanks, a delimiter and 10
blanks; the target repeats the digits at the last 10 positions. Metric: cross-entropy over all
positions (Table 1 at T = 400; a blank-only predictor scores ``10·ln 8 / (T + 20)``). The default
``T`` here is small for a CPU.

Models (``--models``, ``kind:cell``; ``dq.models.SequenceModel``): ``deq:transformer`` /
``deq:trellis`` (one weight-tied cell at its equilibrium, Anderson forward, implicit backward;
``--adjoint`` phantom or unrolled, ``--jr_gamma`` for the JR paper's Eq. 4 penalty), and the
explicit ``tied:<cell>`` (the cell unrolled ``--depth`` times) and ``untied:<cell>`` (``--depth``
layers). Each trains through ``dq.training.fit`` (checkpoints, ``metrics_<model>.jsonl``).

Findings (BENCHMARKS.md): every model first sits on the blank-only plateau; the explicit
transformers leave it after ~130-190 steps, the DEQ-Transformer after ~500-900 (``steps_to_learn``),
hence 1200 steps. A trellis of kernel ``k`` moves information ``k - 1`` positions per evaluation,
so it needs ``max_steps (k - 1) >= T + 10`` to copy at all (a note is printed); even with that
reach the width-16 trellises stayed on the plateau in 600 steps. JR with ``γ = 1`` makes the solve
converge in ~4 steps but holds the transformer at the blank-only loss.

Outputs: ``results.json`` (final train/test loss, copy accuracy on the last 10 positions, forward
NFE and relative residual, per-step histories), ``loss.png`` (train loss per model),
``residual.png`` (the DEQs' forward residual).

Usage:
  python -m experiments.copy_memory                # T = 50, ~10 minutes on 2 CPU cores
  python -m experiments.copy_memory --smoke        # plumbing check, a few minutes
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import ClassVar

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax

import deqjax as dq
from deqjax import data, harness, training

DIGITS, VOCAB = 10, 10  # vocabulary: 0 blank, 1..8 digits, 9 delimiter
SPECS = ("deq:transformer", "deq:trellis", "tied:transformer", "untied:transformer", "tied:trellis")
# Every model --models may name: kind (deq, tied or untied) : cell (transformer or trellis).
MODELS = [f"{k}:{c}" for k in ("deq", "tied", "untied") for c in ("transformer", "trellis")]
Models = harness.choice_list(MODELS)


@dataclasses.dataclass(frozen=True)
class Config:
    """The task, the models compared and their training."""

    # The batch the devices share (the runner refuses one they do not divide).
    SPLIT_OVER_DEVICES: ClassVar[tuple[str, ...]] = ("batch_size",)

    seq_len: harness.PositiveInt = 50  # T, blanks between digits and marker
    models: Models = SPECS  # comma-separated kind:cell
    depth: harness.PositiveInt = 6  # layers of the explicit baselines
    trellis_kernel: harness.PositiveInt = 11  # trellis kernel k: n evaluations reach n(k-1) back
    steps: harness.PositiveInt = 1200  # training steps
    batch_size: harness.PositiveInt = 32  # training batch size
    eval_batch_size: harness.PositiveInt = 256  # evaluation batch size
    learning_rate: harness.PositiveFloat = 2e-3  # peak learning rate
    deq: harness.SequenceModelConfig = harness.SequenceModelConfig(
        d_model=32, num_heads=2, max_steps=20
    )
    run: harness.ResumableRunConfig = harness.ResumableRunConfig()


def setup(c: Config):
    print("data source: synthetic copy-memory task (DEQ paper §5), generated from --seed")
    blank = data.copy_memory_blank_loss(c.seq_len)
    print(f"reference: blank-only predictor loss ~ {blank:.4f}")
    for spec in c.models:
        kind, cell = spec.split(":")
        evals = c.deq.max_steps if kind == "deq" else c.depth
        reach = dq.models.trellis_reach(evals, c.trellis_kernel)
        if cell == "trellis" and reach < c.seq_len + DIGITS:
            print(
                f"note: {spec} reaches at most {reach} positions back in {evals} evaluations "
                f"(kernel {c.trellis_kernel}); the copy needs {c.seq_len + DIGITS}: expect the "
                "blank-only loss."
            )
    return blank, {"data_source": "synthetic copy-memory task (generated, seeded)"}


def make_loss(model: hk.Transformed):
    def loss_fn(params, batch, key, reg_state, step, is_training=True):
        logits, aux = model.apply(params, key, batch["inputs"], is_training)
        nll = dq.models.token_nll(logits, batch["targets"])
        hit = jnp.argmax(logits[:, -DIGITS:], -1) == batch["targets"][:, -DIGITS:]
        metrics = {"nll": nll, "nfe": aux["nfe"], "rel_residual": aux["rel_residual"]}
        return nll + aux["jr"], metrics | {"copy_accuracy": jnp.mean(hit.astype(jnp.float32))}

    return loss_fn


def run_model(spec: str, c: Config, blank: float, ctx) -> dict:
    kind, cell = spec.split(":")
    model = c.deq.transform(VOCAB, kind, cell, depth=c.depth, trellis_kernel=c.trellis_kernel)
    batches = data.CopyMemoryBatches(seed=c.run.seed, batch_size=c.batch_size, seq_len=c.seq_len)
    name = spec.replace(":", "_")
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(c.learning_rate))
    pair = training.train_step(make_loss(model), training.skip_nonfinite(opt))
    params = model.init(jax.random.PRNGKey(c.run.seed), next(batches)["inputs"], True)
    policy = ctx.policy(name)  # resumed only if this training had started
    t0 = time.perf_counter()
    result = training.fit(
        pair,
        pair.init(params, jax.random.PRNGKey(c.run.seed + 1)),
        batches,
        num_steps=c.steps,
        parallel=ctx.data_parallel,
        actions=c.run.actions(log_every=1),
        checkpoints=training.Checkpoints(ctx.checkpoint_dir(name), config=ctx.config),
        policy=policy,
        writers=c.run.writers(ctx, name),
        say=ctx.print,
        run_dir=ctx.out_dir,
        desc=spec,
    )
    seconds = time.perf_counter() - t0
    history = ("nll", "nfe", "rel_residual")
    trained = ctx.trained(name, result, history=history, batch_size=c.batch_size, seconds=seconds)
    hist, last = trained.history, trained.tail
    rng = np.random.default_rng(10_000 + c.run.seed)
    test = data.copy_memory_batch(rng, batch_size=c.eval_batch_size, seq_len=c.seq_len)
    evaluate = jax.jit(lambda p, b: make_loss(model)(p, b, None, (), 0, is_training=False)[1])
    ev = evaluate(trained.result.state.params, dict(zip(("inputs", "targets"), test)))
    r = {"model": spec, "params": trained.num_params}
    r |= {"final_train_loss": last("nll"), "test_loss": float(ev["nll"])}
    r |= {"test_copy_accuracy": float(ev["copy_accuracy"]), "forward_nfe_train": last("nfe")}
    r |= {"forward_nfe_eval": float(ev["nfe"]), "forward_rel_residual_train": last("rel_residual")}
    r |= {"forward_rel_residual_eval": float(ev["rel_residual"])}
    r |= {"steps_to_learn": data.copy_memory_steps_to_learn(hist["nll"], blank)}
    r |= {"train_seconds": trained.seconds, "history": {"loss": hist.pop("nll")} | hist}
    r |= {"interrupted": trained.result.interrupted}
    ctx.print(
        f"{spec:20s} params={r['params']:7d} test_loss={r['test_loss']:.4f} "
        f"copy_acc={r['test_copy_accuracy']:.3f} nfe={r['forward_nfe_eval']:.1f} "
        f"rel_res={r['forward_rel_residual_eval']:.1e} steps_to_learn={r['steps_to_learn']} "
        f"train_s={trained.seconds:.1f}"
    )
    return r


def run(c: Config, blank, ctx) -> dict:
    results = harness.run_until_interrupted(c.models, lambda m: run_model(m, c, blank, ctx))
    harness.line_plot(
        ctx.path("loss.png"),
        {r["model"]: r["history"]["loss"] for r in results},
        per_step=True,
        xlabel="step",
        ylabel="train cross-entropy",
        logy=True,
        hline=blank,
        title=f"copy memory T={c.seq_len} (dotted: blank-only)",
    )
    deqs = {r["model"]: r["history"]["rel_residual"] for r in results if "deq:" in r["model"]}
    if deqs:
        harness.line_plot(
            ctx.path("residual.png"),
            deqs,
            per_step=True,
            xlabel="step",
            ylabel="forward relative residual",
            logy=True,
            hline=c.deq.tol,
            title=f"DEQ solver (Anderson <= {c.deq.max_steps} steps)",
        )
    out = {"data_source": ctx.config["data_source"], "blank_only_loss": blank}
    return out | {"results": results, "interrupted": any(r["interrupted"] for r in results)}


EXPERIMENT = harness.Experiment(
    name="copy_memory",
    doc=__doc__,
    config=Config(),
    setup=setup,
    run=run,
    smoke={"seq_len": 8, "depth": 2, "steps": 3, "batch_size": 4, "eval_batch_size": 8},
    outputs=("loss.png", "residual.png"),
    safe_on_resume=("steps",),
)
main = functools.partial(harness.run, EXPERIMENT)  # main(argv=None) -> results

if __name__ == "__main__":
    main()
