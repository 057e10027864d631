"""The descriptions a function key is made of, and how each builds its value back.

:func:`deqjax._src.function_key.split_callable` describes a user's function as a tree of the
nodes below: equal trees trace to the same program. Every node has ``n``, the number of arrays
(operands) under it, and ``build(ops)``, its value again with the arrays taken from ``ops`` in
the order the description found them (tracers, inside a compiled program). A node with ``n == 0``
builds its value as it is (``proto``); one keeping arrays keeps a copy without them, so a cached
program does not keep the first call's arrays alive.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import types
from collections.abc import Iterator
from typing import Any, Callable

import jax
import numpy as np

ARRAYS = (jax.Array, np.ndarray)
SCALARS = frozenset({bool, int, float, complex, str, bytes, type(None)})
BUDGET = 512  # descriptions per function: a closure over a large object graph is not keyed


class Unkeyable(Exception):
    """Part of a function cannot enter a key; ``path`` names where (innermost first)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.path: list[str] = []


class Walk:
    """One description: the operands found so far, the budget left, the functions on the path,
    the names the user's code spells, and the objects described by contents (by identity of the
    object, so a second sight of one is a :class:`Ref`)."""

    __slots__ = (
        "describe",
        "operands",
        "left",
        "visiting",
        "names",
        "seen",
        "objects",
        "namespaces",
    )

    def __init__(self, describe: Callable[[Any, Walk], Any]) -> None:
        self.describe = describe
        self.operands: list[Any] = []
        self.left = BUDGET
        self.visiting: set[int] = set()
        self.names: set[str] = set()
        self.seen: dict[int, int] = {}  # id(object) -> its index in ``objects``
        self.objects: list[Any] = []
        self.namespaces: list[Namespace] = []

    def tick(self) -> None:
        self.left -= 1
        if self.left < 0:
            raise Unkeyable(f"too large: more than {BUDGET} values")

    def labelled(self, label: str, value: Any) -> Any:
        """The description of ``value``, reached by ``label`` (a variable name, ``.attribute``
        or ``[index]``): a failure names the path to it."""
        try:
            return self.describe(value, self)
        except Unkeyable as e:
            e.path.append(label)
            raise


class _Operand:
    """An array: an argument of the compiled program."""

    n = 1

    def __eq__(self, other: object) -> bool:
        return type(other) is _Operand

    def __hash__(self) -> int:
        return 1

    def build(self, ops: Iterator[Any]) -> Any:
        return next(ops)


OPERAND = _Operand()


@dataclasses.dataclass(frozen=True)
class Value:
    """A value that compares by value (its type too: ``1`` and ``1.0`` are different keys)."""

    kind: type
    value: Any
    n = 0

    def build(self, ops: Iterator[Any]) -> Any:
        return set(self.value) if self.kind is set else self.value


class Identity:
    """An object taken by identity (library code, a library's object)."""

    __slots__ = ("obj",)
    n = 0

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __eq__(self, other: object) -> bool:
        return type(other) is Identity and other.obj is self.obj

    def __hash__(self) -> int:
        return id(self.obj)

    def build(self, ops: Iterator[Any]) -> Any:
        return self.obj


@dataclasses.dataclass(frozen=True)
class Ref:
    """An object described earlier in the same walk (a shared object, or a cycle): its index
    among the walk's objects."""

    index: int
    n = 0
    proto: Any = dataclasses.field(compare=False, repr=False)

    def build(self, ops: Iterator[Any]) -> Any:
        return self.proto


@dataclasses.dataclass(frozen=True)
class Instance:
    """An object by its contents: its class's description, its attributes (``__dict__`` and
    slots) described, and its :class:`Value` when it also compares by value (else ``None``). It
    holds no array (an object is not rebuilt: it is passed as it is)."""

    kind: Any
    items: tuple  # ((attribute, description), ...)
    value: Value | None
    n = 0
    proto: Any = dataclasses.field(compare=False, repr=False)

    def build(self, ops: Iterator[Any]) -> Any:
        return self.proto


