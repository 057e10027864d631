"""A user's function as a cache key and the arrays it reads (what lets entry points run compiled).

``split_callable(f)`` describes ``f`` by what decides the program it traces to: its code and
everything its code can read, described by contents, so that a value changed between two eager
calls makes another key (a cached program is never served for a value that has since changed).
The arrays among them are *operands*: a compiled entry takes them as arguments, so a function
closing over a new matrix of the same shape reuses the compiled program, and
``rebuild(key, operands)`` makes the function again around traced operands.

* A Python function: its code, defaults, closure cells and the globals its code reads; a
  function it reads is described in turn, from whichever module, unless it is library code
  (:mod:`deqjax._src.library_code`: the standard library, an installed package, deqjax), whose
  code and module globals are taken as they are (its defaults and closure cells are data,
  described: ``hk.transform`` closes over the user's function). A global array is an operand
  (rebinding it is seen).
* A ``functools.partial``, a bound method: their function, arguments and object.
* A pytree (a tuple, a dict, an Equinox module, a ``jax.tree_util.Partial``): its structure (the
  user's classes among its nodes described as classes are, below), its array leaves as operands
  and its other leaves described.
* A value of a library's class that compares by value (a number, a string, a solver object): by
  value.
* An object, a class or a module: by its contents (:mod:`deqjax._src.object_contents`), a Haiku
  module by its class, ``module_name`` and attributes (``dq.nn.DEQ`` cells are made again on
  every ``apply`` of a model).

What cannot be described by contents (an unhashable value that is not a pytree, arrays inside a
plain object, a function that reaches itself, an object graph of more than
:data:`~deqjax._src.key_descriptions.BUDGET` values) makes the function unkeyable:
:func:`split_callable` returns an :class:`Unkeyed` naming the value, and its caller runs the
function un-jitted. Used by :mod:`deqjax._src.compiled`.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import weakref
from collections.abc import Hashable, Sequence
from typing import Any, Callable

import jax

from deqjax._src import library_code, object_contents
from deqjax._src.key_descriptions import (
    ARRAYS,
    EMPTY_CELL,
    OPERAND,
    SCALARS,
    Function,
    Identity,
    Method,
    Partial,
    Tree,
    Unkeyable,
    Value,
    Walk,
    bare,
    count,
)


@dataclasses.dataclass(frozen=True)
class Unkeyed:
    """Why a function cannot be keyed: the value (``what``: its path from the function, e.g.
    ``f -> holder.w``), the reason, and the value's own place (``site``: the last step of the
    path and the reason; the same value reached from another function has the same site)."""

    what: str
    why: str
    last: str = ""  # the path's last step

    @property
    def site(self) -> tuple[str, str]:
        return self.last, self.why


# id(code) -> (a weak reference to it, its global names, its spelled names); by identity: a code
# object's hash hashes its constants (the nested functions' code too) on every call.
_code_names: dict[int, tuple[weakref.ref, tuple[str, ...], frozenset[str]]] = {}


def _names(code: types.CodeType) -> tuple[tuple[str, ...], frozenset[str]]:
    """The names ``code`` (and the functions defined in it) may read as globals (its
    ``co_names``), and the attribute names it spells: its ``co_names`` and its string constants
    that are identifiers (``getattr(x, "name")``)."""
    entry = _code_names.get(id(code))
    if entry is not None and entry[0]() is code:
        return entry[1], entry[2]
    read, spelled = set(code.co_names), set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            inner_read, inner_spelled = _names(const)
            read.update(inner_read)
            spelled.update(inner_spelled)
        elif isinstance(const, str) and const.isidentifier():
            spelled.add(const)
    if len(_code_names) > 4096:
        _code_names.clear()
    entry = _code_names[id(code)] = (weakref.ref(code), tuple(sorted(read)), frozenset(spelled))
    return entry[1], entry[2]


def _describe_function(fn: types.FunctionType, walk: Walk) -> Function:
    """A function (see the module docstring): a library's globals are taken as they are."""
    if id(fn) in walk.visiting:  # a function reaching itself through its closure or globals
        raise Unkeyable("a function that reaches itself (recursive)")
    walk.visiting.add(id(fn))
    code, namespace = fn.__code__, fn.__globals__
    try:
        defaults = fn.__defaults__
        if defaults is not None:
            first = code.co_argcount - len(defaults)
            names = code.co_varnames[first : code.co_argcount]
            defaults = tuple(walk.labelled(k, v) for k, v in zip(names, defaults))
        kwdefaults = tuple(
            (k, walk.labelled(k, v)) for k, v in sorted((fn.__kwdefaults__ or {}).items())
        )
        cells = tuple(
            _describe_cell(name, cell, walk)
            for name, cell in zip(code.co_freevars, fn.__closure__ or ())
        )
        reads = []
        if not library_code.is_library_module(namespace.get("__name__")):
            read, spelled = _names(code)
            walk.names.update(spelled)
            for name in read:
                if name not in namespace:
                    continue
                value = namespace[name]
                if type(value) is types.ModuleType and library_code.is_library_module(
                    value.__name__
                ):  # ``jnp``: the common global, taken as it is without a walk
                    reads.append((name, Identity(value)))
                    continue
                try:
                    reads.append((name, _describe(value, walk)))
                except Unkeyable as e:
                    e.path.append(name)
                    raise
    finally:
        walk.visiting.discard(id(fn))
    reads = tuple(reads)
    n = count(defaults or (), tuple(d for _, d in kwdefaults), cells, tuple(d for _, d in reads))
    return Function(
        code, Identity(namespace), defaults, kwdefaults, cells, reads, n=n, proto=bare(fn, n)
    )


