"""The pure functions a training loop needs from a DEQ classifier: the loss (cross entropy with
the optional Jacobian regulariser, JR paper Eq. 4), per-example evaluation, and occasional DEQ
diagnostics (backward-solve convergence, ``‖J_f(z*)‖_F``, ``ρ(J_f(z*))``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import haiku as hk
import jax
import jax.numpy as jnp
import optax

from deqjax._src import jacobian as jacobian_lib
from deqjax._src import jacobian_regularization as jr_lib
from deqjax._src.models import mlp_classifier
from deqjax._src.normalise import as_solver
from deqjax._src.solvers.base import Solver
from deqjax._src.solvers.solution import CONVERGED
from deqjax._src.solvers.summary import summarize


class ClassifierFns(NamedTuple):
    """Pure functions of a classifier (no Haiku state, no apply rng).

    ``init(key, images) -> params``; ``loss(params, images, labels, key, gamma, step) -> (loss,
    metrics)``; ``evaluate(params, images, labels) -> {name: per-example [B]}``;
    ``diagnostics(params, images, labels, key) -> {name: scalar}``.
    """

    init: Callable[..., Any]
    loss: Callable[..., Any]
    evaluate: Callable[..., Any]
    diagnostics: Callable[..., Any]


_MakeModel = Callable[[], mlp_classifier.MLPClassifier]


def _accuracy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    return (jnp.argmax(logits, -1).astype(labels.dtype) == labels).astype(jnp.float32)


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
    ce = jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, labels))
    metrics = {
        "cross_entropy": ce,
        "accuracy": jnp.mean(_accuracy(logits, labels)),
        **summarize(out.solution),
    }
    loss = ce
    if regularizer is not None:
        term, jr_metrics = regularizer.penalty(out.cell_fn, out.z_star, key, step, gamma=gamma)
        loss = loss + term.astype(ce.dtype)
        metrics.update(jr_metrics)
    return loss, metrics


def _evaluate(make_model: _MakeModel, images: jax.Array, labels: jax.Array) -> dict[str, jax.Array]:
    """Per-example accuracy, loss, NFE, residual and convergence, ``[B]`` each."""
    logits, out = make_model()(images)
    sol = out.solution
    nfe = sol.num_steps.astype(jnp.float32)
    rel = sol.rel_residual.astype(jnp.float32)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    return {
        "accuracy": _accuracy(logits, labels),
        "loss": ce.astype(jnp.float32),
        "nfe": nfe,
        "nfe_max": nfe,
        "rel_residual": rel,
        "rel_residual_max": rel,
        "converged": (sol.status == CONVERGED).astype(jnp.float32),
    }


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
    z = jax.lax.stop_gradient(out.z_star)
    ce = lambda z_: optax.softmax_cross_entropy_with_integer_labels(z_ @ w + b[None], labels)  # noqa: E731
    g = jax.grad(lambda z_: jnp.mean(ce(z_)))(z)
    bwd = jacobian_lib.backward_convergence(
        lambda p, x, z_: out.cell_fn(z_), (), (), z, g, solver=backward_solver
    )
    k_fro, k_rho = jax.random.split(key)
    fro_sq = jacobian_lib.frobenius_sq(out.cell_fn, z, k_fro, num_samples=diag_probes)
    rho = jacobian_lib.spectral_radius(out.cell_fn, z, k_rho, num_steps=diag_power_steps)
    f32 = lambda a: a.astype(jnp.float32)  # noqa: E731
    return {
        "bwd_rel_residual": f32(bwd.rel_residual),
        "bwd_abs_residual": f32(bwd.abs_residual),
        "bwd_nfe": f32(bwd.num_steps),
        "jac_frobenius": f32(jnp.sqrt(fro_sq * z.shape[-1])),
        "jac_frobenius_sq_per_dim": f32(fro_sq),
        "spectral_radius": f32(rho),
    }
