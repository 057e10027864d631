"""Forward solvers for ``z = f(z)`` over any pytree; batch with ``jax.vmap``.

``gmres``, ``bicgstab`` and ``normal_cg`` are Krylov solvers for an AFFINE ``f`` (the implicit
backward ``u = g + Jᵀu``, e.g. ``dq.ImplicitAdjoint(solver=dq.solvers.gmres)``), built on
``jax.scipy.sparse.linalg``.

Each solver returns a :class:`Solution` whose ``value`` is the lowest-residual iterate seen.

Solvers as data: ``FixedPointIteration``, ``Anderson``, ``Broyden``, ``Reversible``, ``GMRES``,
``BiCGStab`` and ``NormalCG`` are frozen, hashable dataclasses whose fields are the functions'
keywords (``to_dict`` and :func:`from_dict` for configs; :func:`describe` reads any solver's
settings).
:func:`summarize` turns a Solution into a metrics dict.
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
from deqjax._src.solvers.broyden import BroydenInverse, broyden
from deqjax._src.solvers.fixed_point_iteration import fixed_point_iteration
from deqjax._src.solvers.reversible import reversal_error, reversible
from deqjax._src.solvers.solver_objects import (
    GMRES,
    Anderson,
    BiCGStab,
    Broyden,
    FixedPointIteration,
    NormalCG,
    Reversible,
    Solver,
    describe,
    from_dict,
)
from deqjax._src.solvers.summary import summarize

__all__ = [
    "GMRES",
    "Anderson",
    "BiCGStab",
    "Broyden",
    "CONVERGED",
    "DIVERGED",
    "FixedPointIteration",
    "MAX_STEPS",
    "NONFINITE",
    "NormalCG",
    "Reversible",
    "STATUS_NAMES",
    "Solution",
    "Solver",
    "SolverFn",
    "BroydenInverse",
    "anderson",
    "bicgstab",
    "broyden",
    "describe",
    "fixed_point_iteration",
    "from_dict",
    "gmres",
    "normal_cg",
    "reversal_error",
    "reversible",
    "status_name",
    "summarize",
]
