"""Backprop through every step of the forward solver: the O(steps)-memory baseline."""

from __future__ import annotations

import dataclasses

from deqjax._src.adjoints import base
from deqjax._src.solvers.anderson import Anderson
from deqjax._src.solvers.broyden import Broyden

_ACCELERATED = (Anderson, Broyden)


@dataclasses.dataclass(frozen=True)
class UnrolledAdjoint(base.Adjoint):
    """Backprop through every step of the forward solver (a baseline; O(steps) memory).

    Runs the solver on its scan-based loop (``solver.replace(loop="scan")``), which every solver
    declaring ``"scan"`` in its ``loop_kinds`` has: the library's fixed-point solvers (objects,
    functions or ``functools.partial`` objects of them) and a user's callable that takes
    ``loop=``. Any other solver is refused with ``ValueError``. Gradients also flow to ``z0``.

    Anderson and Broyden are refused unless ``accelerated=True``: the derivative of their steps
    is not the derivative of the fixed point, and can be arbitrarily far from it on a converged
    problem (measured: −1.3e9 through Anderson where central differences of the same float64
    DEQ-Transformer forward give 0.197). The exact gradients are :class:`ImplicitAdjoint` (at
    ``z*``), this adjoint with :class:`~deqjax.solvers.FixedPointIteration` (backprop through
    contractive damped steps, which tends to the implicit gradient) and
    :class:`ReversibleAdjoint` with :class:`~deqjax.solvers.Reversible` (backprop through its
    steps in O(1) memory). What is differentiated, per solver:

    * :func:`~deqjax.solvers.fixed_point_iteration`: every damped step
      ``z ← (1 − damping) z + damping f(z)`` exactly — the derivative of the returned iterate,
      which tends to the implicit gradient as the (contractive) iteration converges.
    * :func:`~deqjax.solvers.anderson`: every evaluation of ``f`` and every mixing step, with the
      mixing coefficients ``α`` held constant (``stop_gradient``), as the literature's "unrolled"
      baselines do. Differentiating through the relative ridge and the tiny least-squares solve
      for ``α`` amplifies rounding by up to ``1/lam`` and gave unusable gradients; with ``α``
      frozen the result is close to, but not exactly, the implicit gradient (about ``1e-5``
      relative on a converged problem).
    * :func:`~deqjax.solvers.broyden`: every evaluation of ``f`` and the low-rank inverse-Jacobian
      updates and line-search decisions as computed (nothing is frozen); the update's divisions
      by ``vᵀdg`` can amplify rounding where that product is tiny.

    Only the lowest-residual iterate carries the gradient (the selection itself is not
    differentiated). Use :class:`ImplicitAdjoint` for the exact gradient at ``z*``; this strategy
    is for comparisons with truncated backpropagation.

    Args:
      accelerated: allow Anderson and Broyden, knowing that the result is the derivative of
        their steps as computed (above), not a gradient of the fixed point.
    """

    accelerated: bool = False

    def solve(self, f, solver, params, x, z0, *, backward_stats=None):
        del backward_stats  # no backward solve
        if isinstance(solver, _ACCELERATED) and not self.accelerated:
            raise ValueError(
                f"UnrolledAdjoint through {type(solver).__name__} is refused: the derivative of "
                "its steps is not the fixed point's and can be far off even where the forward "
                "converged. Use ImplicitAdjoint() (exact at z*), UnrolledAdjoint with "
                "dq.solvers.FixedPointIteration (backprop through damped steps), or "
                "ReversibleAdjoint with dq.solvers.Reversible (exact backprop, O(1) memory); "
                "UnrolledAdjoint(accelerated=True) differentiates the steps anyway."
            )
        if "scan" not in solver.loop_kinds:
            raise ValueError(
                "UnrolledAdjoint needs a solver that runs on loop='scan' (one whose loop_kinds "
                "include 'scan': dq.solvers.FixedPointIteration, Anderson, Broyden, Reversible, "
                "their functions or functools.partial objects of them, or a callable taking "
                f"loop=); got {solver!r}. Krylov solvers have no unrolled form: use "
                "ImplicitAdjoint, PhantomAdjoint or OneStepAdjoint with them."
            )
        sol = solver.replace(loop="scan")(lambda z: f(params, x, z), z0)
        return sol.value, base.stop_statistics(sol, sol.value)
