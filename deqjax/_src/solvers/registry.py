"""The deqjax solvers by name and by function: what rebuilds a solver from a config.

Derived, not listed: each solver's module registers its class with its function form where it
defines them (``@registry.function_form(Anderson)`` on ``anderson``), so a solver cannot be left
out. A run's ``config.json`` stores a solver as :meth:`~deqjax.solvers.Solver.to_dict`'s output;
:func:`from_dict` rebuilds the object. :data:`BY_FUNCTION` maps each function form
(``dq.solvers.anderson``) to its class, for :func:`deqjax.solvers.as_solver`.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

from deqjax._src.solvers.base import Solver

BY_FUNCTION: dict[Callable[..., Any], type[Solver]] = {}
BY_NAME: dict[str, type[Solver]] = {}

_Fn = TypeVar("_Fn", bound=Callable[..., Any])


def function_form(cls: type[Solver]) -> Callable[[_Fn], _Fn]:
    """Registers the decorated function as the function form of the solver class ``cls``
    (``fn(f, z0, **fields)`` is ``cls(**fields)(f, z0)``), and ``cls`` under its name."""

    def register(fn: _Fn) -> _Fn:
        BY_FUNCTION[fn] = cls
        BY_NAME[cls.__name__] = cls
        return fn

    return register


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
