"""Forward solvers for ``z = f(z)`` over any pytree; batch with ``jax.vmap``.

Each solver returns a :class:`Solution` whose ``value`` is the lowest-residual iterate seen.
"""

from deqjax._src.solvers.anderson import anderson
from deqjax._src.solvers.base import (
    CONVERGED,
    DIVERGED,
    MAX_STEPS,
    NONFINITE,
    STATUS_NAMES,
    Solution,
    SolverFn,
    status_name,
)
from deqjax._src.solvers.broyden import broyden
from deqjax._src.solvers.fixed_point_iteration import fixed_point_iteration

__all__ = [
    "CONVERGED",
    "DIVERGED",
    "MAX_STEPS",
    "NONFINITE",
    "STATUS_NAMES",
    "Solution",
    "SolverFn",
    "anderson",
    "broyden",
    "fixed_point_iteration",
    "status_name",
]
