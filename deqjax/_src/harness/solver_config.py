"""The forward solver and the gradient through z*, chosen by the gradient's name.

:func:`solver_and_adjoint` is the one place a gradient name (:data:`GRADIENTS`, the table of
docs/guide/gradients.md) becomes a ``(forward solver, adjoint)`` pair; :class:`SolverConfig` is the
configuration section of its flags (``--max_steps --tol --anderson_m --stop_mode --bwd_max_steps
--bwd_tol --adjoint --adjoint_steps``) and builds the pair with its backward Anderson solver.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import ClassVar, Literal

from deqjax._src.adjoints.base import Adjoint
from deqjax._src.adjoints.implicit import ImplicitAdjoint
from deqjax._src.adjoints.one_step import OneStepAdjoint
from deqjax._src.adjoints.phantom import PhantomAdjoint
from deqjax._src.adjoints.reversible import ReversibleAdjoint
from deqjax._src.adjoints.shine import ShineAdjoint
from deqjax._src.adjoints.unrolled import UnrolledAdjoint
from deqjax._src.harness.flag_types import NonNegativeInt, PositiveFloat, PositiveInt
from deqjax._src.solvers.anderson import Anderson
from deqjax._src.solvers.base import Solver
from deqjax._src.solvers.broyden import Broyden
from deqjax._src.solvers.fixed_point_iteration import FixedPointIteration
from deqjax._src.solvers.reversible import Reversible

Gradient = Literal["implicit", "phantom", "one_step", "unrolled", "shine", "reversible"]
# The gradient strategies selectable by name (``--adjoint``), the table of docs/guide/gradients.md.
GRADIENTS: tuple[str, ...] = typing.get_args(Gradient)


def solver_and_adjoint(
    name: str,
    *,
    max_steps: int,
    tol: float,
    stop_mode: str = "rel",
    m: int = 5,
    backward: Solver | None = None,
    steps: int | None = None,
    tau: float = 0.5,
) -> tuple[Solver, Adjoint]:
    """``(forward solver, adjoint)`` for the gradient named ``name`` (one of :data:`GRADIENTS`).

    Three gradients need their own forward solver, built with the same ``max_steps``, ``tol`` and
    ``stop_mode``: ``"unrolled"`` runs fixed-point iteration (backprop through Anderson's or
    Broyden's steps is not a gradient of the fixed point, see ``dq.UnrolledAdjoint``),
    ``"shine"`` runs Broyden with ``return_inverse=True`` (SHINE reuses its
    inverse estimate, no fallback: the estimate's gradient as it is, refined by ``steps``
    adjoint iterations), ``"reversible"`` runs the reversible solver (its ``max_steps`` counts
    ``f`` evaluations, two per step of the paper). The others use Anderson with memory ``m``;
    ``"implicit"`` solves the backward with ``backward`` (None: the forward's kind),
    ``"phantom"`` differentiates ``steps`` (default 5) damped steps of damping ``tau``.

    Raises:
      ValueError: if ``name`` is not one of :data:`GRADIENTS`.
    """
    common = {"max_steps": max_steps, "tol": tol, "stop_mode": stop_mode}
    if name == "shine":
        broyden = Broyden(return_inverse=True, **common)
        return broyden, ShineAdjoint(refine_steps=steps or 0, fallback=None)
    if name == "reversible":
        return Reversible(**common), ReversibleAdjoint()
    if name == "unrolled":
        return FixedPointIteration(**common), UnrolledAdjoint()
    anderson = Anderson(m=m, **common)
    if name == "implicit":
        return anderson, ImplicitAdjoint(solver=backward)
    if name == "phantom":
        return anderson, PhantomAdjoint(steps=5 if steps is None else steps, tau=tau)
    if name == "one_step":
        return anderson, OneStepAdjoint()
    raise ValueError(f"adjoint must be one of {GRADIENTS}, got {name!r}.")


@dataclasses.dataclass(frozen=True)
class SolverConfig:
    """Solvers: the forward solve, the gradient through z* and its backward solve."""

    # Its tolerance flags: a --dtype that cannot resolve their defaults picks ones it can.
    TOLERANCES: ClassVar[tuple[str, ...]] = ("tol", "bwd_tol")

    max_steps: PositiveInt = 20  # forward steps
    tol: PositiveFloat = 1e-3  # forward tolerance
    anderson_m: PositiveInt = 5  # Anderson memory
    stop_mode: Literal["rel", "abs"] = "rel"  # stop on the relative or the absolute residual
    bwd_max_steps: PositiveInt = 20  # backward Anderson steps
    bwd_tol: PositiveFloat = 1e-3  # backward (implicit) tolerance
    adjoint: Gradient = "implicit"
    """gradient through z* (shine: Broyden forward; reversible: the reversible solver forward)"""
    adjoint_steps: NonNegativeInt | None = None
    """phantom: damped steps (default 5); shine: refinement steps (default 0)"""

    def backward(self) -> Anderson:
        """The Anderson backward solver of ``--bwd_max_steps --bwd_tol`` (the implicit
        gradient's, and the backward-convergence diagnostic of every gradient)."""
        return Anderson(
            max_steps=self.bwd_max_steps,
            tol=self.bwd_tol,
            m=self.anderson_m,
            stop_mode=self.stop_mode,
        )

    def solver_and_adjoint(self) -> tuple[Solver, Adjoint]:
        """``(forward solver, adjoint)`` of ``--adjoint`` (:func:`solver_and_adjoint`); the
        implicit gradient's backward is :meth:`backward`."""
        return solver_and_adjoint(
            self.adjoint,
            max_steps=self.max_steps,
            tol=self.tol,
            stop_mode=self.stop_mode,
            m=self.anderson_m,
            backward=self.backward(),
            steps=self.adjoint_steps,
        )
