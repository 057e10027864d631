"""Solvers as data: frozen, hashable, printable objects called as ``(f, z0) -> Solution``.

``dq.solvers.Anderson(m=5, tol=1e-4)`` is the function :func:`deqjax.solvers.anderson` with its
keyword arguments held as dataclass fields: a config prints and logs it (:meth:`Solver.to_dict`,
rebuilt by :func:`from_dict`), ``jax.jit`` can take it as a static argument (it is hashable and
compares by value), and a call ``solver(f, z0)`` runs the function with those keywords. Each class
takes exactly its function's keyword arguments with the same defaults (the fields are read from the
function's signature, so they cannot drift apart); what a field means is documented once, on the
function.

Capabilities are declared rather than discovered: ``loop_kinds`` (the loops a call may ask for
with ``loop=``; :class:`~deqjax.UnrolledAdjoint` needs ``"scan"``) and ``batch_native`` (the
solver takes ``batch_ndim=``, so :class:`~deqjax.nn.DEQ` solves a batch in one loop and the
implicit backward follows the forward's batch axes). ``deqjax._src.solvers.base.accepts_loop_kind``
and ``accepts_batch_ndim`` read them and fall back to inspecting the signature only for a user's
own callables and ``functools.partial`` objects, which stay valid solvers everywhere.

Example:
  >>> solver = dq.solvers.Anderson(max_steps=30, tol=1e-3)
  >>> solver                              # Anderson(max_steps=30, tol=0.001, stop_mode='rel', ...)
  >>> sol = solver(f, z0)                 # == dq.solvers.anderson(f, z0, max_steps=30, tol=1e-3)
  >>> solver.replace(tol=1e-5).to_dict()  # {'solver': 'Anderson', 'max_steps': 30, ...}
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any, Callable, ClassVar

import jax
import jax.numpy as jnp

from deqjax._src import checks, linear_solvers
from deqjax._src.solvers import anderson as anderson_lib
from deqjax._src.solvers import base
from deqjax._src.solvers import broyden as broyden_lib
from deqjax._src.solvers import fixed_point_iteration as fpi_lib
from deqjax._src.solvers import loop as loop_lib
from deqjax._src.solvers import reversible as reversible_lib

PyTree = Any

_REGISTRY: dict[str, type[Solver]] = {}


def _keyword_parameters(function: Callable[..., Any]) -> list[inspect.Parameter]:
    """The keyword-only parameters of ``function`` (its hyper-parameters), in order."""
    params = inspect.signature(function).parameters.values()
    return [p for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY]


class _SignatureOfFunction:
    """``solver.__signature__``: the function's signature with the object's field values as the
    keywords' defaults, so code that inspects a solver (``inspect.signature``, also through a
    ``functools.partial``) sees what the object runs with. ``None`` on the class itself."""

    def __get__(self, obj: Solver | None, objtype: type | None = None) -> inspect.Signature | None:
        if obj is None:
            return None
        sig = inspect.signature(obj.function)
        fields = obj.to_dict(with_name=False)
        return sig.replace(
            parameters=[
                p.replace(default=fields[p.name]) if p.name in fields else p
                for p in sig.parameters.values()
            ]
        )


class Solver:
    """Base class of the solver objects; a subclass names its function, e.g.
    ``class Anderson(Solver, function=anderson)``, and gets that function's keyword arguments as
    frozen dataclass fields (same names, same defaults).

    Attributes:
      function: the solver function the object calls.
      loop_kinds: the ``loop=`` values a call accepts (empty: the solver runs its own loop).
      batch_native: whether the function takes ``batch_ndim=`` (one loop for a batch of problems).
    """

    function: ClassVar[Callable[..., base.Solution]]
    loop_kinds: ClassVar[tuple[str, ...]]
    batch_native: ClassVar[bool]
    __signature__ = _SignatureOfFunction()

    def __init_subclass__(cls, *, function: Callable[..., base.Solution] | None = None, **kwargs):
        super().__init_subclass__(**kwargs)
        if function is None:  # a solver that is not a deqjax function (normalise.CustomSolver)
            return
        params = _keyword_parameters(function)
        names = [p.name for p in params]
        cls.__annotations__ = {p.name: p.annotation for p in params}
        for p in params:
            if p.default is not inspect.Parameter.empty:
                setattr(cls, p.name, p.default)
        cls.function = staticmethod(function)
        cls.loop_kinds = loop_lib.LOOP_KINDS if "loop" in names else ()
        cls.batch_native = "batch_ndim" in names
        dataclasses.dataclass(frozen=True)(cls)
        _REGISTRY[cls.__name__] = cls

    def __post_init__(self):
        # A list (e.g. sample_steps read back from JSON) becomes a tuple: the object stays hashable.
        for name, value in self.to_dict(with_name=False).items():
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))
        # Fail at construction, naming the bad field, rather than at the first solve inside a
        # traced training step: run the function's own checks on a scalar problem, shapes only.
        kw = self.to_dict(with_name=False)
        batch_ndim = checks.check_int(kw.get("batch_ndim", 0), "batch_ndim", minimum=0)
        if "loop" in kw:
            loop_lib.check_loop_kind(kw["loop"])
            kw["loop"] = "while"  # "python" cannot be traced; the kind itself is checked above
        z0 = jnp.zeros((1,) * batch_ndim)

        jax.eval_shape(lambda: self.function(lambda z: 0.5 * z, z0, **kw).value)

    def __call__(
        self, f: Callable[[PyTree], PyTree], z0: PyTree, /, **overrides: Any
    ) -> base.Solution:
        """Runs ``function(f, z0, **fields)``; ``overrides`` replace fields for this call only
        (``batch_ndim=`` and ``loop=`` are how the DEQ and the adjoints set the batch axes and the
        loop kind; any other field name is accepted too)."""
        unknown = sorted(set(overrides) - set(self.to_dict(with_name=False)))
        if unknown:
            raise ValueError(
                f"{type(self).__name__} got unknown keyword(s) {unknown}; its fields are "
                f"{sorted(self.to_dict(with_name=False))}."
            )
        if "loop" in overrides and overrides["loop"] not in self.loop_kinds:
            raise ValueError(
                f"{type(self).__name__} runs on loop kinds {self.loop_kinds}, got "
                f"loop={overrides['loop']!r}."
            )
        return self.function(f, z0, **{**self.to_dict(with_name=False), **overrides})

    def to_dict(self, *, with_name: bool = True) -> dict[str, Any]:
        """The fields as a JSON-ready dict; with ``with_name`` (default) under the key ``"solver"``
        the class name too, so that :func:`from_dict` can rebuild the object."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {"solver": type(self).__name__, **fields} if with_name else fields

    def replace(self, **changes: Any) -> Solver:
        """A copy with some fields changed (``dataclasses.replace``)."""
        return dataclasses.replace(self, **changes)


