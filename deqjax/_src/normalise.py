"""The one normalisation point: what a user passes becomes a declared object, once, at the boundary.

A solver can be written three ways: a solver object (``dq.solvers.Anderson(m=5)``), a solver
function (``dq.solvers.anderson``) or a ``functools.partial`` of either, and a user may also pass
a callable of their own, ``(f, z0) -> Solution``. Every entry point (``dq.fixed_point``,
``dq.nn.DEQ``, the adjoints, the models) calls :func:`as_solver` on what it is given, and from there
on the code reads the object's declared fields (``tol``, ``stop_mode``, ``max_steps``,
``batch_ndim``) and capabilities (``batch_native``, ``loop_kinds``) only.

This is the one module of deqjax that inspects user callables: a user's callable declares nothing,
so its keywords are read here, once, into a :class:`CustomSolver`; a Haiku cell's optional
``is_training`` keyword is found by :func:`accepts_keyword`; and a user's function becomes a cache
key and its arrays by :func:`split_callable` (what lets ``dq.fixed_point`` run compiled, see
:mod:`deqjax._src.compiled`).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import sys
import types
from collections.abc import Hashable, Iterator, Sequence
from typing import Any, Callable

import jax
import numpy as np

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
      ValueError: ``solver`` is not callable, or a partial binds keywords the solver lacks.

    Example:
      >>> dq.solvers.as_solver(functools.partial(dq.solvers.anderson, tol=1e-3))
      Anderson(max_steps=50, tol=0.001, ...)
    """
    if isinstance(solver, Solver):
        return solver
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
    if not callable(solver):
        raise ValueError(f"{name} must be a solver (object, function or partial), got {solver!r}.")
    bound = solver.keywords if isinstance(solver, functools.partial) else {}
    return CustomSolver(
        fn=solver,
        keywords=frozenset(k for k in _PASSED if accepts_keyword(solver, k)),
        **{k: bound[k] for k in _SETTINGS + _PASSED if k in bound},
    )


def _hashable(obj: Any) -> bool:
    try:
        hash(obj)
    except TypeError:
        return False
    return True


# --- a user's function as a cache key and the arrays it reads ------------------------------------
#
# ``split_callable(f)`` describes ``f`` by what decides the program it traces to: its code, the
# Python values it closes over or reads as globals (by value when they compare by value, else by
# identity), and the structure of the arrays among them. The arrays themselves are *operands*: a
# compiled entry takes them as arguments, so a function closing over a new matrix of the same
# shape reuses the compiled program, and ``rebuild(key, operands)`` makes the function again
# around traced operands. What cannot be described (an unhashable value, a cycle, a very large
# object graph) makes the function unkeyable: its caller then runs it un-jitted, as before.

_ARRAYS = (jax.Array, np.ndarray)
_SCALARS = frozenset({bool, int, float, complex, str, bytes, type(None)})
_BUDGET = 512  # descriptions per function: a closure over a large object graph is not keyed
# Haiku's record of the transform call that created a module: differs per call, changes nothing.
_HAIKU_BOOKKEEPING = frozenset({"_creation_frame_id"})


class _Unkeyable(Exception):
    """Part of a function cannot enter a key (unhashable, cyclic, or too large)."""


class _Walk:
    """One description: the operands found so far, the budget left, the functions on the path."""

    def __init__(self) -> None:
        self.operands: list[Any] = []
        self.left = _BUDGET
        self.visiting: set[int] = set()

    def tick(self) -> None:
        self.left -= 1
        if self.left < 0:
            raise _Unkeyable("too large")


class _Operand:
    """An array: an argument of the compiled program."""

    n = 1

    def __eq__(self, other: object) -> bool:
        return type(other) is _Operand

    def __hash__(self) -> int:
        return 1

    def build(self, ops: Iterator[Any]) -> Any:
        return next(ops)


_OPERAND = _Operand()


