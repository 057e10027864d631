"""End-to-end comparison of the gradient strategies on the Fashion-MNIST main job (issue 18).

Trains the main job (``experiments/fashion_mnist.py``) once per ``--adjoint`` with the same
seed, data, budget and flags, each as its own process, and prints one markdown row per gradient:
test accuracy and loss, forward NFE and relative residual on the test set, the train-time step
throughput (median ``examples_per_sec`` of the logged train records after the first, which holds
compilation) and the wall time of the whole run. Run from the repository root::

    python -m benchmarks.adjoints_end_to_end --train_size 20000 --test_size 2000 --epochs 1

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

from deqjax import training

_COLUMNS = ("adjoint", "test acc", "test loss", "NFE", "rel residual", "train ex/s", "wall s")


def run_one(adjoint: str, out_dir: str, flags: list[str]) -> dict:
    """Runs the main job with ``--adjoint adjoint``; returns its row."""
    cmd = [sys.executable, "-m", "experiments.fashion_mnist", "--adjoint", adjoint]
    cmd += ["--out_dir", out_dir, "--overwrite", "--no_progress", *flags]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(out_dir, "results.json")) as fh:
        results = json.load(fh)
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
    p.add_argument("--adjoints", nargs="+", default=list(training.GRADIENTS))
    p.add_argument("--train_size", type=int, default=20000)
    p.add_argument("--test_size", type=int, default=2000)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    args, extra = p.parse_known_args(argv)
    extra = [a for a in extra if a != "--"]
    flags = [f"--train_size={args.train_size}", f"--test_size={args.test_size}"]
    flags += [f"--epochs={args.epochs}", f"--seed={args.seed}", *extra]
    print(f"fashion_mnist {' '.join(flags)}")
    print("| " + " | ".join(_COLUMNS) + " |\n|" + "---|" * len(_COLUMNS))
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.adjoints:
            row = run_one(name, os.path.join(tmp, name), flags)
            print("| " + " | ".join(row[c] for c in _COLUMNS) + " |", flush=True)


if __name__ == "__main__":
    main()
