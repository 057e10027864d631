"""Forward solvers for ``z = f(z)`` over any pytree; each returns a :class:`Solution`.

A solver is a frozen, hashable object called as ``solver(f, z0)``: ``FixedPointIteration``,
``Anderson``, ``Broyden``, ``Reversible`` (run by the driver, on a ``while``, ``scan`` or
``python`` loop), and ``GMRES``, ``BiCGStab``, ``NormalCG`` (Krylov solvers for an AFFINE ``f``,
e.g. the implicit backward ``u = g + Jᵀu``). Each has a function form taking the same settings as
keywords (``anderson(f, z0, tol=1e-6)`` is ``Anderson(tol=1e-6)(f, z0)``); :func:`as_solver` turns
a function, a ``functools.partial`` or a user's own callable into an object.

States may be complex (``complex64``, ``complex128``: vectors of ``C^n``). Anderson's and Broyden's
models, and GMRES and BiCGStab, assume a map that is complex-linear to first order (a cell
holomorphic in ``z``); for a cell through ``conj(z)``, ``abs``, ``real`` or ``imag`` of the state
use ``FixedPointIteration`` (or ``NormalCG`` for an affine map), or write the state as its real
and imaginary parts.

``solver.to_dict()`` and :func:`from_dict` store and rebuild a solver (a run's config);
``solver.replace(...)`` makes a variant. :func:`status_name` names a status code and
:func:`summarize` turns a Solution into a metrics dict.
"""

from deqjax._src.normalise import as_solver
from deqjax._src.solvers.anderson import Anderson, anderson
from deqjax._src.solvers.base import Solver
from deqjax._src.solvers.broyden import Broyden, broyden
from deqjax._src.solvers.broyden_inverse import BroydenInverse
from deqjax._src.solvers.fixed_point_iteration import FixedPointIteration, fixed_point_iteration
from deqjax._src.solvers.krylov import GMRES, BiCGStab, NormalCG, bicgstab, gmres, normal_cg
from deqjax._src.solvers.registry import from_dict
from deqjax._src.solvers.reversible import Reversible, ReversibleState, reversal_error, reversible
from deqjax._src.solvers.solution import (
    CONVERGED,
    DIVERGED,
    MAX_STEPS,
    NONFINITE,
    PRECISION_FLOOR,
    STALLED,
    Solution,
    status_name,
)
from deqjax._src.solvers.summary import summarize

__all__ = [
    "CONVERGED",
    "DIVERGED",
    "GMRES",
    "MAX_STEPS",
    "NONFINITE",
    "Anderson",
    "BiCGStab",
    "Broyden",
    "BroydenInverse",
    "FixedPointIteration",
    "NormalCG",
    "PRECISION_FLOOR",
    "Reversible",
    "ReversibleState",
    "STALLED",
    "Solution",
    "Solver",
    "anderson",
    "as_solver",
    "bicgstab",
    "broyden",
    "fixed_point_iteration",
    "from_dict",
    "gmres",
    "normal_cg",
    "reversal_error",
    "reversible",
    "status_name",
    "summarize",
]
