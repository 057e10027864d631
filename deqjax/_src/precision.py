"""Matmul precision: the cell's (``precision=``), and the full precision that checks a solve.

On GPUs and TPUs JAX's default precision for float32 matrix products is reduced (TF32-class on
NVIDIA GPUs: operands rounded to 10 mantissa bits, a relative error near 5e-4 per product). A
fixed-point solve whose tolerance is below that error reaches it only in the reduced arithmetic:
it can report convergence that a float64 recomputation refutes (measured in BENCHMARKS.md,
"Honest numbers at any matmul precision"). CPUs compute float32 products in full precision
whatever the setting.

This module holds the three things deqjax does about it:

* **The cell's precision** (``precision=`` of ``dq.fixed_point``, ``dq.nn.DEQ`` and
  ``dq.models.DEQSettings``): :func:`check_precision` checks the value once, at the entry where
  the user passes it, and :func:`at_precision` wraps the cell so that each of its evaluations is
  traced under :func:`jax.default_matmul_precision`: the forward solve, the backward solve's VJPs
  and the final VJP (a VJP's products inherit the precision of the products they transpose),
  whatever transformation later traces them.
* **Knowing whether a map runs at reduced precision**, at trace time, with no evaluation:
  :func:`watching` records the precision of every wrapped cell traced inside it (a map that
  wraps no cell runs at the ambient precision, ``jax_default_matmul_precision``). A map may also
  say so itself: a :class:`TwinMap` carries its full-precision twin (the implicit backward's
  adjoint map, whose VJP is linearised once at the cell's precision).
* **The full-precision twin of a map**, :func:`full_twin`: the same map traced under
  :func:`full_precision`, which overrides the cell's own ``precision=`` too. A solver evaluates
  it once at its returned iterate (:mod:`deqjax._src.solvers.verify`) so that the status and the
  residuals it reports hold at full precision.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
from collections.abc import Iterator
from typing import Any, Callable

import jax

PRECISIONS = ("default", "high", "highest", "bfloat16", "tensorfloat32", "float32")

# Values of jax.default_matmul_precision whose float32 products are full float32 (the others,
# and JAX's default None, are reduced on some backend: TF32 or bfloat16 passes on GPUs, bfloat16
# passes on TPUs).
FULL = frozenset({"highest", "float32", "F32_F32_F32", "F64_F64_F64"})


def check_precision(precision: Any, name: str = "precision") -> str | None:
    """``precision``, if :func:`jax.default_matmul_precision` accepts it, else ``ValueError``.

    Called once per value, by the public entry the user passes it to (``dq.fixed_point``,
    ``dq.nn.DEQ``, ``dq.models.DEQSettings``); what it returns is passed on to the internal
    entries, which do not check it again (``DEQSettings`` builds its DEQ through
    :class:`deqjax._src.nn.deq.CheckedDEQ`; a DEQ wraps its cell itself and hands
    ``dq.fixed_point`` no precision).

    Args:
      precision: ``None`` (JAX's default), one of :data:`PRECISIONS`, or the name of a
        ``jax.lax.DotAlgorithmPreset`` (e.g. ``"F32_F32_F32"``).
      name: the argument's name for the error message.
    """
    if precision is None:
        return None
    if not _accepted(precision):
        raise ValueError(
            f"{name} must be None or a matmul precision jax.default_matmul_precision accepts "
            f"({', '.join(map(repr, PRECISIONS))}, or a DotAlgorithmPreset name), got "
            f"{precision!r}."
        )
    return precision


def _accepted(precision: Any) -> bool:
    """Whether JAX accepts ``precision`` as a matmul precision (a ``str`` it knows)."""
    if not isinstance(precision, str):
        return False
    try:
        with jax.default_matmul_precision(precision):
            return True
    except ValueError:
        return False


def ambient() -> str | None:
    """The matmul precision in force while tracing (``jax_default_matmul_precision``, including
    a surrounding ``jax.default_matmul_precision``); ``None``: JAX's default."""
    value = jax.config.jax_default_matmul_precision
    return None if value is None else str(value)


def is_full(precision: str | None) -> bool:
    """Whether float32 products at ``precision`` are full float32 on every backend (``None``,
    JAX's default, is not: TF32-class on NVIDIA GPUs)."""
    return precision is not None and str(precision) in FULL


def name_of(precision: str | None) -> str:
    """``precision`` for a message: ``"default"`` for ``None``."""
    return "default" if precision is None else str(precision)


# While a solve's check is traced, every cell wrapped by at_precision runs at full precision.
_forced_full: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "deqjax_forced_full_precision", default=False
)
# The Watch of the innermost `watching` block, if any.
_watch: contextvars.ContextVar[Watch | None] = contextvars.ContextVar(
    "deqjax_precision_watch", default=None
)


