"""Compiled entry points: deqjax's solves run under ``jax.jit``, cached by function and settings.

Called eagerly (no ``jit`` of the user's around it), ``dq.fixed_point``, a solver object (so the
solver functions and their ``functools.partial`` forms) and the solve of ``dq.nn.DEQ`` each run
as ONE compiled program, looked up in a bounded cache by

* the user's function, as :func:`deqjax._src.function_key.split_callable` describes it: its code
  and everything it can read, by contents (an attribute of an object, a class or a module it
  reads, changed since an earlier call, makes another key: a program is never served for a
  value that has since changed). The arrays among them are operands of the program, not
  constants baked into it, so closing over new values of the same shapes reuses it, and a
  description keeps no array alive;
* the static configuration: the normalised solver and adjoint objects (frozen dataclasses that
  compare and hash by value; a user's own solver callable among them is described like the
  function), ``has_aux``, ...;
* the Python values (not arrays) among the arguments (scalars: ``f`` is evaluated on them), and
  the arguments' pytree structure (the arrays' shapes and dtypes are ``jax.jit``'s own cache
  key).

So a repeated eager call (the same function or a fresh ``lambda`` with the same code, equal
settings and values, arrays of the same shapes and dtypes) compiles nothing, and an eager
``jax.grad`` of it differentiates the cached program (its linearisation and transpose are cached
by JAX with it). A program is traced with the objects of the call that looks it up (equal in
contents to those it was made for). The cache holds :data:`MAX_ENTRIES` programs (each keeps
its compiled code mapped in memory, and an eager gradient's several): the least recently used
one is dropped, and with it its executables, so a stream of new functions keeps a bounded amount
of code.

*Eager* means that no trace on the stack stages out: the call evaluates, or runs under an eager
``grad``/``jvp``/``vmap`` (:func:`staged` tells, with public JAX API only: under a staging trace
even an operation on a constant gives a tracer, under evaluation and eager ``grad``/``jvp``/
``vmap`` it gives a value). Under a transformation that stages out (``jax.jit``, ``lax.scan``,
``pmap``, ``eval_shape``, ``checkpoint``) nothing changes: the entry runs inline in the caller's
trace, as before. The question is asked only when an input is traced: a call whose inputs are all
concrete runs the cached program, which JAX inlines should it be inside a staging trace after all
(a nested ``jit``; e.g. ``jax.jit`` of a function solving a problem of numpy constants). The
function runs un-jitted, as before, when a value it (or a user's solver callable) reads cannot be
described by contents (``split_callable`` returns an ``Unkeyed``: an unhashable value that is not
a pytree, a plain object holding arrays, a function reaching itself, a very large object graph;
an eager call then warns once per value, naming it), when a setting is unhashable, when the
function fails to trace with abstract values (a ``ConcretizationTypeError`` or
``TracerArrayConversionError``: Python control flow on values, numpy on arrays; such a key is
remembered), when a solver in the settings has ``loop="python"`` (asked for to debug on concrete
values), under an eager ``grad`` (or ``jvp``/``vmap``: public API does not tell them apart) when
the settings hold a user's own solver (a backward solve may run it after the call returned,
where a failure to trace could not fall back), and, for ``dq.fixed_point``, when it closes over a
value traced by an eager ``grad``/``vmap`` (the un-jitted path raises its "closes over traced
array(s)" error).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import threading
import warnings
from collections.abc import Hashable, Iterator
from typing import Any, Callable

import jax
import numpy as np

from deqjax._src import function_key

MAX_ENTRIES = 64

# What ``run`` returns when it does not run the program; the caller then runs its un-jitted path.
NOT_JITTED = object()

# Errors of tracing a function that runs eagerly but not under ``jit`` (Python control flow on
# values, numpy calls on arrays): such a function runs un-jitted.
_UNTRACEABLE = (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError)

_cache: collections.OrderedDict[Hashable, Any] = collections.OrderedDict()
_untraceable: collections.OrderedDict[Hashable, None] = collections.OrderedDict()
_warned: collections.OrderedDict[tuple[str, str], None] = collections.OrderedDict()
_lock = threading.Lock()
_current = threading.local()  # the calling function's key while its program is traced


class _Dynamic:
    """Marks an array among the arguments (the others are static values in the key)."""

    def __repr__(self) -> str:
        return "<array>"


_DYNAMIC = _Dynamic()


# A constant the staging test operates on (a float: ``stop_gradient`` returns integers as they are).
_PROBE = np.float32(0.0)


def staged() -> bool:
    """Whether the caller runs inside a trace that stages out (``jit``, ``scan``, ``pmap``,
    ``eval_shape``, ``checkpoint``, a ``grad`` inside one of them, ...).

    Public JAX API only: under a staging trace every operation is staged, even one on a constant,
    so its result is a ``jax.core.Tracer``; evaluation and an eager ``grad``/``jvp``/``vmap``
    compute an operation on a constant (none of its inputs is theirs) as a value.
    ``stop_gradient`` is the operation: evaluated, it returns its input without running a
    computation (still a call into JAX: :func:`run` asks only when an input is traced).
    """
    return isinstance(jax.lax.stop_gradient(_PROBE), jax.core.Tracer)


def _traced(values: list[Any]) -> bool:
    """Whether some value is traced (by any transformation: :func:`staged` tells which kind)."""
    return any(isinstance(v, jax.core.Tracer) for v in values)


def _parts(obj: Any, depth: int = 0) -> Iterator[Any]:
    """``obj`` and its items and dataclass fields (a few levels down)."""
    yield obj
    if depth >= 4:
        return
    if isinstance(obj, (tuple, list)):
        children = obj
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        children = [getattr(obj, field.name) for field in dataclasses.fields(obj)]
    else:
        return
    for child in children:
        yield from _parts(child, depth + 1)


def _contains(obj: Any, test: Callable[[Any], bool]) -> bool:
    """Whether ``obj``, or an item or dataclass field of it (a few levels down), passes
    ``test``."""
    return any(test(part) for part in _parts(obj))


@functools.lru_cache(maxsize=256)
def _settings_run_eagerly(static: Hashable, differentiated: bool) -> bool:
    """Whether the settings ask for an un-jitted run: a solver with ``loop="python"`` (asked for
    to debug with prints and breakpoints on concrete values), or, when ``differentiated`` (the
    inputs are traced by an eager ``grad``, ``jvp`` or ``vmap``: public API does not tell which),
    a user's own solver (one that ``wraps_user_callable``): a backward solve runs it when ``grad``
    transposes the program, after :func:`run` returned, where an untraceable one could not fall
    back."""
    if _contains(static, lambda o: getattr(o, "loop", None) == "python"):
        return True
    return differentiated and bool(_user_callables(static))


@functools.lru_cache(maxsize=256)
def _user_callables(static: Hashable) -> tuple[Any, ...]:
    """The callables of the user's solvers in the settings (compared by identity there)."""
    return tuple(o.fn for o in _parts(static) if getattr(o, "wraps_user_callable", False))


