"""The user's objects, classes and modules in a function key: described by their contents.

A value that does not compare by value (a plain object, a bound method's ``self``, a
``types.SimpleNamespace``, a class, a module) may change between two eager calls without
becoming another object, so a function key (:mod:`deqjax._src.function_key`) cannot take it by
identity: it describes what the function can read from it.

* **An object** of a user's class: its class (below) and its attributes (``__dict__`` and
  slots), each described in turn (all of them: a helper may read any); one that also compares
  by value (a frozen dataclass) by its value too. An enum member is a constant. A library's object
  is library state (a jitted function's compiled traces, a logger, a random generator): it is
  taken by identity (by value when its class compares by value), as ``jax.jit`` takes it; one
  that compares by its attributes but cannot be hashed (``SimpleNamespace``,
  ``argparse.Namespace``) is described by them. ``staticmethod``, ``classmethod`` and
  ``property`` objects are described by the functions they hold.
* **A class or a module** of the user's (:mod:`deqjax._src.library_code`; a library's is taken
  by identity): itself, by identity, and the attributes the function's code may read from it:
  the names its code objects spell (``co_names``: every ``x.name``; and the string constants
  that are identifiers: ``getattr(x, "name")``), of every function of the user's met in the
  description, and, for a class, its special methods (``__call__``, ``__add__``, ...: Python
  calls them without naming them), each attribute described in turn; a class's attributes are
  looked up along its method resolution order, its library bases left out. The names grow as
  functions are found (a method read from a class is a function whose names count), so the
  classes and modules are described when the walk is otherwise done (:func:`settle`), until no
  name is added.

Shared objects and cycles are described once; a second sight is a :class:`Ref`. Arrays inside
an object, a class or a module cannot become operands (the object is passed as it is, not
rebuilt): the function is not keyed (it runs un-jitted). A Haiku module is the exception:
rebuilt as a copy, its arrays are operands (see :func:`describe_haiku_module`).

Not seen: a name the code does not spell (``getattr(x, name)`` with a computed ``name``,
``vars(x)[...]``) read from a class or a module; a change inside a library's object (make a
new one instead).
"""

from __future__ import annotations

import copy
import enum
import functools
import sys
import types
from typing import Any

from deqjax._src import library_code
from deqjax._src.key_descriptions import (
    HaikuModule,
    Identity,
    Instance,
    Namespace,
    Ref,
    Unkeyable,
    Value,
    Walk,
    count,
)

_DESCRIPTORS = (staticmethod, classmethod, property, functools.cached_property)
_NOT_ATTRIBUTES = frozenset({"__dict__", "__weakref__", "__slots__", "__module__", "__doc__"})


def _holding_arrays(items: tuple, what: str) -> None:
    """Refuses ``items`` when one holds an array (see the module docstring), naming it."""
    for name, d in items:
        if d.n:
            error = Unkeyable(f"{what} holding arrays: it is not rebuilt around traced arrays")
            error.path.append(f".{name}")
            raise error


def _registered(obj: Any, walk: Walk) -> Ref | None:
    """A :class:`Ref` to ``obj`` if the walk described it already, else ``None`` (and it is
    registered)."""
    index = walk.seen.get(id(obj))
    if index is not None:
        return Ref(index, proto=obj)
    walk.seen[id(obj)] = len(walk.objects)
    walk.objects.append(obj)
    return None


@functools.lru_cache(maxsize=256)
def _slots(cls: type) -> tuple[tuple[str, Any], ...]:
    """The slots of ``cls`` and its bases: (name, member descriptor)."""
    return tuple(
        (name, member)
        for klass in cls.__mro__
        for name, member in vars(klass).items()
        if isinstance(member, types.MemberDescriptorType)
    )


def _state(obj: Any) -> dict[str, Any]:
    """An object's attributes: its ``__dict__`` and its slots."""
    state = dict(getattr(obj, "__dict__", None) or {})
    for name, member in _slots(type(obj)):
        if name not in state:
            try:
                state[name] = member.__get__(obj)
            except AttributeError:  # an empty slot
                pass
    return state


def _descriptor(obj: Any, walk: Walk) -> Instance:
    """A ``staticmethod``/``classmethod``/``property``: by the functions it holds."""
    names = ("fget", "fset", "fdel") if isinstance(obj, property) else ("__func__",)
    if isinstance(obj, functools.cached_property):
        names = ("func",)
    items = tuple((k, walk.labelled(f".{k}", getattr(obj, k))) for k in names)
    _holding_arrays(items, "a descriptor")
    return Instance(Identity(type(obj)), items, None, proto=obj)


def _instance(obj: Any, walk: Walk, value: Any) -> Instance | Ref:
    """An object by its class and its attributes (``value``: its :class:`Value` when it also
    compares by value)."""
    ref = _registered(obj, walk)
    if ref is not None:
        return ref
    kind = walk.labelled(".__class__", type(obj))
    items = tuple((k, walk.labelled(f".{k}", v)) for k, v in sorted(_state(obj).items()))
    _holding_arrays(items, f"a {type(obj).__qualname__} object")
    return Instance(kind, items, value, proto=obj)


