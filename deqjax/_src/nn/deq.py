"""``dq.nn.DEQ``: a Haiku module whose output is the equilibrium of a Haiku cell.

Design note (read this before writing a cell)
=============================================

**Cell protocol.** A cell is any callable ``cell(z, x) -> z`` (or ``cell(z, x, *, is_training)``;
the DEQ passes ``is_training`` when the cell's signature accepts that keyword) built from Haiku
modules: a module instance (``dq.nn.MLPCell(...)``) or a function that creates modules. ``z`` is any
pytree of float arrays (the multiscale cell uses a tuple of per-resolution arrays) and the cell
returns the same structure. **Cells are always written for batched arrays** ``[B, ...]`` and must
treat the examples of a batch independently (no statistics across the batch).

**Batching modes** (``per_example=``). ``True`` (default): *batch-native per-example stopping* —
the cell sees the WHOLE batch at every solver step and the solver is called with ``batch_ndim=1``,
so one loop runs for the batch while each example converges on its own and reports its own
``num_steps``/``status``/residuals (the ``Solution``'s fields are ``[B]``, ``trace`` ``[B,
max_steps]``); the implicit backward solves every example's adjoint in one batched loop. A solver
that does not take the ``batch_ndim`` keyword (a user's own ``(f, z0) -> Solution``) falls back to
``"vmap"``, which gives the same results. ``"vmap"``: ``jax.vmap`` of a single-problem solve over
the leading axis, the cell seeing batches of size 1 — the reference semantics, kept for such
solvers and for cells that are not batch-independent; it is slower (every example runs every loop
step, and batch-1 cell evaluations waste convolution/attention throughput). ``False``: one solve
for the whole batch, one stopping test (on the norm over the whole batch), scalar statistics.

**Parameters.** Inside ``DEQ`` the cell becomes a pure ``apply(params, ctx, rng, x, z)`` with
``hk.transform_with_state``; its parameters are created with ``hk.lift`` (``allow_reuse=True``)
under the DEQ module's scope (names ``<deq>/lifted/<cell modules>``) and passed explicitly to
``dq.fixed_point``, so the implicit gradient reaches them.

**Once per forward pass: ``per_forward(name, compute)``.** Anything a cell computes from the
parameters, ``x`` and randomness only — never from ``z`` — should be computed ONCE per forward pass,
outside the solver loop, and held fixed across every solver iteration and the backward pass: weight
normalisation ``w = g·v/‖v‖``, dropout masks, input injections ``U x``. A module does this with::

    value = dq.nn.per_forward("name", lambda: expensive(params, x, hk.next_rng_key()))

``DEQ`` runs the cell in two phases. *Prepare* (once per forward, outside the solver): the cell is
evaluated once at ``z0``; every ``per_forward`` computes its value and records it in Haiku state;
the resulting state pytree ``ctx`` is a differentiable function of the parameters and ``x``. *Step*
(every solver iteration, and the backward pass): ``per_forward`` returns the recorded value from
``ctx``, which travels to ``dq.fixed_point`` next to the parameters, so gradients flow through it
back to the parameters by ordinary autodiff. Outside a DEQ (a cell called directly, or unrolled by
hand) ``per_forward`` simply returns ``compute()``. Under ``jit`` the prepare pass's own output is
discarded and XLA removes everything in it except what ``ctx`` needs. ``compute`` must not depend on
``z`` (the value would be frozen at ``z0``). Haiku state of the cell's own (``hk.get_state`` outside
``per_forward``, e.g. batch-norm statistics) is not supported.

**Randomness.** ``DEQ`` draws one key per forward pass (``hk.maybe_next_rng_key()``; in
``"vmap"`` mode it is split into one key per example) and passes the SAME key to every cell
evaluation of that forward pass (through ``fixed_point``'s ``x``, not a closure): any
``hk.next_rng_key()`` draw in the cell is therefore identical across solver iterations and the
backward pass, and fresh on the next forward. ``VariationalDropout`` additionally draws its mask
inside ``per_forward`` (sampled once, not re-sampled per step). Masks stay per example in every
mode: a draw shaped like the batched activation ``[B, ...]`` gives every example its own
independent rows (only a draw broadcast over the batch axis — ``broadcast_axes`` containing 0 —
would be shared by the batch outside ``"vmap"`` mode; no cell of deqjax does that). With no rng
(``apply(params, None, x)``) cells must not draw.

**Initial state.** ``z0`` given to ``__call__`` (e.g. the previous segment's equilibrium) wins;
otherwise the constructor's ``init_state(x)``; otherwise ``cell.initial_state(x)`` if the cell
has that method (``MultiscaleCell`` does: per-resolution zeros); otherwise ``zeros_like(x)``.

**Init.** ``hk.lift`` creates the parameters by running the cell once. By default the solve is
then skipped (``solve_at_init=False``): ``init`` returns ``z* = f(z0)`` and a Solution with 0 steps
(compiling the solver for init would double compile time). With ``solve_at_init=True`` the solve
runs exactly as in ``apply`` (our solvers use ``lax.while_loop`` on a pure function, which Haiku
allows inside a transform — only ``hk.while_loop`` refuses to run during init).

**Train/eval.** ``__call__(x, z0=None, *, is_training=True)``; ``eval_solver`` (default: ``solver``)
is used when ``is_training=False`` (the papers solve with fewer steps or looser tolerance at
inference).

**One return type; what else a forward pass offers.** ``deq(x, z0)`` always returns ``(z_star,
solution)`` (``solution.f_value`` is ``f(z*)`` as the solver evaluated it). ``DEQ.solve(...)`` runs
the same forward pass and returns a :class:`DEQOutput` ``(z_star, solution, cell_fn,
f_star)``: ``f_star`` is ``f(z*)`` with the gradient of ``z*`` (no extra cell
evaluation), for readouts such as MDEQ's that read the cell output at the equilibrium; ``cell_fn``
is ``z ↦ f_θ(z; x)`` of this very forward pass (same parameters, masks, key; batched like
``z_star``) for regularisers and diagnostics. **Jacobian regularisation (JR paper Eq. 4)** has one
path: ``dq.regularization.JacobianRegularizer(gamma, p=..., num_samples=...).penalty(out.cell_fn,
out.z_star, key, step)``, whose Bernoulli gate is drawn in the graph (one compiled step, the
estimator skipped by ``lax.cond`` when the coin says no) and whose estimate is taken at
``stop_gradient(z*)``, differentiable w.r.t. the cell parameters (as in the JR reference code).

**Solvers.** ``solver`` is any ``(f, z0) -> Solution``: a solver object
(``dq.solvers.Anderson(max_steps=30, tol=1e-3)``, frozen and printable, so a config can log it), a
solver function or a ``functools.partial`` of one. Whether the batch-native mode applies is read
from the object's declared ``batch_native`` (a function's or partial's signature otherwise), and
an object is set to ``batch_ndim=1`` by ``replace`` so it stays an object. The forward solve runs
once per call: ``init`` skips it (see **Init**), and no adjoint re-runs it under ``grad``.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
from typing import Any, Callable, NamedTuple

import haiku as hk
import jax
import jax.numpy as jnp

from deqjax._src import adjoints, tree
from deqjax._src import fixed_point as fixed_point_lib
from deqjax._src.normalise import as_solver
from deqjax._src.solvers import anderson as anderson_lib
from deqjax._src.solvers import base

PyTree = Any
Cell = Callable[..., PyTree]

_PREPARE = "prepare"
_STEP = "step"
_phase_stack = threading.local()


class _Phase:
    """One pass of the cell inside a DEQ; ``values`` caches this pass's per-forward values."""

    def __init__(self, kind: str):
        self.kind = kind
        self.values: dict[tuple[str, str], PyTree] = {}