@dataclasses.dataclass(frozen=True)
class _Value:
    """A value that compares by value (its type too: ``1`` and ``1.0`` are different keys)."""

    kind: type
    value: Any
    n = 0

    def build(self, ops: Iterator[Any]) -> Any:
        return set(self.value) if self.kind is set else self.value


class _Identity:
    """An object that compares by identity (a module, a class, a plain object without arrays)."""

    __slots__ = ("obj",)
    n = 0

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __eq__(self, other: object) -> bool:
        return type(other) is _Identity and other.obj is self.obj

    def __hash__(self) -> int:
        return id(self.obj)

    def build(self, ops: Iterator[Any]) -> Any:
        return self.obj


_EMPTY_CELL = _Value(type(None), "<empty cell>")


def _built(described: tuple, ops: Iterator[Any]) -> list[Any]:
    return [d.build(ops) for d in described]


def _count(*groups: tuple) -> int:
    return sum(d.n for group in groups for d in group)


@dataclasses.dataclass(frozen=True)
class _Function:
    """A Python function: code, global namespace (by identity), defaults, closure cells and the
    globals its code reads."""

    code: types.CodeType
    namespace: _Identity
    defaults: tuple | None
    kwdefaults: tuple  # ((name, description), ...)
    cells: tuple
    reads: tuple  # ((global name, description), ...)
    n: int
    proto: Callable = dataclasses.field(compare=False, repr=False)

    def build(self, ops: Iterator[Any]) -> Callable:
        proto = self.proto
        if not self.n:
            return proto
        defaults = None if self.defaults is None else tuple(_built(self.defaults, ops))
        kwdefaults = {k: d.build(ops) for k, d in self.kwdefaults} or None
        cells = tuple(
            types.CellType() if d is _EMPTY_CELL else types.CellType(d.build(ops))
            for d in self.cells
        )
        namespace = proto.__globals__
        changed = {name: d.build(ops) for name, d in self.reads if d.n}
        if changed:  # the global arrays it reads, as operands
            namespace = {**namespace, **changed}
        fn = types.FunctionType(proto.__code__, namespace, proto.__name__, defaults, cells)
        fn.__kwdefaults__ = kwdefaults
        fn.__qualname__ = proto.__qualname__
        fn.__dict__.update(proto.__dict__)
        return fn


@dataclasses.dataclass(frozen=True)
class _Partial:
    """A ``functools.partial``."""

    func: Any
    args: tuple
    keywords: tuple  # ((name, description), ...)
    n: int
    proto: functools.partial = dataclasses.field(compare=False, repr=False)

    def build(self, ops: Iterator[Any]) -> Callable:
        if not self.n:
            return self.proto
        func, args = self.func.build(ops), _built(self.args, ops)
        return functools.partial(func, *args, **{k: d.build(ops) for k, d in self.keywords})


@dataclasses.dataclass(frozen=True)
class _Method:
    """A bound method: its function and its object."""

    func: Any
    obj: Any
    n: int
    proto: types.MethodType = dataclasses.field(compare=False, repr=False)

    def build(self, ops: Iterator[Any]) -> Callable:
        if not self.n:
            return self.proto
        return types.MethodType(self.func.build(ops), self.obj.build(ops))


@dataclasses.dataclass(frozen=True)
class _Tree:
    """A pytree node (a tuple, a dict, an Equinox module, ...): its structure and its leaves."""

    treedef: Any
    leaves: tuple
    n: int
    proto: Any = dataclasses.field(compare=False, repr=False)

    def build(self, ops: Iterator[Any]) -> Any:
        if not self.n:
            return self.proto
        return jax.tree_util.tree_unflatten(self.treedef, _built(self.leaves, ops))


@dataclasses.dataclass(frozen=True)
class _Module:
    """A Haiku module instance, by its class and attributes (a new instance per ``apply`` of the
    same model is the same key)."""

    kind: type
    items: tuple  # ((attribute, description), ...)
    n: int
    proto: Any = dataclasses.field(compare=False, repr=False)

    def build(self, ops: Iterator[Any]) -> Any:
        if not self.n:
            return self.proto
        obj = copy.copy(self.proto)
        for name, d in self.items:
            object.__setattr__(obj, name, d.build(ops))
        return obj


