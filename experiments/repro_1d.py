"""``experiments/synthetic_1d.py`` with the forward/backward Broyden budgets as flags
(REPRODUCTION.md claim 3: is the unregularized 1D fit's failure the solver budget?).

Every other flag is ``synthetic_1d``'s (``--num_seeds``, ``--lr``, ``--gammas``, ``--no_adaptive``,
``--out_dir``, ...); the budgets replace ``Settings.forward`` / ``Settings.backward``'s
``max_steps`` (defaults 6 and 6, the JR paper's budget) and are logged in ``config.json``.

Usage: python -m experiments.repro_1d --fwd_steps 30 --bwd_steps 30 --num_seeds 8 --gammas 0 1
           --no_adaptive --out_dir runs/repro_1d_budget30
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from experiments import synthetic_1d as s1d


def main(argv: list[str] | None = None):
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--fwd_steps", type=int, default=6, help="forward Broyden budget")
    p.add_argument("--bwd_steps", type=int, default=6, help="backward Broyden budget")
    budgets, rest = p.parse_known_args(sys.argv[1:] if argv is None else argv)

    def setup(args):
        s, extra = s1d.setup(args)
        s = dataclasses.replace(
            s,
            forward=s.forward.replace(max_steps=budgets.fwd_steps),
            backward=s.backward.replace(max_steps=budgets.bwd_steps),
        )
        return s, extra | {"settings": s}

    experiment = dataclasses.replace(s1d.EXPERIMENT, setup=setup)
    return s1d.training.run(experiment, rest)


if __name__ == "__main__":
    main()