@dataclasses.dataclass
class Watch:
    """The precisions of the cells traced inside a :func:`watching` block.

    Attributes:
      seen: the precision each wrapped cell was traced at (``None``: JAX's default).
      ambient: the precision in force when the block opened (what an unwrapped map runs at).
    """

    seen: list[str | None] = dataclasses.field(default_factory=list)
    ambient: str | None = None

    @property
    def reduced(self) -> bool:
        """Whether the traced map's products may be reduced: a wrapped cell at a precision that
        is not full, or no wrapped cell and an ambient precision that is not full."""
        if not self.seen:
            return not is_full(self.ambient)
        return not all(is_full(p) for p in self.seen)

    @property
    def precision(self) -> str:
        """The reduced precision found, for messages (``"default"`` for JAX's default)."""
        reduced = [p for p in self.seen if not is_full(p)] or [self.ambient]
        return name_of(reduced[0])


@contextlib.contextmanager
def watching() -> Iterator[Watch]:
    """Records, in the :class:`Watch` it yields, the precision of every cell wrapped by
    :func:`at_precision` that is traced inside the block (e.g. by ``jax.eval_shape``)."""
    watch = Watch(ambient=ambient())
    token = _watch.set(watch)
    try:
        yield watch
    finally:
        _watch.reset(token)


@contextlib.contextmanager
def full_precision() -> Iterator[None]:
    """Traces everything inside at full precision: JAX's products (``"highest"``) and every
    cell wrapped by :func:`at_precision`, whatever its own ``precision``."""
    token = _forced_full.set(True)
    try:
        with jax.default_matmul_precision("highest"):
            yield
    finally:
        _forced_full.reset(token)


def at_precision(f: Callable[..., Any], precision: str | None) -> Callable[..., Any]:
    """``f`` traced under ``jax.default_matmul_precision(precision)`` (``None``: the ambient
    precision), or at full precision inside :func:`full_precision`; a :func:`watching` block
    records the precision it runs at."""

    @functools.wraps(f)
    def f_at_precision(*args: Any) -> Any:
        p = "highest" if _forced_full.get() else precision
        watch = _watch.get()
        if watch is not None:
            watch.seen.append(ambient() if p is None else str(p))
        if p is None:
            return f(*args)
        with jax.default_matmul_precision(str(p)):  # JAX takes a plain str
            return f(*args)

    return f_at_precision


@dataclasses.dataclass(frozen=True)
class TwinMap:
    """A map that knows its full-precision twin (see :func:`full_twin`).

    Attributes:
      fn: the map, as a solver evaluates it in its loop.
      full: the same map at full precision, or ``None`` where ``fn`` already is.
      precision: ``fn``'s precision, for messages.
    """

    fn: Callable[..., Any]
    full: Callable[..., Any] | None
    precision: str = "default"

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)


def full_twin(f: Callable[..., Any], watch: Watch) -> tuple[Callable[..., Any] | None, str]:
    """``(f at full precision, f's precision)``, or ``(None, ...)`` where ``f`` runs at full
    precision already.

    Args:
      f: a map; a :class:`TwinMap` gives its own twin.
      watch: the :class:`Watch` of a trace of ``f`` (:func:`watching`).
    """
    if isinstance(f, TwinMap):
        return f.full, f.precision
    if not watch.reduced:
        return None, watch.precision

    def f_full(*args: Any) -> Any:
        with full_precision():
            return f(*args)

    return f_full, watch.precision
