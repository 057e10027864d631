"""Copy-memory task (DEQ paper §5, Table 1) with DEQ-Transformer / DEQ-Trellis vs explicit stacks.

Task (Bai et al. 2019 §5, after Bai et al. 2018): the input is 10 digits drawn uniformly from
``1..8``, then ``T - 1`` blanks (``0``), a delimiter ``9`` and 10 more blanks (length ``T + 20``);
the target is blank everywhere except the last 10 positions, which must repeat the 10 digits. The
reported metric is the cross-entropy over all positions (Table 1: loss at T = 400; a blank-only
predictor scores about ``10·ln 8 / (T + 20)``). The default ``T`` here is small for CPU.

Models (``--models``, ``kind:cell`` pairs): ``deq:transformer`` / ``deq:trellis`` (one weight-tied
cell at its equilibrium, Anderson forward, implicit backward), and the explicit baselines
``tied:<cell>`` (the same weight-tied cell unrolled ``--depth`` times) and ``untied:<cell>``
(``--depth`` separate layers).

Outputs in ``--out_dir`` (default ``runs/copy_memory``): ``config.json``, ``results.json``
(final train/test loss, copy accuracy on the last 10 positions, forward NFE per model),
``loss.png``.

Usage:
  python experiments/copy_memory.py                # T = 50, ~minutes on 2 CPU cores
  python experiments/copy_memory.py --smoke        # seconds
"""

from __future__ import annotations

import argparse
import functools
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _seq_common as common  # noqa: E402

NUM_DIGITS = 10
VOCAB = 10  # 0 blank, 1..8 digits, 9 delimiter


def make_batch(rng: np.random.Generator, *, batch_size: int, seq_len: int):
    """``(inputs, targets)``, int32 ``[B, T + 20]`` each (see the module docstring)."""
    digits = rng.integers(1, 9, size=(batch_size, NUM_DIGITS), dtype=np.int32)
    length = seq_len + 2 * NUM_DIGITS
    inputs = np.zeros((batch_size, length), np.int32)
    targets = np.zeros((batch_size, length), np.int32)
    inputs[:, :NUM_DIGITS] = digits
    inputs[:, NUM_DIGITS + seq_len - 1] = 9
    targets[:, -NUM_DIGITS:] = digits
    return inputs, targets


