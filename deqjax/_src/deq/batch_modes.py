"""How a DEQ layer (``dq.nn.DEQ``, ``deqjax.nnx.DEQ``, ``deqjax.equinox.DEQ``) solves a batch: the
three batching modes.

``per_example=True`` (each example stops on its own) runs in one of two modes, chosen from the
solver's declared capability ``batch_native``:

* **batch-native** (the solver takes ``batch_ndim``): the cell sees the WHOLE batch at every
  solver step and the solver runs with ``batch_ndim=1``, so one loop runs for the batch while
  each example converges on its own and reports its own ``num_steps``/``status``/residuals (the
  ``Solution``'s fields are ``[B]``, ``trace`` ``[B, max_steps]``); the implicit backward solves
  every example's adjoint in one batched loop.
* **vmap** (a solver that declares no ``batch_ndim``, e.g. a user's own ``(f, z0) -> Solution``):
  ``jax.vmap`` of a single-problem solve over the leading axis, the cell seeing batches of size 1.
  Same results, slower (every example runs every loop step, and batch-1 cell evaluations waste
  convolution/attention throughput).

``per_example=False`` is the **whole-batch** mode: one solve for the whole batch, one stopping
test (on the norm over the whole batch), scalar statistics.

One key per forward pass (Haiku's ``hk.maybe_next_rng_key()``, the front-ends' ``key``) is passed
to every cell evaluation of that pass; the vmap mode splits it into one key per example. Nothing
here depends on a framework: the cell comes as its two phases (:class:`~.phases.CellPhases`).
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from deqjax._src import fixed_point as fixed_point_lib
from deqjax._src.deq.phases import CellPhases
from deqjax._src.solvers.base import Solver
from deqjax._src.solvers.solution import Solution

PyTree = Any
SolveFn = Callable[[Any, PyTree, PyTree, Any], tuple[PyTree, Solution]]


class Mode(enum.Enum):
    """A batching mode; its value says how the cell is called (for error messages)."""

    WHOLE_BATCH = "the cell is called on x and z0 as given"
    BATCH_NATIVE = (
        "per-example mode takes the leading axis as the batch and calls the cell on the whole batch"
    )
    VMAP = (
        "per-example mode with a solver that is not batch-native takes the leading axis as the "
        "batch and calls the cell on one example at a time, with a batch axis of 1"
    )


def mode_of(per_example: bool, solver: Solver) -> Mode:
    """The mode of a solve: whole batch, else batch-native when ``solver.batch_native``."""
    if not per_example:
        return Mode.WHOLE_BATCH
    return Mode.BATCH_NATIVE if solver.batch_native else Mode.VMAP


def mode_solver(mode: Mode, solver: Solver) -> Solver:
    """``solver`` as the mode runs it: one loop over problems indexed by the leading axis in the
    batch-native mode."""
    return solver.replace(batch_ndim=1) if mode is Mode.BATCH_NATIVE else solver


class Bound(NamedTuple):
    """A forward pass's solve and cell map, bound to its parameters, input and key(s).

    Attributes:
      solve: ``solve(params, x, z0, keys) -> (z_star, solution)``.
      keys: the key(s) ``solve`` takes: the pass's key, or one per example (vmap).
      cell_fn: ``z ↦ f_θ(z; x)`` of this pass, batched like ``z``.
    """

    solve: SolveFn
    keys: Any
    cell_fn: Callable[[PyTree], PyTree]


def solve_batch(
    cell: CellPhases,
    solver: Solver,
    adjoint: Any,
    backward_stats: Any,
) -> SolveFn:
    """``solve(params, x, z0, key)``: prepare the pass's context, then :func:`dq.fixed_point`
    of the step phase, on arrays with a batch axis (of 1 in the vmap mode); both phases at the
    cell's matmul precision (``cell.precision``)."""

    def solve(params, x, z0, key):
        ctx = cell.prepare(params, key, x, z0)
        return fixed_point_lib.fixed_point(
            cell.step,
            (params, ctx),
            (x, key),
            z0,
            solver=solver,
            adjoint=adjoint,
            backward_stats=backward_stats,
        )

    return solve


