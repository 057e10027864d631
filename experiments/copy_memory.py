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

import time

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax

import deqjax as dq
from deqjax import data, training

DIGITS, VOCAB = 10, 10  # vocabulary: 0 blank, 1..8 digits, 9 delimiter
SPECS = "deq:transformer,deq:trellis,tied:transformer,untied:transformer,tied:trellis"
SMOKE = dict(seq_len=8, d_model=16, depth=2, max_steps=4, steps=3, batch_size=4, eval_batch_size=8)


def add_flags(p) -> None:
    add = p.add_argument
    add("--seq_len", type=int, default=50, help="T, blanks between digits and marker")
    add("--models", default=SPECS, help="comma-separated kind:cell (kind deq, tied or untied;\n"
        "cell transformer or trellis)")  # fmt: skip
    add("--d_model", type=int, default=32, help="model width")
    add("--num_heads", type=int, default=2, help="attention heads")
    add("--depth", type=int, default=6, help="layers of the explicit baselines")
    add("--max_steps", type=int, default=20, help="DEQ Anderson steps")
    add("--tol", type=float, default=1e-3, help="forward solver tolerance")
    add("--trellis_kernel", type=int, default=11,
        help="trellis kernel size k: n evaluations reach n (k - 1) positions back")  # fmt: skip
    add("--jr_gamma", type=float, default=0.0, help="Jacobian regularization weight")
    add("--adjoint", choices=dq.training.GRADIENTS, default="implicit", help="DEQ gradient")
    add("--steps", type=int, default=1200, help="training steps")
    add("--batch_size", type=int, default=32, help="training batch size")
    add("--eval_batch_size", type=int, default=256, help="evaluation batch size")
    add("--learning_rate", type=float, default=2e-3, help="peak learning rate")


def setup(args):
    print("data source: synthetic copy-memory task (DEQ paper §5), generated from --seed")
    blank = data.copy_memory_blank_loss(args.seq_len)
    print(f"reference: blank-only predictor loss ~ {blank:.4f}")
    for spec in args.models.split(","):
        kind, cell = spec.split(":")
        evals = args.max_steps if kind == "deq" else args.depth
        reach = dq.models.trellis_reach(evals, args.trellis_kernel)
        if cell == "trellis" and reach < args.seq_len + DIGITS:
            print(f"note: {spec} reaches at most {reach} positions back in {evals} evaluations "
                  f"(kernel {args.trellis_kernel}); the copy needs {args.seq_len + DIGITS}: expect "
                  "the blank-only loss.")  # fmt: skip
    return blank, {"data_source": "synthetic copy-memory task (generated, seeded)"}


def build(kind: str, cell: str, args) -> hk.Transformed:
    """``apply(params, rng, inputs, is_training) -> (logits, aux)``."""
    solver, adjoint = dq.training.solver_and_adjoint(
        args.adjoint, max_steps=args.max_steps, tol=args.tol, tau=0.8)  # fmt: skip
    reg = dq.regularization.JacobianRegularizer(args.jr_gamma) if args.jr_gamma > 0 else None

    def forward(inputs, is_training):
        return dq.models.SequenceModel(
            VOCAB, kind, cell, d_model=args.d_model,
            num_heads=args.num_heads, depth=args.depth, trellis_kernel=args.trellis_kernel,
            solver=solver, adjoint=adjoint, regularizer=reg,
        )(inputs, is_training=is_training)  # fmt: skip

    return hk.transform(forward)


def make_loss(model: hk.Transformed):
    def loss_fn(params, batch, key, reg_state, step, is_training=True):
        logits, aux = model.apply(params, key, batch["inputs"], is_training)
        nll = dq.models.token_nll(logits, batch["targets"])
        hit = jnp.argmax(logits[:, -DIGITS:], -1) == batch["targets"][:, -DIGITS:]
        metrics = {"nll": nll, "nfe": aux["nfe"], "rel_residual": aux["rel_residual"]}
        return nll + aux["jr"], metrics | {"copy_accuracy": jnp.mean(hit.astype(jnp.float32))}

    return loss_fn


