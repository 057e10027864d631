"""The two phases of a cell's evaluation inside a DEQ layer, whatever framework made the cell.

A DEQ's forward pass evaluates its cell ``f_θ(z; x)`` in two phases:

* **prepare**, once per forward pass, outside the solver loop: everything that does not depend
  on ``z`` (normalised weights, dropout masks, the input injection ``U x``) into a context
  ``ctx``, a differentiable function of the parameters, ``x`` and the pass's key;
* **step**, at every solver iteration and in the backward pass: ``f(z)`` from the parameters,
  ``ctx``, ``x``, the key and ``z``. ``ctx`` travels to :func:`deqjax.fixed_point` next to the
  parameters, so gradients reach the parameters through it by ordinary autodiff.

A Haiku cell reaches the phases through ``dq.nn.per_forward`` (``PhasedCell`` of
:mod:`deqjax._src.nn.per_forward`). A Flax NNX or Equinox cell is a module, made a pure function
of its arrays by the framework's split (``nnx.merge(graphdef, state)``, ``eqx.combine``):
:class:`ModuleCell` calls it, its ``prepare``/``step`` methods when it has them (the framework-free
cells of :mod:`deqjax._src.cells` do), else ``cell(z, x)`` at every step with ``ctx = None``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import jax

from deqjax._src import precision as precision_lib
from deqjax._src.normalise import accepts_keyword

PyTree = Any


class CellPhases(Protocol):
    """A cell as the pure functions of the two phases (module docstring); ``params`` are the
    cell's arrays, ``ctx`` the prepared context, ``key`` the forward pass's key or ``None``."""

    precision: str | None

    def prepare(self, params: Any, key: jax.Array | None, x: PyTree, z: PyTree) -> PyTree:
        """``ctx``: the values of one forward pass that do not depend on ``z``."""

    def step(self, params_ctx: tuple[Any, PyTree], x_key: tuple[PyTree, Any], z: PyTree) -> PyTree:
        """``f(z)``: the ``f(params, x, z)`` that :func:`deqjax.fixed_point` solves, with
        ``params = (params, ctx)`` and ``x = (x, key)``."""

    def apply(self, params: Any, x: PyTree, z: PyTree, key: jax.Array | None) -> PyTree:
        """One evaluation ``f(z)`` of a forward pass on its own (its ``ctx`` recomputed)."""


class ModuleCell(NamedTuple):
    """A framework's cell module as :class:`CellPhases`.

    Attributes:
      bind: ``params -> module``: the cell rebuilt around (traced) arrays, e.g.
        ``functools.partial(nnx.merge, graphdef)`` or ``functools.partial(eqx.combine, static)``.
      phased: the module splits its evaluation as ``ctx = module.prepare(x, **kw)`` (once per
        pass) and ``module.step(z, ctx)``; ``False``: ``module(z, x, **kw)`` at every step.
      flags: static keywords passed to the module's call or ``prepare`` (e.g.
        ``(("deterministic", True),)``), as pairs.
      pass_key: pass the forward pass's key as ``key=`` (the module accepts it).
      precision: the matmul precision of every evaluation (``None``: the ambient one).
    """

    bind: Callable[[Any], Any]
    phased: bool = False
    flags: tuple[tuple[str, Any], ...] = ()
    pass_key: bool = False
    precision: str | None = None

    def _keywords(self, key: jax.Array | None) -> dict[str, Any]:
        return dict(self.flags, **({"key": key} if self.pass_key else {}))

    def prepare(self, params: Any, key: jax.Array | None, x: PyTree, z: PyTree) -> PyTree:
        """``module.prepare(x, **kw)`` (``None`` for a module without phases)."""
        if not self.phased:
            return None

        def run(params, key, x):
            return self.bind(params).prepare(x, **self._keywords(key))

        return precision_lib.at_precision(run, self.precision)(params, key, x)

    def step(self, params_ctx: tuple[Any, PyTree], x_key: tuple[PyTree, Any], z: PyTree) -> PyTree:
        """``module.step(z, ctx)``, or ``module(z, x, **kw)`` for a module without phases."""

        def run(params_ctx, x_key, z):
            (params, ctx), (x, key) = params_ctx, x_key
            module = self.bind(params)
            if self.phased:
                return module.step(z, ctx)
            return module(z, x, **self._keywords(key))

        return precision_lib.at_precision(run, self.precision)(params_ctx, x_key, z)

    def apply(self, params: Any, x: PyTree, z: PyTree, key: jax.Array | None) -> PyTree:
        """One evaluation ``f(z)`` on its own (its ``ctx`` recomputed)."""
        return self.step((params, self.prepare(params, key, x, z)), (x, key), z)


class ModuleCall(NamedTuple):
    """How a front-end's DEQ calls its cell module, read once from the module.

    Attributes:
      phased: the module has ``prepare`` and ``step`` methods.
      pass_key: its entry (``prepare``, else the call) accepts ``key=``.
      flag: the train/eval keyword of the framework (``"deterministic"``, ``"inference"``) when
        the entry accepts it, else ``None``.
    """

    phased: bool
    pass_key: bool
    flag: str | None

    @classmethod
    def of(cls, cell: Any, flag: str) -> ModuleCall:
        """What ``cell`` takes, ``flag`` being the framework's train/eval keyword."""
        phased = hasattr(cell, "prepare") and hasattr(cell, "step")
        entry = cell.prepare if phased else cell
        return cls(
            phased, accepts_keyword(entry, "key"), flag if accepts_keyword(entry, flag) else None
        )

    def cell(
        self, bind: Callable[[Any], Any], flag_value: bool, precision: str | None
    ) -> ModuleCell:
        """The :class:`ModuleCell` of a pass: the module rebuilt by ``bind``, the train/eval
        keyword set to ``flag_value``, at ``precision``."""
        flags = () if self.flag is None else ((self.flag, flag_value),)
        return ModuleCell(bind, self.phased, flags, self.pass_key, precision)
