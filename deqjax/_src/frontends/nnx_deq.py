"""``deqjax.nnx.DEQ``: a Flax NNX module whose output is the equilibrium of an NNX cell.

The layer of ``dq.nn.DEQ`` for Flax NNX, on the same framework-free forward pass
(:mod:`deqjax._src.deq.forward_pass`): the same settings, batching modes, ``Solution``, cell map
and backward statistics. What NNX changes:

* **Parameters.** The cell is an ``nnx.Module`` attribute of the DEQ, so its parameters are the
  DEQ's (``nnx.state(deq, nnx.Param)``, ``nnx.Optimizer(model, tx, wrt=nnx.Param)``). Each pass
  splits the cell (``nnx.split``) and solves with its state as the operands of
  :func:`deqjax.fixed_point` and ``nnx.merge(graphdef, state)`` inside ``f``: the implicit
  gradient reaches every parameter, and an eager call (no ``nnx.jit``) runs the cached compiled
  solve with the cell's current arrays, never a program made for earlier values. The cell must
  not mutate its own state during a call (its changes inside the solve are discarded).
* **Train and eval.** ``deterministic`` (an attribute, set with ``deq.eval()``/``deq.train()`` or
  ``nnx.view(deq, deterministic=...)``, or a call argument) selects ``eval_solver`` and is passed
  to the cell as ``deterministic=`` when it accepts that keyword.
* **Randomness.** In training, one key per pass is drawn from ``rngs`` (the constructor's or the
  call's, stream ``"dropout"``, as ``nnx.Dropout`` draws) and passed to the cell as ``key=`` when
  it accepts that keyword: the same key at every evaluation of the pass (the vmap mode splits it
  per example), so dropout masks are fixed across solver iterations and fresh on the next pass.
* **Phases.** A cell with ``prepare(x, **kw) -> ctx`` and ``step(z, ctx) -> z`` methods (the
  ``MLPCell`` and ``TransformerCell`` of ``deqjax.nnx``) has ``prepare`` run once per pass, outside
  the solver loop (see :mod:`deqjax._src.deq.phases`); ``prepare`` gets the keywords.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
from flax import nnx

from deqjax._src import checks
from deqjax._src.adjoints.base import Adjoint
from deqjax._src.deq import forward_pass
from deqjax._src.deq.deq_config import ANDERSON, checked_config
from deqjax._src.deq.deq_output import DEQOutput
from deqjax._src.deq.phases import ModuleCall
from deqjax._src.solvers.solution import Solution

PyTree = Any
LAYER = "deqjax.nnx.DEQ"


def _stream(rngs: Any, collection: str) -> Any:
    """The dropout stream of ``rngs`` (an ``nnx.Rngs``, an ``nnx.RngStream`` or ``None``), as
    ``nnx.Dropout`` keeps it."""
    if isinstance(rngs, nnx.Rngs):
        return rngs[collection].fork()
    if isinstance(rngs, nnx.RngStream):
        return rngs.fork()
    if rngs is None:
        return nnx.data(None)
    raise ValueError(f"rngs must be an nnx.Rngs, an nnx.RngStream or None, got {rngs!r}.")


class DEQ(nnx.Module):
    """Deep equilibrium layer ``z* = f_θ(z*; x)`` for a Flax NNX cell (DEQ paper, Eq. 3-4).

    See the module docstring for parameters, train/eval, randomness and phases, and
    ``dq.nn.DEQ`` for the cell protocol (written for batched arrays ``[B, ...]``), the batching
    modes and the initial state.

    Args:
      cell: an ``nnx.Module`` called as ``cell(z, x) -> z`` (optionally with ``key=`` and
        ``deterministic=`` keywords), or with ``prepare``/``step`` methods.
      solver: forward solver when training (a solver object such as
        ``dq.solvers.Anderson(max_steps=30, tol=1e-3)``, a solver function or a
        ``functools.partial`` of one, or a user's ``(f, z0) -> Solution``).
      adjoint: gradient strategy (``None``: ``dq.ImplicitAdjoint()``).
      eval_solver: solver when ``deterministic`` (``None``: ``solver``).
      per_example: ``True`` (default): each example stops on its own (one batch-native loop, or
        a ``jax.vmap`` of single-problem solves for a solver that is not batch-native);
        ``False``: one solve for the whole batch.
      init_state: ``x -> z0`` when no ``z0`` is given (``None``: the cell's ``initial_state(x)``
        if it has one, else ``zeros_like(x)``).
      precision: the cell's matmul precision in every evaluation (``None``: JAX's default).
      deterministic: start in eval mode (``eval_solver``, no dropout key).
      rngs: where the training passes draw their key (stream ``"dropout"``), or ``None``.

    Raises:
      ValueError: for the settings ``dq.nn.DEQ`` refuses, a cell that is not an ``nnx.Module``,
        a non-bool ``deterministic``, or ``rngs`` that is not an ``nnx.Rngs``/``nnx.RngStream``.

    Example:
      >>> cell = deqjax.nnx.MLPCell(784, 128, rngs=nnx.Rngs(0))
      >>> deq = deqjax.nnx.DEQ(cell, solver=dq.solvers.Anderson(max_steps=30, tol=1e-4))
      >>> z_star, sol = deq(x)                      # x: [B, 784] -> z_star: [B, 128]
    """

    def __init__(
        self,
        cell: nnx.Module,
        *,
        solver: Any = ANDERSON,
        adjoint: Adjoint | None = None,
        eval_solver: Any = None,
        per_example: bool = True,
        init_state: Callable[[PyTree], PyTree] | None = None,
        precision: str | None = None,
        deterministic: bool = False,
        rngs: nnx.Rngs | nnx.RngStream | None = None,
    ):
        if callable(cell) and not isinstance(cell, nnx.Module):
            raise ValueError(
                f"cell must be a flax.nnx.Module (its parameters are the DEQ's), got "
                f"{type(cell).__name__}."
            )
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
        self.deterministic = checks.check_bool(deterministic, "deterministic")
        self.rngs = _stream(rngs, "dropout")
        self.cell_call = ModuleCall.of(cell, "deterministic")

    def set_view(self, deterministic: bool | None = None) -> None:
        """``nnx.view(deq, deterministic=...)``: sets ``deterministic`` when given."""
        if deterministic is not None:
            self.deterministic = deterministic

    def __call__(
        self,
        x: PyTree,
        z0: PyTree | None = None,
        *,
        deterministic: bool | None = None,
        rngs: nnx.Rngs | nnx.RngStream | jax.Array | None = None,
        backward_stats: Any = None,
    ) -> tuple[PyTree, Solution]:
        """Solves for the equilibrium; returns ``(z_star, solution)`` as ``dq.nn.DEQ`` does.

        Args:
          x: the input, a pytree with a leading batch axis ``[B, ...]``.
          z0: initial state; ``None``: see ``init_state``.
          deterministic: overrides the attribute (``True``: ``eval_solver``, no key).
          rngs: a key, stream or ``nnx.Rngs`` for this pass (``None``: the constructor's).
          backward_stats: a :class:`~deqjax.BackwardStats` probe: differentiate the loss with
            respect to it to receive the implicit backward solves' statistics.

        Raises:
          ValueError: as ``dq.nn.DEQ``: a ``z0`` that is not a state, leaves without a common
            batch axis in per-example mode.
        """
        out = self.solve(
            x, z0, deterministic=deterministic, rngs=rngs, backward_stats=backward_stats
        )
        return out.z_star, out.solution

    def solve(
        self,
        x: PyTree,
        z0: PyTree | None = None,
        *,
        deterministic: bool | None = None,
        rngs: nnx.Rngs | nnx.RngStream | jax.Array | None = None,
        backward_stats: Any = None,
    ) -> DEQOutput:
        """The forward pass of ``__call__``, returned as a :class:`~deqjax.nn.DEQOutput` with
        this pass's cell map ``cell_fn`` and ``f_star = f(z*)``.

        Jacobian regularisation (JR paper Eq. 4):
        ``reg.penalty(out.cell_fn, out.z_star, key, step)`` with a
        :class:`~deqjax.regularization.JacobianRegularizer`, in the same trace.
        """
        det = self.deterministic if deterministic is None else deterministic
        det = checks.check_bool(det, "deterministic")
        key = None if det else self._key(rngs)
        graphdef, state = nnx.split(self.cell)
        phases = self.cell_call.cell(
            functools.partial(nnx.merge, graphdef), det, self.config.precision
        )
        return forward_pass.forward(
            self.config,
            self.cell,
            phases,
            state,
            x,
            z0,
            key,
            is_training=not det,
            backward_stats=backward_stats,
            layer=LAYER,
        )

    def _key(self, rngs: Any) -> jax.Array | None:
        """This pass's key: from the call's ``rngs``, else the constructor's, else ``None``."""
        if rngs is None:
            rngs = self.rngs
        if rngs is None:
            return None
        if isinstance(rngs, nnx.Rngs):
            return rngs["dropout"]()
        if isinstance(rngs, nnx.RngStream):
            return rngs()
        if isinstance(rngs, jax.Array):
            return rngs
        raise ValueError(
            f"rngs must be an nnx.Rngs, an nnx.RngStream, a key or None, got {rngs!r}."
        )
