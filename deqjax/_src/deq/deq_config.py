"""The settings of a DEQ layer, checked once where the user passes them, in every framework.

``dq.nn.DEQ``, ``deqjax.nnx.DEQ`` and ``deqjax.equinox.DEQ`` take the same keywords (``solver``,
``adjoint``, ``eval_solver``, ``per_example``, ``init_state``, ``precision``) and hold them as one
frozen, hashable :class:`DEQConfig` (an Equinox static field, an NNX static attribute): solvers
become solver objects once (:func:`~deqjax._src.normalise.as_solver`), the defaults are resolved,
and from there on the layer reads declared fields only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from deqjax._src import checks, tree
from deqjax._src import precision as precision_lib
from deqjax._src.adjoints.base import Adjoint
from deqjax._src.adjoints.implicit import ImplicitAdjoint
from deqjax._src.normalise import as_solver
from deqjax._src.solvers.anderson import Anderson
from deqjax._src.solvers.base import Solver

PyTree = Any

ANDERSON = Anderson()  # the default forward solver


@dataclasses.dataclass(frozen=True)
class DEQConfig:
    """A DEQ layer's checked settings (see ``dq.nn.DEQ`` for each).

    Attributes:
      solver: the forward solver when training, a solver object.
      eval_solver: the solver when not training (``solver`` when none was given).
      adjoint: the gradient strategy (``dq.ImplicitAdjoint()`` when none was given).
      per_example: each example stops on its own (``False``: one solve for the whole batch).
      init_state: ``x -> z0`` when no ``z0`` is given, or ``None``.
      precision: the cell's matmul precision in every evaluation (``None``: the ambient one).
    """

    solver: Solver
    eval_solver: Solver
    adjoint: Adjoint
    per_example: bool = True
    init_state: Callable[[PyTree], PyTree] | None = None
    precision: str | None = None

    def solver_for(self, is_training: bool) -> Solver:
        """``solver`` when training, else ``eval_solver``."""
        return self.solver if is_training else self.eval_solver

    def start(self, cell: Any, x: PyTree, z0: PyTree | None) -> PyTree:
        """The pass's initial state, checked: ``z0`` if given, else ``init_state(x)``, else the
        cell's ``initial_state(x)`` if it has one, else ``zeros_like(x)``.

        Raises:
          ValueError: for a ``z0`` (given or made) that is not a float or complex pytree,
            naming where it came from.
        """
        if z0 is not None:
            tree.check_state_tree(z0, "z0")
            return z0
        if self.init_state is not None:
            z0, made_by = self.init_state(x), "init_state(x)"
        elif hasattr(cell, "initial_state"):
            z0, made_by = cell.initial_state(x), "cell.initial_state(x)"
        else:
            z0, made_by = jax.tree_util.tree_map(jnp.zeros_like, x), "zeros_like(x)"
        tree.check_state_tree(z0, f"z0 = {made_by} (no z0 was given)")
        return z0


def checked_config(
    cell: Any,
    *,
    solver: Any,
    adjoint: Any,
    eval_solver: Any,
    per_example: Any,
    init_state: Any,
    precision: Any,
) -> DEQConfig:
    """The :class:`DEQConfig` of a layer's constructor arguments, each checked and normalised.

    Raises:
      ValueError: naming the argument, if ``cell``, ``solver``, ``eval_solver`` or
        ``init_state`` is not callable, ``adjoint`` is not a deqjax adjoint, ``per_example`` is
        not a bool, or ``precision`` is not a matmul precision.
    """
    if not callable(cell):
        raise ValueError(f"cell must be callable, got {type(cell).__name__}.")
    solver = as_solver(solver, name="solver")
    if eval_solver is not None:
        eval_solver = as_solver(eval_solver, name="eval_solver")
    if adjoint is not None and not isinstance(adjoint, Adjoint):
        raise ValueError(f"adjoint must be a deqjax adjoint object, got {adjoint!r}.")
    if init_state is not None and not callable(init_state):
        raise ValueError(f"init_state must be callable or None, got {init_state!r}.")
    return resolved_config(
        solver=solver,
        eval_solver=eval_solver,
        adjoint=adjoint,
        per_example=checks.check_bool(per_example, "per_example"),
        init_state=init_state,
        precision=precision_lib.check_precision(precision),
    )


def resolved_config(
    *,
    solver: Solver,
    eval_solver: Solver | None,
    adjoint: Adjoint | None,
    per_example: bool = True,
    init_state: Callable[[PyTree], PyTree] | None = None,
    precision: str | None = None,
) -> DEQConfig:
    """The :class:`DEQConfig` of settings already checked (no second check); ``None`` takes the
    defaults: ``eval_solver`` is ``solver``, ``adjoint`` is ``dq.ImplicitAdjoint()``."""
    return DEQConfig(
        solver=solver,
        eval_solver=solver if eval_solver is None else eval_solver,
        adjoint=ImplicitAdjoint() if adjoint is None else adjoint,
        per_example=per_example,
        init_state=init_state,
        precision=precision,
    )