def bind(
    mode: Mode,
    cell: CellPhases,
    solve: SolveFn,
    params: Any,
    x: PyTree,
    key: jax.Array | None,
) -> Bound:
    """The pass's :class:`Bound` in ``mode``: batch-native and whole-batch calls see the whole
    batch and one key (the cell's draws shaped ``[B, ...]`` give each example its own rows); the
    vmap mode runs one example at a time with its own key."""
    if mode is not Mode.VMAP:
        return Bound(solve, key, lambda z: cell.apply(params, x, z, key))
    keys = None if key is None else jax.random.split(key, batch_size(x, "x"))
    key_axis = None if key is None else 0
    solve_each = jax.vmap(_one_example(solve), in_axes=(None, 0, 0, key_axis))

    def apply_one(x_i, z_i, key_i):
        return _drop_batch(cell.apply(params, _add_batch(x_i), _add_batch(z_i), key_i))

    def cell_fn(z):
        return jax.vmap(apply_one, in_axes=(0, 0, key_axis))(x, z, keys)

    return Bound(solve_each, keys, cell_fn)


def _one_example(solve: SolveFn) -> SolveFn:
    """``solve`` of one example without its batch axis (given a batch axis of 1 inside)."""

    def solve_one(params, x_i, z0_i, key_i):
        z_i, sol_i = solve(params, _add_batch(x_i), _add_batch(z0_i), key_i)
        samples = sol_i.samples  # [n, 1, ...]: drop the cell's batch axis of 1
        if samples is not None:
            samples = jax.tree_util.tree_map(lambda s: s[:, 0], samples)
        return _drop_batch(z_i), sol_i._replace(
            value=_drop_batch(sol_i.value),
            f_value=_drop_batch(sol_i.f_value),
            samples=samples,
        )

    return solve_one


def init_inputs(mode: Mode, x: PyTree, z0: PyTree) -> tuple[PyTree, PyTree]:
    """What the cell's parameters are created from: the first example alone in the vmap mode
    (the cell then sees a batch of 1, as in every solve), else ``x`` and ``z0``."""
    if mode is Mode.VMAP:
        return _take_first(x), _take_first(z0)
    return x, z0


def batch_size(tree_: PyTree, name: str) -> int:
    """The common leading axis of every leaf of ``tree_``.

    Raises:
      ValueError: naming ``name``, if the leaves have no common leading axis.
    """
    leaves = jax.tree_util.tree_leaves(tree_)
    sizes = {leaf.shape[0] if jnp.ndim(leaf) else None for leaf in leaves}
    if len(sizes) != 1 or None in sizes:
        raise ValueError(
            f"{name}: in per-example mode every leaf must have the same leading batch axis; got "
            f"shapes {[jnp.shape(leaf) for leaf in leaves]}."
        )
    return sizes.pop()


@contextlib.contextmanager
def naming_user_shapes(x: PyTree, z0: PyTree, mode: Mode, layer: str) -> Iterator[None]:
    """Re-raises a cell's shape error with the shapes the user passed (not the internal ones),
    naming the ``layer`` (e.g. ``"dq.nn.DEQ"``)."""
    try:
        yield
    except (ValueError, TypeError) as e:
        shapes = lambda t: [tuple(jnp.shape(a)) for a in jax.tree_util.tree_leaves(t)]  # noqa: E731
        raise (TypeError if isinstance(e, TypeError) else ValueError)(
            f"{layer} failed on the input x of shape {shapes(x)} with z0 of shape "
            f"{shapes(z0)} ({mode.value}). If the shapes are the problem: x and z0 need a leading "
            f"batch axis [B, ...]; for a single example pass x[None]. The error: {e}"
        ) from e


def _take_first(tree_: PyTree) -> PyTree:
    return jax.tree_util.tree_map(lambda a: a[:1], tree_)


def _add_batch(tree_: PyTree) -> PyTree:
    return jax.tree_util.tree_map(lambda a: a[None], tree_)


def _drop_batch(tree_: PyTree) -> PyTree:
    return jax.tree_util.tree_map(lambda a: a[0], tree_)