class Namespace:
    """A user's class or module: itself (by identity) and the attributes the walk's code may read
    from it, described. Filled while the walk settles (the names grow as code is found), then
    frozen; it holds no array."""

    __slots__ = ("obj", "items", "_hash")
    n = 0

    def __init__(self, obj: Any) -> None:
        self.obj = obj
        self.items: dict[str, Any] | tuple = {}
        self._hash = 0

    def freeze(self) -> None:
        self.items = tuple(sorted(self.items.items()))
        self._hash = hash((id(self.obj), self.items))

    def __eq__(self, other: object) -> bool:
        return type(other) is Namespace and other.obj is self.obj and other.items == self.items

    def __hash__(self) -> int:
        return self._hash

    def build(self, ops: Iterator[Any]) -> Any:
        return self.obj


EMPTY_CELL = Value(type(None), "<empty cell>")


def built(described: tuple, ops: Iterator[Any]) -> list[Any]:
    return [d.build(ops) for d in described]


def count(*groups: tuple) -> int:
    return sum(d.n for group in groups for d in group)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Rebuilt:
    """A description that may hold arrays: ``n`` of them, and ``proto``, its value as found (a
    copy without its arrays when ``n > 0``). :meth:`build` returns ``proto`` when ``n == 0``, else
    the value rebuilt around the operands (:meth:`rebuild`)."""

    n: int
    proto: Any = dataclasses.field(compare=False, repr=False)

    def build(self, ops: Iterator[Any]) -> Any:
        return self.rebuild(ops) if self.n else self.proto

    def rebuild(self, ops: Iterator[Any]) -> Any:
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class Function(Rebuilt):
    """A Python function: code, global namespace (by identity), defaults, closure cells and the
    globals its code reads."""

    code: types.CodeType
    namespace: Identity
    defaults: tuple | None
    kwdefaults: tuple  # ((name, description), ...)
    cells: tuple
    reads: tuple  # ((global name, description), ...)

    def rebuild(self, ops: Iterator[Any]) -> Callable:
        proto = self.proto
        defaults = None if self.defaults is None else tuple(built(self.defaults, ops))
        kwdefaults = {k: d.build(ops) for k, d in self.kwdefaults} or None
        cells = tuple(
            types.CellType() if d is EMPTY_CELL else types.CellType(d.build(ops))
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


def bare(fn: types.FunctionType, n: int) -> types.FunctionType:
    """``fn`` itself when it reaches no array, else a copy without its closure and defaults:
    what a description keeps (a cached program must not keep the first call's arrays alive)."""
    if not n:
        return fn
    cells = tuple(types.CellType() for _ in fn.__closure__ or ())
    copied = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, None, cells)
    copied.__qualname__ = fn.__qualname__
    copied.__dict__.update(fn.__dict__)
    return copied


@dataclasses.dataclass(frozen=True)
class Partial(Rebuilt):
    """A ``functools.partial``."""

    func: Any
    args: tuple
    keywords: tuple  # ((name, description), ...)

    def rebuild(self, ops: Iterator[Any]) -> Callable:
        func, args = self.func.build(ops), built(self.args, ops)
        return functools.partial(func, *args, **{k: d.build(ops) for k, d in self.keywords})


@dataclasses.dataclass(frozen=True)
class Method(Rebuilt):
    """A bound method: its function and its object."""

    func: Any
    obj: Any

    def rebuild(self, ops: Iterator[Any]) -> Callable:
        return types.MethodType(self.func.build(ops), self.obj.build(ops))


@dataclasses.dataclass(frozen=True)
class Tree(Rebuilt):
    """A pytree node (a tuple, a dict, an Equinox module, ...): its structure, the user's classes
    among its nodes (described) and its leaves."""

    treedef: Any
    classes: tuple
    leaves: tuple

    def rebuild(self, ops: Iterator[Any]) -> Any:
        return jax.tree_util.tree_unflatten(self.treedef, built(self.leaves, ops))


@dataclasses.dataclass(frozen=True)
class HaikuModule(Rebuilt):
    """A Haiku module instance, by its class, its full name and the attributes its class sets (a
    new instance per ``apply`` of the same model is the same key); its arrays are operands (it is
    rebuilt as a copy holding them)."""

    kind: Any  # the class's description
    name: str  # ``module_name``: the scope of its parameters' names
    items: tuple  # ((attribute, description), ...)

    def rebuild(self, ops: Iterator[Any]) -> Any:
        obj = copy.copy(self.proto)
        for name, d in self.items:
            object.__setattr__(obj, name, d.build(ops))
        return obj
