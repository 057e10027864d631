"""Reversible fixed-point iteration (McCallum, Arora, Foster, "Reversible Deep Equilibrium Models",
2025, arXiv 2509.12917).

The paper's scheme runs two coupled relaxed iterations from ``y_0 = z_0``::

    y_{n+1} = (1 - β) y_n + β f(z_n)
    z_{n+1} = (1 - β) z_n + β f(y_{n+1})

Each half-step is algebraically invertible for ``β ≠ 1``
(``z_n = (z_{n+1} - β f(y_{n+1})) / (1 - β)``, then ``y_n = (y_{n+1} - β f(z_n)) / (1 - β)``), so
the iterates can be rebuilt backwards from the last pair alone: :class:`deqjax.ReversibleAdjoint`
back-propagates through the solve in memory independent of the number of steps.

Here the two sequences are interleaved into one, ``w_{-1} = w_0 = z_0``, ``w_{2n} = z_n``,
``w_{2n-1} = y_n``, which obeys the second-order recurrence (one evaluation of ``f`` per step)::

    w_{k+1} = (1 - β) w_{k-1} + β f(w_k),        w_{k-1} = (w_{k+1} - β f(w_k)) / (1 - β).

So, as in every deqjax solver, ``num_steps`` counts evaluations of ``f`` (one paper step is two),
the residual ``||f(w_k) - w_k||`` of every evaluated iterate (``y`` or ``z``) is traced and tested
for stopping, and ``value`` is the lowest-residual iterate seen. The pair ``(w_{k-1}, w_k)`` of that
iterate and its index ``k`` are all the reverse pass needs (``return_state=True``).

Floating-point reversal: the inverse divides by ``1 - β`` and expands rounding at least as fast
as the forward contracts (the forward destroys that information), so the rebuilt start is off by
at least about ``eps / tol`` and a tightly converged float32 solve cannot be rebuilt. The gradient
degrades more slowly (the cotangent reaching old iterates shrinks too) but in float32 it is about
1e-2 off beyond ~15 evaluations on the d = 512 benchmark (BENCHMARKS.md, "Reversible solver");
``checkpoint_every`` bounds the amplification, :func:`reversal_error` measures it.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from deqjax._src import checks, tree, vma
from deqjax._src.solvers import driver, registry, stopping
from deqjax._src.solvers.problem import Problem
from deqjax._src.solvers.solution import Solution

PyTree = Any

# The paper's code uses beta = 0.8 in its examples, tests and image-classification runs.
DEFAULT_BETA = 0.8


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["prev", "value", "steps", "checkpoints"],
    meta_fields=["beta", "checkpoint_every"],
)
@dataclasses.dataclass(frozen=True)
class ReversibleState:
    """What the reverse pass needs: the pair ``(w_{k-1}, w_k)`` of the returned iterate and ``k``.

    Attributes:
      prev: pytree like ``z0``: ``w_{k-1}``, the iterate before the returned one.
      value: pytree like ``z0``: ``w_k``, the returned iterate (``Solution.value``).
      steps: int32 ``[*batch]``: ``k``, the number of relaxed updates from ``(z0, z0)`` to
        ``(prev, value)`` (per problem); ``k`` reverse steps rebuild ``(z0, z0)``.
      beta: the relaxation ``β`` (static).
      checkpoints: ``None``, or with ``checkpoint_every = m`` the pairs ``(w_{j-1}, w_j)`` at
        ``j = m, 2m, ...`` as a pair of pytrees whose leaves have ``[*batch, max_steps // m, ...]``
        (rows a problem never reached are unused).
      checkpoint_every: ``m`` or ``None`` (static).
    """

    prev: PyTree
    value: PyTree
    steps: jax.Array
    beta: float = dataclasses.field(metadata={"static": True})
    checkpoints: Any = None
    checkpoint_every: int | None = dataclasses.field(default=None, metadata={"static": True})


def check_beta(beta: Any) -> float:
    """``beta`` as a float; ``ValueError`` unless it is a number in ``(0, 1)`` or ``(1, 2)``."""
    if isinstance(beta, (bool, str)):
        raise ValueError(f"beta must be a Python float in (0, 1) or (1, 2), got {beta!r}.")
    try:
        value = float(beta)
    except (TypeError, ValueError, jax.errors.ConcretizationTypeError) as err:
        raise ValueError(
            f"beta must be a concrete Python float in (0, 1) or (1, 2), got {beta!r}."
        ) from err
    if not (0.0 < value < 2.0) or value == 1.0:
        raise ValueError(
            f"beta must be in (0, 1) or (1, 2), got {value}: beta = 1 is plain fixed-point "
            "iteration, which is not invertible (the reverse step divides by 1 - beta), and "
            "beta outside (0, 2) does not converge even for f = const."
        )
    return value


def check_checkpoint_every(checkpoint_every: Any) -> None:
    """``ValueError`` unless ``checkpoint_every`` is ``None`` or an int ``>= 1``."""
    checks.check_int(checkpoint_every, "checkpoint_every", allow_none=True)


def _relax(beta: float, prev: PyTree, fx: PyTree) -> PyTree:
    """``(1 - β) prev + β f(w_k)``: the forward step (``β`` a Python float, weakly typed)."""
    return jax.tree_util.tree_map(lambda p, v: (1.0 - beta) * p + beta * v, prev, fx)


def unrelax(beta: float, nxt: PyTree, fx: PyTree) -> PyTree:
    """``(w_{k+1} - β f(w_k)) / (1 - β) = w_{k-1}``: the exact algebraic inverse of the step."""
    return jax.tree_util.tree_map(lambda n, v: (n - beta * v) / (1.0 - beta), nxt, fx)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Reversible(driver.DriverSolver):
    """The reversible (coupled, relaxed) fixed-point iteration, as a solver object.

    McCallum, Arora and Foster (2025), the reversible scheme: ``y_{n+1} = (1-β) y_n + β
    f(z_n)``, ``z_{n+1} = (1-β) z_n + β f(y_{n+1})`` from ``y_0 = z_0``, run here as the
    interleaved sequence ``w_{k+1} = (1-β) w_{k-1} + β f(w_k)``, ``w_{-1} = w_0 = z_0`` (see
    the module docstring). Every evaluated iterate, ``y`` or ``z``, is a candidate: the solve stops
    at the first whose residual meets ``tol`` and returns the lowest-residual one, with the same
    statistics, stop modes, divergence rule and per-problem batching as the other solvers
    (``max_steps`` counts evaluations of ``f``: one step of the paper is two). Differentiate it
    with :class:`deqjax.ReversibleAdjoint` (exact backprop through the solve in O(1) memory in
    ``max_steps``) or any other adjoint.

    Fields: those of :class:`~deqjax._src.solvers.options.Options` and
    :class:`~deqjax._src.solvers.options.DriverOptions`, and

    Attributes:
      beta: relaxation ``β`` in ``(0, 1)`` or ``(1, 2)`` (``β = 1`` is not invertible). Default
        0.8, the value of the paper's code (examples, tests, image classification); ``β`` near 1
        converges fastest for a strongly contractive ``f`` but amplifies rounding in the reverse
        pass by ``1/|1-β|`` per step, ``β`` near 0 reverses gently but converges slowly.
      return_state: also return, as ``Solution.reversible_state``, the :class:`ReversibleState`
        (the pair of the returned iterate and its index) that :class:`deqjax.ReversibleAdjoint`
        reverses from.
      checkpoint_every: ``None`` (default: O(1) memory), or ``m >= 1``: with ``return_state``, also
        keep the pair at every ``m``-th evaluation (``2 max_steps / m`` states), where the reverse
        pass restarts from the stored pair instead of its own rebuilt one, so rounding is amplified
        over at most ``m`` steps (``dq.ReversibleAdjoint(checkpoint_every=m)`` sets it).

    Example:
      >>> sol = dq.solvers.Reversible(tol=1e-6)(jnp.cos, jnp.array(1.0))
      >>> sol.value  # 0.739085...
    """

    forward_only: ClassVar[dict[str, Any]] = {
        **driver.DriverSolver.forward_only,
        "return_state": False,
    }

    beta: float = DEFAULT_BETA
    return_state: bool = False
    checkpoint_every: int | None = None

    def check(self) -> None:
        super().check()
        check_beta(self.beta)
        checks.check_bool(self.return_state, "return_state")
        check_checkpoint_every(self.checkpoint_every)

    def rule(self, problem: Problem) -> driver.ProposalRule:
        beta = check_beta(self.beta)

        def propose(prev, k, x, fx, gx, gx_sq, running):
            # (w_{k-1}, w_k) -> (w_k, w_{k+1}): the state is the iterate before x.
            del k, gx, gx_sq, running
            return _relax(beta, prev, fx), x

        if not self.return_state:
            return driver.ProposalRule(propose, problem.z0)
        every = self.checkpoint_every
        n_checkpoints = self.max_steps // every if every else 0
        return driver.ProposalRule(
            propose,
            problem.z0,
            track=functools.partial(_track, every, n_checkpoints, problem.batch_ndim),
            extra0=_initial_kept(problem, n_checkpoints),
            finish=functools.partial(_state_of, beta, every if n_checkpoints else None),
        )


class _Kept(NamedTuple):
    """What the reverse pass needs, kept through the loop (the driver's ``extra``)."""

    best_prev: PyTree  # w_{k-1} of the best iterate w_k
    best_k: jax.Array  # int32 [*batch]: index k of the best iterate
    checkpoints: Any  # () or (prev rows, cur rows) with leaves [*batch, n_checkpoints, ...]


def _initial_kept(problem: Problem, n_checkpoints: int) -> _Kept:
    checkpoints = ()
    if n_checkpoints:
        stack = tree.tree_stack_zeros(problem.z0, n_checkpoints, problem.batch_ndim)
        checkpoints = (stack, stack)
    return _Kept(problem.z0, jnp.zeros(problem.batch_shape, jnp.int32), checkpoints)


def _track(
    every: int | None,
    n_checkpoints: int,
    bn: int,
    kept: _Kept,
    step: stopping.StepUpdate,
    k: jax.Array,
    cur: PyTree,
    prev: PyTree,
) -> _Kept:
    """Keeps the pair ``(w_{k-1}, w_k) = (prev, cur)`` and ``k`` of the best iterate, and the
    pair of every ``every``-th evaluation (at row ``k // every - 1``)."""
    checkpoints = kept.checkpoints
    if n_checkpoints:
        due = step.running & (k > 0) & (k % every == 0)
        row = jnp.where(due, k // every - 1, -1)
        checkpoints = (
            tree.tree_set_row(checkpoints[0], row, prev, bn),
            tree.tree_set_row(checkpoints[1], row, cur, bn),
        )
    # A running problem has made exactly k evaluations: k is the index of cur.
    return _Kept(
        best_prev=tree.tree_where(step.improved, prev, kept.best_prev, bn),
        best_k=jnp.where(step.improved, k, kept.best_k),
        checkpoints=checkpoints,
    )


def _state_of(beta: float, every: int | None, end: driver.LoopEnd) -> dict[str, ReversibleState]:
    kept = end.extra
    state = ReversibleState(
        prev=kept.best_prev,
        value=end.value,
        steps=kept.best_k,
        beta=beta,
        checkpoints=kept.checkpoints if every else None,
        checkpoint_every=every,
    )
    return {"reversible_state": state}


@registry.function_form(Reversible)
def reversible(f: Callable[[PyTree], PyTree], z0: PyTree, /, **options) -> Solution:
    """Solves ``z = f(z)`` by the reversible fixed-point iteration, ``Reversible(**options)``.

    Args:
      f: the map ``Z -> Z`` over any pytree of float arrays (``(z, aux)`` with ``has_aux``).
      z0: initial iterate (``y_0 = z_0``).
      **options: the fields of :class:`~deqjax.solvers.Reversible` (``beta=0.8``,
        ``max_steps=50``, ``tol=1e-4``, ``stop_mode="rel"``, ``return_state=False``,
        ``checkpoint_every=None``, ...).

    Returns:
      A :class:`~deqjax.solvers.Solution`; ``value`` is the best iterate and ``f_value`` is
      ``f(value)`` (with ``return_state``, ``reversible_state`` is set).

    Raises:
      ValueError: for invalid arguments (named in the message).

    Example:
      >>> sol = dq.solvers.reversible(jnp.cos, jnp.array(1.0), tol=1e-6)
      >>> sol.value  # 0.739085...
    """
    return Reversible(**options)(f, z0)


def _stored_pair(state: ReversibleState, index: jax.Array, batch_ndim: int):
    """Where the pair of ``index`` (per problem) was checkpointed: ``(hit, prev, cur)``."""
    m = state.checkpoint_every
    n = jax.tree_util.tree_leaves(state.checkpoints[0])[0].shape[batch_ndim]
    hit = (index > 0) & (index % m == 0) & (index // m <= n)
    row = jnp.clip(index // m - 1, 0, n - 1).astype(jnp.int32)

    def take(stack):
        if batch_ndim == 0:
            return jax.lax.dynamic_index_in_dim(stack, row, 0, keepdims=False)
        idx = row.reshape(row.shape + (1,) * (stack.ndim - batch_ndim))
        return jnp.take_along_axis(stack, idx, axis=batch_ndim).squeeze(batch_ndim)

    prev, cur = (jax.tree_util.tree_map(take, t) for t in state.checkpoints)
    return hit, prev, cur


def reverse_step(
    f_value: PyTree,
    state: ReversibleState,
    i: jax.Array,
    u: PyTree,
    v: PyTree,
    batch_ndim: int,
) -> tuple[PyTree, PyTree]:
    """Step ``i`` of the reverse pass: from the pair ``(u, v) = (w_j, w_{j+1})`` with
    ``j = steps - 1 - i`` and ``f_value = f(u)``, the pair ``(w_{j-1}, w_j)``, taken from the
    checkpoints where one was stored. Problems with ``i >= steps`` keep ``(u, v)``."""
    active = i < state.steps
    older, newer = unrelax(state.beta, v, f_value), u
    if state.checkpoints is not None:
        hit, c_prev, c_cur = _stored_pair(state, state.steps - 1 - i, batch_ndim)
        older = tree.tree_where(hit, c_prev, older, batch_ndim)
        newer = tree.tree_where(hit, c_cur, newer, batch_ndim)
    return (
        tree.tree_where(active, older, u, batch_ndim),
        tree.tree_where(active, newer, v, batch_ndim),
    )


def reconstruct(
    f: Callable[[PyTree], PyTree], state: ReversibleState, *, batch_ndim: int = 0
) -> tuple[PyTree, PyTree]:
    """Runs the reversible iteration backwards from ``state`` to its start.

    Args:
      f: the map the forward solve used.
      state: a :class:`ReversibleState` (``reversible(..., return_state=True)``).
      batch_ndim: as in the forward solve; each problem reverses its own ``state.steps``.

    Returns:
      The rebuilt ``(w_{-1}, w_0)``, equal to ``(z0, z0)`` up to floating-point reversal error.
    """

    def cond_fun(c):
        return jnp.any(c[0] < state.steps)

    def body_fun(c):
        i, prev, cur = c
        return (i + 1, *reverse_step(f(prev), state, i, prev, cur, batch_ndim))

    init = (jnp.zeros((), jnp.int32), state.prev, state.value)
    _, prev, cur = vma.while_loop(cond_fun, body_fun, init)
    return prev, cur


def reversal_error(
    f: Callable[[PyTree], PyTree], z0: PyTree, *, batch_ndim: int = 0, **solver_kwargs: Any
) -> jax.Array:
    """Floating-point reversal error of :func:`reversible` on ``z = f(z)`` from ``z0``.

    Solves forward, rebuilds ``(y_0, z_0)`` from the returned pair by the exact algebraic inverse
    and returns ``max(||ŷ_0 - z0||, ||ẑ_0 - z0||) / max(||z0||, ||z*||)`` per problem (shape
    ``[*batch]``). Jit-able; ``solver_kwargs`` go to :func:`reversible`.
    """
    sol = Reversible(batch_ndim=batch_ndim, return_state=True, **solver_kwargs)(f, z0)
    y0_hat, z0_hat = reconstruct(f, sol.reversible_state, batch_ndim=batch_ndim)
    err = jnp.maximum(
        tree.tree_norm(tree.tree_sub(y0_hat, z0), batch_ndim),
        tree.tree_norm(tree.tree_sub(z0_hat, z0), batch_ndim),
    )
    scale = jnp.maximum(tree.tree_norm(z0, batch_ndim), tree.tree_norm(sol.value, batch_ndim))
    return err / jnp.maximum(scale, jnp.finfo(scale.dtype).tiny)
