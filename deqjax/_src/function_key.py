"""A user's function as a cache key and the arrays it reads (what lets entry points run compiled).

``split_callable(f)`` describes ``f`` by what decides the program it traces to: its code, the
Python values it closes over or reads as globals (by value when they compare by value, else by
identity), and the structure of the arrays among them. The arrays themselves are *operands*: a
compiled entry takes them as arguments, so a function closing over a new matrix of the same
shape reuses the compiled program, and ``rebuild(key, operands)`` makes the function again
around traced operands. What cannot be described (an unhashable value, a cycle, a very large
object graph) makes the function unkeyable: its caller then runs it un-jitted, as before.
Used by :mod:`deqjax._src.compiled`.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import sys
import types
from collections.abc import Hashable, Iterator, Sequence
from typing import Any, Callable

import jax
import numpy as np

_ARRAYS = (jax.Array, np.ndarray)
_SCALARS = frozenset({bool, int, float, complex, str, bytes, type(None)})
_BUDGET = 512  # descriptions per function: a closure over a large object graph is not keyed


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
    """A Haiku module instance, by its class, its full name and the attributes its class sets (a
    new instance per ``apply`` of the same model is the same key)."""

    kind: type
    name: str  # ``module_name``: the scope of its parameters' names
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


def _haiku() -> types.ModuleType | None:
    """Haiku if it is loaded (it is not imported here: the core loads only JAX; no object can be
    a Haiku module before Haiku is loaded)."""
    return sys.modules.get("haiku")


@functools.lru_cache(maxsize=4)
def haiku_own_attributes(hk: types.ModuleType) -> frozenset[str]:
    """The attributes ``hk.Module`` itself sets on every module: its names and Haiku's
    bookkeeping (e.g. a record of the ``transform`` call that made it, new on every ``apply``).

    Found once with public API, whatever Haiku calls them: a bare ``hk.Module`` made inside an
    ``hk.transform``. A module is keyed by its ``module_name`` and the other attributes.

    Args:
      hk: the ``haiku`` module.

    Returns:
      The attribute names of a bare Haiku module.
    """

    def bare() -> frozenset[str]:
        return frozenset(vars(hk.Module(name="deqjax_probe")))

    return hk.transform(bare).apply({}, None)


def _describe_object(obj: Any, walk: _Walk) -> Any:
    """A leaf that is neither an array nor a function: by value when its class compares by
    value, else by identity; a plain object holding arrays cannot be keyed (its arrays may be
    replaced between calls)."""
    kind = type(obj)
    if isinstance(obj, (types.ModuleType, type)):
        return _Identity(obj)
    hk = _haiku()
    if hk is not None and isinstance(obj, hk.Module):
        own = haiku_own_attributes(hk)
        items = tuple((k, _describe(v, walk)) for k, v in sorted(vars(obj).items()) if k not in own)
        n = _count(tuple(d for _, d in items))
        if n:  # keep no array alive: the arrays are rebuilt from the operands
            obj = copy.copy(obj)
            for k, d in items:
                if d.n:
                    object.__setattr__(obj, k, None)
        return _Module(kind, obj.module_name, items, n, proto=obj)
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
    * a Haiku module instance: its class, ``module_name`` and the attributes its class sets (not
      Haiku's own bookkeeping, see :func:`haiku_own_attributes`): ``dq.nn.DEQ`` cells are
      rebuilt on every ``apply`` of a model;
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
