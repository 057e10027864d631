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

import dataclasses
import json
import math
import os
import sys

import numpy as np

import deqjax as dq
from deqjax import harness
from experiments import language_model as lm

Families = harness.choice_list(dq.models.INIT_FAMILIES)  # the FFN ensembles --families names
# Flags fixed by the sweep itself: not passed after ``--``.
OWN = ("--d_model", "--d_ff", "--ffn_init", "--ffn_scale", "--seed")


@dataclasses.dataclass(frozen=True)
class Config:
    """The sweep: FFN ensembles, scales, seeds; the rest is language_model's (after --)."""

    families: Families = ("gaussian", "orthogonal", "goe")  # comma-separated FFN ensembles
    scales: harness.FloatList = (2.0,)  # comma-separated ensemble scales of the FFN
    seeds: harness.PositiveInt = 8  # seeds per (scale, family)
    first_seed: int = 0  # the first seed
    d_model: harness.PositiveInt = 32  # also the FFN width d_ff
    threshold: float = 4.8  # validation loss, nats/token
    curve_every: harness.PositiveInt = 10  # steps per curve point kept
    out_dir: str = "runs/repro_lm_init"  # one run folder per (scale, family, seed) inside
    summary: str = ""  # summary path (default: <out_dir>/summary.json)


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
            harness.run(lm.EXPERIMENT, argv)
        except SystemExit as e:  # 3: a non-finite stop; the run counts as failed
            if e.code not in (0, None, 3):
                raise
    res = json.load(open(path)) if os.path.exists(path) else {"results": [{}]}
    r = res["results"][0]
    hist = r.get("history", {"nll": [], "nfe": [], "rel_residual": []})
    ppl = r.get("valid_ppl", math.inf)
    row = {"family": family, "scale": scale, "seed": seed}
    row["valid_loss"] = math.log(ppl) if math.isfinite(ppl) else math.inf
    row["nfe_last"] = r.get("forward_nfe_train_last", math.nan)
    row["rel_residual_last"] = r.get("forward_rel_residual_train_last", math.nan)
    row |= {"train_nll": hist["nll"], "nfe": hist["nfe"], "rel_residual": hist["rel_residual"]}
    return row


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    rest = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    c = harness.parse_config(Config(), argv, description=__doc__)
    if any(f in rest for f in OWN):
        message = "set --d_model (it is also d_ff), the families, scales and seeds before '--'"
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)
    rest = ["--d_model", str(c.d_model), *rest]
    seeds = range(c.first_seed, c.first_seed + c.seeds)
    rows = []
    for run in harness.grid(scale=c.scales, family=c.families, seed=seeds):
        out = os.path.join(c.out_dir, f"s{run['scale']:g}_{run['family']}_seed{run['seed']}")
        rows.append(run_one(out, run["family"], run["scale"], run["seed"], c.d_model, rest))
    for r in rows:
        r["below_threshold"] = float(r["valid_loss"] < c.threshold)
        for k in ("train_nll", "nfe", "rel_residual"):
            r[k] = block_means(r[k], c.curve_every)
    with open(c.summary or os.path.join(c.out_dir, "summary.json"), "w") as f:
        head = {"argv": sys.argv[1:], "threshold": c.threshold, "curve_every": c.curve_every}
        json.dump(head | {"runs": rows}, f)
    table = harness.summarize_runs(
        rows,
        ("scale", "family"),
        "valid_loss",
        name="loss",
        means=("below_threshold", "nfe_last", "rel_residual_last"),
    )
    print(harness.markdown_table(table))


if __name__ == "__main__":
    main()
