"""The deqjax solvers by name and by function: what rebuilds a solver from a config.

A run's ``config.json`` stores a solver as :meth:`~deqjax.solvers.Solver.to_dict`'s output;
:func:`from_dict` rebuilds the object. :data:`BY_FUNCTION` maps each function form
(``dq.solvers.anderson``) to its class, for :func:`deqjax.solvers.as_solver`.
"""

from __future__ import annotations

from typing import Any, Callable

from deqjax._src.solvers.anderson import Anderson, anderson
from deqjax._src.solvers.base import Solver
from deqjax._src.solvers.broyden import Broyden, broyden
from deqjax._src.solvers.fixed_point_iteration import FixedPointIteration, fixed_point_iteration
from deqjax._src.solvers.krylov import GMRES, BiCGStab, NormalCG, bicgstab, gmres, normal_cg
from deqjax._src.solvers.reversible import Reversible, reversible

BY_FUNCTION: dict[Callable[..., Any], type[Solver]] = {
    fixed_point_iteration: FixedPointIteration,
    anderson: Anderson,
    broyden: Broyden,
    reversible: Reversible,
    gmres: GMRES,
    bicgstab: BiCGStab,
    normal_cg: NormalCG,
}

BY_NAME: dict[str, type[Solver]] = {cls.__name__: cls for cls in BY_FUNCTION.values()}


def from_dict(config: dict[str, Any]) -> Solver:
    """Rebuilds a solver object from :meth:`~deqjax.solvers.Solver.to_dict`'s output (e.g. a run's
    config.json; the class name may also stand under ``"type"``, as ``dq.harness.to_python``
    writes it).

    Raises:
      ValueError: if ``config["solver"]`` names no solver class, or for a bad field.

    Example:
      >>> dq.solvers.from_dict({"solver": "Anderson", "m": 3}) == dq.solvers.Anderson(m=3)
      True
    """
    config = dict(config)
    name = config.pop("solver", None) or config.pop("type", None)
    if name not in BY_NAME:
        raise ValueError(f"config['solver'] must be one of {sorted(BY_NAME)}, got {name!r}.")
    return BY_NAME[name]().replace(**config)