def _current_phase() -> _Phase | None:
    stack = getattr(_phase_stack, "stack", None)
    return stack[-1] if stack else None


@contextlib.contextmanager
def _phase(kind: str):
    if not hasattr(_phase_stack, "stack"):
        _phase_stack.stack = []
    _phase_stack.stack.append(_Phase(kind))
    try:
        yield
    finally:
        _phase_stack.stack.pop()


def per_forward(name: str, compute: Callable[[], PyTree]) -> PyTree:
    """A value computed once per DEQ forward pass and held fixed across solver iterations.

    Call it inside a Haiku module of a cell for anything that depends on parameters, the input
    ``x`` or randomness but not on the state ``z`` (normalised weights, dropout masks, input
    injections). Inside a :class:`DEQ`, ``compute()`` runs once per forward pass, outside the
    solver loop; every solver iteration and the backward pass reuse its value, and gradients flow
    through it to the parameters. A module calling it several times with the same ``name`` in one
    cell evaluation gets the first value each time (e.g. one dropout module applied twice shares
    one mask). Outside a DEQ it just returns ``compute()``.

    Args:
      name: a name unique within the calling module (it names a Haiku state entry).
      compute: zero-argument function returning a pytree of arrays; may call
        ``hk.get_parameter`` and ``hk.next_rng_key``; must not depend on ``z``.

    Returns:
      ``compute()``'s value (recorded or replayed).

    Example:
      >>> inj = per_forward("injection", lambda: x @ hk.get_parameter("U", [dx, d], init=u_init))
    """
    phase = _current_phase()
    if phase is None:
        return compute()
    if phase.kind == _STEP:
        return hk.get_state(name)
    key = (hk.experimental.current_name(), name)
    if key not in phase.values:
        phase.values[key] = compute()
        hk.set_state(name, phase.values[key])
    return phase.values[key]


