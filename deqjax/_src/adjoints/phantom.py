"""The phantom gradient (Geng et al. 2021): differentiate a few damped steps started at ``z*``."""

from __future__ import annotations

import dataclasses

from deqjax._src import checks, tree, vma
from deqjax._src.adjoints import base


@dataclasses.dataclass(frozen=True)
class PhantomAdjoint(base.Adjoint):
    """Phantom gradient (Geng et al. 2021): differentiate damped steps started at ``z*``.

    The gradient is that of ``steps`` iterations ``z ← (1 − tau) z + tau f(θ, x, z)`` from
    ``stop_gradient(z*)``; the returned value is ``z*`` itself. As ``steps`` grows (with
    ``tau`` in (0, 1]) the gradient approaches the implicit one for a contractive ``f``.

    Args:
      steps: number of differentiated damped steps (``>= 1``).
      tau: damping in ``(0, 1]``.
    """

    steps: int = 5
    tau: float = 0.5

    def __post_init__(self):
        checks.check_positive_int(self.steps, "steps")
        if not 0.0 < self.tau <= 1.0:
            raise ValueError(f"tau must be in (0, 1], got {self.tau}.")

    def solve(self, f, solver, params, x, z0, *, backward_stats=None):
        del backward_stats  # no backward solve
        sol = base.solve_without_gradient(f, solver, params, x, z0)
        z_star = sol.value

        def damped_step(z, _):
            return tree.tree_axpy(self.tau, tree.tree_sub(f(params, x, z), z), z), None

        z_phantom, _ = vma.scan(damped_step, z_star, None, length=self.steps)
        z_out = base.straight_through(z_star, z_phantom)
        return z_out, base.stop_statistics(sol, z_out)