class FixedPointIteration(Solver, function=fpi_lib.fixed_point_iteration):
    """:func:`deqjax.solvers.fixed_point_iteration` as a frozen object (fields: its keywords)."""


class Anderson(Solver, function=anderson_lib.anderson):
    """:func:`deqjax.solvers.anderson` as a frozen object (fields: its keywords)."""


class Broyden(Solver, function=broyden_lib.broyden):
    """:func:`deqjax.solvers.broyden` as a frozen object (fields: its keywords)."""


class Reversible(Solver, function=reversible_lib.reversible):
    """:func:`deqjax.solvers.reversible` as a frozen object (fields: its keywords); the forward
    solver of :class:`~deqjax.ReversibleAdjoint`."""


class GMRES(Solver, function=linear_solvers.gmres):
    """:func:`deqjax.solvers.gmres` (affine maps, e.g. the implicit backward) as a frozen object."""


class BiCGStab(Solver, function=linear_solvers.bicgstab):
    """:func:`deqjax.solvers.bicgstab` (affine maps) as a frozen object (fields: its keywords)."""


class NormalCG(Solver, function=linear_solvers.normal_cg):
    """:func:`deqjax.solvers.normal_cg` (affine maps) as a frozen object (fields: its keywords)."""


def registry() -> dict[str, type[Solver]]:
    """The deqjax solver classes by name (those :func:`from_dict` rebuilds)."""
    return dict(_REGISTRY)


def from_dict(config: dict[str, Any]) -> Solver:
    """Rebuilds a solver object from :meth:`Solver.to_dict`'s output (e.g. a run's config.json;
    the class name may also stand under ``"type"``, as ``dq.training.to_python`` writes it).

    Raises:
      ValueError: if ``config["solver"]`` names no solver class.
    """
    config = dict(config)
    name = config.pop("solver", None) or config.pop("type", None)
    if name not in _REGISTRY:
        raise ValueError(f"config['solver'] must be one of {sorted(_REGISTRY)}, got {name!r}.")
    return _REGISTRY[name](**config)


def describe(solver: Callable[..., Any]) -> dict[str, Any]:
    """The settings a solver runs with, as a JSON-ready dict: ``{"solver": name, **keywords}``.

    Works for solver objects (their :meth:`~Solver.to_dict`), the solver functions (their
    keyword defaults), ``functools.partial`` of either (the bound keywords win) and, for any other
    callable, just its name. Configs log it; :class:`~deqjax.ImplicitAdjoint` reads the backward
    solver's ``tol``/``stop_mode``/``max_steps`` from it.
    """
    if isinstance(solver, Solver):
        return solver.to_dict()
    if isinstance(solver, functools.partial):
        return {**describe(solver.func), **solver.keywords}
    name = getattr(solver, "__name__", type(solver).__name__)
    try:
        params = _keyword_parameters(solver)
    except (TypeError, ValueError):
        return {"solver": name}
    return {
        "solver": name,
        **{p.name: p.default for p in params if p.default is not inspect.Parameter.empty},
    }


def with_batch_ndim(solver: Callable[..., Any], batch_ndim: int) -> Callable[..., Any]:
    """``solver`` set to solve ``batch_ndim`` leading axes natively: a solver object stays an
    object (``replace``); a function or partial is wrapped in ``functools.partial``."""
    if isinstance(solver, Solver):
        return solver.replace(batch_ndim=batch_ndim)
    return functools.partial(solver, batch_ndim=batch_ndim)