@functools.lru_cache(maxsize=1024)
def _global_names(code: types.CodeType) -> tuple[str, ...]:
    """The names ``code`` (and the functions defined in it) may read as globals."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names.update(_global_names(const))
    return tuple(sorted(names))


def _describe_function(fn: types.FunctionType, walk: _Walk) -> _Function:
    if id(fn) in walk.visiting:  # a function reaching itself through its closure or globals
        raise _Unkeyable("recursive")
    walk.visiting.add(id(fn))
    try:
        defaults = fn.__defaults__
        if defaults is not None:
            defaults = tuple(_describe(v, walk) for v in defaults)
        kwdefaults = tuple(
            (k, _describe(v, walk)) for k, v in sorted((fn.__kwdefaults__ or {}).items())
        )
        cells = tuple(_describe_cell(cell, walk) for cell in fn.__closure__ or ())
        namespace = fn.__globals__
        reads = tuple(
            (name, _describe_global(namespace[name], namespace, walk))
            for name in _global_names(fn.__code__)
            if name in namespace
        )
    finally:
        walk.visiting.discard(id(fn))
    n = _count(defaults or (), tuple(d for _, d in kwdefaults), cells, tuple(d for _, d in reads))
    return _Function(
        fn.__code__, _Identity(namespace), defaults, kwdefaults, cells, reads, n, _bare(fn, n)
    )


def _bare(fn: types.FunctionType, n: int) -> types.FunctionType:
    """``fn`` itself when it reaches no array, else a copy without its closure and defaults:
    what a description keeps (a cached program must not keep the first call's arrays alive)."""
    if not n:
        return fn
    cells = tuple(types.CellType() for _ in fn.__closure__ or ())
    bare = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, None, cells)
    bare.__qualname__ = fn.__qualname__
    bare.__dict__.update(fn.__dict__)
    return bare


def _describe_cell(cell: types.CellType, walk: _Walk) -> Any:
    try:
        value = cell.cell_contents
    except ValueError:  # a cell not yet filled (a name assigned after the function is defined)
        return _EMPTY_CELL
    return _describe(value, walk)


def _describe_global(value: Any, namespace: dict, walk: _Walk) -> Any:
    """A global the code reads: arrays are operands (rebinding a global array is seen), a
    function of the same module is described (it may read global arrays too), anything else
    that cannot be described is taken by identity, as ``jax.jit`` takes globals."""
    if isinstance(value, _ARRAYS):
        walk.operands.append(value)
        return _OPERAND
    if isinstance(value, (types.ModuleType, type)) or (
        isinstance(value, types.FunctionType) and value.__globals__ is not namespace
    ):
        return _Identity(value)
    mark = len(walk.operands)
    try:
        return _describe(value, walk)
    except _Unkeyable:
        if walk.left < 0:
            raise
        del walk.operands[mark:]
        return _Identity(value)


def _is_haiku_module(obj: Any) -> bool:
    """Whether ``obj`` is a Haiku module (Haiku is not imported here: the core loads only JAX;
    no object can be one before Haiku is loaded)."""
    hk = sys.modules.get("haiku")
    return hk is not None and isinstance(obj, hk.Module)


