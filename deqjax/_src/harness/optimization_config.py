"""The optimisation section: step count, batch sizes, Adam's learning-rate schedule, clipping.

Flags ``--epochs --steps --batch_size --eval_batch_size --lr --schedule --warmup_steps --clip_norm
--max_nonfinite_steps``; :meth:`OptimizationConfig.optimizer` builds the schedule and Adam with
clipping (:func:`deqjax.training.make_schedule`, :func:`~deqjax.training.make_optimizer`). The
batch sizes are split over the devices (``SPLIT_OVER_DEVICES``: the runner refuses, before the run
starts, a batch the devices do not divide).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Literal

import optax

from deqjax._src.harness.flag_types import (
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
)
from deqjax._src.training.optimizer import make_optimizer, make_schedule


@dataclasses.dataclass(frozen=True)
class OptimizationConfig:
    """Optimisation: how long, in which batches, with which Adam learning rate and clipping."""

    # Settings a resumed run may change (with --force): how long it trains, how it evaluates.
    SAFE_ON_RESUME: ClassVar[tuple[str, ...]] = (
        "epochs",
        "steps",
        "eval_batch_size",
        "max_nonfinite_steps",
    )
    # Batches the devices share (the runner checks them before the run starts).
    SPLIT_OVER_DEVICES: ClassVar[tuple[str, ...]] = ("batch_size", "eval_batch_size")

    epochs: PositiveInt = 4  # passes over the data
    steps: NonNegativeInt = 0  # total steps (0: epochs x steps/epoch)
    batch_size: PositiveInt = 128  # global batch
    eval_batch_size: PositiveInt = 1000  # evaluation batch
    lr: PositiveFloat = 1e-3  # peak Adam learning rate
    schedule: Literal["constant", "cosine", "linear"] = "cosine"  # decay after the warmup
    warmup_steps: NonNegativeInt = 0  # linear warmup from 0
    clip_norm: NonNegativeFloat = 1.0  # global-norm gradient clipping (0: off)
    max_nonfinite_steps: PositiveInt = 10
    """non-finite updates are skipped (skipped_updates); stop after this many in a row"""

    def num_steps(self, steps_per_epoch: int) -> int:
        """``--steps``, or ``--epochs`` x ``steps_per_epoch`` when it is 0."""
        return self.steps if self.steps else self.epochs * steps_per_epoch

    def optimizer(self, num_steps: int) -> tuple[optax.Schedule, optax.GradientTransformation]:
        """``(schedule, Adam with clipping)`` for a run of ``num_steps`` steps."""
        schedule = make_schedule(
            learning_rate=self.lr,
            schedule=self.schedule,
            warmup_steps=min(self.warmup_steps, max(num_steps - 1, 0)),
            total_steps=num_steps if self.schedule != "constant" else None,
        )
        return schedule, make_optimizer(learning_rate=schedule, clip_norm=self.clip_norm or None)