class DEQOutput(NamedTuple):
    """What :meth:`DEQ.solve` returns.

    Attributes:
      z_star: the equilibrium ``z*``, a pytree like the state, differentiable (per ``adjoint``).
      solution: the forward :class:`~deqjax.solvers.Solution`; per-example mode: every field has
        a leading batch axis (``num_steps`` ``[B]``, ``trace`` ``[B, max_steps]``...).
      cell_fn: ``z ↦ f_θ(z; x)`` of this forward pass (same parameters, dropout masks and key),
        batched like ``z_star``; differentiable in the parameters. Use it only inside the same
        Haiku transform (it closes over traced values), e.g. for
        ``JacobianRegularizer.penalty(out.cell_fn, out.z_star, key, step)``.
      f_star: ``f(z*)``, the cell output at the returned equilibrium as the solver evaluated it
        (``solution.f_value``, no extra cell evaluation; ``None`` when the solver returns no
        ``f_value``). Its value is ``f(z*)``; its gradient is that of ``z_star``
        (``z* + stop_gradient(f(z*) - z*)``). With the implicit adjoint this equals the gradient
        of the readout ``cell_fn(z_star)`` up to the backward solve's tolerance: ``∂f/∂θ +
        J (I - J)⁻¹ ∂f/∂θ = (I - J)⁻¹ ∂f/∂θ`` (DEQ paper Theorem 1), at the cost of no extra
        cell application forward or backward. With other adjoints use ``cell_fn(z_star)`` to
        differentiate an explicit extra application. At ``init`` without ``solve_at_init`` it
        equals ``z_star``.
    """

    z_star: PyTree
    solution: base.Solution
    cell_fn: Callable[[PyTree], PyTree]
    f_star: PyTree = None


def _unsolved(shapes: base.Solution, value: PyTree) -> base.Solution:
    """A Solution shaped like ``shapes`` for "no solve ran": 0 steps, +inf residuals, MAX_STEPS."""
    full = lambda s, v: jnp.full(s.shape, v, s.dtype)  # noqa: E731
    return base.Solution(
        value=value,
        num_steps=full(shapes.num_steps, 0),
        abs_residual=full(shapes.abs_residual, jnp.inf),
        rel_residual=full(shapes.rel_residual, jnp.inf),
        trace=full(shapes.trace, jnp.inf),
        status=full(shapes.status, base.MAX_STEPS),
        f_value=value,
        samples=_unsolved_samples(shapes, value),
    )


