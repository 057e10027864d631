"""The multiscale DEQ (MDEQ) image classifier (Bai, Koltun & Kolter 2020, "Multiscale deep
equilibrium models" §3–4; the JR paper's CIFAR-10 recipe, App. A.3 / Table 4).

``images [B, H, W, C] -> stem -> x -> z* = f_θ(z*; x) (dq.nn.MultiscaleCell in dq.nn.DEQ) -> head``

* **Stem**: 3×3 conv with stride ``stem_stride`` (no bias), GroupNorm, ReLU. Stride 2 is MDEQ's
  input downsampling (the cell then runs at ``H/2`` and coarser).
* **Multiscale DEQ**: one :class:`~deqjax.nn.MultiscaleCell` (one state per resolution) solved per
  example by :class:`~deqjax.nn.DEQ`.
* **Readout**: the head reads a **cell output** ``f(z)``, never a raw solver iterate: ``f(z*)`` as
  the solver already evaluated it (``DEQOutput.f_star`` = ``Solution.f_value``), so the readout
  costs no extra cell application forward or backward. With the implicit adjoint its gradient is
  ``(I - J)⁻¹ ∂f/∂θ``, the gradient of an exact equilibrium (DEQ paper Theorem 1).
* **Head**: ReLU, average-pool every resolution to a ``head_grid × head_grid`` grid (1: global
  pooling), concatenate, one linear layer.

**Inference budget** (JR paper Table 3). "Budget ``b``" means the prediction depends on at most
``b`` evaluations of the cell: :func:`budget_solver` is Anderson with ``max_steps = b``, which
evaluates ``f`` at iterates ``z_0 … z_{k-1}`` (``k ≤ b``; fewer when it converges to ``tol``) and
returns ``z_best``, the evaluated iterate of lowest residual, with ``f(z_best)``. The head reads
``f(z_best)``, one of those ``k`` evaluations. ``b = 1`` evaluates only ``f(z0)`` (``z0 = 0``).
The NFE reported per example is ``k ≤ b``.

**Jacobian regularisation** (JR paper Eq. 4): with ``deq.regularizer`` (a
:class:`~deqjax.regularization.JacobianRegularizer`, its Bernoulli gate drawn in-graph) and
``is_training=True`` the model adds ``aux["jr"] = τ γ ‖J_f(z*)‖²_F / d`` (Hutchinson, at
``stop_gradient(z*)``); add it to the loss.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import haiku as hk
import jax
import jax.numpy as jnp

from deqjax._src import checks
from deqjax._src.models import deq_settings
from deqjax._src.nn import multiscale_cell, norms
from deqjax._src.solvers.anderson import Anderson
from deqjax._src.solvers.summary import summarize

PyTree = Any


def budget_solver(budget: int, *, tol: float, m: int = 5) -> Anderson:
    """The inference solver of budget ``budget``: ``dq.solvers.Anderson(max_steps=budget, tol=tol,
    m=m)`` (module docstring); the head reads ``f(z_best)``, so the prediction depends on
    ``≤ budget`` evaluations of the cell.

    Raises:
      ValueError: if ``budget`` is not an int ``>= 1``.
    """
    checks.check_positive_int(budget, "budget")
    return Anderson(max_steps=budget, tol=tol, m=m)


def _grid_pool(z: jax.Array, grid: int) -> jax.Array:
    """Average-pools ``[B, H, W, C]`` to a ``g × g`` grid (``g = min(grid, H, W)``) and flattens:
    ``[B, g²·C]``."""
    b, h, w, c = z.shape
    g = min(grid, h, w)
    z = z.reshape(b, g, h // g, g, w // g, c).mean(axis=(2, 4))
    return z.reshape(b, -1)


def _per_example_norm(tree_: PyTree) -> jax.Array:
    """Per-example L2 norm of a pytree of ``[B, ...]`` arrays: ``[B]``."""
    sq = [jnp.sum(jnp.square(a.reshape(a.shape[0], -1)), axis=1) for a in jax.tree.leaves(tree_)]
    return jnp.sqrt(functools.reduce(jnp.add, sq))


class MDEQClassifier(hk.Module):
    """MDEQ image classifier: stem, multiscale DEQ, ``f(z*)`` readout, pooled linear head.

    See the module docstring for the architecture, the readout and the inference budget.

    Args:
      channels: ``C_i`` per resolution of the :class:`~deqjax.nn.MultiscaleCell`, highest first;
        the stem outputs ``channels[0]``.
      num_classes: logits per image.
      num_groups: GroupNorm groups (stem and cell).
      expansion: the cell's residual-block channel expansion.
      dropout_rate: the cell's recurrent (variational) dropout.
      stem_stride: stride of the stem convolution (1 or 2).
      head_grid: the head pools every resolution to a ``head_grid × head_grid`` grid.
      deq: how the DEQ is solved, a :class:`~deqjax.models.DEQSettings`: the forward solver
        (e.g. ``dq.solvers.Anderson(max_steps=6, tol=1e-3)``), the evaluation solver (e.g.
        :func:`budget_solver`), the adjoint, the JR regulariser and the cell's precision
        (``None``: ``DEQSettings()``, Anderson and the implicit adjoint, no regulariser).
      name: Haiku module name.

    Raises:
      ValueError: for empty ``channels``, a non-positive ``num_classes``, ``head_grid`` or
        ``stem_stride``, or a ``deq`` that is not a ``DEQSettings``.

    Example:
      >>> deq = dq.models.DEQSettings(
      ...     dq.solvers.Anderson(max_steps=6, tol=1e-3),
      ...     eval_solver=dq.models.budget_solver(4, tol=1e-3))
      >>> def forward(images, is_training):
      ...     model = dq.models.MDEQClassifier((8, 16), deq=deq)
      ...     logits, aux = model(images, is_training=is_training)
      ...     return logits, aux["jr"]
    """

    def __init__(
        self,
        channels: Sequence[int] = (8, 16),
        *,
        num_classes: int = 10,
        num_groups: int = 4,
        expansion: int = 2,
        dropout_rate: float = 0.0,
        stem_stride: int = 2,
        head_grid: int = 4,
        deq: deq_settings.DEQSettings | None = None,
        name: str | None = None,
    ):
        super().__init__(name=name)
        channels = tuple(channels)
        if not channels:
            raise ValueError("channels must name at least one resolution, got ().")
        for arg, value in (
            ("num_classes", num_classes),
            ("head_grid", head_grid),
            ("stem_stride", stem_stride),
        ):
            checks.check_positive_int(value, arg)
        self.channels = channels
        self.num_classes = num_classes
        self.num_groups = num_groups
        self.expansion = expansion
        self.dropout_rate = dropout_rate
        self.stem_stride = stem_stride
        self.head_grid = head_grid
        self.deq_settings = deq_settings.check_settings(deq)

    def stem(self, images: jax.Array) -> jax.Array:
        """``[B, H, W, C] -> [B, H/s, W/s, channels[0]]``: conv (stride ``s``), GroupNorm, ReLU."""
        conv = hk.Conv2D(
            self.channels[0], 3, stride=self.stem_stride, with_bias=False, name="stem_conv"
        )
        return jax.nn.relu(norms.GroupNorm(self.num_groups, name="stem_gn")(conv(images)))

    def head(self, zs: Sequence[jax.Array]) -> jax.Array:
        """ReLU, grid pooling of every resolution, concatenation, one linear layer -> logits."""
        pooled = [_grid_pool(jax.nn.relu(z), self.head_grid) for z in zs]
        return hk.Linear(self.num_classes, name="classifier")(jnp.concatenate(pooled, axis=-1))

    def __call__(
        self, images: jax.Array, *, is_training: bool, step: jax.Array | None = None
    ) -> tuple[jax.Array, dict[str, Any]]:
        """Classifies ``images [B, H, W, C]`` (``H, W`` divisible by ``stem_stride · 2^(n-1)``).

        Args:
          images: float ``[B, H, W, C]``.
          is_training: ``deq.solver`` (and the JR penalty) vs ``deq.eval_solver``; dropout.
          step: the training step, for a ``deq.regularizer`` whose ``gamma`` is a schedule.

        Returns:
          ``(logits [B, num_classes], aux)``: ``aux["solver"]`` (``dq.solvers.summarize`` of
          the forward solve), ``aux["nfe"]`` ``[B]`` (cell evaluations the
          prediction depends on), ``aux["residual"]`` ``[B]`` (``‖f(z) - z‖ / ‖f(z)‖`` at the
          point read, gradient stopped), ``aux["jr"]`` (the scalar JR term to add to the loss;
          0 without a regularizer or at evaluation) and its metrics ``aux["jr/..."]``,
          ``aux["readout"]`` (the cell output the head read, one array per resolution).

        Raises:
          ValueError: if ``images`` is not 4-D.
        """
        if jnp.ndim(images) != 4:
            raise ValueError(f"images must be [B, H, W, C], got shape {jnp.shape(images)}.")
        x = self.stem(images)
        cell = multiscale_cell.MultiscaleCell(
            self.channels,
            num_groups=self.num_groups,
            expansion=self.expansion,
            dropout_rate=self.dropout_rate,
            name="mdeq_cell",
        )
        out, jr = self.deq_settings.solve(cell, x, is_training=is_training, step=step, name="deq")
        z_read = out.f_star  # f(z*), evaluated by the solver (no extra cell application)
        diff = jax.tree.map(jnp.subtract, z_read, out.z_star)
        residual = _per_example_norm(diff) / (_per_example_norm(z_read) + 1e-12)
        aux: dict[str, Any] = {
            "solver": summarize(out.solution),
            "nfe": out.solution.num_steps,
            "residual": jax.lax.stop_gradient(residual),
            "readout": z_read,
        }
        return self.head(z_read), aux | jr
