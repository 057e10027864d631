"""Init paper §4.3 at CPU size (REPRODUCTION.md claim 2): the DEQ-Transformer LM
(``experiments/language_model.py``, KJV stand-in) with its dense (FFN) layers drawn from the
Gaussian, Haar-orthogonal or GOE ensemble at each ``--scales`` value, over many seeds.

As the init paper (App. D) only the FFN weights change (``--ffn_init``/``--ffn_scale``);
``d_ff = d_model`` for every family (GOE matrices are square). Every other setting is
``language_model.py``'s, passed through (the flags after ``--``). One run directory per
(scale, family, seed) under ``--out_dir``; a run whose ``results.json`` exists is not run again
and one killed midway continues from its checkpoint (``--resume``), so a killed sweep resumes
where it stopped. At the end ``summary.json`` holds every run's final
validation loss, NFE, residual and learning curve, and the table printed is, per (scale,
family): the fraction of seeds whose validation loss (nats/token) ends below ``--threshold``,
median and mean loss, forward NFE and relative residual over the last tenth of training (the
curves in ``summary.json`` are means over ``--curve_every`` steps).

Usage (REPRODUCTION.md claim 2; ~1 min per run on 2 CPU cores):
  python -m experiments.repro_lm_init --scales 2 --seeds 10 --out_dir runs/repro_lm_init -- \
      --num_heads 2 --seq_len 32 --batch_size 8 --steps 1000 --no_progress
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import numpy as np

from deqjax import training
from experiments import language_model as lm


def block_means(xs: list[float], block: int) -> list[float]:
    """Means of consecutive ``block``-step blocks (the curves kept in ``summary.json``)."""
    n = len(xs) // block * block
    return np.asarray(xs[:n], np.float64).reshape(-1, block).mean(axis=1).tolist() if n else []


def run_one(out: str, family: str, scale: float, seed: int, d_ff: int, rest: list[str]) -> dict:
    """One LM run (or its saved results); the row :func:`main` summarises (full curves)."""
    path = os.path.join(out, "results.json")
    if not os.path.exists(path):
        argv = ["--models", "deq", "--seed", str(seed), "--out_dir", out, "--ffn_init", family]
        argv += ["--ffn_scale", str(scale), "--d_ff", str(d_ff), *rest]
        argv += ["--resume"] if os.path.exists(os.path.join(out, "config.json")) else []
        try:
            training.run(lm.EXPERIMENT, argv)
        except SystemExit as e:  # 3: a non-finite stop; the run counts as failed
            if e.code not in (0, None, 3):
                raise
    res = json.load(open(path)) if os.path.exists(path) else {"results": [{}]}
    r = res["results"][0]
    hist = r.get("history", {"nll": [], "nfe": [], "rel_residual": []})
    ppl = r.get("valid_ppl", math.inf)
    return {
        "family": family, "scale": scale, "seed": seed,
        "valid_loss": math.log(ppl) if math.isfinite(ppl) else math.inf,
        "nfe_last": r.get("forward_nfe_train_last", math.nan),
        "rel_residual_last": r.get("forward_rel_residual_train_last", math.nan),
        "train_nll": hist["nll"], "nfe": hist["nfe"], "rel_residual": hist["rel_residual"],
    }  # fmt: skip


def main() -> None:
    argv = sys.argv[1:]
    rest = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--families", default="gaussian,orthogonal,goe")
    p.add_argument("--scales", default="2", help="comma-separated ensemble scales of the FFN")
    p.add_argument("--seeds", type=int, default=8)
    p.add_argument("--first_seed", type=int, default=0)
    p.add_argument("--d_model", type=int, default=32, help="also the FFN width d_ff")
    p.add_argument("--threshold", type=float, default=4.8, help="validation loss, nats/token")
    p.add_argument("--curve_every", type=int, default=10, help="steps per curve point kept")
    p.add_argument("--out_dir", default="runs/repro_lm_init")
    p.add_argument("--summary", default="", help="summary path (default: <out_dir>/summary.json)")
    a = p.parse_args(argv)
    if any(f in rest for f in ("--d_model", "--d_ff", "--ffn_init", "--ffn_scale", "--seed")):
        p.error("set --d_model (it is also d_ff), the families, scales and seeds before '--'")
    rest = ["--d_model", str(a.d_model), *rest]
    rows = []
    for scale in (float(s) for s in a.scales.split(",")):
        for fam in a.families.split(","):
            for seed in range(a.first_seed, a.first_seed + a.seeds):
                out = os.path.join(a.out_dir, f"s{scale:g}_{fam}_seed{seed}")
                rows.append(run_one(out, fam, scale, seed, a.d_model, rest))
    for r in rows:
        r["below_threshold"] = float(r["valid_loss"] < a.threshold)
        for k in ("train_nll", "nfe", "rel_residual"):
            r[k] = block_means(r[k], a.curve_every)
    with open(a.summary or os.path.join(a.out_dir, "summary.json"), "w") as f:
        head = {"argv": sys.argv[1:], "threshold": a.threshold, "curve_every": a.curve_every}
        json.dump(head | {"runs": rows}, f)
    table = training.summarize_runs(
        rows, ("scale", "family"), "valid_loss", name="loss",
        means=("below_threshold", "nfe_last", "rel_residual_last"),
    )  # fmt: skip
    print(training.markdown_table(table))


if __name__ == "__main__":
    main()
