"""The model section of the fully connected DEQ classifier (init paper §4.1), and its functions.

The main job's (``experiments/fashion_mnist.py``; ``benchmarks/training.py`` times it). Flags
``--width --hidden --cell_form --init --init_scale --diag_power_steps``;
:meth:`MLPClassifierConfig.fns` builds :func:`deqjax.models.classifier_fns` of
:class:`deqjax.models.MLPClassifier` with the solver, gradient and Jacobian regulariser of the
other sections; :func:`batch_fns` gives them the signatures :func:`~deqjax.training.fit` calls, on
``{"image", "label"}`` batches.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, ClassVar, Literal, NamedTuple

import jax
import jax.numpy as jnp

import deqjax as dq
from deqjax import harness
from deqjax.harness import NonNegativeFloat, NonNegativeInt, PositiveInt

# The recurrent weights' families (dq.models.recurrent_init).
InitFamily = Literal[tuple(sorted(dq.models.INIT_FAMILIES))]
FLOAT32 = harness.DtypeConfig()  # the default compute dtype: no mixed-precision policy


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
        solver: harness.SolverConfig,
        jr: harness.JRConfig,
        *,
        family: str | None = None,
        scale: float | None = None,
        compute: harness.DtypeConfig = FLOAT32,
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
