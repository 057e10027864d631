"""Damped fixed-point (Picard) iteration: ``z_{k+1} = (1 - damping) z_k + damping f(z_k)``.

Converges when ``f`` is a contraction (Banach); ``damping < 1`` (Krasnosel'skii–Mann averaging)
can also tame maps whose Jacobian has eigenvalues near -1, at the price of slower steps.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from deqjax._src import checks, tree
from deqjax._src.solvers import driver, registry
from deqjax._src.solvers.problem import Problem
from deqjax._src.solvers.solution import Solution

PyTree = Any


@dataclasses.dataclass(frozen=True, kw_only=True)
class FixedPointIteration(driver.DriverSolver):
    """Damped fixed-point iteration ``z <- (1 - damping) z + damping f(z)`` as a solver object.

    Fields: those of :class:`~deqjax._src.solvers.options.Options` and
    :class:`~deqjax._src.solvers.options.DriverOptions`, and

    Attributes:
      damping: the step, in ``(0, 1]`` (1: plain iteration).

    Example:
      >>> sol = dq.solvers.FixedPointIteration(tol=1e-6)(jnp.cos, jnp.array(1.0))
      >>> sol.value  # 0.739085...
    """

    damping: float = 1.0

    def check(self) -> None:
        super().check()
        if not 0.0 < checks.check_real(self.damping, "damping") <= 1.0:
            raise ValueError(f"damping must be in (0, 1], got {self.damping}.")

    def rule(self, problem: Problem) -> driver.ProposalRule:
        damping = self.damping

        def propose(state, k, x, fx, gx, gx_sq, running):
            del k, fx, gx_sq, running
            return tree.tree_axpy(damping, gx, x), state

        return driver.ProposalRule(propose, ())


@registry.function_form(FixedPointIteration)
def fixed_point_iteration(f: Callable[[PyTree], PyTree], z0: PyTree, /, **options) -> Solution:
    """Solves ``z = f(z)`` by damped fixed-point iteration, ``FixedPointIteration(**options)``.

    Args:
      f: the map ``Z -> Z`` over any pytree of float arrays (``(z, aux)`` with ``has_aux``).
      z0: initial iterate.
      **options: the fields of :class:`~deqjax.solvers.FixedPointIteration` (``max_steps=50``,
        ``tol=1e-4``, ``stop_mode="rel"``, ``damping=1.0``, ...).

    Returns:
      A :class:`~deqjax.solvers.Solution` (fields with the leading batch axes under
      ``batch_ndim``); its value is the best iterate and its ``f_value`` is ``f(value)``.

    Raises:
      ValueError: for invalid arguments (named in the message).

    Example:
      >>> sol = fixed_point_iteration(jnp.cos, jnp.array(1.0), tol=1e-6)
      >>> sol.value  # 0.739085...
    """
    return FixedPointIteration(**options)(f, z0)