def _describe_object(obj: Any, walk: _Walk) -> Any:
    """A leaf that is neither an array nor a function: by value when its class compares by
    value, else by identity; a plain object holding arrays cannot be keyed (its arrays may be
    replaced between calls)."""
    kind = type(obj)
    if isinstance(obj, (types.ModuleType, type)):
        return _Identity(obj)
    if _is_haiku_module(obj):
        items = tuple(
            (k, _describe(v, walk))
            for k, v in sorted(vars(obj).items())
            if k not in _HAIKU_BOOKKEEPING
        )
        n = _count(tuple(d for _, d in items))
        if n:  # keep no array alive: the arrays are rebuilt from the operands
            obj = copy.copy(obj)
            for k, d in items:
                if d.n:
                    object.__setattr__(obj, k, None)
        return _Module(kind, items, n, proto=obj)
    if isinstance(obj, (set, frozenset)):
        obj = frozenset(obj)
    elif kind.__eq__ is object.__eq__ and kind.__hash__ is not None:
        attributes = getattr(obj, "__dict__", None) or {}
        if any(isinstance(v, _ARRAYS) for v in attributes.values()):
            raise _Unkeyable("an object holding arrays")
        return _Identity(obj)
    try:
        hash(obj)
    except TypeError:
        raise _Unkeyable("unhashable") from None
    return _Value(kind, obj)


def _describe(value: Any, walk: _Walk) -> Any:
    """The description of ``value`` (see the section's comment); its arrays go to
    ``walk.operands``."""
    walk.tick()
    if isinstance(value, _ARRAYS):
        walk.operands.append(value)
        return _OPERAND
    kind = type(value)
    if kind in _SCALARS:
        return _Value(kind, value)
    if kind is types.FunctionType:
        return _describe_function(value, walk)
    if kind is functools.partial:
        func, args = _describe(value.func, walk), tuple(_describe(a, walk) for a in value.args)
        kw = tuple((k, _describe(v, walk)) for k, v in sorted(value.keywords.items()))
        n = _count((func,), args, tuple(d for _, d in kw))
        return _Partial(func, args, kw, n, proto=None if n else value)
    if kind is types.MethodType:
        func, obj = _describe(value.__func__, walk), _describe(value.__self__, walk)
        n = func.n + obj.n
        return _Method(func, obj, n, proto=None if n else value)
    leaves, treedef = jax.tree_util.tree_flatten(value)
    if treedef.num_nodes == 1 and treedef.num_leaves == 1:  # a leaf
        return _describe_object(value, walk)
    try:
        hash(treedef)
    except TypeError:
        raise _Unkeyable("unhashable pytree node data") from None
    described = tuple(_describe(leaf, walk) for leaf in leaves)
    n = _count(described)
    return _Tree(treedef, described, n, proto=None if n else value)


def split_callable(f: Callable[..., Any]) -> tuple[Hashable, list[Any]] | None:
    """``f`` as ``(key, operands)``: what decides the program it traces to, and its arrays.

    * a Python function: its code, defaults, closure cells and the globals its code reads (a
      global array is an operand, so rebinding it is seen; a function of the same module is
      described in turn); a function it defines inside (``lambda``) has the same code on every
      call, so a fresh lambda over new arrays of the same shapes is the same key;
    * a ``functools.partial``, a bound method: their function, arguments and object;
    * a pytree (a tuple, an Equinox module, a ``jax.tree_util.Partial``): its structure, its
      array leaves as operands and its other leaves described;
    * a Haiku module instance: its class and attributes (``dq.nn.DEQ`` cells are rebuilt on
      every ``apply`` of a model);
    * any other value: by value if its class compares by value, else by identity (a plain
      object holding arrays is not keyed).

    Args:
      f: the user's callable.

    Returns:
      ``(key, operands)`` with ``key`` hashable (equal keys trace to the same program for
      operands of the same shapes and dtypes), or ``None`` when ``f`` cannot be keyed.

    Example:
      >>> key, ops = split_callable(lambda z: jnp.tanh(W @ z))  # ops == [W]
      >>> rebuild(key, ops)(z)                                   # the same function
    """
    walk = _Walk()
    try:
        key = _describe(f, walk)
        hash(key)
    except (_Unkeyable, TypeError, RecursionError):
        return None
    return key, walk.operands


def rebuild(key: Any, operands: Sequence[Any]) -> Callable[..., Any]:
    """The function of :func:`split_callable`'s ``key`` around ``operands`` (e.g. tracers)."""
    ops = iter(operands)
    return key.build(ops)
