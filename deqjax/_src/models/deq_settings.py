"""How a model solves its DEQ: the forward and evaluation solvers, the adjoint, the Jacobian
regulariser and the cell's matmul precision, one value that every model takes as its ``deq=``
(``dq.models.MDEQClassifier``, ``dq.models.SequenceBackbone``, ``dq.models.SequenceModel``).

:class:`DEQSettings` checks and normalises its fields once, when it is built (solvers become
objects, ``precision`` is checked); :meth:`DEQSettings.solve` runs ``dq.nn.DEQ(cell).solve(x)``
with them (no second check) and returns the JR penalty (JR paper Eq. 4) as entries of the
model's ``aux`` dict (:func:`jr_terms`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import haiku as hk
import jax
import jax.numpy as jnp

from deqjax._src import jacobian_regularization as jr_lib
from deqjax._src import precision as precision_lib
from deqjax._src import tree
from deqjax._src.adjoints.base import Adjoint
from deqjax._src.nn import deq as deq_lib
from deqjax._src.normalise import as_solver
from deqjax._src.solvers.anderson import Anderson

JR_KEYS = ("jr", "jr/frobenius_sq", "jr/applied")


@dataclasses.dataclass(frozen=True)
class DEQSettings:
    """The solve of a model's DEQ: what a model passes to its ``dq.nn.DEQ``, and its JR penalty.

    A frozen value (it compares, hashes and prints), checked once when built; a model takes it
    as one keyword, ``deq=``.

    Attributes:
      solver: forward solver used when ``is_training=True`` (``None``: ``dq.solvers.Anderson()``),
        held as a solver object.
      eval_solver: solver used when ``is_training=False`` (``None``: ``solver``).
      adjoint: the DEQ's gradient strategy (``None``: ``dq.ImplicitAdjoint()``).
      regularizer: JR penalty computed when ``is_training`` (``None``: none).
      precision: the cell's matmul precision in every evaluation (``None``: JAX's default; see
        ``dq.nn.DEQ``).

    Raises:
      ValueError: for a solver that is not one, an ``adjoint`` that is not a deqjax adjoint, a
        ``regularizer`` that is not a ``dq.regularization.JacobianRegularizer``, or a
        ``precision`` that is not a matmul precision.

    Example:
      >>> deq = dq.models.DEQSettings(
      ...     dq.solvers.Anderson(max_steps=6, tol=1e-3),
      ...     eval_solver=dq.models.budget_solver(4, tol=1e-3),
      ...     regularizer=dq.regularization.JacobianRegularizer(1.0, p=0.5),
      ... )
      >>> model = dq.models.MDEQClassifier((8, 16), deq=deq)  # inside hk.transform
    """

    solver: Any = None
    eval_solver: Any = None
    adjoint: Any = None
    regularizer: jr_lib.JacobianRegularizer | None = None
    precision: str | None = None

    def __post_init__(self):
        object.__setattr__(self, "precision", precision_lib.check_precision(self.precision))
        solver = Anderson() if self.solver is None else self.solver
        object.__setattr__(self, "solver", as_solver(solver, name="solver"))
        if self.eval_solver is not None:
            eval_solver = as_solver(self.eval_solver, name="eval_solver")
            object.__setattr__(self, "eval_solver", eval_solver)
        if self.adjoint is not None and not isinstance(self.adjoint, Adjoint):
            raise ValueError(f"adjoint must be a deqjax adjoint object, got {self.adjoint!r}.")
        if self.regularizer is not None and not isinstance(
            self.regularizer, jr_lib.JacobianRegularizer
        ):
            raise ValueError(
                f"regularizer must be a dq.regularization.JacobianRegularizer or None, got "
                f"{self.regularizer!r}."
            )

    def solve(
        self,
        cell: deq_lib.Cell,
        x: Any,
        *,
        is_training: bool,
        step: jax.Array | None,
        name: str | None = None,
    ) -> tuple[deq_lib.DEQOutput, dict[str, jax.Array]]:
        """``dq.nn.DEQ(cell).solve(x)`` with these settings, checked when they were built (call
        inside a Haiku transform).

        Args:
          cell: the DEQ's cell.
          x: the DEQ's input.
          is_training: ``solver`` (and the JR penalty) vs ``eval_solver``; passed to the cell.
          step: the training step, for a ``regularizer`` whose ``gamma`` is a schedule.
          name: the DEQ module's name.

        Returns:
          ``(out, jr)``: the :class:`~deqjax.nn.DEQOutput` and :func:`jr_terms` of it.
        """
        deq = deq_lib.CheckedDEQ(
            cell,
            solver=self.solver,
            eval_solver=self.eval_solver,
            adjoint=self.adjoint,
            precision=self.precision,
            name=name,
        )
        out = deq.solve(x, is_training=is_training)
        return out, jr_terms(self.regularizer, out, is_training, step)


def check_settings(deq: DEQSettings | None) -> DEQSettings:
    """A model's ``deq=``: ``deq`` itself, or ``DEQSettings()`` for ``None``.

    Raises:
      ValueError: if ``deq`` is neither ``None`` nor a ``DEQSettings`` (e.g. a solver passed
        where its settings are expected).
    """
    if deq is None:
        return DEQSettings()
    if not isinstance(deq, DEQSettings):
        raise ValueError(
            "deq must be a dq.models.DEQSettings (e.g. dq.models.DEQSettings(solver, "
            f"regularizer=...)) or None, got {deq!r}."
        )
    return deq


def jr_terms(
    regularizer: jr_lib.JacobianRegularizer | None,
    out: deq_lib.DEQOutput,
    is_training: bool,
    step: jax.Array | None,
) -> dict[str, jax.Array]:
    """``{"jr": τ γ ‖J_f(z*)‖²_F / d, "jr/frobenius_sq": estimate, "jr/applied": τ}`` of
    ``regularizer`` at this forward pass's ``z*`` (call inside ``hk.transform``; the key is
    ``hk.next_rng_key()``); zeros without a regularizer or when not ``is_training``.

    The gate ``τ ~ Bernoulli(p)`` is drawn in-graph (one compiled step for both outcomes).
    """
    if regularizer is None or not is_training:
        zero = jnp.zeros((), tree.reduction_dtype(out.z_star))
        return dict.fromkeys(JR_KEYS, zero)
    term, metrics = regularizer.penalty(out.cell_fn, out.z_star, hk.next_rng_key(), step)
    return {
        "jr": term,
        "jr/frobenius_sq": metrics["jr/frobenius_sq"],
        "jr/applied": metrics["jr/applied"],
    }
