"""The bounded loop under every fixed-point solver: ``(cond_fun, body_fun)``, at most ``max_steps``.

The driver (:mod:`deqjax._src.solvers.driver`) runs every fixed-point solver's iterations through
:func:`bounded_while_loop`, in one of three kinds:

* ``"while"`` (default): :func:`jax.lax.while_loop`. Fast: stops as soon as ``cond_fun`` is false,
  but has no reverse-mode derivative.
* ``"scan"``: :func:`jax.lax.scan` over ``max_steps`` with a :func:`jax.lax.cond` that skips the
  body once ``cond_fun`` is false. Always pays ``max_steps`` iterations of bookkeeping but is
  reverse-mode differentiable; :class:`deqjax.UnrolledAdjoint` runs solvers on it.
* ``"python"``: a plain Python loop on concrete values, for debugging with prints and breakpoints.
  It cannot be traced (it calls ``bool`` on the condition), so it fails under ``jit``.

**Checking every k steps** (``check_every``, the ``"while"`` kind): on a GPU, XLA's while loop
copies its predicate to the host and waits for it on every iteration (jax#2491). With
``check_every = k`` the loop body runs ``k`` bodies between two reads of ``cond_fun``; the body
must then be safe to run after ``cond_fun`` turned false and past ``max_steps`` (the driver's is:
a problem that stopped keeps its fields frozen). ``k`` is capped at ``max_steps``, and resolved
once per solve by :func:`steps_per_check`: ``"auto"`` is :data:`CHECK_EVERY_AUTO` of the platform
the program is compiled for (:func:`jax.lax.platform_dependent`, chosen at lowering: no host
synchronisation, and traced like any JAX function under ``jit``, ``vmap`` and the implicit
gradient), 1 on a CPU, which reads the predicate where it computes it, and 4 elsewhere
(BENCHMARKS.md, "Loop floor").

Each of the ``k`` bodies computes exactly what the body of a ``k = 1`` loop computes, bit for bit:
XLA must not fuse one body's arithmetic into the next (a multiply fused into the next body's add
becomes one fused multiply-add, and the rounding changes). Elsewhere than on a CPU the bodies are
unrolled with :func:`jax.lax.optimization_barrier` between them (XLA:GPU removes the barrier only
after fusion and scheduling); XLA:CPU drops that barrier before fusing, so on a CPU the chunk is a
loop of static trip count ``k`` around the body (XLA runs a loop of known trip count without
reading its predicate), which copies nothing more per step than ``k = 1``. The body is traced
once and replayed in each place.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.extend.core
import jax.numpy as jnp

from deqjax._src import vma

LOOP_KINDS = ("while", "scan", "python")

# check_every="auto": the steps between two reads of the stopping rule on the platform the solve is
# compiled for; CHECK_EVERY_AUTO_DEFAULT on a platform not named. 4 on accelerators: of the
# values measured (BENCHMARKS.md, "Loop floor") the one that wastes fewer whole-batch
# evaluations after the last problem stopped (at most k - 1).
CHECK_EVERY_AUTO = {"cpu": 1}
CHECK_EVERY_AUTO_DEFAULT = 4

Carry = Any


class StepsPerCheck(NamedTuple):
    """``check_every`` resolved for one solve: the bodies run between two reads of the stopping
    rule on a CPU and on any other platform (each ``>= 1`` and ``<= max_steps``)."""

    cpu: int
    other: int


EVERY_STEP = StepsPerCheck(1, 1)


def check_loop_kind(loop: str) -> None:
    """Raises ``ValueError`` unless ``loop`` is one of :data:`LOOP_KINDS`."""
    if loop not in LOOP_KINDS:
        raise ValueError(f"loop must be one of {LOOP_KINDS}, got {loop!r}.")


def steps_per_check(check_every: int | str, max_steps: int) -> StepsPerCheck:
    """``check_every`` (validated: ``"auto"`` or an int ``>= 1``) for a solve of at most
    ``max_steps`` evaluations: ``"auto"`` per platform (:data:`CHECK_EVERY_AUTO`), an int as it
    is; each capped at ``max_steps`` (more bodies between two checks could only run past it)."""
    if isinstance(check_every, str):
        cpu = CHECK_EVERY_AUTO.get("cpu", CHECK_EVERY_AUTO_DEFAULT)
        return StepsPerCheck(min(cpu, max_steps), min(CHECK_EVERY_AUTO_DEFAULT, max_steps))
    k = min(int(check_every), int(max_steps))
    return StepsPerCheck(k, k)


def resolve_check_every(check_every: int | str, platform: str | None = None) -> int:
    """What ``check_every`` means on ``platform`` (default ``jax.default_backend()``), for reports
    on the host (a solve resolves it where it is compiled, :func:`steps_per_check`)."""
    if check_every != "auto":
        return int(check_every)
    return CHECK_EVERY_AUTO.get(platform or jax.default_backend(), CHECK_EVERY_AUTO_DEFAULT)


def _traced_once(body_fun: Callable[[Carry], Carry], val: Carry) -> Callable[[Carry], Carry]:
    """``body_fun`` traced once at ``val``'s types, as a function that replays it."""
    closed, out_shape = jax.make_jaxpr(body_fun, return_shape=True)(val)
    replay = jax.extend.core.jaxpr_as_fun(closed)
    out_tree = jax.tree_util.tree_structure(out_shape)
    return lambda v: jax.tree_util.tree_unflatten(out_tree, replay(*jax.tree_util.tree_leaves(v)))


