"""The model section of the fully connected DEQ classifier (init paper §4.1), and its functions.

The main job's (``experiments/fashion_mnist.py``; ``benchmarks/training.py`` times it). Flags
``--framework --width --hidden --cell_form --init --init_scale --diag_power_steps``;
:meth:`MLPClassifierConfig.fns` builds the classifier's functions with the solver, gradient and
Jacobian regulariser of the other sections, in the framework of ``--framework``:
:func:`deqjax.models.classifier_fns` of :class:`deqjax.models.MLPClassifier` (Haiku),
:func:`deqjax.nnx.classifier_fns` (Flax NNX) or :func:`deqjax.equinox.classifier_fns` (Equinox),
the same equations, signatures and metrics; :func:`batch_fns` gives them the signatures
:func:`~deqjax.training.fit` calls, on ``{"image", "label"}`` batches.
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
# The modules' framework: dq.models (Haiku), dq.nnx (Flax NNX) or dq.equinox (each loaded on use).
Framework = Literal["haiku", "nnx", "equinox"]
FLOAT32 = harness.DtypeConfig()  # the default compute dtype: no mixed-precision policy


@dataclasses.dataclass(frozen=True)
class MLPClassifierConfig:
    """Model: flatten -> DEQ(MLPCell) -> dense logits (the MLPClassifier of --framework)."""

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

    framework: Framework = "haiku"
    """the modules' framework: dq.models (Haiku), dq.nnx (Flax NNX) or dq.equinox (float32)"""
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
        """The classifier's pure functions in ``--framework`` (:func:`deqjax.models.classifier_fns`
        or its NNX or Equinox counterpart: the same signatures and metrics).

        Args:
          solver: the forward solver, the gradient and the backward-diagnostic solver.
          jr: the Jacobian regulariser of the loss (its adaptive γ is the caller's).
          family, scale: the recurrent weights' initialisation (default ``--init``,
            ``--init_scale``); only ``init`` depends on them.
          compute: the compute dtype (``--dtype``): every function runs the classifier under
            its mixed-precision policy (Haiku's; the NNX and Equinox classifiers: float32 only).
          **model_kwargs: further ``MLPClassifier`` arguments (the same in each framework).

        Raises:
          ValueError: a compute dtype other than float32 outside Haiku.
        """
        forward, adjoint = solver.solver_and_adjoint()
        family = self.init if family is None else family
        w_init = dq.models.recurrent_init(family, self.init_scale if scale is None else scale)
        kwargs = {"hidden": self.hidden or None, "cell_form": self.cell_form, "w_init": w_init}
        kwargs |= {"solver": forward, "adjoint": adjoint, **model_kwargs}
        regularizer, _ = jr.build(solver.tol)
        options = {"regularizer": regularizer, "backward_solver": solver.backward()}
        options["diag_power_steps"] = self.diag_power_steps
        if self.framework == "haiku":
            model = functools.partial(dq.models.MLPClassifier, self.width, **kwargs)
            fns = dq.models.classifier_fns(model, **options)
            return compute.apply_each(dq.models.MLPClassifier, fns)
        if compute.dtype != "float32":
            raise ValueError(self.dtype_refusal(compute))
        if self.framework == "nnx":
            make = lambda p, rngs: dq.nnx.MLPClassifier(p, self.width, rngs=rngs, **kwargs)  # noqa: E731
            return dq.nnx.classifier_fns(make, **options)
        make = lambda p, key: dq.equinox.MLPClassifier(p, self.width, key=key, **kwargs)  # noqa: E731
        return dq.equinox.classifier_fns(make, **options)

    def dtype_refusal(self, compute: harness.DtypeConfig) -> str | None:
        """Why ``--framework`` cannot compute in ``--dtype`` (a Haiku mixed-precision policy),
        or ``None``."""
        if self.framework == "haiku" or compute.dtype == "float32":
            return None
        return (
            f"--dtype {compute.dtype} is a Haiku mixed-precision policy; --framework "
            f"{self.framework} trains in float32: pass --framework haiku or --dtype float32."
        )


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