def describe_object(obj: Any, walk: Walk) -> Any:
    """A leaf that is neither an array, a function, a class nor a module (module docstring)."""
    kind = type(obj)
    hk = sys.modules.get("haiku")  # not imported here: no object is a Haiku module before
    if hk is not None and isinstance(obj, hk.Module):
        return describe_haiku_module(obj, walk, hk)
    if isinstance(obj, (set, frozenset)):
        return _hashed(kind, frozenset(obj))
    if isinstance(obj, _DESCRIPTORS):
        return _descriptor(obj, walk)
    if isinstance(obj, enum.Enum):
        return Value(kind, obj)
    by_value = kind.__eq__ is not object.__eq__
    if library_code.is_library_module(kind.__module__):
        try:
            hash(obj)
        except TypeError:
            if by_value and hasattr(obj, "__dict__"):  # SimpleNamespace, argparse.Namespace
                return _instance(obj, walk, None)
            raise Unkeyable("unhashable") from None
        return Value(kind, obj) if by_value else Identity(obj)
    value = None
    if by_value:
        try:
            value = _hashed(kind, obj)
        except Unkeyable:  # its attributes say what it holds, unless a builtin base holds more
            if any(b.__module__ == "builtins" for b in kind.__mro__[1:-1]):
                raise
    return _instance(obj, walk, value)


def _hashed(kind: type, obj: Any) -> Value:
    try:
        hash(obj)
    except TypeError:
        raise Unkeyable("unhashable") from None
    return Value(kind, obj)


def describe_namespace(obj: type | types.ModuleType, walk: Walk) -> Any:
    """A class or a module: a library's by identity, a user's as a :class:`Namespace` filled by
    :func:`settle`."""
    is_module = isinstance(obj, types.ModuleType)
    if library_code.is_library_module(obj.__name__ if is_module else obj.__module__):
        return Identity(obj)
    ref = _registered(obj, walk)
    if ref is not None:
        return ref
    namespace = Namespace(obj)
    walk.namespaces.append(namespace)
    return namespace


_SKIP = object()  # a class attribute that a library class defines


@functools.lru_cache(maxsize=256)
def _resolution_order(cls: type) -> tuple[tuple[dict[str, Any], bool], ...]:
    """``cls``'s method resolution order: each class's attributes (live) and whether it is a
    library's."""
    return tuple((vars(k), library_code.is_library_module(k.__module__)) for k in cls.__mro__)


def _class_attribute(cls: type, name: str) -> Any:
    """``name`` as ``cls`` resolves it (without calling descriptors), ``_SKIP`` when a library
    class defines it."""
    for attributes, library in _resolution_order(cls):
        if name in attributes:
            return _SKIP if library else attributes[name]
    return _SKIP


def _special_methods(cls: type) -> set[str]:
    """The special methods (``__call__``, ``__add__``, ...) the user's classes of ``cls``'s
    method resolution order define: Python calls them without naming them."""
    return {
        name
        for attributes, library in _resolution_order(cls)
        if not library
        for name, value in attributes.items()
        if name.startswith("__") and name.endswith("__") and name not in _NOT_ATTRIBUTES
        if isinstance(value, (types.FunctionType, *_DESCRIPTORS))
    }


def _unread(namespace: Namespace, names: set[str]) -> list[tuple[str, Any]]:
    """The attributes of a user's class or module that its readers may read and the walk has not
    described yet, by name: (name, value)."""
    obj, items = namespace.obj, namespace.items
    if isinstance(obj, types.ModuleType):
        attributes = vars(obj)
        return [(n, attributes[n]) for n in sorted(names) if n in attributes and n not in items]
    unread = []
    for name in sorted(names | _special_methods(obj)):
        if name not in items and name not in _NOT_ATTRIBUTES:
            value = _class_attribute(obj, name)
            if value is not _SKIP:
                unread.append((name, value))
    return unread


def settle(walk: Walk) -> None:
    """Describes the attributes of the walk's namespaces (classes and modules of the user's)
    that its code may read, until describing them adds no name (a namespace added meanwhile is
    described in the same pass); then freezes them (see the module docstring)."""
    names = -1
    while len(walk.names) != names:
        names = len(walk.names)
        i = 0
        while i < len(walk.namespaces):  # describing may add namespaces (and names)
            namespace = walk.namespaces[i]
            try:
                for name, value in _unread(namespace, walk.names):
                    namespace.items[name] = walk.labelled(f".{name}", value)
            except Unkeyable as e:
                e.path.append(_label(namespace.obj))
                raise
            i += 1
    for namespace in walk.namespaces:
        namespace.freeze()
        try:
            _holding_arrays(namespace.items, "a class or module")
        except Unkeyable as e:
            e.path.append(_label(namespace.obj))
            raise


def _label(obj: Any) -> str:
    return obj.__name__ if isinstance(obj, types.ModuleType) else obj.__qualname__


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


def describe_haiku_module(obj: Any, walk: Walk, hk: types.ModuleType) -> HaikuModule:
    """A Haiku module: its class (a user's by its contents), its ``module_name`` and the
    attributes its class sets (not Haiku's own, see :func:`haiku_own_attributes`). ``dq.nn.DEQ``
    cells are made again on every ``apply`` of a model: the same description. Its arrays are
    operands: it is rebuilt as a copy holding them."""
    own = haiku_own_attributes(hk)
    kind = walk.labelled(".__class__", type(obj))
    items = tuple(
        (k, walk.labelled(f".{k}", v)) for k, v in sorted(vars(obj).items()) if k not in own
    )
    n = count(tuple(d for _, d in items))
    if n:  # keep no array alive: the arrays are rebuilt from the operands
        obj = copy.copy(obj)
        for k, d in items:
            if d.n:
                object.__setattr__(obj, k, None)
    return HaikuModule(kind, obj.module_name, items, n=n, proto=obj)
