"""The model section of the fully connected DEQ classifier (init paper §4.1), and its functions.

Flags ``--width --hidden --cell_form --init --init_scale --diag_power_steps``, and of the init
sweep (:class:`InitSweepConfig`) ``--sweep --sweep_families --sweep_scales --sweep_seeds``;
:meth:`MLPClassifierConfig.fns` builds :func:`deqjax.models.classifier_fns` of
:class:`deqjax.models.MLPClassifier` with the solver, gradient and Jacobian regulariser of the
other sections (the main job's model, and the one its benchmarks time); :func:`batch_fns` gives
them the signatures :func:`~deqjax.training.fit` calls, on ``{"image", "label"}`` batches.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, ClassVar, Literal, NamedTuple

import jax
import jax.numpy as jnp

import deqjax as dq
from deqjax._src.harness.dtype_config import FLOAT32, DtypeConfig
from deqjax._src.harness.flag_types import (
    FloatList,
    IntList,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveInt,
    Switch,
    choice_list,
)
from deqjax._src.harness.jr_config import JRConfig
from deqjax._src.harness.solver_config import SolverConfig
from deqjax._src.harness.sweep import grid

# The recurrent weights' families (dq.models.recurrent_init): one, or a comma-separated list.
InitFamily = Literal[tuple(sorted(dq.models.INIT_FAMILIES))]
InitFamilyList = choice_list(sorted(dq.models.INIT_FAMILIES))


@dataclasses.dataclass(frozen=True)
class MLPClassifierConfig:
    """Model: flatten -> DEQ(MLPCell) -> dense logits (dq.models.MLPClassifier)."""

    # Settings a resumed run may change (with --force): the diagnostics' iterations.
    SAFE_ON_RESUME: ClassVar[tuple[str, ...]] = ("diag_power_steps",)
    # The metrics of its training runs drawn in curves.png (classifier_fns's, fit's, diagnostics').
    CURVES: ClassVar[tuple[str, ...]] = (
        "loss",
        "accuracy",
        "nfe",
        "rel_residual",
        "rel_residual_max",
        "jr/penalty",
        "jr/gamma",
        "bwd_rel_residual",
        "jac_frobenius",
        "spectral_radius",
        "skipped_updates",
    )

    width: PositiveInt = 128  # DEQ state size D
    hidden: NonNegativeInt = 0  # cell hidden size (0: D)
    cell_form: Literal["resnet", "single"] = "resnet"  # resnet: init paper 4.1; single: phi(Wz+Ux)
    init: InitFamily = "orthogonal"  # family of the recurrent weights
    init_scale: NonNegativeFloat = 1.0  # recurrent sigma
    diag_power_steps: PositiveInt = 30  # rho(J) iterations

    def fns(
        self,
        solver: SolverConfig,
        jr: JRConfig,
        *,
        family: str | None = None,
        scale: float | None = None,
        compute: DtypeConfig = FLOAT32,
        **model_kwargs: Any,
    ) -> dq.models.ClassifierFns:
        """The classifier's pure functions (:func:`deqjax.models.classifier_fns`).

        Args:
          solver: the forward solver, the gradient and the backward-diagnostic solver.
          jr: the Jacobian regulariser of the loss (its adaptive γ is the caller's).
          family, scale: the recurrent weights' initialisation (default ``--init``,
            ``--init_scale``); only ``init`` depends on them.
          compute: the compute dtype (``--dtype``): every function runs the classifier under
            its mixed-precision policy.
          **model_kwargs: further :class:`deqjax.models.MLPClassifier` arguments.
        """
        forward, adjoint = solver.solver_and_adjoint()
        family = self.init if family is None else family
        w_init = dq.models.recurrent_init(family, self.init_scale if scale is None else scale)
        model = functools.partial(
            dq.models.MLPClassifier,
            self.width,
            hidden=self.hidden or None,
            cell_form=self.cell_form,
            w_init=w_init,
            solver=forward,
            adjoint=adjoint,
            **model_kwargs,
        )
        regularizer, _ = jr.build(solver.tol)
        fns = dq.models.classifier_fns(
            model,
            regularizer=regularizer,
            backward_solver=solver.backward(),
            diag_power_steps=self.diag_power_steps,
        )
        return compute.apply_each(dq.models.MLPClassifier, fns)


@dataclasses.dataclass(frozen=True)
class InitSweepConfig:
    """Init sweep (init paper Fig. 5): test error vs the recurrent weights' family and scale."""

    sweep: Switch = False  # the Fig. 5 sweep instead of one run
    sweep_families: InitFamilyList = ("gaussian", "orthogonal", "goe")  # families swept
    sweep_scales: FloatList = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)  # initialisation scales swept
    sweep_seeds: IntList = (0, 1, 2)  # seeds per point

    def runs(self) -> list[dict]:
        """One ``{"family", "scale", "seed"}`` per run (:func:`~deqjax.harness.grid`)."""
        return grid(family=self.sweep_families, scale=self.sweep_scales, seed=self.sweep_seeds)


class BatchFns(NamedTuple):
    """A classifier's functions on ``{"image", "label"}`` batches, as ``fit`` calls them."""

    loss: Any  # (params, batch, key, reg_state, step) -> (loss, metrics)
    evaluate: Any  # (params, batch) -> {name: per-example values}
    diagnostics: Any  # (params, batch, key, reg_state) -> {name: scalar}


def batch_fns(
    fns: dq.models.ClassifierFns,
    gamma: float,
    controller: dq.regularization.AdaptiveGamma | None = None,
) -> BatchFns:
    """``fns`` on batches; the JR strength is ``gamma``, or the controller state's γ (the
    ``reg_state`` of ``fit``) when there is an adaptive ``controller``."""
    fixed = jnp.asarray(gamma, jnp.float32)

    def loss(params, batch, key, reg_state, step) -> tuple[jax.Array, dict]:
        strength = reg_state.gamma if controller is not None else fixed
        return fns.loss(params, batch["image"], batch["label"], key, strength, step)

    def evaluate(params, batch) -> dict:
        return fns.evaluate(params, batch["image"], batch["label"])

    def diagnostics(params, batch, key, reg_state) -> dict:
        return fns.diagnostics(params, batch["image"], batch["label"], key)

    return BatchFns(loss, evaluate, diagnostics)
