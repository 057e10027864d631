"""The fully connected DEQ classifier of the initialisation paper (Agarwala & Schoenholz 2022,
"Deep equilibrium networks are sensitive to initialization statistics", §4.1 and Fig. 5).

``images [B, ...] -> flatten -> x [B, P] -> z* = f(z*; x) (dq.nn.MLPCell in dq.nn.DEQ) -> z* W + b``

* **Cell** (§4.1): :class:`~deqjax.nn.MLPCell`, ``form="resnet"``:
  ``f(z; x) = LN(φ(z + LN(u + W₂ LN(φ(W₁ z)))))`` with ``u = U x + b``; ``form="single"`` is the
  paper's theory model ``φ(W z + U x)``.
* **Recurrent initialisation** (the paper's subject): the recurrent weights ``W₁, W₂`` are drawn
  from a random-matrix family at a scale σ, :func:`recurrent_init`: ``"gaussian"`` (i.i.d.
  ``N(0, σ²/n)``), ``"orthogonal"`` (Haar-orthogonal × σ, the paper's recommendation) or ``"goe"``
  (symmetric, Gaussian orthogonal ensemble); Fig. 5 plots test error against σ per family.
* **Solve**: ``dq.nn.DEQ`` with the given forward solver (Anderson in the paper's setup) and
  adjoint (implicit differentiation, DEQ paper Theorem 1); zero initial state.
* **Head**: dense logits read from ``z*``.

:func:`classifier_fns` turns the module into the pure functions a training loop needs (loss with
the optional Jacobian regulariser, per-example evaluation, and occasional DEQ diagnostics).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import haiku as hk
import jax
import jax.numpy as jnp
import optax

from deqjax._src import adjoints, checks, initializers
from deqjax._src import jacobian as jacobian_lib
from deqjax._src import jacobian_regularization as jr_lib
from deqjax._src.nn import deq as deq_lib
from deqjax._src.nn import mlp_cell
from deqjax._src.solvers import base
from deqjax._src.solvers.solution import CONVERGED
from deqjax._src.solvers.summary import summarize

INIT_FAMILIES = {
    "gaussian": initializers.Gaussian,
    "orthogonal": initializers.HaarOrthogonal,
    "goe": initializers.GOE,
}


def recurrent_init(family: str, scale: float) -> hk.initializers.Initializer:
    """The recurrent-weight initializer: ``family`` in ``gaussian | orthogonal | goe`` at σ.

    Raises:
      ValueError: for an unknown family or an invalid scale (named).
    """
    if family not in INIT_FAMILIES:
        raise ValueError(f"init family must be one of {sorted(INIT_FAMILIES)}, got {family!r}.")
    return INIT_FAMILIES[family](scale)


class MLPClassifier(hk.Module):
    """The §4.1 classifier (module docstring): ``images -> (logits [B, C], DEQOutput)``.

    Args:
      width: state size ``D`` of the DEQ layer.
      num_classes: number of logits ``C``.
      hidden: hidden size of the ResNet cell (None: ``D``; GOE needs ``hidden == width``).
      cell_form: ``"resnet"`` (§4.1) or ``"single"`` (``φ(W z + U x)``).
      w_init: initializer of the recurrent weights (None: Haar-orthogonal at σ = 1).
      solver: the forward solver (e.g. ``dq.solvers.Anderson(max_steps=20, tol=1e-3)``).
      adjoint: how gradients flow through ``z*`` (default ``dq.ImplicitAdjoint()``).
      per_example: ``dq.nn.DEQ``'s batching mode (default: batch-native per-example stopping).

    Example:
      >>> def forward(images):
      ...     return dq.models.MLPClassifier(128, solver=dq.solvers.Anderson(tol=1e-3))(images)
    """

    def __init__(
        self,
        width: int = 128,
        num_classes: int = 10,
        *,
        hidden: int | None = None,
        cell_form: str = "resnet",
        w_init: hk.initializers.Initializer | None = None,
        solver: base.Solver | None = None,
        adjoint: Any = None,
        per_example: bool | str = True,
        name: str | None = None,
    ):
        super().__init__(name=name)
        checks.check_positive_int(width, "width")
        checks.check_positive_int(num_classes, "num_classes")
        if cell_form not in ("resnet", "single"):
            raise ValueError(f"cell_form must be 'resnet' or 'single', got {cell_form!r}.")
        self.width, self.num_classes, self.hidden, self.cell_form = (
            width,
            num_classes,
            hidden,
            cell_form,
        )
        self.w_init = initializers.HaarOrthogonal(1.0) if w_init is None else w_init
        self.solver = solver
        self.adjoint = adjoints.ImplicitAdjoint() if adjoint is None else adjoint
        self.per_example = per_example

    def __call__(self, images: jax.Array) -> tuple[jax.Array, deq_lib.DEQOutput]:
        x = images.reshape(images.shape[0], -1).astype(jnp.float32)  # [B, P]
        cell = mlp_cell.MLPCell(self.hidden, form=self.cell_form, w_init=self.w_init)
        width = self.width
        deq = deq_lib.DEQ(
            cell,
            solver=self.solver,
            adjoint=self.adjoint,
            per_example=self.per_example,
            init_state=lambda x_: jnp.zeros((x_.shape[0], width), x_.dtype),
            name="deq",
        )
        out = deq.solve(x)  # z_star [B, D]
        dtype = out.z_star.dtype
        w_init = hk.initializers.VarianceScaling(1.0, "fan_in", "truncated_normal")
        with hk.experimental.name_scope("head"):
            w = hk.get_parameter("w", [width, self.num_classes], dtype, init=w_init)
            b = hk.get_parameter("b", [self.num_classes], dtype, init=jnp.zeros)
        self.head_params = (w, b)
        return out.z_star @ w + b[None, :], out


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


def _accuracy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    return (jnp.argmax(logits, -1).astype(labels.dtype) == labels).astype(jnp.float32)


def classifier_fns(
    make_model: Callable[[], MLPClassifier],
    *,
    regularizer: jr_lib.JacobianRegularizer | None = None,
    backward_solver: base.Solver | None = None,
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

    def loss_fn(images, labels, key, gamma, step):
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

    def eval_fn(images, labels):
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

    def diagnostics_fn(images, labels, key):
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

    t = lambda fn: hk.without_apply_rng(hk.transform(fn))  # noqa: E731
    return ClassifierFns(
        init=t(lambda images: make_model()(images)[0]).init,
        loss=t(loss_fn).apply,
        evaluate=t(eval_fn).apply,
        diagnostics=t(diagnostics_fn).apply,
    )
