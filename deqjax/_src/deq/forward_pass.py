"""The forward pass of a DEQ layer, framework-free: solver choice, batching mode, solve, cell map.

``dq.nn.DEQ`` (Haiku), ``deqjax.nnx.DEQ`` and ``deqjax.equinox.DEQ`` run the same pass: from the
layer's :class:`~.deq_config.DEQConfig`, :func:`start` picks the solver (``solver`` when
training, else ``eval_solver``), the batching mode (:mod:`~.batch_modes`) and the initial state;
:func:`solve` binds the cell's two phases (:class:`~.phases.CellPhases`) to the parameters, input
and key of the pass, solves with :func:`deqjax.fixed_point` (the adjoint, a
:class:`~deqjax.BackwardStats` probe) and returns a :class:`~.deq_output.DEQOutput`. A framework
adds only how its cell's parameters are made and read (Haiku lifts them between the two calls).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax

from deqjax._src.adjoints.backward_stats import BackwardStats
from deqjax._src.deq import batch_modes
from deqjax._src.deq.deq_config import DEQConfig
from deqjax._src.deq.deq_output import DEQOutput, f_star, unsolved
from deqjax._src.deq.phases import CellPhases
from deqjax._src.solvers.base import Solver

PyTree = Any


class Start(NamedTuple):
    """A pass's initial state, solver (as the mode runs it) and batching mode."""

    z0: PyTree
    solver: Solver
    mode: batch_modes.Mode


def start(
    config: DEQConfig, cell: Any, x: PyTree, z0: PyTree | None, *, is_training: bool
) -> Start:
    """The :class:`Start` of a pass of ``cell`` on ``x`` (``z0``: see ``DEQConfig.start``).

    Raises:
      ValueError: for a ``z0`` that is not a state, or (per-example mode) leaves of ``x``/``z0``
        without a common leading batch axis.
    """
    z0 = config.start(cell, x, z0)
    solver = config.solver_for(is_training)
    mode = batch_modes.mode_of(config.per_example, solver)
    if mode is not batch_modes.Mode.WHOLE_BATCH:
        batch_modes.batch_size((x, z0), "x and z0")
    return Start(z0, batch_modes.mode_solver(mode, solver), mode)


def solve(
    begin: Start,
    cell: CellPhases,
    adjoint: Any,
    params: Any,
    x: PyTree,
    key: jax.Array | None,
    backward_stats: BackwardStats | None,
    *,
    layer: str,
    skip: bool = False,
) -> DEQOutput:
    """The pass from ``begin``: ``z* = f(z*)`` for ``cell`` at ``params``, ``x`` and ``key``.

    Args:
      begin: what :func:`start` returned.
      cell: the cell's phases, at the layer's precision.
      adjoint: the gradient strategy.
      params: the cell's parameters (any pytree; the operands of the solve).
      x: the input, ``[B, ...]`` in the per-example modes.
      key: the pass's key (split per example in the vmap mode), or ``None``.
      backward_stats: a :class:`~deqjax.BackwardStats` probe for :func:`deqjax.fixed_point`.
      layer: the layer's name for error messages (``"dq.nn.DEQ"``).
      skip: return ``z* = f(z0)`` and a Solution with no steps instead of solving (Haiku's
        ``init``).

    Returns:
      the :class:`~.deq_output.DEQOutput` of the pass.
    """
    mode, z0 = begin.mode, begin.z0
    solve_fn = batch_modes.solve_batch(cell, begin.solver, adjoint, backward_stats)
    bound = batch_modes.bind(mode, cell, solve_fn, params, x, key)
    with batch_modes.naming_user_shapes(x, z0, mode, layer):
        if skip:
            # No solve (compiling it for a Haiku init would double the compile time): z* :=
            # f(z0), a Solution of the right structure with no steps taken.
            z_star = bound.cell_fn(z0)
            shapes = jax.eval_shape(bound.solve, params, x, z0, bound.keys)[1]
            batch_ndim = int(mode is not batch_modes.Mode.WHOLE_BATCH)
            sol = unsolved(shapes, z_star, batch_ndim=batch_ndim)
        else:
            z_star, sol = bound.solve(params, x, z0, bound.keys)
    return DEQOutput(z_star, sol, bound.cell_fn, f_star(z_star, sol))


def forward(
    config: DEQConfig,
    cell: Any,
    phases: CellPhases,
    params: Any,
    x: PyTree,
    z0: PyTree | None,
    key: jax.Array | None,
    *,
    is_training: bool,
    backward_stats: BackwardStats | None,
    layer: str,
) -> DEQOutput:
    """:func:`start` then :func:`solve`: the whole pass of a layer whose parameters exist before
    the pass (the NNX and Equinox front-ends). ``cell`` is the user's cell (for its
    ``initial_state``), ``phases`` its two phases over ``params``."""
    begin = start(config, cell, x, z0, is_training=is_training)
    return solve(begin, phases, config.adjoint, params, x, key, backward_stats, layer=layer)