def run_model(spec: str, args, blank: float, ctx) -> dict:
    kind, cell = spec.split(":")
    model = build(kind, cell, args)
    batches = data.CopyMemoryBatches(
        seed=args.seed, batch_size=args.batch_size, seq_len=args.seq_len
    )
    params = model.init(jax.random.PRNGKey(args.seed), next(batches)["inputs"], True)
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(args.learning_rate))
    name = spec.replace(":", "_")
    path = ctx.path(f"metrics_{name}.jsonl")
    t0 = time.perf_counter()
    fit = training.fit(
        params=params, loss_fn=make_loss(model), optimizer=opt, train_data=batches,
        num_steps=args.steps, rng=jax.random.PRNGKey(args.seed + 1), log_every=1, desc=spec,
        **ctx.fit_kwargs(checkpoint_dir=ctx.path(f"ckpt_{name}"), metrics_path=path),
    )  # fmt: skip
    train_s = time.perf_counter() - t0
    recs = [r for r in training.read_jsonl(path) if r.get("split") == "train"]
    hist = {k: [r[k] for r in recs] for k in ("nll", "nfe", "rel_residual")}
    test = data.copy_memory_batch(
        np.random.default_rng(10_000 + args.seed), batch_size=args.eval_batch_size,
        seq_len=args.seq_len,
    )  # fmt: skip
    evaluate = jax.jit(lambda p, b: make_loss(model)(p, b, None, (), 0, is_training=False)[1])
    ev = evaluate(fit.state.params, dict(zip(("inputs", "targets"), test)))
    tail = max(1, args.steps // 10)
    last = lambda k: float(np.mean(hist[k][-tail:]))  # noqa: E731
    r = {
        "model": spec, "params": int(sum(x.size for x in jax.tree.leaves(fit.state.params))),
        "final_train_loss": last("nll"), "test_loss": float(ev["nll"]),
        "test_copy_accuracy": float(ev["copy_accuracy"]), "forward_nfe_train": last("nfe"),
        "forward_nfe_eval": float(ev["nfe"]), "forward_rel_residual_train": last("rel_residual"),
        "forward_rel_residual_eval": float(ev["rel_residual"]),
        "steps_to_learn": data.copy_memory_steps_to_learn(hist["nll"], blank),
        "train_seconds": train_s,
        "history": {"loss": hist.pop("nll")} | hist,
        "interrupted": fit.interrupted,
    }  # fmt: skip
    ctx.print(
        f"{spec:20s} params={r['params']:7d} test_loss={r['test_loss']:.4f} "
        f"copy_acc={r['test_copy_accuracy']:.3f} nfe={r['forward_nfe_eval']:.1f} "
        f"rel_res={r['forward_rel_residual_eval']:.1e} steps_to_learn={r['steps_to_learn']} "
        f"train_s={train_s:.1f}"
    )
    return r


def run(args, blank, ctx) -> dict:
    results = []
    for spec in args.models.split(","):
        results.append(run_model(spec, args, blank, ctx))
        if results[-1]["interrupted"]:
            break
    curve = lambda ys: (range(1, len(ys) + 1), ys)  # noqa: E731
    training.line_plot(
        ctx.path("loss.png"), {r["model"]: curve(r["history"]["loss"]) for r in results},
        xlabel="step", ylabel="train cross-entropy", logy=True, hline=blank,
        title=f"copy memory T={args.seq_len} (dotted: blank-only)",
    )  # fmt: skip
    deqs = {
        r["model"]: curve(r["history"]["rel_residual"]) for r in results if "deq:" in r["model"]
    }
    if deqs:
        training.line_plot(
            ctx.path("residual.png"), deqs, xlabel="step", ylabel="forward relative residual",
            logy=True, hline=args.tol, title=f"DEQ solver (Anderson <= {args.max_steps} steps)",
        )  # fmt: skip
    return {
        "data_source": ctx.config["data_source"], "blank_only_loss": blank, "results": results,
        "interrupted": any(r["interrupted"] for r in results),
    }  # fmt: skip


EXPERIMENT = training.Experiment(
    name="copy_memory", doc=__doc__, add_flags=add_flags, setup=setup, run=run, smoke=SMOKE,
    safe_on_resume=("steps",), outputs=("loss.png", "residual.png"),
)  # fmt: skip

if __name__ == "__main__":
    training.run(EXPERIMENT)