def _is_array(leaf: Any) -> bool:
    return isinstance(leaf, (jax.Array, np.ndarray, np.generic))


def _solver_key(fn: Callable[..., Any]) -> Hashable | function_key.Unkeyed:
    """The key of a user's solver callable: described like the function; one holding arrays is
    not keyed (they would be baked into the program)."""
    split = function_key.split_callable(fn)
    if isinstance(split, function_key.Unkeyed):
        return dataclasses.replace(split, what=f"the solver {split.what}")
    key, ops = split
    if ops:
        what = f"the solver {function_key.path_of(fn)}"
        return function_key.Unkeyed(what, "it holds arrays, which would be baked into the program")
    return key


def _split_arguments(args: tuple) -> tuple[Hashable, list[Any]]:
    """``args`` as (structure and Python values, arrays); ``TypeError`` for an unhashable
    Python value. (``f`` is evaluated on them: their leaves are arrays or Python scalars.)"""
    leaves, treedef = jax.tree_util.tree_flatten(args)
    arrays = [leaf for leaf in leaves if _is_array(leaf)]
    statics = tuple(_DYNAMIC if _is_array(leaf) else (type(leaf), leaf) for leaf in leaves)
    hash(statics)
    return (treedef, statics), arrays


def _program(impl: Callable[..., Any], static: Hashable, arguments: Hashable, first_key: Any):
    """The jitted program of one cache entry."""
    treedef, statics = arguments

    def program(operands: list[Any], arrays: list[Any]) -> Any:
        it = iter(arrays)
        leaves = [next(it) if s is _DYNAMIC else s[1] for s in statics]
        args = jax.tree_util.tree_unflatten(treedef, leaves)
        # The function is rebuilt from the calling function's description (this call's objects,
        # equal in contents to the first call's), around the traced operands.
        key = getattr(_current, "key", None) or first_key
        return impl(functools.partial(function_key.rebuild, key), operands, static, *args)

    return jax.jit(program)