def build(kind: str, cell: str, args) -> hk.Transformed:
    def forward(inputs, is_training):
        x = hk.Embed(VOCAB, args.d_model)(inputs)
        z, aux = common.backbone(
            x,
            None,
            kind=kind,
            cell=cell,
            d_model=args.d_model,
            num_heads=args.num_heads,
            depth=args.depth,
            pre_ln=False,
            max_steps=args.max_steps,
            tol=args.tol,
            is_training=is_training,
            adjoint=args.adjoint,
        )
        if cell == "trellis":
            z = z[..., : args.d_model // 2]
        return hk.Linear(VOCAB)(z), aux

    return hk.transform(forward)


def run_model(spec: str, args, log) -> dict:
    kind, cell = spec.split(":")
    model = build(kind, cell, args)
    rng = np.random.default_rng(args.seed)
    inputs, _ = make_batch(rng, batch_size=args.batch_size, seq_len=args.seq_len)
    params = model.init(jax.random.PRNGKey(args.seed), inputs, True)
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(args.learning_rate))
    opt_state = opt.init(params)

    def loss_fn(params, key, inputs, targets, is_training):
        logits, aux = model.apply(params, key, inputs, is_training)
        logp = jax.nn.log_softmax(logits)
        nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
        acc = jnp.mean(
            (jnp.argmax(logits[:, -NUM_DIGITS:], -1) == targets[:, -NUM_DIGITS:]).astype(
                jnp.float32
            )
        )
        return jnp.mean(nll), (aux["nfe"], aux["rel_residual"], acc)

    @jax.jit
    def train_step(params, opt_state, key, inputs, targets):
        (loss, (nfe, res, acc)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            params, key, inputs, targets, True
        )
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss, nfe, res

    eval_fn = jax.jit(functools.partial(loss_fn, is_training=False))
    key = jax.random.PRNGKey(args.seed + 1)
    history: dict[str, list[float]] = {"loss": [], "nfe": [], "rel_residual": []}
    t0 = time.perf_counter()
    for _ in tqdm.trange(args.steps, desc=spec, disable=not args.progress):
        inputs, targets = make_batch(rng, batch_size=args.batch_size, seq_len=args.seq_len)
        key, sub = jax.random.split(key)
        params, opt_state, loss, nfe, res = train_step(params, opt_state, sub, inputs, targets)
        for name, value in (("loss", loss), ("nfe", nfe), ("rel_residual", res)):
            history[name].append(float(value))
    train_s = time.perf_counter() - t0
    test_rng = np.random.default_rng(10_000 + args.seed)
    inputs, targets = make_batch(test_rng, batch_size=args.eval_batch_size, seq_len=args.seq_len)
    test_loss, (test_nfe, test_res, test_acc) = eval_fn(params, None, inputs, targets)
    tail = max(1, args.steps // 10)
    result = {
        "model": spec,
        "params": common.param_count(params),
        "final_train_loss": float(np.mean(history["loss"][-tail:])),
        "test_loss": float(test_loss),
        "test_copy_accuracy": float(test_acc),
        "forward_nfe_train": float(np.mean(history["nfe"][-tail:])),
        "forward_nfe_eval": float(test_nfe),
        "forward_rel_residual_train": float(np.mean(history["rel_residual"][-tail:])),
        "forward_rel_residual_eval": float(test_res),
        "train_seconds": train_s,
        "history": history,
    }
    log(
        f"{spec:20s} params={result['params']:7d} test_loss={result['test_loss']:.4f} "
        f"copy_acc={result['test_copy_accuracy']:.3f} nfe={result['forward_nfe_eval']:.1f} "
        f"rel_res={result['forward_rel_residual_eval']:.1e} "
        f"train_s={train_s:.1f}"
    )
    return result


def parse_args(argv: Sequence[str] | None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seq_len", type=int, default=50, help="T, blanks between digits and marker")
    p.add_argument(
        "--models", default="deq:transformer,deq:trellis,tied:transformer,untied:transformer"
    )
    p.add_argument("--d_model", type=int, default=32)
    p.add_argument("--num_heads", type=int, default=2)
    p.add_argument("--depth", type=int, default=6, help="layers of the explicit baselines")
    p.add_argument("--max_steps", type=int, default=12, help="DEQ Anderson steps")
    p.add_argument("--tol", type=float, default=1e-3)
    p.add_argument("--adjoint", choices=common.ADJOINTS, default="implicit", help="DEQ gradient")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--eval_batch_size", type=int, default=256)
    p.add_argument("--learning_rate", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out_dir", default="runs/copy_memory")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, a few steps")
    p.add_argument("--no_progress", dest="progress", action="store_false")
    return common.parse_with_smoke_defaults(
        p,
        argv,
        {
            "seq_len": 8,
            "d_model": 16,
            "depth": 2,
            "max_steps": 4,
            "steps": 3,
            "batch_size": 4,
            "eval_batch_size": 8,
        },
    )


def main(argv: Sequence[str] | None = None) -> dict:
    args = parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    config = vars(args) | {"data_source": "synthetic copy-memory task (generated, seeded)"}
    print("config:", config)
    print("data source: synthetic copy-memory task (DEQ paper §5), generated from --seed")
    common.write_json(os.path.join(args.out_dir, "config.json"), config)
    blank_loss = NUM_DIGITS * np.log(8.0) / (args.seq_len + 2 * NUM_DIGITS)
    print(f"reference: blank-only predictor loss ~ {blank_loss:.4f}")
    results = [run_model(spec, args, print) for spec in args.models.split(",")]
    summary = {
        "data_source": config["data_source"],
        "blank_only_loss": blank_loss,
        "results": results,
    }
    common.write_json(os.path.join(args.out_dir, "results.json"), summary)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax_res) = plt.subplots(1, 2, figsize=(11, 4))
    for r in results:
        ax.plot(r["history"]["loss"], label=r["model"])
        if r["model"].startswith("deq:"):
            ax_res.plot(r["history"]["rel_residual"], label=r["model"])
    ax.axhline(blank_loss, color="k", ls="--", lw=0.8, label="blank-only")
    ax.set(
        xlabel="step",
        ylabel="train cross-entropy",
        yscale="log",
        title=f"copy memory T={args.seq_len}",
    )
    ax.legend()
    ax_res.set(
        xlabel="step",
        ylabel="forward relative residual",
        yscale="log",
        title=f"DEQ solver (Anderson <= {args.max_steps} steps, tol {args.tol:g})",
    )
    if ax_res.lines:
        ax_res.axhline(args.tol, color="k", ls=":", lw=0.8, label="tol")
        ax_res.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(args.out_dir, "loss.png"), dpi=100)
    plt.close(fig)
    return summary


if __name__ == "__main__":
    main()