def _unsolved_samples(shapes: base.Solution, value: PyTree) -> PyTree:
    """``Solution.samples`` of "no solve ran" (solver given ``sample_steps``): ``value`` each."""
    if shapes.samples is None:
        return None
    bn = len(shapes.status.shape)  # the sample axis follows the batch axes
    return jax.tree_util.tree_map(
        lambda s, v: jnp.broadcast_to(jnp.expand_dims(v, bn), s.shape).astype(s.dtype),
        shapes.samples,
        value,
    )


def _accepts_keyword(fn: Callable[..., Any], keyword: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return keyword in params or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()
    )


def _batch_size(tree_: PyTree, name: str) -> int:
    leaves = jax.tree_util.tree_leaves(tree_)
    sizes = {leaf.shape[0] if jnp.ndim(leaf) else None for leaf in leaves}
    if len(sizes) != 1 or None in sizes:
        raise ValueError(
            f"{name}: in per-example mode every leaf must have the same leading batch axis; got "
            f"shapes {[jnp.shape(leaf) for leaf in leaves]}."
        )
    return sizes.pop()


_NATIVE, _VMAP, _WHOLE = "native", "vmap", "whole_batch"


def _mode_of(per_example: bool | str, solver: base.SolverFn) -> str:
    """The batching mode a solve runs in: ``per_example=True`` is batch-native when ``solver``
    takes ``batch_ndim`` and falls back to ``"vmap"`` (same results) when it does not."""
    if per_example is False:
        return _WHOLE
    if per_example == _VMAP:
        return _VMAP
    return _NATIVE if base.accepts_batch_ndim(solver) else _VMAP


@contextlib.contextmanager
def _naming_user_shapes(x: PyTree, z0: PyTree, mode: str):
    """Re-raises a cell's shape error with the shapes the user passed (not the internal ones)."""
    try:
        yield
    except (ValueError, TypeError) as e:
        shapes = lambda t: [tuple(jnp.shape(a)) for a in jax.tree_util.tree_leaves(t)]  # noqa: E731
        how = {
            _NATIVE: "per-example mode takes the leading axis as the batch and calls the cell on "
            "the whole batch",
            _VMAP: "vmap mode takes the leading axis as the batch and calls the cell on one "
            "example at a time, with a batch axis of 1",
            _WHOLE: "the cell is called on x and z0 as given",
        }[mode]
        raise (TypeError if isinstance(e, TypeError) else ValueError)(
            f"dq.nn.DEQ failed on the input x of shape {shapes(x)} with z0 of shape "
            f"{shapes(z0)} ({how}). If the shapes are the problem: x and z0 need a leading batch "
            f"axis [B, ...]; for a single example pass x[None]. The error: {e}"
        ) from e


def _take_first(tree_: PyTree) -> PyTree:
    return jax.tree_util.tree_map(lambda a: a[:1], tree_)


def _add_batch(tree_: PyTree) -> PyTree:
    return jax.tree_util.tree_map(lambda a: a[None], tree_)