def _entry(key: Hashable, make: Callable[[], Any]) -> Any:
    """The cached program of ``key`` (made by ``make`` on a miss), least recently used dropped."""
    with _lock:
        program = _cache.get(key)
        if program is None:
            program = _cache[key] = make()
            while len(_cache) > MAX_ENTRIES:
                _cache.popitem(last=False)
        else:
            _cache.move_to_end(key)
    return program


def _uncached(unkeyed: function_key.Unkeyed) -> Any:
    """:data:`NOT_JITTED` for a call reading a value that cannot be keyed by contents, warning
    once per value (not inside a staging trace, where the call is inlined anyway)."""
    with _lock:
        if unkeyed.site in _warned:
            return NOT_JITTED
    if staged():
        return NOT_JITTED
    with _lock:
        _warned[unkeyed.site] = None
        while len(_warned) > 4 * MAX_ENTRIES:
            _warned.popitem(last=False)
    warnings.warn(
        f"deqjax: `{unkeyed.what}` cannot be part of a cached program's key ({unkeyed.why}), "
        "so eager calls reading it run un-jitted: slower, never stale. Pass arrays as "
        "arguments (params) and settings as values that compare by value, or jit the caller. "
        "Warned once per value.",
        stacklevel=4,
    )
    return NOT_JITTED


def run(
    impl: Callable[..., Any],
    f: Callable[..., Any],
    static: Hashable,
    args: tuple,
    *,
    operands: bool = True,
    traced_operands: bool = True,
) -> Any:
    """``impl(make, operands, static, *args)`` as a cached compiled program, or :data:`NOT_JITTED`.

    Inside the program ``make(operands)`` is ``f`` rebuilt around the traced operands (the
    arrays ``f`` closes over); ``impl`` passes them where ``f`` needs them.

    Args:
      impl: the un-jitted implementation (a module-level function: it is part of the key).
      f: the user's function.
      static: the static configuration (hashable; compares by value).
      args: the dynamic arguments (pytrees; their Python values are static).
      operands: whether ``f`` may close over arrays (else such an ``f`` is not jitted).
      traced_operands: whether those arrays may be traced by an eager ``grad`` or ``vmap``
        (else such an ``f`` is not jitted: ``dq.fixed_point`` refuses it on its un-jitted path).

    Returns:
      The program's output, or :data:`NOT_JITTED` when the caller must run un-jitted: inside a
      trace that stages out (:func:`staged`), a value ``f`` reads, a Python value in ``args`` or
      a setting cannot be keyed (see the module docstring), or ``f`` cannot be traced.
    """
    try:
        arguments, arrays = _split_arguments(args)
    except TypeError:  # an unhashable argument value
        return NOT_JITTED
    traced = _traced(arrays)
    if traced and staged():
        return NOT_JITTED
    split = function_key.split_callable(f)
    if isinstance(split, function_key.Unkeyed):
        return _uncached(split)
    fkey, ops = split
    if ops and not operands:
        return NOT_JITTED
    if _traced(ops):
        if not traced and staged():
            return NOT_JITTED
        if not traced_operands:
            return NOT_JITTED
        traced = True
    # No staging trace owns an input here: ``traced`` says an eager ``grad``/``jvp``/``vmap`` does
    # (a staging trace that owns none inlines the program as a nested ``jit``).
    try:
        if _settings_run_eagerly(static, traced):
            return NOT_JITTED
        solvers = tuple(_solver_key(fn) for fn in _user_callables(static))
        key = (impl, fkey, static, solvers, arguments)
        hash(key)
    except TypeError:  # an unhashable setting
        return NOT_JITTED
    for described in solvers:
        if isinstance(described, function_key.Unkeyed):
            return _uncached(described)
    if key in _untraceable:
        return NOT_JITTED
    program = _entry(key, lambda: _program(impl, static, arguments, fkey))
    outer, _current.key = getattr(_current, "key", None), fkey
    try:
        return program(ops, arrays)
    except _UNTRACEABLE:
        with _lock:
            _cache.pop(key, None)
            _untraceable[key] = None
            while len(_untraceable) > MAX_ENTRIES:
                _untraceable.popitem(last=False)
        return NOT_JITTED
    finally:
        _current.key = outer


def clear() -> None:
    """Drops every cached program (their executables go with them)."""
    with _lock:
        _cache.clear()
        _untraceable.clear()
        _warned.clear()


def size() -> int:
    """The number of cached programs."""
    return len(_cache)
