"""What every forward solver shares: the :class:`Solution`, status codes, validation and the driver.

A solver in deqjax is a *proposal rule* run by :func:`solve`. Each driver iteration evaluates ``f``
once at the current iterate ``x_k``; the driver records the residual ``r_k = ||f(x_k) - x_k||``
(``stop_mode="abs"``) or ``||f(x_k) - x_k|| / ||f(x_k)||`` (``"rel"``) in the trace, keeps the
lowest-residual iterate seen, decides whether to stop, and otherwise asks the rule for ``x_{k+1}``.
So ``num_steps`` is exactly the number of evaluations of ``f``, and all stopping logic lives here.

Stopping, checked after each evaluation in this order:

1. ``r_k <= tol``                          -> ``CONVERGED``
2. ``f(x_k)`` or ``r_k`` not finite          -> ``NONFINITE``
3. ``r_k > divergence_factor * min_{j<k} r_j`` -> ``DIVERGED`` ("protective break" of the DEQ code)
4. ``k + 1 == max_steps``                   -> ``MAX_STEPS``

No branch raises or prints, so a solve can run under ``jit`` and ``vmap`` (where each example
keeps its own status, step count and statistics).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from deqjax._src import loop as loop_lib
from deqjax._src import tree

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

STOP_MODES = ("abs", "rel")

# Denominator guard of the relative residual: ||f(z) - z|| / (||f(z)|| + _REL_EPS).
_REL_EPS = 1e-30


class Solution(NamedTuple):
    """Result of a forward solve of ``z = f(z)`` for a single problem.

    Under ``jax.vmap`` every field gains the batch axis and holds per-example values.

    Attributes:
      value: pytree like ``z0``: the lowest-residual iterate seen (by ``stop_mode``).
      num_steps: int32 scalar, the number of evaluations of ``f`` used.
      abs_residual: ``||f(value) - value||``.
      rel_residual: ``||f(value) - value|| / ||f(value)||``.
      trace: ``[max_steps]`` residual (in ``stop_mode``) after each evaluation; ``+inf`` afterwards.
      status: int32, one of ``CONVERGED``, ``MAX_STEPS``, ``DIVERGED``, ``NONFINITE``.
    """

    value: PyTree
    num_steps: jax.Array
    abs_residual: jax.Array
    rel_residual: jax.Array
    trace: jax.Array
    status: jax.Array


class SolverFn(Protocol):
    """A forward solver: ``(f, z0) -> Solution`` (hyper-parameters bound with functools.partial)."""

    def __call__(self, f: Callable[[PyTree], PyTree], z0: PyTree, /) -> Solution: ...


def status_name(status: int) -> str:
    """Human-readable name of a status code, e.g. ``status_name(sol.status)`` -> ``"converged"``."""
    return STATUS_NAMES.get(int(status), f"unknown({int(status)})")


def accepts_loop_kind(solver: Callable[..., Any]) -> bool:
    """Whether ``solver`` (a function or functools.partial) takes the ``loop=`` keyword."""
    try:
        return "loop" in inspect.signature(solver).parameters
    except (TypeError, ValueError):
        return False


def check_common_args(
    f: Callable, z0: PyTree, *, max_steps: int, tol: float, stop_mode: str, loop: str
) -> PyTree:
    """Validates the arguments every solver takes; raises ``ValueError`` naming the argument.

    Returns:
      ``z0`` with every leaf converted to a JAX array (Python floats become the default float).
    """
    if not callable(f):
        raise ValueError(f"f must be callable, got {type(f).__name__}.")
    if isinstance(max_steps, bool) or not isinstance(max_steps, (int, np.integer)):
        raise ValueError(f"max_steps must be an int, got {max_steps!r}.")
    if max_steps < 1:
        raise ValueError(f"max_steps must be >= 1, got {max_steps}.")
    if not isinstance(tol, (int, float, np.floating, np.integer)) or isinstance(tol, bool):
        raise ValueError(f"tol must be a Python float, got {tol!r}.")
    if not tol >= 0:  # also rejects NaN
        raise ValueError(f"tol must be >= 0, got {tol}.")
    if stop_mode not in STOP_MODES:
        raise ValueError(f"stop_mode must be one of {STOP_MODES}, got {stop_mode!r}.")
    loop_lib.check_loop_kind(loop)
    tree.check_float_tree(z0, "z0")
    z0 = jax.tree_util.tree_map(jnp.asarray, z0)
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


class _Carry(NamedTuple):
    k: jax.Array  # int32 []: evaluations done
    x: PyTree  # the next iterate to evaluate
    aux: Any  # the proposal rule's state
    best_x: PyTree  # lowest-residual iterate so far
    best_abs: jax.Array  # []: its absolute residual
    best_rel: jax.Array  # []: its relative residual
    trace: jax.Array  # [max_steps]
    status: jax.Array  # int32 []


# propose(aux, k, x, fx, gx) -> (next_x, aux); gx = fx - x is passed so rules need not recompute it.
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
) -> Solution:
    """Runs a proposal rule on the bounded loop and assembles the :class:`Solution`."""
    rdtype = tree.reduction_dtype(z0)
    inf = jnp.array(jnp.inf, rdtype)
    step_ids = jnp.arange(max_steps, dtype=jnp.int32)

    def cond_fun(c: _Carry) -> jax.Array:
        return c.status == _RUNNING

    def body_fun(c: _Carry) -> _Carry:
        fx = f(c.x)
        gx = tree.tree_sub(fx, c.x)
        # Residuals steer the loop but are not differentiated (sqrt has no derivative at 0).
        abs_res = jax.lax.stop_gradient(tree.tree_norm(gx))
        fx_norm = jax.lax.stop_gradient(tree.tree_norm(fx))
        rel_res = abs_res / (fx_norm + jnp.asarray(_REL_EPS, rdtype))
        res = rel_res if stop_mode == "rel" else abs_res
        best_res = c.best_rel if stop_mode == "rel" else c.best_abs
        # A NaN or inf entry of f(x) propagates into ||f(x)||, so checking the two norms replaces a
        # separate pass over f(x) (a norm that overflows also counts as non-finite). CONVERGED
        # requires finiteness too: an overflowing ||f(x)|| would otherwise give rel_res = 0.
        finite = jnp.isfinite(abs_res) & jnp.isfinite(fx_norm)
        improved = finite & (res < best_res)
        status = jnp.where(
            finite & (res <= tol),
            CONVERGED,
            jnp.where(
                ~finite,
                NONFINITE,
                jnp.where(
                    res > divergence_factor * best_res,
                    DIVERGED,
                    jnp.where(c.k + 1 >= max_steps, MAX_STEPS, _RUNNING),
                ),
            ),
        ).astype(jnp.int32)
        next_x, aux = propose(c.aux, c.k, c.x, fx, gx)
        return _Carry(
            k=c.k + 1,
            x=next_x,
            aux=aux,
            best_x=tree.tree_where(improved, c.x, c.best_x),
            best_abs=jnp.where(improved, abs_res, c.best_abs),
            best_rel=jnp.where(improved, rel_res, c.best_rel),
            # A masked select, not .at[k].set: under vmap k is batched and a scatter is slow.
            trace=jnp.where(step_ids == c.k, jnp.where(finite, res, inf), c.trace),
            status=status,
        )

    init = _Carry(
        k=jnp.zeros((), jnp.int32),
        x=z0,
        aux=aux0,
        best_x=z0,
        best_abs=inf,
        best_rel=inf,
        trace=jnp.full((max_steps,), jnp.inf, rdtype),
        status=jnp.asarray(_RUNNING, jnp.int32),
    )
    c = loop_lib.bounded_while_loop(cond_fun, body_fun, init, max_steps=max_steps, loop=loop)
    return Solution(
        value=c.best_x,
        num_steps=c.k,
        abs_residual=c.best_abs,
        rel_residual=c.best_rel,
        trace=c.trace,
        status=c.status,
    )