def _drop_batch(tree_: PyTree) -> PyTree:
    return jax.tree_util.tree_map(lambda a: a[0], tree_)


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
      solver: forward solver ``(f_z, z0) -> Solution`` used when ``is_training=True``, e.g.
        ``dq.solvers.Anderson(max_steps=30, tol=1e-3)`` (or a ``functools.partial`` of a solver
        function).
      adjoint: gradient strategy (``None``: ``dq.ImplicitAdjoint()``).
      eval_solver: solver used when ``is_training=False`` (``None``: ``solver``).
      per_example: ``True`` (default): batch-native per-example stopping — the cell sees the
        whole batch, the solver gets ``batch_ndim=1`` and each example (leading axis of ``x``
        and ``z0``) converges on its own with its own statistics; a solver without the
        ``batch_ndim`` keyword falls back to ``"vmap"``. ``"vmap"``: ``jax.vmap`` of a
        single-problem solve (the cell sees batches of size 1; same results, slower).
        ``False``: one solve for the whole batch (one stopping test for all examples).
      init_state: ``x -> z0`` used when ``__call__`` gets no ``z0``; ``None``: the cell's
        ``initial_state(x)`` method if it has one, else ``zeros_like(x)``.
      solve_at_init: run the solve during ``init`` too. Default ``False``: ``init`` creates the
        parameters, returns ``z* = f(z0)`` (one cell application, so downstream modules get
        correctly shaped inputs) and a Solution with ``num_steps = 0``, ``+inf`` residuals and
        status ``MAX_STEPS`` — compiling the solver for ``init`` would double compile time.
      name: Haiku module name.

    Raises:
      ValueError: if ``cell``, ``solver``, ``eval_solver`` or ``init_state`` is not callable, or
        ``adjoint`` is not a deqjax adjoint.

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
        solver: base.SolverFn = anderson_lib.anderson,
        adjoint: adjoints.Adjoint | None = None,
        eval_solver: base.SolverFn | None = None,
        per_example: bool | str = True,
        init_state: Callable[[PyTree], PyTree] | None = None,
        solve_at_init: bool = False,
        name: str | None = None,
    ):
        super().__init__(name=name)
        if not callable(cell):
            raise ValueError(f"cell must be callable, got {type(cell).__name__}.")
        if not callable(solver):
            raise ValueError(f"solver must be callable, got {solver!r}.")
        if eval_solver is not None and not callable(eval_solver):
            raise ValueError(f"eval_solver must be callable or None, got {eval_solver!r}.")
        if adjoint is None:
            adjoint = adjoints.ImplicitAdjoint()
        if not isinstance(adjoint, adjoints.Adjoint):
            raise ValueError(f"adjoint must be a deqjax adjoint object, got {adjoint!r}.")
        if init_state is not None and not callable(init_state):
            raise ValueError(f"init_state must be callable or None, got {init_state!r}.")
        if not (isinstance(per_example, bool) or per_example == _VMAP):
            raise ValueError(f'per_example must be True, False or "vmap", got {per_example!r}.')
        self.cell = cell
        self.solver = solver
        self.eval_solver = solver if eval_solver is None else eval_solver
        self.adjoint = adjoint
        self.per_example = per_example
        self.init_state = init_state
        self.solve_at_init = solve_at_init
        self._pass_is_training = _accepts_keyword(cell, "is_training")

    def initial_state(self, x: PyTree) -> PyTree:
        """The ``z0`` used when none is given (see ``init_state``)."""
        if self.init_state is not None:
            return self.init_state(x)
        if hasattr(self.cell, "initial_state"):
            return self.cell.initial_state(x)
        return jax.tree_util.tree_map(jnp.zeros_like, x)

    def __call__(
        self,
        x: PyTree,
        z0: PyTree | None = None,
        *,
        is_training: bool = True,
        backward_stats: Any = None,
    ) -> tuple[PyTree, base.Solution]:
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
          ValueError: for ``z0`` not a float pytree, or (per-example mode) leaves of ``x``/``z0``
            without a common leading batch axis.
        """
        if z0 is None:
            z0 = self.initial_state(x)
        tree.check_float_tree(z0, "z0")
        solver = self.solver if is_training else self.eval_solver
        mode = _mode_of(self.per_example, solver)
        if mode == _NATIVE:  # one loop for the batch, each example stopping on its own
            solver = as_solver(solver).replace(batch_ndim=1)
        adjoint = self.adjoint
        cell = self.cell
        pass_is_training = self._pass_is_training

        def cell_fn(x_, z_):
            if pass_is_training:
                return cell(z_, x_, is_training=is_training)
            return cell(z_, x_)

        inner = hk.transform_with_state(cell_fn)

        def init_params(key, x_, z_):
            with _phase(_PREPARE):
                params, _ = inner.init(key, x_, z_)
            return params

        def prepare(params, key, x_, z_):
            with _phase(_PREPARE):
                _, ctx = inner.apply(params, {}, key, x_, z_)
            return ctx

        def step(p, xk, z_):  # the f(params, x, z) of dq.fixed_point
            (params, ctx), (x_, key) = p, xk
            with _phase(_STEP):
                z_new, _ = inner.apply(params, ctx, key, x_, z_)
            return z_new

        def solve_batch(params, x_, z0_, key):  # arrays with a batch axis (of 1 in vmap mode)
            ctx = prepare(params, key, x_, z0_)
            return fixed_point_lib.fixed_point(
                step,
                (params, ctx),
                (x_, key),
                z0_,
                solver=solver,
                adjoint=adjoint,
                backward_stats=backward_stats,
            )

        def apply_cell(params, x_, z_, key):  # one f evaluation, context recomputed
            return step((params, prepare(params, key, x_, z_)), (x_, key), z_)

        if mode != _WHOLE:
            batch = _batch_size((x, z0), "x and z0")
        if mode == _VMAP:
            x_init, z_init = _take_first(x), _take_first(z0)
        else:
            x_init, z_init = x, z0
        init_key = hk.next_rng_key() if hk.running_init() else None
        with _naming_user_shapes(x, z0, mode):
            params = hk.lift(init_params, allow_reuse=True)(init_key, x_init, z_init)
        key = hk.maybe_next_rng_key()

        if mode == _VMAP:
            keys = None if key is None else jax.random.split(key, batch)
            key_axis = None if key is None else 0

            def solve_one(params, x_i, z0_i, key_i):
                z_i, sol_i = solve_batch(params, _add_batch(x_i), _add_batch(z0_i), key_i)
                samples = sol_i.samples  # [n, 1, ...]: drop the cell's batch axis of 1
                if samples is not None:
                    samples = jax.tree_util.tree_map(lambda s: s[:, 0], samples)
                return _drop_batch(z_i), sol_i._replace(
                    value=_drop_batch(sol_i.value),
                    f_value=_drop_batch(sol_i.f_value),
                    samples=samples,
                )

            def run_solve(params, x, z0, keys):
                return jax.vmap(solve_one, in_axes=(None, 0, 0, key_axis))(params, x, z0, keys)

            def cell_one(x_i, z_i, key_i):
                return _drop_batch(apply_cell(params, _add_batch(x_i), _add_batch(z_i), key_i))

            def bound_cell(z):
                return jax.vmap(cell_one, in_axes=(0, 0, key_axis))(x, z, keys)
        else:
            # Batch-native or whole-batch: the whole batch in the cell and one key for the forward
            # pass (the cell's draws shaped [B, ...] give each example its own rows).
            keys = key
            run_solve = solve_batch

            def bound_cell(z):
                return apply_cell(params, x, z, key)

        with _naming_user_shapes(x, z0, mode):
            if hk.running_init() and not self.solve_at_init:
                # Skip the solve (compiling it for init would double the compile time): z* :=
                # f(z0), a Solution of the right structure with no steps taken.
                z_star = bound_cell(z0)
                sol = _unsolved(jax.eval_shape(run_solve, params, x, z0, keys)[1], z_star)
            else:
                z_star, sol = run_solve(params, x, z0, keys)

        # This pass's cell map, for solve() (which calls __call__: Haiku names the parameters
        # by the method that creates them, so there is one forward method).
        self._cell_fn = bound_cell
        return z_star, sol

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
        z_star, sol = self(x, z0, is_training=is_training, backward_stats=backward_stats)
        f_star = None  # a user solver may return no f_value
        if sol.f_value is not None:
            f_star = jax.tree_util.tree_map(
                lambda z, fz: z + jax.lax.stop_gradient(fz - z), z_star, sol.f_value
            )
        return DEQOutput(z_star, sol, self._cell_fn, f_star)
