"""What a training loop computes from a DEQ classifier's forward pass, in every framework: the
loss (cross entropy with the optional Jacobian regulariser, JR paper Eq. 4), the per-example
evaluation, and occasional DEQ diagnostics (backward-solve convergence, ``‖J_f(z*)‖_F``,
``ρ(J_f(z*))``).

Functions of the logits, the labels and the pass's :class:`~deqjax.nn.DEQOutput` only: Haiku's
``dq.models.classifier_fns`` and the NNX and Equinox ``classifier_fns`` wrap them around their
models, so the three report the same metrics under the same names (:class:`ClassifierFns`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from deqjax._src import jacobian as jacobian_lib
from deqjax._src import jacobian_regularization as jr_lib
from deqjax._src.deq.deq_output import DEQOutput
from deqjax._src.solvers.base import Solver
from deqjax._src.solvers.solution import CONVERGED, Solution
from deqjax._src.solvers.summary import summarize


class ClassifierFns(NamedTuple):
    """Pure functions of a classifier (no framework state, no apply rng).

    ``init(key, images) -> params``; ``loss(params, images, labels, key, gamma, step) -> (loss,
    metrics)``; ``evaluate(params, images, labels) -> {name: per-example [B]}``;
    ``diagnostics(params, images, labels, key) -> {name: scalar}``.
    """

    init: Callable[..., Any]
    loss: Callable[..., Any]
    evaluate: Callable[..., Any]
    diagnostics: Callable[..., Any]


def flat_width(images: jax.Array) -> int:
    """The width of one flattened image of ``images [B, ...]``: a classifier's ``in_features``."""
    return math.prod(int(s) for s in images.shape[1:])


def accuracy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Per-example ``argmax(logits) == label`` as float32 ``[B]``."""
    return (jnp.argmax(logits, -1).astype(labels.dtype) == labels).astype(jnp.float32)


def loss(
    logits: jax.Array,
    labels: jax.Array,
    out: DEQOutput,
    regularizer: jr_lib.JacobianRegularizer | None,
    key: jax.Array,
    gamma: jax.Array,
    step: jax.Array,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Cross entropy (+ the JR penalty at strength ``gamma``, JR paper Eq. 4) and the training
    metrics: ``cross_entropy``, ``accuracy``, the forward solve's
    :func:`~deqjax.solvers.summarize` and the regulariser's ``jr/*``."""
    ce = jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, labels))
    metrics = {
        "cross_entropy": ce,
        "accuracy": jnp.mean(accuracy(logits, labels)),
        **summarize(out.solution),
    }
    total = ce
    if regularizer is not None:
        term, jr_metrics = regularizer.penalty(out.cell_fn, out.z_star, key, step, gamma=gamma)
        total = total + term.astype(ce.dtype)
        metrics.update(jr_metrics)
    return total, metrics


def evaluate(logits: jax.Array, labels: jax.Array, sol: Solution) -> dict[str, jax.Array]:
    """Per-example accuracy, loss, NFE, residual and convergence, ``[B]`` each."""
    nfe = sol.num_steps.astype(jnp.float32)
    rel = sol.rel_residual.astype(jnp.float32)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    return {
        "accuracy": accuracy(logits, labels),
        "loss": ce.astype(jnp.float32),
        "nfe": nfe,
        "nfe_max": nfe,
        "rel_residual": rel,
        "rel_residual_max": rel,
        "converged": (sol.status == CONVERGED).astype(jnp.float32),
    }


def diagnostics(
    out: DEQOutput,
    head: Callable[[jax.Array], jax.Array],
    labels: jax.Array,
    key: jax.Array,
    *,
    backward_solver: Solver | None,
    probes: int,
    power_steps: int,
) -> dict[str, jax.Array]:
    """The backward solve's convergence for the loss's cotangent, ``‖J_f(z*)‖_F`` (``probes``
    Hutchinson probes) and ``ρ(J_f(z*))`` (``power_steps`` power iterations) at this batch's
    equilibrium; ``head`` maps ``z*`` to the logits."""
    z = jax.lax.stop_gradient(out.z_star)
    ce = lambda z_: optax.softmax_cross_entropy_with_integer_labels(head(z_), labels)  # noqa: E731
    g = jax.grad(lambda z_: jnp.mean(ce(z_)))(z)
    bwd = jacobian_lib.backward_convergence(
        lambda p, x, z_: out.cell_fn(z_), (), (), z, g, solver=backward_solver
    )
    k_fro, k_rho = jax.random.split(key)
    fro_sq = jacobian_lib.frobenius_sq(out.cell_fn, z, k_fro, num_samples=probes)
    rho = jacobian_lib.spectral_radius(out.cell_fn, z, k_rho, num_steps=power_steps)
    f32 = lambda a: a.astype(jnp.float32)  # noqa: E731
    return {
        "bwd_rel_residual": f32(bwd.rel_residual),
        "bwd_abs_residual": f32(bwd.abs_residual),
        "bwd_nfe": f32(bwd.num_steps),
        "jac_frobenius": f32(jnp.sqrt(fro_sq * z.shape[-1])),
        "jac_frobenius_sq_per_dim": f32(fro_sq),
        "spectral_radius": f32(rho),
    }


def module_fns(
    model: Callable[[Any, jax.Array], Any],
    init: Callable[[jax.Array, jax.Array], Any],
    *,
    regularizer: jr_lib.JacobianRegularizer | None,
    backward_solver: Solver | None,
    probes: int,
    power_steps: int,
) -> ClassifierFns:
    """The :class:`ClassifierFns` of a classifier module of NNX or Equinox: ``model(params,
    images)`` rebuilds the module around ``params`` (``init(key, images)`` made them); the module
    maps ``images`` to ``(logits, DEQOutput)`` and has a ``logits(z)`` head."""

    def loss_fn(params, images, labels, key, gamma, step):
        logits, out = model(params, images)(images)
        return loss(logits, labels, out, regularizer, key, gamma, step)

    def evaluate_fn(params, images, labels):
        logits, out = model(params, images)(images)
        return evaluate(logits, labels, out.solution)

    def diagnostics_fn(params, images, labels, key):
        module = model(params, images)
        _, out = module(images)
        return diagnostics(
            out,
            module.logits,
            labels,
            key,
            backward_solver=backward_solver,
            probes=probes,
            power_steps=power_steps,
        )

    return ClassifierFns(init, loss_fn, evaluate_fn, diagnostics_fn)
