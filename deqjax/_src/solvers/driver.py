"""The driver: the bounded loop that runs a fixed-point solver's proposal rule.

A fixed-point solver in deqjax is a *proposal rule* run by :func:`solve`. Each iteration evaluates
``f`` once at the current iterate ``x_k``; the driver judges it by the one stopping rule
(:mod:`deqjax._src.solvers.stopping`: residual in the trace, the best iterate, the status), and
unless the problem stopped asks the rule for ``x_{k+1}``. So ``num_steps`` is exactly the number of
evaluations of ``f``, and no solver holds stopping logic of its own.

A rule (:class:`ProposalRule`) is a function
``propose(state, k, x, f(x), f(x) - x, ||f(x) - x||^2, running) -> (x_{k+1}, state)`` and its
initial state (the squared residual norm is the stopping rule's: a rule that needs it reduces
nothing; ``running`` says which problems this step belongs to: a rule whose state outlives the
loop, Broyden's inverse estimate, leaves a stopped problem's part of it alone).
A solver that must remember more about its best iterate than the iterate itself (the reversible
solver keeps the pair ``(x_{k-1}, x_k)`` and ``k``, and checkpoints) adds a ``track`` hook, called
with each step's judgement, and a ``finish`` hook that turns what it kept into extra fields of the
:class:`~deqjax.solvers.Solution`.

Batches (``batch_ndim = n``): the leading ``n`` axes of every leaf of ``z0`` index independent
problems. One loop runs while any problem is running; ``f`` is evaluated on the whole batch once per
step; every statistic is per problem, and a problem that has stopped keeps its fields frozen (it
evaluates its best iterate until the loop ends, and nothing of those evaluations is kept). The
result equals ``jax.vmap`` of the ``batch_ndim=0`` solve (up to float rounding), at the cost of one
batched loop. No branch raises or prints, so a solve runs under ``jit`` and ``vmap``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from deqjax._src import tree
from deqjax._src.solvers import loop as loop_lib
from deqjax._src.solvers import stopping, verify
from deqjax._src.solvers.options import DriverOptions
from deqjax._src.solvers.problem import Problem, check_problem
from deqjax._src.solvers.solution import Solution

PyTree = Any

# propose(state, k, x, fx, gx, gx_sq, running) -> (next_x, state); gx = fx - x and its squared
# norm per problem gx_sq (no gradient) are passed so rules need not recompute them. k is the shared
# step counter (a scalar int32 under batch_ndim > 0); running (bool [*batch]) marks the problems
# this step belongs to (a stopped problem evaluates its best iterate until the loop ends).
ProposeFn = Callable[
    [Any, jax.Array, PyTree, PyTree, PyTree, jax.Array, jax.Array], tuple[PyTree, Any]
]


class LoopEnd(NamedTuple):
    """What the loop leaves for a rule's ``finish`` hook."""

    k: jax.Array  # int32 []: loop steps run
    num_steps: jax.Array  # int32 [*batch]: evaluations per problem
    state: Any  # the rule's final state
    extra: Any  # what the rule's track hook kept
    value: PyTree  # the best iterate


class ProposalRule(NamedTuple):
    """A proposal rule and its optional hooks.

    Attributes:
      propose: ``(state, k, x, fx, gx, gx_sq, running) -> (next_x, state)``.
      state0: the rule's initial state.
      track: ``(extra, step, k, x, state) -> extra``: called at each step with the
        :class:`~deqjax._src.solvers.stopping.StepUpdate` judging ``x`` and the rule's state
        before ``propose``; ``None`` keeps nothing.
      extra0: the initial ``extra``.
      finish: ``(LoopEnd) -> dict``: extra fields of the Solution (``inverse_estimate``,
        ``reversible_state``); ``None`` adds none.
    """

    propose: ProposeFn
    state0: Any
    track: Callable[[Any, stopping.StepUpdate, jax.Array, PyTree, Any], Any] | None = None
    extra0: Any = ()
    finish: Callable[[LoopEnd], dict[str, Any]] | None = None


class _Carry(NamedTuple):
    k: jax.Array  # int32 []: loop iterations done, shared by every problem
    x: PyTree  # the next iterate to evaluate
    state: Any  # the proposal rule's state
    best_x: PyTree  # best iterate so far (see stopping)
    best_fx: PyTree  # f(best_x)
    best_aux: PyTree  # the aux of f at best_x (() without has_aux)
    book: stopping.Book  # per-problem residuals, status, num_steps, trace
    samples: PyTree  # () or, with sample_steps, leaves [*batch, n_samples, ...]
    extra: Any  # what the rule's track hook keeps


def _record_sample(
    samples: PyTree,
    sample_ids: jax.Array,
    k: jax.Array,
    running: jax.Array,
    x: PyTree,
    batch_ndim: int,
) -> PyTree:
    """Writes ``x`` (evaluated at loop step ``k``) into the slot of step ``k`` of the problems
    still ``running``, if ``k`` is one of ``sample_ids``; ``samples`` leaves are
    ``[*batch, n, ...]``."""
    hits = sample_ids == k
    slot = jnp.argmax(hits).astype(jnp.int32)
    record = running & jnp.any(hits)
    if batch_ndim == 0:  # a masked select (k is batched under vmap)
        return tree.tree_set_row(samples, jnp.where(record, slot, -1), x)
    # The shared slot, written in place.
    old = jax.tree_util.tree_map(
        lambda s: jax.lax.dynamic_index_in_dim(s, slot, batch_ndim, False), samples
    )
    return tree.tree_put_row(samples, slot, tree.tree_where(record, x, old, batch_ndim), batch_ndim)


