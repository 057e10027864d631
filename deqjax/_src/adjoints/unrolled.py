"""Backprop through every step of the forward solver: the O(steps)-memory baseline."""

from __future__ import annotations

import dataclasses

from deqjax._src.adjoints import base


@dataclasses.dataclass(frozen=True)
class UnrolledAdjoint(base.Adjoint):
    """Backprop through every step of the forward solver (a baseline; O(steps) memory).

    Runs the solver on its scan-based loop (``solver.replace(loop="scan")``), which every solver
    declaring ``"scan"`` in its ``loop_kinds`` has: the library's fixed-point solvers (objects,
    functions or ``functools.partial`` objects of them) and a user's callable that takes
    ``loop=``. Any other solver is refused with ``ValueError``. Gradients also flow to ``z0``.
    What is differentiated, per solver:

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
    """

    def solve(self, f, solver, params, x, z0, *, backward_stats=None):
        del backward_stats  # no backward solve
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
