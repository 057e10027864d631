"""The fully connected DEQ classifier of the initialisation paper (§4.1) in Flax NNX, and the pure
functions a training loop needs from it (the NNX counterpart of ``dq.models.MLPClassifier`` and
``dq.models.classifier_fns``).

``images [B, ...] -> flatten -> x [B, P] -> z* = f(z*; x) (MLPCell in DEQ) -> z* W + b``, the
same equations and parameter names as the Haiku classifier's; :func:`classifier_fns` gives the
same :class:`~deqjax.models.ClassifierFns` signatures and metrics (the framework-free
:mod:`deqjax._src.classifier_objective`), its ``params`` the model's ``nnx.State``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from deqjax._src import checks
from deqjax._src import classifier_objective as objective
from deqjax._src import jacobian_regularization as jr_lib
from deqjax._src.cells import layers
from deqjax._src.classifier_objective import ClassifierFns
from deqjax._src.deq.deq_config import ANDERSON
from deqjax._src.deq.deq_output import DEQOutput
from deqjax._src.frontends import nnx_cells, nnx_deq
from deqjax._src.initializers import HaarOrthogonal
from deqjax._src.normalise import as_solver


class MLPClassifier(nnx.Module):
    """The §4.1 classifier: ``images -> (logits [B, C], DEQOutput)``.

    Args:
      in_features: the number of pixels ``P`` of an image (the flattened width).
      width: state size ``D`` of the DEQ layer.
      num_classes: number of logits ``C``.
      hidden: hidden size of the ResNet cell (``None``: ``D``).
      cell_form: ``"resnet"`` (§4.1) or ``"single"`` (``φ(W z + U x)``).
      w_init: initializer of the recurrent weights (``None``: Haar-orthogonal at σ = 1).
      solver, adjoint, per_example, precision: as ``deqjax.nnx.DEQ``'s (``solver`` ``None``:
        ``dq.solvers.Anderson()``).
      dtype: the compute dtype (``None``: the parameters').
      param_dtype: the parameters' dtype.
      rngs: the ``params`` stream draws the weights.

    Example:
      >>> model = deqjax.nnx.MLPClassifier(784, 128, rngs=nnx.Rngs(0))
      >>> logits, out = model(images)            # images [B, 28, 28]
    """

    def __init__(
        self,
        in_features: int,
        width: int = 128,
        num_classes: int = 10,
        *,
        hidden: int | None = None,
        cell_form: str = "resnet",
        w_init: layers.Initializer | None = None,
        solver: Any = None,
        adjoint: Any = None,
        per_example: bool = True,
        precision: str | None = None,
        dtype: Any = None,
        param_dtype: Any = jnp.float32,
        rngs: nnx.Rngs,
    ):
        checks.check_positive_int(num_classes, "num_classes")
        if cell_form not in ("resnet", "single"):
            raise ValueError(f"cell_form must be 'resnet' or 'single', got {cell_form!r}.")
        cell = nnx_cells.MLPCell(
            in_features,
            width,
            hidden_features=hidden,
            form=cell_form,
            w_init=HaarOrthogonal(1.0) if w_init is None else w_init,
            dtype=dtype,
            param_dtype=param_dtype,
            rngs=rngs,
        )
        self.deq = nnx_deq.DEQ(
            cell,
            solver=ANDERSON if solver is None else solver,
            adjoint=adjoint,
            per_example=per_example,
            precision=precision,
        )
        w = layers.lecun_truncated_normal(rngs.params(), (width, num_classes), param_dtype)
        self.head = nnx.data({"w": nnx.Param(w), "b": nnx.Param(jnp.zeros(num_classes, w.dtype))})
        self.dtype = dtype

    def logits(self, z: jax.Array) -> jax.Array:
        """The dense head ``z W + b``: ``[B, D] -> [B, C]``."""
        w, b = self.head["w"][...], self.head["b"][...]
        if self.dtype is not None:
            w, b = w.astype(self.dtype), b.astype(self.dtype)
        return z @ w + b[None, :]

    def __call__(
        self, images: jax.Array, *, backward_stats: Any = None
    ) -> tuple[jax.Array, DEQOutput]:
        """``(logits [B, C], the DEQ's DEQOutput)`` of ``images [B, ...]``."""
        dtype = self.dtype or self.head["w"][...].dtype
        x = images.reshape(images.shape[0], -1).astype(dtype)  # [B, P]
        out = self.deq.solve(x, backward_stats=backward_stats)
        return self.logits(out.z_star), out


MakeModel = Callable[[int, nnx.Rngs], MLPClassifier]


def classifier_fns(
    make_model: MakeModel,
    *,
    regularizer: jr_lib.JacobianRegularizer | None = None,
    backward_solver: Any = None,
    diag_probes: int = 2,
    diag_power_steps: int = 30,
) -> ClassifierFns:
    """The training, evaluation and diagnostic functions of ``make_model``'s classifier, as
    ``dq.models.classifier_fns`` gives them for Haiku (same signatures, same metrics).

    Args:
      make_model: ``(in_features, rngs) -> MLPClassifier`` (e.g.
        ``lambda p, rngs: deqjax.nnx.MLPClassifier(p, 128, solver=..., rngs=rngs)``).
      regularizer, backward_solver, diag_probes, diag_power_steps: as
        ``dq.models.classifier_fns``'s.

    Returns:
      :class:`~deqjax.models.ClassifierFns` whose ``params`` are the model's ``nnx.State``
      (``init(key, images)``), a pytree for optax.
    """
    if backward_solver is not None:
        backward_solver = as_solver(backward_solver, name="backward_solver")

    @functools.lru_cache(maxsize=8)
    def graphdef(in_features: int) -> Any:
        abstract = nnx.eval_shape(lambda: make_model(in_features, nnx.Rngs(0)))
        return nnx.split(abstract)[0]

    def model(params: Any, images: jax.Array) -> MLPClassifier:
        return nnx.merge(graphdef(objective.flat_width(images)), params)

    def init(key: jax.Array, images: jax.Array) -> Any:
        return nnx.state(make_model(objective.flat_width(images), nnx.Rngs(key)))

    return objective.module_fns(
        model,
        init,
        regularizer=regularizer,
        backward_solver=backward_solver,
        probes=diag_probes,
        power_steps=diag_power_steps,
    )
