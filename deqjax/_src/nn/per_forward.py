"""Values computed once per DEQ forward pass, and the two phases that hold them fixed.

Anything a cell computes from the parameters, ``x`` and randomness only — never from ``z`` —
should be computed ONCE per forward pass, outside the solver loop, and held fixed across every
solver iteration and the backward pass: weight normalisation ``w = g·v/‖v‖``, dropout masks,
input injections ``U x``. A module does this with::

    value = dq.nn.per_forward("name", lambda: expensive(params, x, hk.next_rng_key()))

:class:`PhasedCell` runs the cell in two phases. *Prepare* (once per forward, outside the
solver): the cell is evaluated once at ``z0``; every ``per_forward`` computes its value and
records it in Haiku state; the resulting state pytree ``ctx`` is a differentiable function of
the parameters and ``x``. *Step* (every solver iteration, and the backward pass):
``per_forward`` returns the recorded value from ``ctx``, which travels to ``dq.fixed_point`` next
to the parameters, so gradients flow through it back to the parameters by ordinary autodiff.
Outside a DEQ (a cell called directly, or unrolled by hand) ``per_forward`` simply returns
``compute()``. Under ``jit`` the prepare pass's own output is discarded and XLA removes
everything in it except what ``ctx`` needs. ``compute`` must not depend on ``z`` (the value
would be frozen at ``z0``). Haiku state of the cell's own (``hk.get_state`` outside
``per_forward``, e.g. batch-norm statistics) is not supported.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import haiku as hk
import jax
import jmp

from deqjax._src import precision as precision_lib

PyTree = Any

_PREPARE = "prepare"
_STEP = "step"
_phase_stack = threading.local()


class _Phase:
    """One pass of the cell inside a DEQ; ``values`` caches this pass's per-forward values."""

    def __init__(self, kind: str):
        self.kind = kind
        self.values: dict[tuple[str, str], PyTree] = {}


def _current_phase() -> _Phase | None:
    stack = getattr(_phase_stack, "stack", None)
    return stack[-1] if stack else None


@contextlib.contextmanager
def _phase(kind: str) -> Iterator[None]:
    if not hasattr(_phase_stack, "stack"):
        _phase_stack.stack = []
    _phase_stack.stack.append(_Phase(kind))
    try:
        yield
    finally:
        _phase_stack.stack.pop()


def per_forward(name: str, compute: Callable[[], PyTree]) -> PyTree:
    """A value computed once per DEQ forward pass and held fixed across solver iterations.

    Call it inside a Haiku module of a cell for anything that depends on parameters, the input
    ``x`` or randomness but not on the state ``z`` (normalised weights, dropout masks, input
    injections). Inside a :class:`~deqjax.nn.DEQ`, ``compute()`` runs once per forward pass,
    outside the solver loop; every solver iteration and the backward pass reuse its value, and
    gradients flow through it to the parameters. A module calling it several times with the same
    ``name`` in one cell evaluation gets the first value each time (e.g. one dropout module
    applied twice shares one mask). Outside a DEQ it just returns ``compute()``.

    Args:
      name: a name unique within the calling module (it names a Haiku state entry).
      compute: zero-argument function returning a pytree of arrays; may call
        ``hk.get_parameter`` and ``hk.next_rng_key``; must not depend on ``z``.

    Returns:
      ``compute()``'s value (recorded or replayed).

    Example:
      >>> inj = per_forward("injection", lambda: x @ hk.get_parameter("U", [dx, d], init=u_init))
    """
    phase = _current_phase()
    if phase is None:
        return compute()
    if phase.kind == _STEP:
        return hk.get_state(name)
    key = (hk.experimental.current_name(), name)
    if key not in phase.values:
        phase.values[key] = compute()
        hk.set_state(name, phase.values[key])
    return phase.values[key]


class PhasedCell(NamedTuple):
    """A Haiku cell as the pure functions of the two phases (module docstring).

    Made by :func:`phased_cell`. ``params`` are the cell's parameters, ``ctx`` its per-forward
    values (Haiku state), ``key`` the forward pass's rng key (or ``None``). Both phases, and so
    every evaluation of the cell a DEQ makes, run at the matmul ``precision``
    (:func:`deqjax._src.precision.at_precision`) and cast the parameters to the compute dtype of
    the mixed-precision ``policy``: Haiku applies a policy (``hk.mixed_precision``) only while
    the module's call is traced, and the implicit backward re-traces the cell after it.

    Attributes:
      inner: ``hk.transform_with_state`` of ``cell_fn(x, z)``.
      precision: the cell's matmul precision (``None``: the ambient one).
      policy: the mixed-precision policy in force where the DEQ was called, or ``None``.
    """

    inner: hk.TransformedWithState
    precision: str | None = None
    policy: jmp.Policy | None = None

    def _cast(self, params: hk.Params) -> hk.Params:
        return params if self.policy is None else self.policy.cast_to_compute(params)

    def init(self, key: jax.Array | None, x: PyTree, z: PyTree) -> hk.Params:
        """The cell's parameters (run once, in the prepare phase)."""
        with _phase(_PREPARE):
            params, _ = self.inner.init(key, x, z)
        return params

    def prepare(self, params: hk.Params, key: jax.Array | None, x: PyTree, z: PyTree) -> PyTree:
        """``ctx``: every ``per_forward`` value of one forward pass, computed at ``z``."""

        def run(params, key, x, z):
            with _phase(_PREPARE):
                return self.inner.apply(self._cast(params), {}, key, x, z)[1]

        return precision_lib.at_precision(run, self.precision)(params, key, x, z)

    def step(self, params_ctx: tuple[hk.Params, PyTree], x_key: tuple[PyTree, Any], z: PyTree):
        """``f(z)`` with the per-forward values of ``ctx``: the ``f(params, x, z)`` that
        :func:`deqjax.fixed_point` solves, ``params = (params, ctx)`` and ``x = (x, key)``."""

        def run(params_ctx, x_key, z):
            (params, ctx), (x, key) = params_ctx, x_key
            with _phase(_STEP):
                return self.inner.apply(self._cast(params), ctx, key, x, z)[0]

        return precision_lib.at_precision(run, self.precision)(params_ctx, x_key, z)

    def apply(self, params: hk.Params, x: PyTree, z: PyTree, key: jax.Array | None) -> PyTree:
        """One evaluation ``f(z)`` of a forward pass on its own (its ``ctx`` recomputed)."""
        return self.step((params, self.prepare(params, key, x, z)), (x, key), z)


def phased_cell(
    cell_fn: Callable[[PyTree, PyTree], PyTree], precision: str | None = None
) -> PhasedCell:
    """The two-phase form of ``cell_fn(x, z) -> z``, a function that creates Haiku modules, at
    the matmul ``precision`` (a value :func:`~deqjax._src.precision.check_precision` returned)
    and under the mixed-precision policy in force (``hk.mixed_precision.current_policy``)."""
    policy = hk.mixed_precision.current_policy()
    return PhasedCell(hk.transform_with_state(cell_fn), precision, policy)
