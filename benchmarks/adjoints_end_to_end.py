"""End-to-end comparison of the gradient strategies on the main job and the language model.

Trains the Fashion-MNIST main job (``experiments/fashion_mnist.py``) or the DEQ-Transformer LM
(``experiments/language_model.py --models deq``) once per ``--adjoint`` with the same seed, data,
budget and flags, each as its own process, and prints one markdown row per gradient. Main job:
test accuracy and loss, forward NFE and relative residual on the test set, the train-time
throughput (median ``examples_per_sec`` of the logged train records after the first, which holds
compilation) and the wall time. LM: validation perplexity, last training perplexity, forward NFE
and relative residual (eval), median train step time and the wall time. From the repository root::

    python -m benchmarks.adjoints_end_to_end --train_size 20000 --test_size 2000 --epochs 1
    python -m benchmarks.adjoints_end_to_end --task lm -- --steps 150

Extra flags after ``--`` go to every run (e.g. ``-- --no_jr``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from benchmarks.common import markdown_header, markdown_row
from deqjax import harness, training

_COLUMNS = ("adjoint", "test acc", "test loss", "NFE", "rel residual", "train ex/s", "wall s")
_LM_COLUMNS = ("adjoint", "valid ppl", "train ppl", "NFE", "rel residual", "step ms", "wall s")


def _run(module: str, adjoint: str, out_dir: str, flags: list[str]) -> dict:
    cmd = [sys.executable, "-m", module, "--adjoint", adjoint]
    cmd += ["--out_dir", out_dir, "--overwrite", "--no_progress", *flags]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(out_dir, "results.json")) as fh:
        return json.load(fh)


def run_lm(adjoint: str, out_dir: str, flags: list[str]) -> dict:
    """Trains the DEQ LM with ``--adjoint adjoint``; returns its row."""
    r = _run("experiments.language_model", adjoint, out_dir, ["--models", "deq", *flags])
    r = r["results"][0]
    return {
        "adjoint": adjoint,
        "valid ppl": f"{float(r['valid_ppl']):.1f}",
        "train ppl": f"{float(r['train_ppl_last']):.1f}",
        "NFE": f"{float(r['forward_nfe_eval']):.2f}",
        "rel residual": f"{float(r['forward_rel_residual_eval']):.2e}",
        "step ms": f"{1e3 * float(r['train_step_s_median']):.1f}",
        "wall s": f"{float(r['wall_s']):.0f}",
    }


def run_one(adjoint: str, out_dir: str, flags: list[str]) -> dict:
    """Runs the main job with ``--adjoint adjoint``; returns its row."""
    results = _run("experiments.fashion_mnist", adjoint, out_dir, flags)
    train = [r for r in training.read_jsonl(os.path.join(out_dir, "metrics.jsonl"))]
    speeds = [r["examples_per_sec"] for r in train if r.get("split") == "train"][1:]
    test = results["test"]
    return {
        "adjoint": adjoint,
        "test acc": f"{float(test['accuracy']):.4f}",
        "test loss": f"{float(test['loss']):.4f}",
        "NFE": f"{float(test['nfe']):.2f}",
        "rel residual": f"{float(test['rel_residual']):.2e}",
        "train ex/s": f"{statistics.median(speeds):.0f}" if speeds else "n/a",
        "wall s": f"{float(results['wall_seconds']):.0f}",
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", choices=("fashion_mnist", "lm"), default="fashion_mnist")
    p.add_argument("--adjoints", nargs="+", default=list(harness.GRADIENTS))
    p.add_argument("--train_size", type=int, default=20000)
    p.add_argument("--test_size", type=int, default=2000)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    args, extra = p.parse_known_args(argv)
    extra = [a for a in extra if a != "--"]
    if args.task == "lm":
        flags, columns, run = [f"--seed={args.seed}", *extra], _LM_COLUMNS, run_lm
    else:
        flags = [f"--train_size={args.train_size}", f"--test_size={args.test_size}"]
        flags += [f"--epochs={args.epochs}", f"--seed={args.seed}", *extra]
        columns, run = _COLUMNS, run_one
    print(f"{args.task} {' '.join(flags)}")
    print("\n".join(markdown_header(columns)))
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.adjoints:
            row = run(name, os.path.join(tmp, name), flags)
            print(markdown_row([row[c] for c in columns]), flush=True)


if __name__ == "__main__":
    main()
