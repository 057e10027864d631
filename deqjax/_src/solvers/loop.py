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
"""

from __future__ import annotations

from typing import Any, Callable

import jax

LOOP_KINDS = ("while", "scan", "python")

Carry = Any


def check_loop_kind(loop: str) -> None:
    """Raises ``ValueError`` unless ``loop`` is one of :data:`LOOP_KINDS`."""
    if loop not in LOOP_KINDS:
        raise ValueError(f"loop must be one of {LOOP_KINDS}, got {loop!r}.")


def bounded_while_loop(
    cond_fun: Callable[[Carry], jax.Array],
    body_fun: Callable[[Carry], Carry],
    init_val: Carry,
    *,
    max_steps: int,
    loop: str = "while",
) -> Carry:
    """Runs ``body_fun`` while ``cond_fun`` holds, at most ``max_steps`` times.

    Args:
      cond_fun: carry -> scalar bool; the loop continues while it is true.
      body_fun: carry -> carry, preserving structure, shapes and dtypes.
      init_val: the initial carry.
      max_steps: static upper bound on the number of bodies run.
      loop: ``"while"``, ``"scan"`` or ``"python"`` (see the module docstring).

    Returns:
      The final carry.

    Raises:
      ValueError: for an unknown ``loop`` or ``max_steps < 1``.
    """
    check_loop_kind(loop)
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
        return body_fun(val), steps + 1

    val, _ = jax.lax.while_loop(while_cond, while_body, (init_val, 0))
    return val