def _fill_samples(
    samples: PyTree,
    sample_ids: jax.Array,
    num_steps: jax.Array,
    value: PyTree,
    batch_ndim: int,
) -> PyTree:
    """``samples`` with the slots of steps a problem did not reach (it stopped first, so that
    iterate was never evaluated) holding its returned ``value``."""
    late = sample_ids.reshape((1,) * batch_ndim + (-1,)) >= num_steps[..., None]  # [*batch, n]

    def fill(s, best):
        mask = late.reshape(late.shape + (1,) * (s.ndim - late.ndim))
        return jnp.where(mask, jnp.expand_dims(best, batch_ndim), s)

    return jax.tree_util.tree_map(fill, samples, value)


def _body(problem: Problem, options: DriverOptions, rule: ProposalRule, sample_ids: Any):
    """The loop body: one evaluation of ``f``, its judgement, the rule's proposal."""
    srule = stopping.fixed_point_rule(options)
    bn = problem.batch_ndim

    def body_fun(c: _Carry) -> _Carry:
        fx, aux = problem.fn(c.x)
        gx = tree.tree_sub(fx, c.x)
        u = stopping.judge(c.x, fx, gx, c.book, srule, start=c.k)
        extra = c.extra if rule.track is None else rule.track(c.extra, u, c.k, c.x, c.state)
        next_x, state = rule.propose(c.state, c.k, c.x, fx, gx, u.residuals.abs_sq, u.running)
        samples = c.samples
        if sample_ids is not None:
            samples = _record_sample(samples, sample_ids, c.k, u.running, c.x, bn)
        best_x = tree.tree_where(u.improved, c.x, c.best_x, bn)
        return _Carry(
            k=c.k + 1,
            # A problem that stopped evaluates its best iterate from now on (its fields are
            # frozen, so the value is never used). Reading best_x here also orders every read of
            # the old x before the new x is written: XLA then updates x in place, where a
            # write it could schedule before the best-iterate select costs a copy of x per step.
            x=tree.tree_where(u.still, next_x, best_x, bn),
            state=state,
            best_x=best_x,
            best_fx=tree.tree_where(u.take_fx, fx, c.best_fx, bn),
            best_aux=tree.tree_where(u.take_fx, aux, c.best_aux, bn),
            book=u.book,
            samples=samples,
            extra=extra,
        )

    return body_fun


def solve(problem: Problem, options: DriverOptions, rule: ProposalRule) -> Solution:
    """Runs a proposal rule on the bounded loop and assembles the :class:`Solution`.

    ``options.sample_steps``: record the iterate evaluated at loop step ``s`` (``x_s``,
    ``x_0 = z0``) of each problem in ``Solution.samples``; steps a problem never evaluated get
    its ``value``. Costs one masked select over the ``n``-row sample buffer per step; ``None``
    keeps no buffer.
    """
    sample_steps = options.sample_steps  # sorted, validated by the options
    z0, bn = problem.z0, problem.batch_ndim
    sample_ids, samples0 = None, ()
    if sample_steps is not None:
        sample_ids = jnp.asarray(sample_steps, jnp.int32)
        samples0 = tree.tree_stack_zeros(z0, len(sample_steps), bn)
    init = _Carry(
        k=jnp.zeros((), jnp.int32),
        x=z0,
        state=rule.state0,
        best_x=z0,
        best_fx=z0,
        best_aux=problem.aux0,
        book=stopping.initial_book(problem.batch_shape, options.max_steps, problem.rdtype),
        samples=samples0,
        extra=rule.extra0,
    )
    c = loop_lib.bounded_while_loop(
        lambda c: jnp.any(c.book.running),
        _body(problem, options, rule, sample_ids),
        init,
        max_steps=options.max_steps,
        loop=options.loop,
        check_every=loop_lib.steps_per_check(options.check_every, options.max_steps),
    )
    book = c.book
    samples = None
    if sample_ids is not None:
        samples = _fill_samples(c.samples, sample_ids, book.num_steps, c.best_x, bn)
    end = LoopEnd(c.k, book.num_steps, c.state, c.extra, c.best_x)
    sol = Solution(
        value=c.best_x,
        num_steps=book.num_steps,
        abs_residual=book.abs_residual,
        rel_residual=book.rel_residual,
        trace=book.trace,
        status=book.status,
        f_value=c.best_fx,
        samples=samples,
        aux=c.best_aux if problem.has_aux else None,
        **({} if rule.finish is None else rule.finish(end)),
    )
    return verify.verified(problem, stopping.fixed_point_rule(options), sol)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DriverSolver(DriverOptions):
    """A solver run by the driver: a subclass declares its fields and its :meth:`rule`."""

    def rule(self, problem: Problem) -> ProposalRule:
        """The proposal rule for ``problem`` with this object's settings."""
        raise NotImplementedError

    def _run(self, f: Callable[[PyTree], PyTree], z0: PyTree, /) -> Solution:
        """Solves ``z = f(z)`` from ``z0`` (see the class's fields for the settings)."""
        problem = check_problem(f, z0, batch_ndim=self.batch_ndim, has_aux=self.has_aux)
        stopping.check_resolvable(self.tol, self.stop_mode, problem.z0)
        return solve(problem, self, self.rule(problem))
