"""The pure functions a training loop needs from a Haiku DEQ classifier: the loss (cross entropy
with the optional Jacobian regulariser, JR paper Eq. 4), per-example evaluation, and occasional
DEQ diagnostics (backward-solve convergence, ``‖J_f(z*)‖_F``, ``ρ(J_f(z*))``), computed by the
framework-free :mod:`deqjax._src.classifier_objective` (as the NNX and Equinox classifiers' are).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import haiku as hk
import jax

from deqjax._src import classifier_objective as objective
from deqjax._src import jacobian_regularization as jr_lib
from deqjax._src.classifier_objective import ClassifierFns
from deqjax._src.models import mlp_classifier
from deqjax._src.normalise import as_solver
from deqjax._src.solvers.base import Solver

_MakeModel = Callable[[], mlp_classifier.MLPClassifier]


def classifier_fns(
    make_model: _MakeModel,
    *,
    regularizer: jr_lib.JacobianRegularizer | None = None,
    backward_solver: Any = None,
    diag_probes: int = 2,
    diag_power_steps: int = 30,
) -> ClassifierFns:
    """The training, evaluation and diagnostic functions of ``make_model()``'s classifier.

    Args:
      make_model: builds the module (called inside each Haiku transform).
      regularizer: adds ``τ γ ‖J_f(z*)‖²_F / d`` (JR paper Eq. 4) to the cross entropy; ``gamma``
        of ``loss`` overrides its strength (an adaptive γ); None: no penalty.
      backward_solver: the solver of the backward-convergence diagnostic (the adjoint's).
      diag_probes, diag_power_steps: Hutchinson probes of ``‖J_f(z*)‖_F`` and power iterations of
        ``ρ(J_f(z*))`` in ``diagnostics``.

    Returns:
      :class:`ClassifierFns`. Training metrics: ``cross_entropy``, ``accuracy``, the forward
      solve's :func:`~deqjax.solvers.summarize` (``nfe``, ``rel_residual``, ``*_max``,
      ``converged``...) and the regulariser's ``jr/*``; diagnostics: ``bwd_rel_residual``,
      ``bwd_abs_residual``, ``bwd_nfe``, ``jac_frobenius`` (per-example ``‖J‖_F``, root mean
      square), ``jac_frobenius_sq_per_dim`` and ``spectral_radius`` (max over the batch).
    """

    if backward_solver is not None:
        backward_solver = as_solver(backward_solver, name="backward_solver")
    diagnostics = functools.partial(
        _diagnostics, make_model, backward_solver, diag_probes, diag_power_steps
    )
    t = lambda fn: hk.without_apply_rng(hk.transform(fn))  # noqa: E731
    return ClassifierFns(
        init=t(lambda images: make_model()(images)[0]).init,
        loss=t(functools.partial(_loss, make_model, regularizer)).apply,
        evaluate=t(functools.partial(_evaluate, make_model)).apply,
        diagnostics=t(diagnostics).apply,
    )


def _loss(
    make_model: _MakeModel,
    regularizer: jr_lib.JacobianRegularizer | None,
    images: jax.Array,
    labels: jax.Array,
    key: jax.Array,
    gamma: jax.Array,
    step: jax.Array,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Cross entropy (+ the JR penalty at strength ``gamma``) and the training metrics."""
    logits, out = make_model()(images)
    return objective.loss(logits, labels, out, regularizer, key, gamma, step)


def _evaluate(make_model: _MakeModel, images: jax.Array, labels: jax.Array) -> dict[str, jax.Array]:
    """Per-example accuracy, loss, NFE, residual and convergence, ``[B]`` each."""
    logits, out = make_model()(images)
    return objective.evaluate(logits, labels, out.solution)


def _diagnostics(
    make_model: _MakeModel,
    backward_solver: Solver | None,
    diag_probes: int,
    diag_power_steps: int,
    images: jax.Array,
    labels: jax.Array,
    key: jax.Array,
) -> dict[str, jax.Array]:
    """The backward solve's convergence for the loss's cotangent, ``‖J_f(z*)‖_F`` and
    ``ρ(J_f(z*))`` at this batch's equilibrium."""
    model = make_model()
    _, out = model(images)
    w, b = model.head_params
    return objective.diagnostics(
        out,
        lambda z: z @ w + b[None],
        labels,
        key,
        backward_solver=backward_solver,
        probes=diag_probes,
        power_steps=diag_power_steps,
    )
