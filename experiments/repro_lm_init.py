"""Init paper §4.3 at CPU size (REPRODUCTION.md claim 2): the DEQ-Transformer LM
(``experiments/language_model.py``, KJV stand-in) with its dense (FFN) layers initialised from the
Gaussian, Haar-orthogonal or GOE ensemble at scale ``--scale``, over many seeds.

As the init paper (App. D): only the FFN weights change; ``d_ff = d_model`` for every family (GOE
matrices are square). Every other setting is ``language_model.py``'s, passed through (the flags
after ``--``). One ``results.json`` per (family, seed) under ``--out_dir/<family>_s<seed>``.

Usage: python -m experiments.repro_lm_init --families gaussian,orthogonal,goe --seeds 8 --scale 2
           --out_dir runs/repro_lm_init -- --d_model 32 --num_heads 2 --seq_len 32 --steps 200
"""

from __future__ import annotations

import argparse
import sys

from deqjax import initializers
from deqjax._src.models import sequence
from deqjax._src.nn import transformer_cell
from experiments import language_model as lm

FAMILIES = {
    "gaussian": initializers.Gaussian,
    "orthogonal": initializers.HaarOrthogonal,
    "goe": initializers.GOE,
}


def main() -> None:
    argv = sys.argv[1:]
    rest = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--families", default="gaussian,orthogonal,goe")
    p.add_argument("--seeds", type=int, default=8)
    p.add_argument("--first_seed", type=int, default=0)
    p.add_argument("--scale", type=float, default=2.0, help="ensemble scale of the FFN weights")
    p.add_argument("--out_dir", default="runs/repro_lm_init")
    a = p.parse_args(argv)
    for fam in a.families.split(","):

        def make_cell(
            cell, *, d_model, num_heads=4, pre_ln=False, trellis_kernel=2, name=None, fam=fam
        ):
            del cell, trellis_kernel
            return transformer_cell.TransformerCell(
                d_model,
                num_heads=num_heads,
                d_ff=d_model,
                pre_ln=pre_ln,
                w_init=FAMILIES[fam](a.scale),
                name=name,
            )

        sequence.sequence_cell = make_cell  # SequenceModel looks it up at call time
        for seed in range(a.first_seed, a.first_seed + a.seeds):
            out = f"{a.out_dir}/{fam}_s{seed}"
            lm.training.run(
                lm.EXPERIMENT, ["--models", "deq", "--seed", str(seed), "--out_dir", out, *rest]
            )


if __name__ == "__main__":
    main()
