"""Jacobian-free backprop (Fung et al. 2022): the gradient of one application of ``f`` at ``z*``."""

from __future__ import annotations

import dataclasses

from deqjax._src.adjoints import base


@dataclasses.dataclass(frozen=True)
class OneStepAdjoint(base.Adjoint):
    """Jacobian-free backprop (Fung et al. 2022): the gradient of ``f(θ, x, stop_gradient(z*))``.

    Equivalent to the implicit gradient with ``J_f(z*)`` replaced by 0 (``u = ∂ℓ/∂z*``); the
    returned value is ``z*``.
    """

    def solve(self, f, solver, params, x, z0, *, backward_stats=None):
        del backward_stats  # no backward solve
        sol = base.solve_without_gradient(f, solver, params, x, z0)
        z_star = sol.value
        z_out = base.straight_through(z_star, f(params, x, z_star))
        return z_out, base.stop_statistics(sol, z_out)