def _describe_cell(name: str, cell: types.CellType, walk: Walk) -> Any:
    try:
        value = cell.cell_contents
    except ValueError:  # a cell not yet filled (a name assigned after the function is defined)
        return EMPTY_CELL
    return walk.labelled(name, value)


def _describe_partial(value: functools.partial, walk: Walk) -> Partial:
    func = walk.labelled(".func", value.func)
    args = tuple(walk.labelled(f".args[{i}]", a) for i, a in enumerate(value.args))
    kw = tuple((k, walk.labelled(k, v)) for k, v in sorted(value.keywords.items()))
    n = count((func,), args, tuple(d for _, d in kw))
    return Partial(func, args, kw, n=n, proto=None if n else value)


def _describe(value: Any, walk: Walk) -> Any:
    """The description of ``value`` (see the module docstring); its arrays go to
    ``walk.operands``."""
    walk.tick()
    if isinstance(value, ARRAYS):
        walk.operands.append(value)
        return OPERAND
    kind = type(value)
    if kind in SCALARS:
        return Value(kind, value)
    if kind is types.FunctionType:
        return _describe_function(value, walk)
    if kind is functools.partial:
        return _describe_partial(value, walk)
    if kind is types.MethodType:
        func = walk.labelled(".__func__", value.__func__)
        obj = walk.labelled(".__self__", value.__self__)
        n = func.n + obj.n
        return Method(func, obj, n=n, proto=None if n else value)
    if isinstance(value, (types.ModuleType, type)):
        return object_contents.describe_namespace(value, walk)
    leaves, treedef = jax.tree_util.tree_flatten(value)
    if treedef.num_nodes == 1 and treedef.num_leaves == 1:  # a leaf
        return object_contents.describe_object(value, walk)
    try:
        kinds = _users_node_types(treedef)
    except TypeError:
        raise Unkeyable("unhashable pytree node data") from None
    classes = tuple(walk.labelled(f"<{k.__qualname__}>", k) for k in kinds)
    described = tuple(walk.labelled(f"[{i}]", leaf) for i, leaf in enumerate(leaves))
    n = count(described)
    return Tree(treedef, classes, described, n=n, proto=None if n else value)


@functools.lru_cache(maxsize=1024)
def _users_node_types(treedef: Any) -> tuple[type, ...]:
    """The user's classes among a pytree's nodes (an Equinox module's class, a NamedTuple): the
    structure names them by identity, their methods' code is described like a class's."""
    kinds: list[type] = []
    pending = [treedef]
    while pending:
        node = pending.pop()
        data = node.node_data()
        if data is None:  # a leaf
            continue
        kind = data[0]
        if kind not in kinds and not library_code.is_library_module(kind.__module__):
            kinds.append(kind)
        pending.extend(node.children())
    return tuple(kinds)


def path_of(f: Any, labels: Sequence[str] = ()) -> str:
    """``f``'s name and the path from it to a value (``labels``: innermost first)."""
    name = getattr(f, "__qualname__", None) or type(f).__qualname__
    path = ""
    for label in reversed(labels):
        path += label if label[0] in ".[" else f" -> {label}"
    return f"{name}{path}"


def split_callable(f: Callable[..., Any]) -> tuple[Hashable, list[Any]] | Unkeyed:
    """``f`` as ``(key, operands)``: what decides the program it traces to, and its arrays.

    See the module docstring for what the key holds: ``f``'s code and the values it can read,
    described by contents (a value changed since an earlier call gives another key); the arrays
    among them are the operands.

    Args:
      f: the user's callable (or any value).

    Returns:
      ``(key, operands)`` with ``key`` hashable (equal keys trace to the same program for
      operands of the same shapes and dtypes), or an :class:`Unkeyed` naming the value that
      cannot be described by contents.

    Example:
      >>> key, ops = split_callable(lambda z: jnp.tanh(W @ z))  # ops == [W]
      >>> rebuild(key, ops)(z)                                   # the same function
    """
    walk = Walk(_describe)
    try:
        key = _describe(f, walk)
        if walk.namespaces:
            object_contents.settle(walk)
        hash(key)
    except Unkeyable as e:
        return Unkeyed(path_of(f, e.path), e.reason, e.path[0] if e.path else "")
    except (TypeError, RecursionError) as e:
        return Unkeyed(path_of(f), f"{type(e).__name__}: {e}")
    return key, walk.operands


def rebuild(key: Any, operands: Sequence[Any]) -> Callable[..., Any]:
    """The function of :func:`split_callable`'s ``key`` around ``operands`` (e.g. tracers)."""
    ops = iter(operands)
    return key.build(ops)
