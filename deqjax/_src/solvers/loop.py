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
``check_every = k`` the loop body runs ``k`` bodies, unrolled, between two reads of ``cond_fun``;
the body must then be safe to run after ``cond_fun`` turned false and past ``max_steps`` (the
driver's is: a problem that stopped keeps its fields frozen). ``"auto"`` is
:data:`CHECK_EVERY_AUTO` of the backend: measured on an H200, a loop of one evaluation of a tanh
layer cost 41.5 µs per iteration checked every step, 26.6 µs checked every 4 and 21.6 µs every 8
(d = 512, batch 128; 147.3 / 88.3 / 84.4 µs at d = 2048, batch 256), while a CPU reads the
predicate where it computes it (BENCHMARKS.md, "Loop floor").
"""

from __future__ import annotations

from typing import Any, Callable

import jax

LOOP_KINDS = ("while", "scan", "python")

# check_every="auto" per backend (jax.default_backend()): the steps between two reads of the
# stopping rule. 4 on accelerators: of the H200's 4 and 8 (module docstring) the one that wastes
# fewer whole-batch evaluations after the last problem stopped (at most k - 1).
CHECK_EVERY_AUTO = {"cpu": 1, "gpu": 4, "tpu": 4}

Carry = Any


def check_loop_kind(loop: str) -> None:
    """Raises ``ValueError`` unless ``loop`` is one of :data:`LOOP_KINDS`."""
    if loop not in LOOP_KINDS:
        raise ValueError(f"loop must be one of {LOOP_KINDS}, got {loop!r}.")


def check_check_every(check_every: Any) -> None:
    """Raises ``ValueError`` unless ``check_every`` is ``"auto"`` or an int ``>= 1``."""
    if check_every == "auto" and isinstance(check_every, str):
        return
    if isinstance(check_every, bool) or not isinstance(check_every, int) or check_every < 1:
        raise ValueError(f'check_every must be "auto" or an int >= 1, got {check_every!r}.')


def resolve_check_every(check_every: int | str, backend: str | None = None) -> int:
    """``check_every`` as an int: ``"auto"`` is :data:`CHECK_EVERY_AUTO` of ``backend`` (default
    ``jax.default_backend()``; 4 for a backend it does not name)."""
    if check_every != "auto":
        return int(check_every)
    return CHECK_EVERY_AUTO.get(backend or jax.default_backend(), 4)


def bounded_while_loop(
    cond_fun: Callable[[Carry], jax.Array],
    body_fun: Callable[[Carry], Carry],
    init_val: Carry,
    *,
    max_steps: int,
    loop: str = "while",
    check_every: int = 1,
) -> Carry:
    """Runs ``body_fun`` while ``cond_fun`` holds, at most ``max_steps`` times.

    Args:
      cond_fun: carry -> scalar bool; the loop continues while it is true.
      body_fun: carry -> carry, preserving structure, shapes and dtypes.
      init_val: the initial carry.
      max_steps: static upper bound on the number of bodies run (with ``check_every = k``, the
        bound on the checks: up to ``k - 1`` bodies more may run, see the module docstring).
      loop: ``"while"``, ``"scan"`` or ``"python"`` (see the module docstring).
      check_every: bodies run between two evaluations of ``cond_fun`` (``"while"`` only; the
        other kinds check every step).

    Returns:
      The final carry.

    Raises:
      ValueError: for an unknown ``loop``, ``max_steps < 1`` or ``check_every < 1``.
    """
    check_loop_kind(loop)
    check_check_every(check_every)
    if int(max_steps) < 1:
        raise ValueError(f"max_steps must be >= 1, got {max_steps}.")

    if loop == "python":
        val, steps = init_val, 0
        while steps < max_steps and bool(cond_fun(val)):
            val, steps = body_fun(val), steps + 1
        return val

    if loop == "scan":

        def scan_body(val, _):
            return jax.lax.cond(cond_fun(val), body_fun, lambda v: v, val), None

        val, _ = jax.lax.scan(scan_body, init_val, None, length=max_steps)
        return val

    def while_cond(carry):
        val, steps = carry
        return (steps < max_steps) & cond_fun(val)

    def while_body(carry):
        val, steps = carry
        val = jax.lax.fori_loop(0, check_every, lambda i, v: body_fun(v), val)
        return val, steps + check_every

    val, _ = jax.lax.while_loop(while_cond, while_body, (init_val, 0))
    return val
