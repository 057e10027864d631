"""The model section of the multiscale DEQ classifier (JR paper App. A.3 / Table 4, scaled down).

Flags ``--channels --num_groups --expansion --dropout --head_grid --stem_stride --train_budget
--tol --backward_steps --backward_tol --jr_p``; :meth:`MDEQConfig.transform` builds
:class:`deqjax.models.MDEQClassifier` with them at a JR strength and an inference budget (the
model of ``experiments/cifar10_mdeq.py``, at whose defaults ``benchmarks/mdeq.py`` times it);
:func:`evaluate_classifier` measures such a model on a test set at one budget.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import Any, ClassVar

import haiku as hk
import jax
import numpy as np

import deqjax as dq
from deqjax.harness import IntList, NonNegativeFloat, PositiveFloat, PositiveInt


@dataclasses.dataclass(frozen=True)
class MDEQConfig:
    """Model: a conv stem (stride --stem_stride); a MultiscaleCell (--channels, --expansion,
    weight norm) solved per example by dq.nn.DEQ: Anderson with --train_budget evaluations (--tol;
    JR: 7), implicit backward with Anderson (--backward_steps, --backward_tol; JR: 8); the head
    reads the cell output f(z*) the solver returned, pools every resolution to a --head_grid
    grid, one linear layer."""

    # Its settings under --smoke: a tiny model and solver budgets.
    SMOKE: ClassVar[dict[str, Any]] = {
        "channels": (4, 8),
        "num_groups": 2,
        "expansion": 1,
        "train_budget": 3,
        "backward_steps": 3,
    }

    channels: IntList = (8, 16)  # MultiscaleCell channels per resolution
    num_groups: PositiveInt = 4  # group-norm groups
    expansion: PositiveInt = 2  # residual block channel expansion
    dropout: NonNegativeFloat = 0.0  # recurrent (variational) dropout
    head_grid: PositiveInt = 4  # head pools to a grid × grid grid
    stem_stride: PositiveInt = 2  # stem downsampling (1 or 2)
    train_budget: PositiveInt = 6  # training Anderson max_steps
    tol: PositiveFloat = 1e-3  # forward relative tolerance
    backward_steps: PositiveInt = 6  # backward (implicit) solver steps
    backward_tol: PositiveFloat = 1e-4  # backward solver tolerance
    jr_p: float = 1.0  # JR frequency p (Bernoulli gate per step)

    def transform(self, gamma: float, budget: int) -> hk.Transformed:
        """``apply(params, rng, images, is_training) -> (logits, aux)`` (float images) with JR
        strength ``gamma`` (0: none) and inference budget ``budget``
        (:func:`deqjax.models.budget_solver`: ``b`` cell evaluations at most)."""
        forward_solver = dq.solvers.Anderson(max_steps=self.train_budget, tol=self.tol, m=5)
        backward = dq.solvers.Anderson(max_steps=self.backward_steps, tol=self.backward_tol, m=5)
        jr = dq.regularization.JacobianRegularizer(gamma, p=self.jr_p) if gamma > 0 else None
        deq = dq.models.DEQSettings(
            forward_solver,
            eval_solver=dq.models.budget_solver(budget, tol=self.tol),
            adjoint=dq.ImplicitAdjoint(solver=backward),
            regularizer=jr,
        )

        def forward(images, is_training):
            model = dq.models.MDEQClassifier(
                list(self.channels),
                num_groups=self.num_groups,
                expansion=self.expansion,
                dropout_rate=self.dropout,
                stem_stride=self.stem_stride,
                head_grid=self.head_grid,
                deq=deq,
            )
            return model(images, is_training=is_training)

        return hk.transform(forward)


def evaluate_classifier(
    model: hk.Transformed,
    params: hk.Params,
    test: Mapping[str, np.ndarray],
    stats: tuple[float, float],
    batch_size: int,
) -> dict[str, float]:
    """Test accuracy, NFE, readout residual and images/s of an :meth:`MDEQConfig.transform`.

    Args:
      model: the transform at the inference budget to measure.
      params: its parameters.
      test: ``{"image": uint8 [N, H, W, C], "label": [N]}``.
      stats: ``(mean, std)`` that standardise ``image / 255``.
      batch_size: images per compiled call (the last batch is padded to it).

    Returns:
      ``test_accuracy``, ``nfe_mean``, ``nfe_max``, ``residual_mean`` (of ``aux["nfe"]`` and
      ``aux["residual"]``), ``images_per_s`` after compiling, and ``compile_s``.
    """
    mean, std = stats
    apply = jax.jit(lambda p, x: model.apply(p, None, (x / 255.0 - mean) / std, False))
    n = test["label"].shape[0]
    pad = -n % batch_size  # the last batch padded to the compiled shape
    images = np.concatenate([test["image"], np.zeros((pad,) + test["image"].shape[1:], np.uint8)])
    t0 = time.perf_counter()
    jax.block_until_ready(apply(params, images[:batch_size]))
    compile_s, out, t0 = time.perf_counter() - t0, [], time.perf_counter()
    for s in range(0, n, batch_size):
        logits, aux = apply(params, images[s : s + batch_size])
        out.append((np.argmax(logits, -1), np.asarray(aux["nfe"]), np.asarray(aux["residual"])))
    pred, nfe, res = (np.concatenate(a)[:n] for a in zip(*out))
    return {
        "test_accuracy": float(np.mean(pred == test["label"])),
        "nfe_mean": float(nfe.mean()),
        "nfe_max": int(nfe.max()),
        "residual_mean": float(res.mean()),
        "images_per_s": n / (time.perf_counter() - t0),
        "compile_s": compile_s,
    }
