"""The :class:`Solver` base: what every solver object declares, whatever runs inside it.

A solver is a frozen, hashable object called as ``solver(f, z0) -> Solution``. Its settings are
fields (a config prints and logs it with :meth:`Solver.to_dict`, ``jax.jit`` takes it as a static
argument because it compares and hashes by value) and variants are made with
:meth:`Solver.replace`. Its capabilities are declared, never discovered from a signature:

* ``batch_native``: it has a ``batch_ndim`` field (leading axes of ``z0`` that index independent
  problems, solved in one loop with per-problem stopping);
* ``loop_kinds``: the values its ``loop`` field may take (:mod:`deqjax._src.solvers.loop`);
  ``"scan"`` among them means an unrolled, reverse-differentiable loop is available
  (:class:`~deqjax.UnrolledAdjoint` needs it).

The deqjax solvers derive from :class:`~deqjax._src.solvers.options.Options`, which holds the
settings they share; a user's own callable becomes a :class:`~deqjax._src.normalise.CustomSolver`
(see :func:`deqjax.solvers.as_solver`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar

from deqjax._src import compiled
from deqjax._src.solvers.solution import Solution

PyTree = Any


class Solver:
    """Base class of the solver objects (subclasses are frozen dataclasses).

    Attributes:
      batch_native: whether the solver has a ``batch_ndim`` setting.
      loop_kinds: the ``loop`` settings it accepts (empty: it runs its own loop).
      wraps_user_callable: whether it runs a user's own callable, which deqjax cannot promise
        to trace (the compiled entry then runs un-jitted under an eager ``grad``).
      forward_only: the fields that ask for outputs only a forward solve has (``has_aux``,
        ``sample_steps``, ``return_inverse``, ...), each with the value that turns it off.
    """

    batch_native: ClassVar[bool] = True
    loop_kinds: ClassVar[tuple[str, ...]] = ()
    wraps_user_callable: ClassVar[bool] = False
    # Fields that ask for outputs only a forward solve has, with the value that turns each off
    # (e.g. Broyden's return_inverse: False); each class declares its own.
    forward_only: ClassVar[dict[str, Any]] = {}

    def __call__(self, f: Callable[[PyTree], PyTree], z0: PyTree, /) -> Solution:
        """Solves ``z = f(z)`` from ``z0`` with this object's settings.

        Called eagerly, the solve runs as one compiled program from a bounded cache
        (``deqjax._src.compiled.MAX_ENTRIES`` programs, least recently used dropped), keyed by
        ``f`` (its code and the Python values it closes over; the arrays it closes over are the
        program's operands), this object (it compares by value) and ``z0``'s structure, shapes
        and dtypes: a repeated call, or a fresh ``lambda`` with the same code, compiles nothing
        (the solver functions and ``functools.partial`` forms call this). Inside a trace that
        stages out (``jit``, ``scan``, ``pmap``) it runs inline, as :meth:`_run`; an ``f`` that
        cannot be keyed or traced runs un-jitted.
        """
        out = compiled.run(_run_compiled, f, self, (z0,))
        return self._run(f, z0) if out is compiled.NOT_JITTED else out

    def _run(self, f: Callable[[PyTree], PyTree], z0: PyTree, /) -> Solution:
        """The solve itself, un-jitted (what a subclass implements)."""
        raise NotImplementedError

    def for_backward(self) -> Solver:
        """This solver for a linear backward or tangent solve: the same settings, with every
        :attr:`forward_only` output turned off (that map returns the state alone, and needs no
        sampled iterates, inverse estimate or reversal state)."""
        changes = {k: off for k, off in self.forward_only.items() if getattr(self, k) != off}
        return self.replace(**changes) if changes else self

    def to_dict(self, *, with_name: bool = True) -> dict[str, Any]:
        """The fields as a JSON-ready dict; with ``with_name`` (default) under the key ``"solver"``
        the class name too, so that :func:`~deqjax.solvers.from_dict` can rebuild the object."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {"solver": type(self).__name__, **fields} if with_name else fields

    def replace(self, **changes: Any) -> Solver:
        """A copy with some fields changed (validated like a new object).

        Raises:
          ValueError: naming a change that is not a field, or a bad value.
        """
        names = [f.name for f in dataclasses.fields(self)]
        unknown = sorted(set(changes) - set(names))
        if unknown:
            raise ValueError(
                f"{type(self).__name__} got unknown field(s) {unknown}; its fields are "
                f"{sorted(names)}."
            )
        return dataclasses.replace(self, **changes)


def _run_compiled(make: Callable[[Any], Callable], operands: Any, solver: Solver, z0: PyTree):
    """A solver's compiled program: its solve of ``f`` rebuilt around the traced operands."""
    return solver._run(make(operands), z0)
