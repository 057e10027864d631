"""Broyden's ("good") quasi-Newton method (Broyden 1965) on ``g(z) = f(z) - z``, as in the DEQ
paper (Bai, Kolter & Koltun 2019, Eq. 10).

The inverse Jacobian ``H ≈ J_g^{-1}`` starts at ``-I`` (so the first step is a plain fixed-point
step) and after each accepted step ``s = x_+ - x`` (``y = g(x_+) - g(x)``) takes Broyden's good
update, in its Sherman–Morrison form:

    H <- H + (s - H y) s^T H / (s^T H y).

For a complex state every transpose is the conjugate transpose (``s^T`` above is ``s^H``, and
``s^H x = <s, x>``, :func:`deqjax._src.tree.tree_vdot`): the same update of ``C^n``, with
complex denominators and coefficients.

A finite ``memory`` keeps at most that many updates and then restarts from ``H = -I`` (the pending
update is applied to ``-I``). Each step costs one evaluation of ``f`` plus ``O(memory * d)`` work.

The algorithm has two forms, each in its own module, and :class:`Broyden` runs the one its
``line_search`` field picks: without a line search every step is ``-H g`` and only the steps are
stored (:mod:`deqjax._src.solvers.broyden_steps`, Kelley's form); with one the inverse is kept as
two buffers (:mod:`deqjax._src.solvers.broyden_line_search`). Both return their final estimate as
a :class:`~deqjax._src.solvers.broyden_inverse.BroydenInverse`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar

from deqjax._src import checks
from deqjax._src.solvers import (
    broyden_inverse,
    broyden_line_search,
    broyden_steps,
    driver,
    registry,
)
from deqjax._src.solvers.problem import Problem
from deqjax._src.solvers.solution import Solution

PyTree = Any


@dataclasses.dataclass(frozen=True, kw_only=True)
class Broyden(driver.DriverSolver):
    """Broyden's good method on ``g(z) = f(z) - z``, as a solver object.

    Fields: those of :class:`~deqjax._src.solvers.options.Options` and
    :class:`~deqjax._src.solvers.options.DriverOptions` (``max_steps`` counts line-search trials
    too), and

    Attributes:
      memory: ``None`` keeps every update (``max_steps`` slots); an int keeps at most ``memory``
        updates and restarts from ``J^{-1} = -I`` when they are used up (limited-memory Broyden;
        a restart keeps the inverse consistent, where evicting the oldest update does not).
      line_search: backtracking on ``||g||^2`` (Armijo, halving up to 5 times); each trial is an
        evaluation of ``f`` and counts in ``num_steps`` and ``trace``.
      return_inverse: also return the final inverse-Jacobian estimate in
        ``Solution.inverse_estimate`` (a :class:`~deqjax.solvers.BroydenInverse`: ``2 * rows``
        iterate-sized buffers, ``rows`` = ``memory`` or ``max_steps``), for
        :class:`~deqjax.ShineAdjoint`. It
        is the estimate after the problem's last step. In a batch-native solve with a finite
        ``memory``, a problem that stopped while the batch ran on long enough for the shared
        memory slot to wrap onto its rows loses them (its estimate becomes ``J_g^{-1} ≈ -I``);
        otherwise (always with ``memory=None``, and under ``vmap``) it equals the per-problem
        solve's estimate.

    Without a line search the memory is one buffer of ``memory + 3`` steps (the steps-only form,
    :mod:`~deqjax._src.solvers.broyden_steps`); with one, two buffers of ``memory`` rows
    (:mod:`~deqjax._src.solvers.broyden_line_search`). With ``batch_ndim``
    they are batched (``[*batch, rows, ...]``).

    For a complex state the inverse estimate is complex-linear: for a cell that is not holomorphic
    in ``z`` (through ``conj(z)``, ``abs``, ``real`` or ``imag`` of the state) Broyden may need far
    more steps than fixed-point iteration, or stop at ``max_steps`` where it converges. Solve such a
    cell with :class:`~deqjax.solvers.FixedPointIteration`, or pass its state as the pair of real
    arrays ``(Re z, Im z)``, on which Broyden's estimate is one of ``R^{2n}``.
    """

    forward_only: ClassVar[dict[str, Any]] = {
        **driver.DriverSolver.forward_only,
        "return_inverse": False,
    }

    memory: int | None = None
    line_search: bool = False
    return_inverse: bool = False

    def check(self) -> None:
        super().check()
        checks.check_int(self.memory, "memory", allow_none=True)
        checks.check_bool(self.line_search, "line_search")
        checks.check_bool(self.return_inverse, "return_inverse")

    def rule(self, problem: Problem) -> driver.ProposalRule:
        mem = self.max_steps if self.memory is None else self.memory
        memory = broyden_inverse.memory_of(mem, self.loop)
        form = broyden_line_search if self.line_search else broyden_steps
        return form.proposal_rule(problem, memory, return_inverse=self.return_inverse)


@registry.function_form(Broyden)
def broyden(f: Callable[[PyTree], PyTree], z0: PyTree, /, **options) -> Solution:
    """Solves ``z = f(z)`` as the root of ``g(z) = f(z) - z`` by Broyden's method:
    ``Broyden(**options)(f, z0)``.

    Args:
      f: the map ``Z -> Z`` over any pytree of float arrays (``(z, aux)`` with ``has_aux``).
      z0: initial iterate.
      **options: the fields of :class:`~deqjax.solvers.Broyden` (``max_steps=50``, ``tol=1e-4``,
        ``stop_mode="rel"``, ``memory=None``, ``line_search=False``, ...).

    Returns:
      A :class:`~deqjax.solvers.Solution` (fields with the leading batch axes under
      ``batch_ndim``); its value is the best iterate and its ``f_value`` is ``f(value)``; with
      ``return_inverse=True`` its ``inverse_estimate`` is a :class:`~deqjax.solvers.BroydenInverse`.

    Raises:
      ValueError: for invalid arguments (named in the message).
    """
    return Broyden(**options)(f, z0)
