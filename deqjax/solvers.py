"""Forward solvers for ``z = f(z)`` over any pytree; batch with ``jax.vmap``.

``gmres``, ``bicgstab`` and ``normal_cg`` are Krylov solvers for an AFFINE ``f`` (the implicit
backward ``u = g + Jᵀu``, e.g. ``dq.ImplicitAdjoint(solver=dq.solvers.gmres)``), built on
``jax.scipy.sparse.linalg``.

Each solver returns a :class:`Solution` whose ``value`` is the lowest-residual iterate seen.
"""

from deqjax._src.linear_solvers import bicgstab, gmres, normal_cg
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
from deqjax._src.solvers.reversible import reversal_error, reversible

__all__ = [
    "CONVERGED",
    "DIVERGED",
    "MAX_STEPS",
    "NONFINITE",
    "STATUS_NAMES",
    "Solution",
    "SolverFn",
    "anderson",
    "bicgstab",
    "broyden",
    "fixed_point_iteration",
    "gmres",
    "normal_cg",
    "reversal_error",
    "reversible",
    "status_name",
]
