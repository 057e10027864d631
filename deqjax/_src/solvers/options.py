"""The settings the deqjax solvers share, declared and validated once.

:class:`Options` holds what every solver has (the budget, the stopping rule, the batch axes,
``has_aux``); :class:`DriverOptions` adds what the solvers run by the driver have (the divergence
test, the loop kind, the sampled iterates). A solver class derives from one of them, declares its
own fields, and extends :meth:`Options.check` with their checks: constructing an object validates
every field (a bad value raises ``ValueError`` naming the field) and runs nothing else, so an
entry point can build or ``replace`` one on every call.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from deqjax._src import checks
from deqjax._src.solvers import loop as loop_lib
from deqjax._src.solvers.base import Solver
from deqjax._src.solvers.stopping import STOP_MODES


def check_sample_steps(sample_steps: Any, max_steps: int) -> tuple[int, ...] | None:
    """``sample_steps`` as a sorted tuple: ``None`` or distinct ints in ``[0, max_steps]``.

    Raises:
      ValueError: naming ``sample_steps`` and the offending entry.
    """
    if sample_steps is None:
        return None
    try:
        steps = tuple(sample_steps)
    except TypeError:
        raise ValueError(
            f"sample_steps must be None or a sequence of ints, got {sample_steps!r}."
        ) from None
    if not steps:
        raise ValueError("sample_steps must be None or a non-empty sequence of ints, got ().")
    for s in steps:
        checks.check_int(s, "every entry of sample_steps", minimum=None)
        if not 0 <= s <= max_steps:
            raise ValueError(
                f"sample_steps entries must lie in [0, max_steps={max_steps}], got {s} in "
                f"{sample_steps!r}."
            )
    if len(set(steps)) != len(steps):
        raise ValueError(f"sample_steps entries must be distinct, got {sample_steps!r}.")
    return tuple(sorted(int(s) for s in steps))


def check_check_every(check_every: Any) -> int | str:
    """``check_every`` as ``"auto"`` or a Python int ``>= 1`` (any integer type is accepted).

    Raises:
      ValueError: naming ``check_every`` and the value.
    """
    if isinstance(check_every, str) and check_every == "auto":
        return check_every
    try:
        return int(checks.check_int(check_every, "check_every"))
    except ValueError:
        raise ValueError(
            f'check_every must be "auto" or an int >= 1, got {check_every!r}.'
        ) from None


def _check_nonnegative(value: Any, name: str) -> None:
    if not checks.check_real(value, name) >= 0:  # also rejects NaN
        raise ValueError(f"{name} must be >= 0, got {value}.")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Options(Solver):
    """The settings of every deqjax solver.

    Attributes:
      max_steps: the budget of evaluations of ``f``.
      tol: stop when the residual (by ``stop_mode``) is ``<= tol``.
      stop_mode: ``"abs"`` for ``||f(z) - z||``, ``"rel"`` for ``||f(z) - z|| / ||f(z)||``, or
        ``"mixed"`` for ``||f(z) - z|| <= atol + tol * ||z||`` (see
        :mod:`deqjax._src.solvers.stopping`).
      atol: the absolute tolerance of ``stop_mode="mixed"`` (``None``: equal to ``tol``).
      batch_ndim: the number of leading axes of every leaf of ``z0`` that index independent
        problems, solved together with per-problem statistics (0: one problem).
      has_aux: ``f`` returns ``(z, aux)``; the solve uses ``z`` and ``Solution.aux`` is the
        ``aux`` at the returned value (with ``batch_ndim``, every leaf of ``aux`` has the batch
        axes).
      stall_steps: stop with ``STALLED`` when this many evaluations of ``f`` in a row brought no
        new lowest residual (the floor of the arithmetic, or a stagnating method); ``None``:
        never (the solve runs to ``tol`` or ``max_steps``; ``tol = 0`` also never stalls: it asks
        for the whole budget). Default 30.
    """

    forward_only: ClassVar[dict[str, Any]] = {"has_aux": False}

    max_steps: int = 50
    tol: float = 1e-4
    stop_mode: str = "rel"
    atol: float | None = None
    batch_ndim: int = 0
    has_aux: bool = False
    stall_steps: int | None = 30

    def __post_init__(self) -> None:
        # A list (e.g. sample_steps read back from JSON) becomes a tuple: the object stays hashable.
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, list):
                object.__setattr__(self, field.name, tuple(value))
        self.check()

    def check(self) -> None:
        """Validates the fields; subclasses extend it with their own (calling ``super``).

        Raises:
          ValueError: naming the first bad field.
        """
        checks.check_positive_int(self.max_steps, "max_steps")
        _check_nonnegative(self.tol, "tol")
        if self.stop_mode not in STOP_MODES:
            raise ValueError(f"stop_mode must be one of {STOP_MODES}, got {self.stop_mode!r}.")
        if self.atol is not None:
            _check_nonnegative(self.atol, "atol")
            if self.stop_mode != "mixed":
                raise ValueError(
                    f'atol is used only with stop_mode="mixed", got {self.stop_mode!r}.'
                )
        if self.stop_mode == "mixed" and not self.tol > 0:
            raise ValueError(
                f'stop_mode="mixed" needs tol > 0 (it is the rtol of atol + tol * ||z||), got '
                f'{self.tol}; use stop_mode="abs" for a purely absolute rule.'
            )
        checks.check_int(self.batch_ndim, "batch_ndim", minimum=0)
        checks.check_bool(self.has_aux, "has_aux")
        if self.stall_steps is not None:
            checks.check_positive_int(self.stall_steps, "stall_steps")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DriverOptions(Options):
    """The settings of the solvers run by the driver (:mod:`deqjax._src.solvers.driver`).

    Attributes:
      divergence_factor: stop with ``DIVERGED`` when the absolute residual exceeds this multiple
        of the lowest absolute residual seen (in every ``stop_mode``); ``> 1``.
      loop: ``"while"`` (default), ``"scan"`` (reverse-differentiable) or ``"python"``
        (debugging); see :mod:`deqjax._src.solvers.loop`.
      sample_steps: ``None``, or loop steps ``s`` in ``[0, max_steps]`` whose iterates ``x_s``
        (``x_0 = z0``) are returned in ``Solution.samples`` (for the fixed-point correction loss;
        see :func:`deqjax.correction_states`).
      check_every: steps between two reads of the stopping rule by the ``"while"`` loop (an int
        ``>= 1``, capped at ``max_steps``, or ``"auto"``: 1 on CPUs, 4 on GPUs and TPUs, where
        each read is a round trip to the host, chosen for the platform the solve is compiled
        for; :mod:`deqjax._src.solvers.loop`). Every step is still judged: a problem that stops
        inside a chunk is frozen at that step, so the iterate, ``num_steps``, status, trace and
        statistics are exactly (bit for bit) those of ``check_every=1``; only whole-batch
        evaluations after the last problem stopped (at most ``k - 1``) are spent. The implicit
        backward's solve inherits it from the forward solver.

    ``sample_steps`` is kept sorted, and ``check_every`` as ``"auto"`` or a Python int, whatever
    sequence or integer type was passed.
    """

    loop_kinds: ClassVar[tuple[str, ...]] = loop_lib.LOOP_KINDS
    forward_only: ClassVar[dict[str, Any]] = {**Options.forward_only, "sample_steps": None}

    divergence_factor: float = 1e4
    loop: str = "while"
    sample_steps: tuple[int, ...] | None = None
    check_every: int | str = "auto"

    def check(self) -> None:
        super().check()
        if not checks.check_real(self.divergence_factor, "divergence_factor") > 1.0:
            raise ValueError(f"divergence_factor must be > 1, got {self.divergence_factor}.")
        loop_lib.check_loop_kind(self.loop)
        # Normalised here, once: everything after reads the fields as they are.
        object.__setattr__(
            self, "sample_steps", check_sample_steps(self.sample_steps, self.max_steps)
        )
        object.__setattr__(self, "check_every", check_check_every(self.check_every))
