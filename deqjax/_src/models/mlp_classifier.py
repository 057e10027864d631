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

:func:`~deqjax.models.classifier_fns` turns the module into the pure functions a training loop
needs.
"""

from __future__ import annotations

from typing import Any

import haiku as hk
import jax
import jax.numpy as jnp

from deqjax._src import checks, classifier_settings, initializers
from deqjax._src.nn import deq as deq_lib
from deqjax._src.nn import mlp_cell

_FAMILIES = {
    "gaussian": initializers.Gaussian,
    "orthogonal": initializers.HaarOrthogonal,
    "goe": initializers.GOE,
}
INIT_FAMILIES = tuple(_FAMILIES)  # the families recurrent_init takes


def recurrent_init(family: str, scale: float) -> hk.initializers.Initializer:
    """The recurrent-weight initializer: ``family`` in ``gaussian | orthogonal | goe`` at σ.

    Raises:
      ValueError: for an unknown family or an invalid scale (named).
    """
    if family not in _FAMILIES:
        raise ValueError(f"init family must be one of {sorted(_FAMILIES)}, got {family!r}.")
    return _FAMILIES[family](scale)


class MLPClassifier(hk.Module):
    """The §4.1 classifier (module docstring): ``images -> (logits [B, C], DEQOutput)``.

    Args:
      width: state size ``D`` of the DEQ layer.
      num_classes: number of logits ``C``.
      hidden: hidden size of the ResNet cell (None: ``D``; GOE needs ``hidden == width``).
      cell_form: ``"resnet"`` (§4.1) or ``"single"`` (``φ(W z + U x)``).
      w_init: initializer of the recurrent weights (None: Haar-orthogonal at σ = 1).
      solver: the forward solver (e.g. ``dq.solvers.Anderson(max_steps=20, tol=1e-3)``;
        ``None``: ``dq.solvers.Anderson()``).
      adjoint: how gradients flow through ``z*`` (default ``dq.ImplicitAdjoint()``).
      per_example: ``dq.nn.DEQ``'s ``per_example`` (default ``True``: each example stops on its
        own).

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
        solver: Any = None,
        adjoint: Any = None,
        per_example: bool = True,
        name: str | None = None,
    ):
        super().__init__(name=name)
        checks.check_positive_int(width, "width")
        self.w_init, self.solver = classifier_settings.checked(
            num_classes, cell_form, w_init, solver
        )
        self.width, self.num_classes, self.hidden, self.cell_form = (
            width,
            num_classes,
            hidden,
            cell_form,
        )
        self.adjoint = adjoint
        self.per_example = per_example

    def __call__(self, images: jax.Array) -> tuple[jax.Array, deq_lib.DEQOutput]:
        policy = hk.mixed_precision.current_policy()  # e.g. bfloat16 compute (--dtype)
        dtype = jnp.float32 if policy is None else policy.compute_dtype
        x = images.reshape(images.shape[0], -1).astype(dtype)  # [B, P]
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