def _loop_of(body: Callable[[Carry], Carry], k: int, val: Carry) -> tuple[Carry, jax.Array]:
    """``k`` bodies as a loop of static trip count (a CPU's chunk)."""
    if k > 1:
        val = jax.lax.fori_loop(0, k, lambda _, v: body(v), val)
    else:
        val = body(val)
    return val, jnp.asarray(k, jnp.int32)


def _unrolled(body: Callable[[Carry], Carry], k: int, val: Carry) -> tuple[Carry, jax.Array]:
    """``k`` bodies unrolled, with an optimization barrier between two (an accelerator's chunk)."""
    for i in range(k):
        val = body(vma.optimization_barrier(val) if i else val)
    return val, jnp.asarray(k, jnp.int32)


def _chunk(body_fun: Callable[[Carry], Carry], per_check: StepsPerCheck, val: Carry):
    """The bodies run between two checks: ``(carry, how many)``."""
    if per_check == EVERY_STEP:
        return body_fun(val), jnp.asarray(1, jnp.int32)
    body = _traced_once(body_fun, val)
    return jax.lax.platform_dependent(
        val,
        cpu=functools.partial(_loop_of, body, per_check.cpu),
        default=functools.partial(_unrolled, body, per_check.other),
    )


def bounded_while_loop(
    cond_fun: Callable[[Carry], jax.Array],
    body_fun: Callable[[Carry], Carry],
    init_val: Carry,
    *,
    max_steps: int,
    loop: str = "while",
    check_every: StepsPerCheck = EVERY_STEP,
) -> Carry:
    """Runs ``body_fun`` while ``cond_fun`` holds, at most ``max_steps`` times.

    The arguments are those of a validated solver object (:class:`~deqjax._src.solvers.options.
    DriverOptions` checks ``max_steps``, ``loop`` and ``check_every``); nothing is checked here.

    Args:
      cond_fun: carry -> scalar bool; the loop continues while it is true.
      body_fun: carry -> carry, preserving structure, shapes and dtypes.
      init_val: the initial carry.
      max_steps: static upper bound on the number of bodies run (with ``check_every``, the
        bound on the checks: up to ``k - 1`` bodies more may run, see the module docstring).
      loop: ``"while"``, ``"scan"`` or ``"python"`` (see the module docstring).
      check_every: bodies run between two evaluations of ``cond_fun``, per platform
        (:func:`steps_per_check`; ``"while"`` only, the other kinds check every step).

    Returns:
      The final carry.
    """
    if loop == "python":
        val, steps = init_val, 0
        while steps < max_steps and bool(cond_fun(val)):
            val, steps = body_fun(val), steps + 1
        return val

    # Inside a checked shard_map a carry started from constants varies once the body reads this
    # device's shard: vma matches the initial carry to the loop's body (a no-op elsewhere).
    if loop == "scan":

        def scan_body(val, _):
            return vma.cond(cond_fun(val), body_fun, lambda v: v, val), None

        val, _ = vma.scan(scan_body, init_val, None, length=max_steps)
        return val

    def while_cond(carry):
        val, steps = carry
        return (steps < max_steps) & cond_fun(val)

    def while_body(carry):
        val, steps = carry
        val, ran = _chunk(body_fun, check_every, val)
        return val, steps + ran

    init_val = vma.match_carry(body_fun, init_val)
    val, _ = jax.lax.while_loop(while_cond, while_body, (init_val, jnp.zeros((), jnp.int32)))
    return val
