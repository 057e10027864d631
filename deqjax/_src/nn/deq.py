"""``dq.nn.DEQ``: a Haiku module whose output is the equilibrium of a Haiku cell.

Design note (read this before writing a cell)
=============================================

**Cell protocol.** A cell is any callable ``cell(z, x) -> z`` (or ``cell(z, x, *, is_training)``;
the DEQ passes ``is_training`` when the cell accepts that keyword) built from Haiku modules: a
module instance (``dq.nn.MLPCell(...)``) or a function that creates modules. ``z`` is any state
the solvers take: a pytree of float arrays (the multiscale cell uses a tuple of per-resolution
arrays), or of complex arrays (a complex ``x`` gives a complex ``zeros_like(x)`` start), and the
cell returns the same structure. **Cells are always written for batched arrays** ``[B, ...]``
and must treat the examples of a batch independently (no statistics across the batch).

**Batching** (``per_example: bool``). ``True`` (default): each example stops on its own, in one
loop for the whole batch when the solver is batch-native (declares ``batch_ndim``), else as a
``jax.vmap`` of single-problem solves; ``False``: one solve for the whole batch. See
:mod:`deqjax._src.deq.batch_modes`.

**Parameters.** Inside ``DEQ`` the cell becomes a pure ``apply(params, ctx, rng, x, z)`` with
``hk.transform_with_state``; its parameters are created with ``hk.lift`` (``allow_reuse=True``)
under the DEQ module's scope (names ``<deq>/lifted/<cell modules>``, the same whether the pass is
run by ``__call__`` or :meth:`DEQ.solve`) and passed explicitly to ``dq.fixed_point``, so the
implicit gradient reaches them.

**Once per forward pass: ``per_forward(name, compute)``.** Anything a cell computes from the
parameters, ``x`` and randomness only — never from ``z`` — is computed ONCE per forward pass,
outside the solver loop, and held fixed across every solver iteration and the backward pass
(weight normalisation, dropout masks, input injections): see :mod:`deqjax._src.nn.per_forward`
for the prepare and step phases that do this.

**Randomness.** ``DEQ`` draws one key per forward pass (``hk.maybe_next_rng_key()``; split into
one key per example when the solves are vmapped) and passes the SAME key to every cell
evaluation of that forward pass (through ``fixed_point``'s ``x``, not a closure): any
``hk.next_rng_key()`` draw in the cell is therefore identical across solver iterations and the
backward pass, and fresh on the next forward. ``VariationalDropout`` additionally draws its mask
inside ``per_forward`` (sampled once, not re-sampled per step). Masks stay per example in every
mode: a draw shaped like the batched activation ``[B, ...]`` gives every example its own
independent rows (only a draw broadcast over the batch axis — ``broadcast_axes`` containing 0 —
would be shared by the batch when the cell sees the whole batch; no cell of deqjax does that).
With no rng (``apply(params, None, x)``) cells must not draw.

**Initial state.** ``z0`` given to ``__call__`` (e.g. the previous segment's equilibrium) wins;
otherwise the constructor's ``init_state(x)``; otherwise ``cell.initial_state(x)`` if the cell
has that method (``MultiscaleCell`` does: per-resolution zeros); otherwise ``zeros_like(x)``.

**Init.** ``hk.lift`` creates the parameters by running the cell once. By default the solve is
then skipped (``solve_at_init=False``): ``init`` returns ``z* = f(z0)`` and a Solution with 0 steps
(compiling the solver for init would double compile time). With ``solve_at_init=True`` the solve
runs exactly as in ``apply`` (our solvers use ``lax.while_loop`` on a pure function, which Haiku
allows inside a transform — only ``hk.while_loop`` refuses to run during init).

**One return type.** ``deq(x, z0)`` always returns ``(z_star, solution)``; :meth:`DEQ.solve` runs
the same forward pass and returns a :class:`DEQOutput`, which adds this pass's cell map
``cell_fn`` (for regularisers and diagnostics: Jacobian regularisation, JR paper Eq. 4, is
``JacobianRegularizer.penalty(out.cell_fn, out.z_star, key, step)``) and ``f_star = f(z*)`` with
the gradient of ``z*`` (for readouts such as MDEQ's, at no extra cell evaluation).

**Solvers.** ``solver`` is any ``(f, z0) -> Solution``: a solver object
(``dq.solvers.Anderson(max_steps=30, tol=1e-3)``, frozen and printable, so a config can log it), a
solver function or a ``functools.partial`` of one, or a user's own callable. The constructor
turns it into a solver object once (``as_solver``); from there on the DEQ reads its declared
``batch_native`` and sets ``batch_ndim=1`` by ``replace``. ``eval_solver`` (default: ``solver``)
is used when ``is_training=False`` (the papers solve with fewer steps or looser tolerance at
inference). The forward solve runs once per call: ``init`` skips it (see **Init**), and no
adjoint re-runs it under ``grad``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import haiku as hk

from deqjax._src.adjoints.base import Adjoint
from deqjax._src.deq import batch_modes, forward_pass
from deqjax._src.deq.deq_config import ANDERSON, DEQConfig, checked_config, resolved_config
from deqjax._src.deq.deq_output import DEQOutput
from deqjax._src.nn import per_forward
from deqjax._src.normalise import accepts_keyword
from deqjax._src.solvers.base import Solver
from deqjax._src.solvers.solution import Solution

PyTree = Any
Cell = Callable[..., PyTree]
LAYER = "dq.nn.DEQ"  # the layer's name in error messages


class DEQ(hk.Module):
    """Deep equilibrium layer: ``z* = f_θ(z*; x)`` for a Haiku cell ``f`` (DEQ paper, Eq. 3–4).

    The cell's parameters live under this module's scope; the forward pass solves for the fixed
    point with ``solver`` and the gradient is ``adjoint``'s (default: implicit differentiation, DEQ
    paper Theorem 1), via :func:`deqjax.fixed_point`. See the module docstring for the cell
    protocol, ``per_forward`` (computations held fixed across solver iterations), randomness and
    how the initial state is chosen.

    Args:
      cell: ``cell(z, x) -> z`` or ``cell(z, x, *, is_training)``, built from Haiku modules and
        written for batched arrays ``[B, ...]``.
      solver: forward solver used when ``is_training=True``: a solver object such as
        ``dq.solvers.Anderson(max_steps=30, tol=1e-3)`` (or a solver function, a
        ``functools.partial`` of one, or a user's ``(f, z0) -> Solution``).
      adjoint: gradient strategy (``None``: ``dq.ImplicitAdjoint()``).
      eval_solver: solver used when ``is_training=False`` (``None``: ``solver``).
      per_example: ``True`` (default): each example (leading axis of ``x`` and ``z0``) stops on
        its own with its own statistics — in one loop for the whole batch when the solver is
        batch-native, else as a ``jax.vmap`` of single-problem solves (the cell then sees
        batches of size 1; same results, slower). ``False``: one solve for the whole batch (one
        stopping test for all examples, scalar statistics).
      init_state: ``x -> z0`` used when ``__call__`` gets no ``z0``; ``None``: the cell's
        ``initial_state(x)`` method if it has one, else ``zeros_like(x)``.
      solve_at_init: run the solve during ``init`` too. Default ``False``: ``init`` creates the
        parameters, returns ``z* = f(z0)`` (one cell application, so downstream modules get
        correctly shaped inputs) and a Solution with ``num_steps = 0``, ``+inf`` residuals and
        status ``MAX_STEPS`` — compiling the solver for ``init`` would double compile time.
      precision: the matmul precision of the cell in every evaluation: the forward solve, the
        backward solve, the final VJP and the cell map ``cell_fn`` (``None``: JAX's default; see
        :func:`deqjax.fixed_point`). On a GPU, ``"highest"`` for tolerances below about 1e-3.
      name: Haiku module name.

    Raises:
      ValueError: if ``cell``, ``solver``, ``eval_solver`` or ``init_state`` is not callable,
        ``adjoint`` is not a deqjax adjoint, ``per_example`` is not a bool, or ``precision`` is
        not a matmul precision.

    Example:
      >>> def forward(x, is_training):
      ...     deq = dq.nn.DEQ(dq.nn.MLPCell(64), solver=dq.solvers.Anderson(max_steps=30, tol=1e-4))
      ...     z, sol = deq(hk.Linear(64)(x), is_training=is_training)
      ...     return hk.Linear(10)(z), sol
    """

    def __init__(
        self,
        cell: Cell,
        *,
        solver: Any = ANDERSON,
        adjoint: Adjoint | None = None,
        eval_solver: Any = None,
        per_example: bool = True,
        init_state: Callable[[PyTree], PyTree] | None = None,
        solve_at_init: bool = False,
        precision: str | None = None,
        name: str | None = None,
    ):
        super().__init__(name=name)
        config = checked_config(
            cell,
            solver=solver,
            adjoint=adjoint,
            eval_solver=eval_solver,
            per_example=per_example,
            init_state=init_state,
            precision=precision,
        )
        self._configure(cell, config, solve_at_init=solve_at_init)

    def _configure(self, cell: Cell, config: DEQConfig, *, solve_at_init: bool) -> None:
        """Holds the cell and the settings, checked by the caller (``__init__``, or
        :class:`CheckedDEQ` for settings a :class:`~deqjax.models.DEQSettings` checked)."""
        self.cell = cell
        self.config = config
        self.solve_at_init = solve_at_init
        self._pass_is_training = accepts_keyword(cell, "is_training")

    def initial_state(self, x: PyTree) -> PyTree:
        """The ``z0`` used when none is given (see ``init_state``)."""
        return self.config.start(self.cell, x, None)

    def __call__(
        self,
        x: PyTree,
        z0: PyTree | None = None,
        *,
        is_training: bool = True,
        backward_stats: Any = None,
    ) -> tuple[PyTree, Solution]:
        """Solves for the equilibrium; always returns ``(z_star, solution)``.

        Args:
          x: the input (injection), a pytree with a leading batch axis ``[B, ...]``.
          z0: initial state (e.g. the previous segment's equilibrium); ``None``: see
            ``init_state``.
          is_training: selects ``solver`` vs ``eval_solver``; passed to the cell if it accepts it.
          backward_stats: a :class:`~deqjax.BackwardStats` probe passed to
            :func:`deqjax.fixed_point`: differentiate the loss with respect to it (pass it into
            ``apply``) to receive the implicit backward solves' statistics, summed over examples.

        Returns:
          ``(z_star, solution)``: the equilibrium (differentiable per ``adjoint``) and the forward
          :class:`~deqjax.solvers.Solution` (``solution.f_value`` is ``f(z*)`` as the solver
          evaluated it). :meth:`solve` returns the cell map of this forward pass too.

        Raises:
          ValueError: for a ``z0`` (given, or made from ``x`` by ``init_state``) that is not a
            state (a float or complex pytree), or (per-example mode) leaves of ``x``/``z0``
            without a common leading batch axis.
        """
        out = self._forward(x, z0, is_training, backward_stats)
        return out.z_star, out.solution

    @hk.name_like("__call__")  # the same parameter names as __call__: deq/lifted/...
    def solve(
        self,
        x: PyTree,
        z0: PyTree | None = None,
        *,
        is_training: bool = True,
        backward_stats: Any = None,
    ) -> DEQOutput:
        """The forward pass of ``__call__`` (same arguments, same parameters), returned as a
        :class:`DEQOutput` with this pass's cell map ``cell_fn`` and ``f_star = f(z*)``.

        Jacobian regularisation (JR paper Eq. 4) goes through
        :class:`~deqjax.regularization.JacobianRegularizer` and its in-graph Bernoulli gate:
        ``reg.penalty(out.cell_fn, out.z_star, key, step)``.

        Args:
          x, z0, is_training, backward_stats: as in ``__call__``.

        Example:
          >>> reg = dq.regularization.JacobianRegularizer(gamma=2.0, p=0.4)
          >>> out = deq.solve(x)
          >>> jr, jr_metrics = reg.penalty(out.cell_fn, out.z_star, hk.next_rng_key())
          >>> loss = cross_entropy(head(out.z_star)) + jr
        """
        return self._forward(x, z0, is_training, backward_stats)

    @hk.transparent
    def _forward(
        self, x: PyTree, z0: PyTree | None, is_training: bool, backward_stats: Any
    ) -> DEQOutput:
        """The one forward pass of ``__call__`` and :meth:`solve`: parameters, solve, cell map."""
        begin = forward_pass.start(self.config, self.cell, x, z0, is_training=is_training)
        cell = per_forward.phased_cell(self._cell_fn(is_training), self.config.precision)
        init_key = hk.next_rng_key() if hk.running_init() else None
        with batch_modes.naming_user_shapes(x, begin.z0, begin.mode, LAYER):
            lift = hk.lift(cell.init, allow_reuse=True)
            params = lift(init_key, *batch_modes.init_inputs(begin.mode, x, begin.z0))
        return forward_pass.solve(
            begin,
            cell,
            self.config.adjoint,
            params,
            x,
            hk.maybe_next_rng_key(),
            backward_stats,
            layer=LAYER,
            skip=hk.running_init() and not self.solve_at_init,
        )

    def _cell_fn(self, is_training: bool) -> Callable[[PyTree, PyTree], PyTree]:
        """``(x, z) -> cell(z, x[, is_training])``: the function the DEQ transforms."""
        cell = self.cell
        if self._pass_is_training:
            return lambda x, z: cell(z, x, is_training=is_training)
        return lambda x, z: cell(z, x)


class CheckedDEQ(DEQ):
    """The internal entry of :class:`DEQ` for settings already checked and normalised (a
    :class:`~deqjax.models.DEQSettings`' solver objects, adjoint and the ``precision``
    :func:`~deqjax._src.precision.check_precision` returned): the same module, with no second
    check; per-example solves, the default initial state, no solve at ``init``."""

    def __init__(
        self,
        cell: Cell,
        *,
        solver: Solver,
        eval_solver: Solver | None,
        adjoint: Adjoint | None,
        precision: str | None,
        name: str | None = None,
    ):
        hk.Module.__init__(self, name="deq" if name is None else name)  # DEQ's default name
        config = resolved_config(
            solver=solver, eval_solver=eval_solver, adjoint=adjoint, precision=precision
        )
        self._configure(cell, config, solve_at_init=False)
