"""``experiments/synthetic_1d.py`` with the forward/backward Broyden budgets as flags
(REPRODUCTION.md claim 3: is the unregularized 1D fit's failure the solver budget?).

Every other flag is ``synthetic_1d``'s (``--num_seeds``, ``--lr``, ``--gammas``, ``--no_adaptive``,
``--out_dir``, ...); the budgets replace ``Settings.forward`` / ``Settings.backward``'s
``max_steps`` (defaults 6 and 6, the JR paper's budget) and are logged in ``config.json``.

Usage: python -m experiments.repro_1d --fwd_steps 30 --bwd_steps 30 --num_seeds 8 --gammas 0 1
           --no_adaptive --out_dir runs/repro_1d_budget30
"""

from __future__ import annotations

import dataclasses
import functools

from deqjax import harness
from experiments import synthetic_1d as s1d


@dataclasses.dataclass(frozen=True)
class Config(s1d.Config):
    """synthetic_1d's runs, with the Broyden budgets of training."""

    fwd_steps: int = 6  # forward Broyden budget
    bwd_steps: int = 6  # backward Broyden budget


def setup(c: Config):
    (s, runs), extra = s1d.setup(c)
    s = dataclasses.replace(
        s,
        forward=s.forward.replace(max_steps=c.fwd_steps),
        backward=s.backward.replace(max_steps=c.bwd_steps),
    )
    return (s, runs), extra | {"settings": s}


EXPERIMENT = dataclasses.replace(s1d.EXPERIMENT, doc=__doc__, config=Config(), setup=setup)
main = functools.partial(harness.run, EXPERIMENT)  # main(argv=None) -> results

if __name__ == "__main__":
    main()
