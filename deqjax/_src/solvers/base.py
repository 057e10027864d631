"""What every forward solver shares: the :class:`Solution`, status codes, validation and the driver.

A solver in deqjax is a *proposal rule* run by :func:`solve`. Each driver iteration evaluates ``f``
once at the current iterate ``x_k``; the driver records the residual ``r_k`` in the trace, keeps the
best iterate seen, decides whether to stop, and otherwise asks the rule for ``x_{k+1}``. So
``num_steps`` is exactly the number of evaluations of ``f``, and all stopping logic lives here.

Residuals, by ``stop_mode`` (``g_k = f(x_k) - x_k``):

* ``"abs"``:   ``r_k = ||g_k||``
* ``"rel"``:   ``r_k = ||g_k|| / ||f(x_k)||``
* ``"mixed"``: ``r_k = ||g_k|| / (atol / tol + ||x_k||)``, so ``r_k <= tol`` is optimistix's
  combined rule ``||f(x) - x|| <= atol + tol * ||x||`` (``atol`` defaults to ``tol``: the scale is
  ``1 + ||x||``). It reaches a fixed point at 0, where ``"rel"`` stalls (its denominator vanishes).

Stopping, checked after each evaluation in this order:

1. ``r_k <= tol``                                      -> ``CONVERGED``
2. ``f(x_k)`` or ``r_k`` not finite                      -> ``NONFINITE``
3. ``||g_k|| > divergence_factor * min_{j<k} ||g_j||``  -> ``DIVERGED`` (the "protective break"
   of the DEQ code), judged on the ABSOLUTE residual in every ``stop_mode``: a blowing-up map
   such as ``z -> 2z + 1`` has a relative residual that tends to a constant and would never trip
   a relative test.
4. ``k + 1 == max_steps``                            -> ``MAX_STEPS``

The returned ``value`` ("best" iterate) is the iterate with the lowest ``r_k`` among those whose
absolute residual is at most twice the lowest absolute residual seen before them (a converged
iterate always qualifies). In ``"abs"`` mode this is simply the lowest-residual iterate. In
``"rel"`` and ``"mixed"`` mode the extra condition keeps a geometrically growing sequence, whose
relative residual shrinks as ``||f(x)||`` grows, from being returned: the returned absolute
residual is never more than twice the lowest one seen, so ``z -> 2z + 1`` from 0 returns ``z = 1``
(absolute residual 2), not an iterate with absolute residual ``1e7``. (Twice, not once: an
oscillating iteration's lowest relative residual often sits a few percent above its lowest
absolute residual.)

Batches (``batch_ndim = n``): the leading ``n`` axes of every leaf of ``z0`` index independent
problems. One loop runs while any problem is running; ``f`` is evaluated on the whole batch once per
step; norms, residuals, stopping, the best iterate, ``num_steps``, ``status`` and ``trace`` are per
problem, and a problem that has stopped keeps its fields frozen. The result equals ``jax.vmap`` of
the ``batch_ndim=0`` solve (up to float rounding), at the cost of one batched loop.

No branch raises or prints, so a solve can run under ``jit`` and ``vmap`` (where each example
keeps its own status, step count and statistics).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from deqjax._src import checks, tree
from deqjax._src.solvers import loop as loop_lib

PyTree = Any

# Status codes (int32). RUNNING only ever appears inside the loop.
CONVERGED = 0
MAX_STEPS = 1
DIVERGED = 2
NONFINITE = 3
_RUNNING = -1

STATUS_NAMES = {
    CONVERGED: "converged",
    MAX_STEPS: "max_steps",
    DIVERGED: "diverged",
    NONFINITE: "nonfinite",
}

STOP_MODES = ("abs", "rel", "mixed")

# In "rel"/"mixed" mode an iterate can become the best only if its absolute residual is at most this
# multiple of the lowest absolute residual seen before it (see the module docstring). In "abs" mode
# the condition is implied by the ranking itself.
_BEST_ABS_SLACK = 2.0

# Denominator guard of the relative residual: ||f(z) - z|| / (||f(z)|| + _REL_EPS).
_REL_EPS = 1e-30


def _concrete(x: Any) -> np.ndarray | None:
    """``x`` as a numpy array, or None when it is abstract (a tracer under jit/vmap/grad)."""
    try:
        return np.asarray(x)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError, TypeError):
        return None


class Solution(NamedTuple):
    """Result of a forward solve of ``z = f(z)`` (one problem, or a batch with ``batch_ndim``).

    With ``batch_ndim = n`` (or under ``jax.vmap``) every field gains the leading batch axes and
    holds per-problem values; a consumer finds ``n`` as ``sol.status.ndim``.

    Attributes:
      value: pytree like ``z0``: the best iterate seen (see :mod:`deqjax.solvers`' base docstring).
      num_steps: int32 ``[*batch]``, the number of evaluations of ``f`` used.
      abs_residual: ``||f(value) - value||``.
      rel_residual: ``||f(value) - value|| / ||f(value)||``.
      trace: ``[*batch, max_steps]`` residual (in ``stop_mode``) after each evaluation; ``+inf``
        afterwards.
      status: int32, one of ``CONVERGED``, ``MAX_STEPS``, ``DIVERGED``, ``NONFINITE``.
      f_value: pytree like ``z0``: ``f(value)``, as evaluated by the solver (no extra evaluation);
        a DEQ readout that needs ``f(z*)`` can use it.
      samples: ``None`` unless the solver was called with ``sample_steps=(s_1, ..., s_n)``: then a
        pytree like ``z0`` whose leaves have ``[*batch, n, ...]``: ``samples[..., i, ...]`` is the
        iterate ``x_{s_i}`` the solver evaluated after ``s_i`` steps (``x_0 = z0``), or ``value``
        where the problem stopped before evaluating it (for the fixed-point correction loss,
        :func:`deqjax.correction_states`).
      inverse_estimate: ``None`` unless requested from a solver that keeps one
        (``broyden(..., return_inverse=True)``): its final low-rank estimate of the inverse
        Jacobian of ``g(z) = f(z) - z`` (a :class:`~deqjax.solvers.BroydenInverse`), which
        :class:`~deqjax.ShineAdjoint` reuses in the backward pass.
      reversible_state: ``None`` unless requested from the reversible solver
        (``reversible(..., return_state=True)``): the :class:`~deqjax.solvers.ReversibleState`
        (the returned iterate's pair and index) that :class:`~deqjax.ReversibleAdjoint` reverses
        from.
    """

    value: PyTree
    num_steps: jax.Array
    abs_residual: jax.Array
    rel_residual: jax.Array
    trace: jax.Array
    status: jax.Array
    f_value: PyTree = None
    samples: PyTree = None
    inverse_estimate: Any = None
    reversible_state: Any = None

    def __repr__(self) -> str:
        status = _concrete(self.status)
        if status is None:  # abstract: shapes only
            return (
                f"Solution(<abstract: status {getattr(self.status, 'shape', ())}, "
                f"value {jax.tree_util.tree_map(lambda a: getattr(a, 'shape', ()), self.value)}>)"
            )
        steps = np.asarray(self.num_steps)
        abs_res, rel_res = np.asarray(self.abs_residual), np.asarray(self.rel_residual)
        if status.ndim == 0:
            return (
                f"Solution(status={status_name(status)}, num_steps={int(steps)}, "
                f"abs_residual={float(abs_res):.3e}, rel_residual={float(rel_res):.3e})"
            )
        names, counts = np.unique(status, return_counts=True)
        summary = ", ".join(f"{status_name(n)}: {c}" for n, c in zip(names.tolist(), counts))
        return (
            f"Solution(batch={status.shape}, status={{{summary}}}, "
            f"num_steps=[min {steps.min()}, mean {steps.mean():.1f}, max {steps.max()}], "
            f"max abs_residual={np.max(abs_res):.3e}, max rel_residual={np.max(rel_res):.3e})"
        )


class SolverFn(Protocol):
    """A forward solver: ``(f, z0) -> Solution`` (hyper-parameters bound with functools.partial)."""

    def __call__(self, f: Callable[[PyTree], PyTree], z0: PyTree, /) -> Solution: ...


def status_name(status: Any) -> str | list:
    """Name(s) of status code(s), e.g. ``status_name(sol.status)`` -> ``"converged"``.

    A scalar gives a ``str``; an array (a batched Solution's status) gives nested lists of names
    with the array's shape (``np.array(status_name(s))`` is an array of strings).
    """
    arr = np.asarray(status)
    if arr.ndim == 0:
        code = int(arr)
        return STATUS_NAMES.get(code, f"unknown({code})")
    return [status_name(s) for s in arr]


def _declared(solver: Callable[..., Any], capability: str) -> Any:
    """What ``solver`` declares about ``capability`` (solver objects: ``loop_kinds``,
    ``batch_native``; see ``solver_objects``), looking through ``functools.partial``; ``None``
    when it declares nothing (then the signature is inspected)."""
    while isinstance(solver, functools.partial):
        solver = solver.func
    return getattr(solver, capability, None)


def accepts_loop_kind(solver: Callable[..., Any]) -> bool:
    """Whether ``solver`` takes the ``loop=`` keyword: its declared ``loop_kinds`` (solver
    objects), else its signature (a function, a ``functools.partial``, a user's callable)."""
    declared = _declared(solver, "loop_kinds")
    if declared is not None:
        return "scan" in declared
    try:
        return "loop" in inspect.signature(solver).parameters
    except (TypeError, ValueError):
        return False


def accepts_batch_ndim(solver: Callable[..., Any]) -> bool:
    """Whether ``solver`` takes the ``batch_ndim=`` keyword: its declared ``batch_native`` (solver
    objects), else its signature (a function, a ``functools.partial``, a user's callable)."""
    declared = _declared(solver, "batch_native")
    if declared is not None:
        return bool(declared)
    try:
        return "batch_ndim" in inspect.signature(solver).parameters
    except (TypeError, ValueError):
        return False


def check_common_args(
    f: Callable,
    z0: PyTree,
    *,
    max_steps: int,
    tol: float,
    stop_mode: str,
    loop: str,
    atol: float | None = None,
    batch_ndim: int = 0,
) -> PyTree:
    """Validates the arguments every solver takes; raises ``ValueError`` naming the argument.

    Returns:
      ``z0`` with every leaf converted to a JAX array (Python floats become the default float).
    """
    if not callable(f):
        raise ValueError(f"f must be callable, got {type(f).__name__}.")
    checks.check_positive_int(max_steps, "max_steps")
    if not checks.check_real(tol, "tol") >= 0:  # also rejects NaN
        raise ValueError(f"tol must be >= 0, got {tol}.")
    if stop_mode not in STOP_MODES:
        raise ValueError(f"stop_mode must be one of {STOP_MODES}, got {stop_mode!r}.")
    if atol is not None:
        if not checks.check_real(atol, "atol") >= 0:
            raise ValueError(f"atol must be >= 0, got {atol}.")
        if stop_mode != "mixed":
            raise ValueError(f'atol is used only with stop_mode="mixed", got {stop_mode!r}.')
    if stop_mode == "mixed" and not tol > 0:
        raise ValueError(
            f'stop_mode="mixed" needs tol > 0 (it is the rtol of atol + tol * ||z||), got {tol}; '
            'use stop_mode="abs" for a purely absolute rule.'
        )
    checks.check_int(batch_ndim, "batch_ndim", minimum=0)
    loop_lib.check_loop_kind(loop)
    tree.check_float_tree(z0, "z0")
    z0 = jax.tree_util.tree_map(jnp.asarray, z0)
    if batch_ndim:
        leaves = jax.tree_util.tree_leaves(z0)
        batch_shape = None
        for leaf in leaves:
            if leaf.ndim < batch_ndim:
                raise ValueError(
                    f"batch_ndim={batch_ndim} needs every leaf of z0 to have at least "
                    f"{batch_ndim} leading batch axes; got a leaf of shape {list(leaf.shape)}."
                )
            if batch_shape is None:
                batch_shape = leaf.shape[:batch_ndim]
            elif leaf.shape[:batch_ndim] != batch_shape:
                raise ValueError(
                    f"batch_ndim={batch_ndim}: every leaf of z0 must share the leading batch axes "
                    f"{list(batch_shape)}; got a leaf of shape {list(leaf.shape)}."
                )
    out = jax.eval_shape(f, z0)
    in_struct = jax.tree_util.tree_structure(z0)
    out_struct = jax.tree_util.tree_structure(out)
    if in_struct != out_struct:
        raise ValueError(
            f"f must return a pytree with the structure of z0: got {out_struct}, "
            f"expected {in_struct}."
        )
    for a, b in zip(jax.tree_util.tree_leaves(z0), jax.tree_util.tree_leaves(out)):
        if np.shape(a) != b.shape or a.dtype != b.dtype:
            raise ValueError(
                "f must preserve the shape and dtype of every leaf of z0: got "
                f"{b.dtype}{list(b.shape)} for a leaf of {a.dtype}{list(np.shape(a))}."
            )
    return z0


def check_sample_steps(sample_steps: Any, max_steps: int) -> tuple[int, ...] | None:
    """Validates ``sample_steps``: ``None`` or distinct ints in ``[0, max_steps]``, sorted.

    Raises:
      ValueError: naming ``sample_steps`` and the offending entry.
    """
    if sample_steps is None:
        return None
    try:
        steps = tuple(sample_steps)
    except TypeError:
        raise ValueError(
            f"sample_steps must be None or a sequence of ints, got {sample_steps!r}."
        ) from None
    if not steps:
        raise ValueError("sample_steps must be None or a non-empty sequence of ints, got ().")
    for s in steps:
        checks.check_int(s, "every entry of sample_steps", minimum=None)
        if not 0 <= s <= max_steps:
            raise ValueError(
                f"sample_steps entries must lie in [0, max_steps={max_steps}], got {s} in "
                f"{sample_steps!r}."
            )
    if len(set(steps)) != len(steps):
        raise ValueError(f"sample_steps entries must be distinct, got {sample_steps!r}.")
    return tuple(sorted(int(s) for s in steps))


class _Carry(NamedTuple):
    k: jax.Array  # int32 []: loop iterations done, shared by every problem
    x: PyTree  # the next iterate to evaluate
    aux: Any  # the proposal rule's state
    best_x: PyTree  # best iterate so far (see the module docstring)
    best_fx: PyTree  # f(best_x)
    # The per-problem scalars are packed into two arrays so that a step updates each in one
    # fused kernel (fewer kernels per step is what matters at small d, where the loop's own
    # per-kernel cost dominates):
    stats: jax.Array  # [*batch, 4]: best's abs, rel and stop_mode residual; lowest abs seen
    counts: jax.Array  # int32 [*batch, 2]: status, num_steps
    trace: jax.Array  # [*batch, max_steps]
    samples: PyTree  # () or, with sample_steps, leaves [*batch, n_samples, ...]


_BEST_ABS, _BEST_REL, _BEST_RES, _MIN_ABS = range(4)


def _squared_norms(trees: list[PyTree], batch_ndim: int, dtype: jnp.dtype) -> jax.Array:
    """``[||t||^2 for t in trees]`` per problem, ``[len(trees), *batch]``, in one reduction."""
    total = None
    for leaves in zip(*(jax.tree_util.tree_leaves(t) for t in trees)):
        stacked = jnp.stack([leaf.astype(dtype) for leaf in leaves])
        part = jnp.sum(stacked * stacked, axis=tuple(range(1 + batch_ndim, stacked.ndim)))
        total = part if total is None else total + part
    return total


class StepUpdate(NamedTuple):
    """What one evaluation ``f(x)`` does to the per-problem bookkeeping (:func:`step_update`)."""

    running: jax.Array  # bool [*batch]: problems this step belongs to
    still: jax.Array  # bool [*batch]: problems still running after it
    improved: jax.Array  # bool [*batch]: x becomes the returned ("best") iterate
    take_fx: jax.Array  # bool [*batch]: f(x) becomes f_value (improved, or the first evaluation)
    stats: jax.Array  # [*batch, 4]: the carry's new residual statistics
    counts: jax.Array  # int32 [*batch, 2]: the new status and num_steps
    trace: jax.Array  # [*batch, max_steps]: the trace with this step's column written


def stopping_rule(
    tol: float,
    stop_mode: str,
    atol: float | None,
    divergence_factor: float,
    max_steps: int,
    batch_ndim: int,
) -> dict[str, Any]:
    """The keywords of :func:`step_update` for a solver's stopping arguments."""
    # Mixed mode: ||g|| <= atol + tol ||x||  <=>  ||g|| / (atol / tol + ||x||) <= tol.
    scale_floor = (tol if atol is None else atol) / tol if stop_mode == "mixed" else 0.0
    return dict(
        tol=tol,
        stop_mode=stop_mode,
        scale_floor=scale_floor,
        divergence_factor=divergence_factor,
        max_steps=max_steps,
        batch_ndim=batch_ndim,
    )


def initial_bookkeeping(
    batch_shape: tuple[int, ...], max_steps: int, rdtype: jnp.dtype
) -> dict[str, jax.Array]:
    """The ``stats``, ``counts`` and ``trace`` that :func:`step_update` starts from: nothing seen
    (residuals +inf), every problem running with 0 evaluations, an all-+inf trace."""
    return dict(
        stats=jnp.full(batch_shape + (4,), jnp.inf, rdtype),
        counts=jnp.stack(
            [jnp.full(batch_shape, _RUNNING, jnp.int32), jnp.zeros(batch_shape, jnp.int32)], -1
        ),
        trace=jnp.full(batch_shape + (max_steps,), jnp.inf, rdtype),
    )


def step_update(
    x: PyTree,
    fx: PyTree,
    gx: PyTree,
    *,
    k: jax.Array,
    stats: jax.Array,
    counts: jax.Array,
    trace: jax.Array,
    tol: float,
    stop_mode: str,
    scale_floor: float,
    divergence_factor: float,
    max_steps: int,
    batch_ndim: int,
) -> StepUpdate:
    """Judges the evaluation ``fx = f(x)`` (``gx = fx - x``) of loop step ``k`` per problem.

    The one stopping rule of every deqjax solver (module docstring): residual by ``stop_mode``,
    CONVERGED / NONFINITE / DIVERGED (on the absolute residual) / MAX_STEPS, the lowest-residual
    candidate among iterates within ``_BEST_ABS_SLACK`` of the lowest absolute residual, and the
    trace. Problems that stopped earlier keep their statistics.
    """
    rdtype = trace.dtype
    status_in, num_steps = counts[..., 0], counts[..., 1]
    best_res, min_abs = stats[..., _BEST_RES], stats[..., _MIN_ABS]
    running = status_in == _RUNNING  # [*batch]: problems this step belongs to
    # Residuals steer the loop but are not differentiated (sqrt has no derivative at 0).
    trees = [gx, fx, x] if stop_mode == "mixed" else [gx, fx]
    norms = jnp.sqrt(jax.lax.stop_gradient(_squared_norms(trees, batch_ndim, rdtype)))
    abs_res, fx_norm = norms[0], norms[1]
    rel_res = abs_res / (fx_norm + jnp.asarray(_REL_EPS, rdtype))
    if stop_mode == "rel":
        res = rel_res
    elif stop_mode == "mixed":
        res = abs_res / (jnp.asarray(scale_floor, rdtype) + norms[2])
    else:
        res = abs_res
    # A NaN or inf entry of f(x) propagates into ||f(x)||, so checking the two norms replaces a
    # separate pass over f(x) (a norm that overflows also counts as non-finite). CONVERGED
    # requires finiteness too: an overflowing ||f(x)|| would otherwise give rel_res = 0.
    finite = jnp.isfinite(abs_res) & jnp.isfinite(fx_norm) & jnp.isfinite(res)
    converged = finite & (res <= tol)
    # "Best" ranks by stop_mode, but only among iterates whose ABSOLUTE residual is within
    # _BEST_ABS_SLACK of the lowest seen: a geometrically growing sequence has a shrinking
    # relative residual and must not win. A converged iterate is always taken.
    eligible = finite & (abs_res <= _BEST_ABS_SLACK * min_abs) & (res < best_res)
    improved = running & (converged | eligible)
    # Divergence is judged on the absolute residual in every stop_mode.
    diverged = abs_res > divergence_factor * min_abs
    status = jnp.where(
        converged,
        CONVERGED,
        jnp.where(
            ~finite,
            NONFINITE,
            jnp.where(
                diverged,
                DIVERGED,
                jnp.where(k + 1 >= max_steps, MAX_STEPS, _RUNNING),
            ),
        ),
    ).astype(jnp.int32)
    status = jnp.where(running, status, status_in)
    column = jnp.where(running & finite, res, jnp.asarray(jnp.inf, rdtype))
    if batch_ndim == 0:
        # A masked select, not .at[k].set: under vmap k is batched and a scatter is slow.
        trace = jnp.where(jnp.arange(max_steps, dtype=jnp.int32) == k, column, trace)
    else:
        trace = jax.lax.dynamic_update_index_in_dim(trace, column, k, batch_ndim)
    new_min = jnp.where(running & finite, jnp.minimum(min_abs, abs_res), min_abs)
    return StepUpdate(
        running=running,
        still=status == _RUNNING,
        improved=improved,
        # f(best_x) is recorded at the first evaluation whatever it is, so f_value = f(value).
        take_fx=improved | (running & (num_steps == 0)),
        stats=jnp.where(
            improved[..., None],
            jnp.stack([abs_res, rel_res, res, new_min], axis=-1),
            jnp.concatenate([stats[..., :3], new_min[..., None]], axis=-1),
        ),
        counts=jnp.stack([status, num_steps + running.astype(jnp.int32)], axis=-1),
        trace=trace,
    )


def record_sample(
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


def fill_samples(
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


# propose(aux, k, x, fx, gx) -> (next_x, aux); gx = fx - x is passed so rules need not recompute it.
# k is the shared step counter (a scalar int32 under batch_ndim > 0).
ProposeFn = Callable[[Any, jax.Array, PyTree, PyTree, PyTree], tuple[PyTree, Any]]


def solve(
    f: Callable[[PyTree], PyTree],
    z0: PyTree,
    *,
    propose: ProposeFn,
    aux0: Any,
    max_steps: int,
    tol: float,
    stop_mode: str,
    loop: str,
    divergence_factor: float,
    atol: float | None = None,
    batch_ndim: int = 0,
    sample_steps: tuple[int, ...] | None = None,
    aux_output: Callable[[jax.Array, jax.Array, Any], Any] | None = None,
) -> Solution:
    """Runs a proposal rule on the bounded loop and assembles the :class:`Solution`.

    With ``batch_ndim = n`` the leading ``n`` axes of every leaf of ``z0`` index independent
    problems: one loop runs while any problem is running, ``f`` is evaluated on the whole batch
    each step, and every statistic is kept per problem (see the module docstring).

    ``sample_steps`` (validated by :func:`check_sample_steps`): record the iterate evaluated at
    loop step ``s`` (``x_s``, ``x_0 = z0``) of each problem in ``Solution.samples``; steps a
    problem never evaluated get its ``value``. Costs one masked select over the ``n``-row sample
    buffer per step; ``None`` keeps no buffer. ``aux_output(k, num_steps, aux)``: called once after
    the loop with the number of loop steps run, the per-problem ``num_steps`` and the rule's final
    state; its result becomes
    ``Solution.inverse_estimate`` (how Broyden returns its inverse estimate).
    """
    sample_steps = check_sample_steps(sample_steps, max_steps)
    rdtype = tree.reduction_dtype(z0)
    batch_shape = tuple(jax.tree_util.tree_leaves(z0)[0].shape[:batch_ndim])
    rule = stopping_rule(tol, stop_mode, atol, divergence_factor, max_steps, batch_ndim)

    def cond_fun(c: _Carry) -> jax.Array:
        return jnp.any(c.counts[..., 0] == _RUNNING)

    def body_fun(c: _Carry) -> _Carry:
        fx = f(c.x)
        gx = tree.tree_sub(fx, c.x)
        u = step_update(c.x, fx, gx, k=c.k, stats=c.stats, counts=c.counts, trace=c.trace, **rule)
        next_x, aux = propose(c.aux, c.k, c.x, fx, gx)
        samples = c.samples
        if sample_steps is not None:
            samples = record_sample(samples, sample_ids, c.k, u.running, c.x, batch_ndim)
        return _Carry(
            k=c.k + 1,
            x=tree.tree_where(u.still, next_x, c.x, batch_ndim),
            aux=aux,
            best_x=tree.tree_where(u.improved, c.x, c.best_x, batch_ndim),
            best_fx=tree.tree_where(u.take_fx, fx, c.best_fx, batch_ndim),
            stats=u.stats,
            counts=u.counts,
            trace=u.trace,
            samples=samples,
        )

    if sample_steps is not None:
        sample_ids = jnp.asarray(sample_steps, jnp.int32)
        samples0 = tree.tree_stack_zeros(z0, len(sample_steps), batch_ndim)
    else:
        samples0 = ()
    init = _Carry(
        k=jnp.zeros((), jnp.int32),
        x=z0,
        aux=aux0,
        best_x=z0,
        best_fx=z0,
        **initial_bookkeeping(batch_shape, max_steps, rdtype),
        samples=samples0,
    )
    c = loop_lib.bounded_while_loop(cond_fun, body_fun, init, max_steps=max_steps, loop=loop)
    samples = None
    if sample_steps is not None:
        samples = fill_samples(c.samples, sample_ids, c.counts[..., 1], c.best_x, batch_ndim)
    return Solution(
        value=c.best_x,
        num_steps=c.counts[..., 1],
        abs_residual=c.stats[..., _BEST_ABS],
        rel_residual=c.stats[..., _BEST_REL],
        trace=c.trace,
        status=c.counts[..., 0],
        f_value=c.best_fx,
        samples=samples,
        inverse_estimate=None if aux_output is None else aux_output(c.k, c.counts[..., 1], c.aux),
    )
