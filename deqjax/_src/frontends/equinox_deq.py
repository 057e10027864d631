"""``deqjax.equinox.DEQ``: an Equinox module whose output is the equilibrium of an Equinox cell.

The layer of ``dq.nn.DEQ`` for Equinox, on the same framework-free forward pass
(:mod:`deqjax._src.deq.forward_pass`): the same settings, batching modes, ``Solution``, cell map
and backward statistics. What Equinox changes:

* **Parameters.** The cell is a field of the DEQ, so its arrays are the DEQ's leaves
  (``eqx.filter(deq, eqx.is_inexact_array)``, ``eqx.filter_value_and_grad``). Each pass
  partitions the cell (``eqx.partition(cell, eqx.is_array)``) and solves with its arrays as the
  operands of :func:`deqjax.fixed_point` and ``eqx.combine`` inside ``f``: the implicit gradient
  reaches every array, and an eager call (no ``eqx.filter_jit``) runs the cached compiled solve
  with the cell's current arrays.
* **Train and eval.** ``inference`` (a field, set by ``eqx.nn.inference_mode(model)``, or a call
  argument) selects ``eval_solver`` and is passed to the cell as ``inference=`` when it accepts
  that keyword.
* **Randomness.** ``key`` (a call argument, as Equinox layers take it) is the pass's key in
  training, passed to the cell as ``key=`` when it accepts that keyword: the same key at every
  evaluation of the pass (the vmap mode splits it per example).
* **Phases.** A cell with ``prepare(x, **kw) -> ctx`` and ``step(z, ctx) -> z`` methods (the
  ``MLPCell`` and ``TransformerCell`` of ``deqjax.equinox``) has ``prepare`` run once per pass,
  outside the solver loop (see :mod:`deqjax._src.deq.phases`); ``prepare`` gets the keywords.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax

from deqjax._src import checks
from deqjax._src.adjoints.base import Adjoint
from deqjax._src.deq import forward_pass
from deqjax._src.deq.deq_config import ANDERSON, DEQConfig, checked_config
from deqjax._src.deq.deq_output import DEQOutput
from deqjax._src.deq.phases import ModuleCall
from deqjax._src.solvers.solution import Solution

PyTree = Any
LAYER = "deqjax.equinox.DEQ"


class DEQ(eqx.Module):
    """Deep equilibrium layer ``z* = f_θ(z*; x)`` for an Equinox cell (DEQ paper, Eq. 3-4).

    See the module docstring for parameters, train/eval, randomness and phases, and
    ``dq.nn.DEQ`` for the cell protocol (written for batched arrays ``[B, ...]``: vmap an
    Equinox layer written per example inside the cell), the batching modes and the initial
    state.

    Args:
      cell: an ``eqx.Module`` (or any pytree callable) called as ``cell(z, x) -> z``
        (optionally with ``key=`` and ``inference=`` keywords), or with ``prepare``/``step``
        methods.
      solver: forward solver when training (a solver object such as
        ``dq.solvers.Anderson(max_steps=30, tol=1e-3)``, a solver function or a
        ``functools.partial`` of one, or a user's ``(f, z0) -> Solution``).
      adjoint: gradient strategy (``None``: ``dq.ImplicitAdjoint()``).
      eval_solver: solver when ``inference`` (``None``: ``solver``).
      per_example: ``True`` (default): each example stops on its own; ``False``: one solve for
        the whole batch (see ``dq.nn.DEQ``).
      init_state: ``x -> z0`` when no ``z0`` is given (``None``: the cell's ``initial_state(x)``
        if it has one, else ``zeros_like(x)``).
      precision: the cell's matmul precision in every evaluation (``None``: JAX's default).
      inference: start in inference mode (``eval_solver``, no dropout).

    Raises:
      ValueError: for the settings ``dq.nn.DEQ`` refuses, or a non-bool ``inference``.

    Example:
      >>> cell = deqjax.equinox.MLPCell(784, 128, key=jax.random.key(0))
      >>> deq = deqjax.equinox.DEQ(cell, solver=dq.solvers.Anderson(max_steps=30, tol=1e-4))
      >>> z_star, sol = deq(x)                      # x: [B, 784] -> z_star: [B, 128]
    """

    cell: Any
    inference: bool
    config: DEQConfig = eqx.field(static=True)
    cell_call: ModuleCall = eqx.field(static=True)

    def __init__(
        self,
        cell: Any,
        *,
        solver: Any = ANDERSON,
        adjoint: Adjoint | None = None,
        eval_solver: Any = None,
        per_example: bool = True,
        init_state: Callable[[PyTree], PyTree] | None = None,
        precision: str | None = None,
        inference: bool = False,
    ):
        self.config = checked_config(
            cell,
            solver=solver,
            adjoint=adjoint,
            eval_solver=eval_solver,
            per_example=per_example,
            init_state=init_state,
            precision=precision,
        )
        self.cell = cell
        self.inference = checks.check_bool(inference, "inference")
        self.cell_call = ModuleCall.of(cell, "inference")

    def __call__(
        self,
        x: PyTree,
        z0: PyTree | None = None,
        *,
        key: jax.Array | None = None,
        inference: bool | None = None,
        backward_stats: Any = None,
    ) -> tuple[PyTree, Solution]:
        """Solves for the equilibrium; returns ``(z_star, solution)`` as ``dq.nn.DEQ`` does.

        Args:
          x: the input, a pytree with a leading batch axis ``[B, ...]``.
          z0: initial state; ``None``: see ``init_state``.
          key: the pass's key in training (for the cell's dropout), or ``None``.
          inference: overrides the field (``True``: ``eval_solver``, no key).
          backward_stats: a :class:`~deqjax.BackwardStats` probe: differentiate the loss with
            respect to it to receive the implicit backward solves' statistics.

        Raises:
          ValueError: as ``dq.nn.DEQ``: a ``z0`` that is not a state, leaves without a common
            batch axis in per-example mode.
        """
        out = self.solve(x, z0, key=key, inference=inference, backward_stats=backward_stats)
        return out.z_star, out.solution

    def solve(
        self,
        x: PyTree,
        z0: PyTree | None = None,
        *,
        key: jax.Array | None = None,
        inference: bool | None = None,
        backward_stats: Any = None,
    ) -> DEQOutput:
        """The forward pass of ``__call__``, returned as a :class:`~deqjax.nn.DEQOutput` with
        this pass's cell map ``cell_fn`` and ``f_star = f(z*)``.

        Jacobian regularisation (JR paper Eq. 4):
        ``reg.penalty(out.cell_fn, out.z_star, key, step)`` with a
        :class:`~deqjax.regularization.JacobianRegularizer`, in the same trace.
        """
        inf = checks.check_bool(self.inference if inference is None else inference, "inference")
        params, static = eqx.partition(self.cell, eqx.is_array)
        bind = functools.partial(eqx.combine, static)
        phases = self.cell_call.cell(bind, inf, self.config.precision)
        return forward_pass.forward(
            self.config,
            self.cell,
            phases,
            params,
            x,
            z0,
            None if inf else key,
            is_training=not inf,
            backward_stats=backward_stats,
            layer=LAYER,
        )
