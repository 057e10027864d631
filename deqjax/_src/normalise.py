"""The one normalisation point: what a user passes becomes a declared object, once, at the boundary.

A solver can be written three ways: a solver object (``dq.solvers.Anderson(m=5)``), a solver
function (``dq.solvers.anderson``) or a ``functools.partial`` of either, and a user may also pass
a callable of their own, ``(f, z0) -> Solution``. Every entry point (``dq.fixed_point``,
``dq.nn.DEQ``, the adjoints, the models) calls :func:`as_solver` on what it is given, and from there
on the code reads the object's declared fields (``tol``, ``stop_mode``, ``max_steps``,
``batch_ndim``) and capabilities (``batch_native``, ``loop_kinds``) only.

This is the one module of deqjax that inspects user callables: a user's callable declares nothing,
so its keywords are read here, once, into a :class:`CustomSolver`; a Haiku cell's optional
``is_training`` keyword is found by :func:`accepts_keyword`. (A user's function becomes a cache key
and its arrays in :mod:`deqjax._src.function_key`, which reads code objects and closures, not
signatures.)
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any, Callable, ClassVar

from deqjax._src import checks
from deqjax._src.solvers import loop as loop_lib
from deqjax._src.solvers import registry
from deqjax._src.solvers.base import Solver
from deqjax._src.solvers.solution import Solution

PyTree = Any

# The settings a consumer may read from a user's functools.partial (the backward's tolerance).
_SETTINGS = ("max_steps", "tol", "stop_mode", "atol")
# The keywords a CustomSolver passes on (its batch axes and loop kind); a partial may bind them.
_PASSED = ("batch_ndim", "loop")


def accepts_keyword(fn: Callable[..., Any], keyword: str) -> bool:
    """Whether ``fn`` can be called with ``keyword=`` (named, or through ``**kwargs``)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return keyword in params or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()
    )


@dataclasses.dataclass(frozen=True)
class CustomSolver(Solver):
    """A user's own solver callable ``(f, z0) -> Solution``, with what it declares read once.

    Made by :func:`as_solver`; there is no need to build one by hand. ``batch_native`` and
    ``loop_kinds`` say whether the callable takes ``batch_ndim=`` and ``loop=``; ``tol``,
    ``stop_mode``, ``max_steps`` and ``atol`` are those bound by a ``functools.partial`` (``None``
    where the callable does not say, e.g. :class:`~deqjax.ImplicitAdjoint` then runs its fallback
    wherever the backward did not converge). Equal (and equally hashed) when the callable is.

    Attributes:
      fn: the callable.
      keywords: the keywords it accepts among ``batch_ndim`` and ``loop`` (static).
      batch_ndim: leading axes of ``z0`` that index problems; passed on when nonzero.
      loop: the loop kind to pass (``None``: the callable's own default).
      max_steps, tol, stop_mode, atol: what a partial binds, else ``None`` (``batch_ndim`` and
        ``loop`` too: a partial binding them declares them).
    """

    wraps_user_callable: ClassVar[bool] = True

    fn: Callable[..., Solution] = None  # type: ignore[assignment]
    keywords: frozenset = frozenset()
    batch_ndim: int = 0
    loop: str | None = None
    max_steps: int | None = None
    tol: float | None = None
    stop_mode: str | None = None
    atol: float | None = None

    def __post_init__(self):
        if not callable(self.fn):
            raise ValueError(f"solver must be callable, got {self.fn!r}.")
        checks.check_int(self.batch_ndim, "batch_ndim", minimum=0)
        if self.batch_ndim and "batch_ndim" not in self.keywords:
            raise ValueError(f"{self.fn!r} takes no batch_ndim keyword.")
        if self.loop is not None and "loop" not in self.keywords:
            raise ValueError(f"{self.fn!r} takes no loop keyword.")

    @property
    def batch_native(self) -> bool:  # type: ignore[override]
        return "batch_ndim" in self.keywords

    @property
    def loop_kinds(self) -> tuple[str, ...]:  # type: ignore[override]
        return loop_lib.LOOP_KINDS if "loop" in self.keywords else ()

    def _run(self, f: Callable[[PyTree], PyTree], z0: PyTree, /) -> Solution:
        kwargs: dict[str, Any] = {}
        if self.batch_ndim:
            kwargs["batch_ndim"] = self.batch_ndim
        if self.loop is not None:
            kwargs["loop"] = self.loop
        return self.fn(f, z0, **kwargs)

    def to_dict(self, *, with_name: bool = True) -> dict[str, Any]:
        fn = self.fn.func if isinstance(self.fn, functools.partial) else self.fn
        name = getattr(fn, "__name__", type(fn).__name__)
        settings = {k: getattr(self, k) for k in _SETTINGS if getattr(self, k) is not None}
        return {"solver": name, **settings} if with_name else settings


def as_solver(solver: Any, *, name: str = "solver") -> Solver:
    """``solver`` as a solver object: the normalisation every entry point applies once.

    * a solver object (``dq.solvers.Anderson(...)``, any :class:`~deqjax.solvers.Solver`): as is;
    * a deqjax solver function (``dq.solvers.anderson``): its object with the defaults;
    * a ``functools.partial`` of either, keywords only: the object with those keywords
      (validated by the object, so a bad keyword is named here);
    * any other callable ``(f, z0) -> Solution`` (or a partial of one): a :class:`CustomSolver`.

    Args:
      solver: what the user passed.
      name: the argument's name, for error messages.

    Returns:
      A hashable, frozen :class:`~deqjax.solvers.Solver`.

    Raises:
      ValueError: ``solver`` is not callable, is a solver class (not an instance), is a function
        of deqjax's solver modules that is not registered, or is a partial that binds keywords
        the solver lacks.

    Example:
      >>> dq.solvers.as_solver(functools.partial(dq.solvers.anderson, tol=1e-3))
      Anderson(max_steps=50, tol=0.001, ...)
    """
    if isinstance(solver, Solver):
        return solver
    if isinstance(solver, type) and issubclass(solver, Solver):
        raise ValueError(
            f"{name} must be a solver object, not the class {solver.__name__}: pass an instance, "
            f"e.g. dq.solvers.{solver.__name__}()."
        )
    if isinstance(solver, functools.partial) and not solver.args:
        inner = as_solver(solver.func, name=name)
        if not isinstance(inner, CustomSolver):
            try:
                return inner.replace(**solver.keywords)
            except ValueError as err:
                raise ValueError(f"{name}: {err}") from err
    cls = registry.BY_FUNCTION.get(solver) if _hashable(solver) else None
    if cls is not None:
        return cls()
    if _in_solver_modules(solver):
        raise ValueError(
            f"{name}: {solver.__qualname__} is defined among deqjax's solvers but is not a "
            "registered solver function (deqjax._src.solvers.registry.function_form)."
        )
    if not callable(solver):
        raise ValueError(f"{name} must be a solver (object, function or partial), got {solver!r}.")
    bound = solver.keywords if isinstance(solver, functools.partial) else {}
    return CustomSolver(
        fn=solver,
        keywords=frozenset(k for k in _PASSED if accepts_keyword(solver, k)),
        **{k: bound[k] for k in _SETTINGS + _PASSED if k in bound},
    )


def _in_solver_modules(obj: Any) -> bool:
    """Whether ``obj`` is defined in ``deqjax.solvers`` or a module of ``deqjax._src.solvers``:
    a function of theirs that is not registered is a deqjax bug, never a user's own solver."""
    module = getattr(obj, "__module__", None) or ""
    return module == "deqjax.solvers" or module.startswith("deqjax._src.solvers.")


def _hashable(obj: Any) -> bool:
    try:
        hash(obj)
    except TypeError:
        return False
    return True
