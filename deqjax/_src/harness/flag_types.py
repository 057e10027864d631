"""Value types of configuration fields that the command line checks: a bad value names its flag.

A configuration field annotated with one of these types is parsed and checked by tyro when the
command line is read, so ``--epochs -1`` stops at once with ``Error parsing --epochs: must be an
int >= 1, got -1`` (exit status 2) instead of failing later inside the run:

* :data:`PositiveInt` (``>= 1``), :data:`NonNegativeInt` (``>= 0``), :data:`PositiveFloat`
  (finite, ``> 0``), :data:`NonNegativeFloat` (finite, ``>= 0``), and any lower bound of an
  int with :func:`at_least` (``n: Annotated[int, at_least(2)]``);
* :data:`FloatList`, :data:`IntList` and :func:`choice_list` (names from a set): one
  comma-separated value (``--sweep_scales 0.5,1.5``) read as a tuple;
* :data:`Switch`: a boolean flag that only turns something on (``--sweep``, ``--resume``), or
  for a field whose default is True only off; no ``--no_<name>`` twin;
* :data:`StepWindow`: a window of training steps ``A:B`` (``--profile_steps 10:12``), or ``''``
  for none; :func:`step_window` reads it as ``(A, B)``.

>>> @dataclasses.dataclass(frozen=True)
... class Config:
...     epochs: PositiveInt = 4  # passes over the data
...     scales: FloatList = (0.5, 1.0)  # initialisation scales
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Annotated, Any

import tyro
from tyro.constructors import PrimitiveConstructorSpec


def _convert(kind: type, text: str) -> Any:
    try:
        return kind(text)
    except ValueError:
        raise ValueError(f"expected {kind.__name__}, got {text!r}") from None


def _bounded(kind: type, low: float, *, strict: bool = False) -> PrimitiveConstructorSpec:
    """A tyro constructor of ``kind`` that accepts ``> low`` (``strict``) or ``>= low``."""
    what = "an int" if kind is int else "a finite number"
    bound = f"> {low:g}" if strict else f">= {low:g}"

    def from_text(args: list[str]) -> Any:
        value = _convert(kind, args[0])
        ok = value > low if strict else value >= low
        if not ok or not math.isfinite(value):
            raise ValueError(f"must be {what} {bound}, got {value}")
        return value

    return PrimitiveConstructorSpec(
        nargs=1,
        metavar=kind.__name__.upper(),
        instance_from_str=from_text,
        is_instance=lambda value: isinstance(value, kind),
        str_from_instance=lambda value: [str(value)],
    )


def _comma_separated(convert: Callable[[str], Any], metavar: str) -> PrimitiveConstructorSpec:
    """A tyro constructor of a tuple from one comma-separated value (empty items dropped);
    ``convert`` turns one item into a value or raises ``ValueError``."""

    def from_text(args: list[str]) -> tuple:
        return tuple(convert(item.strip()) for item in args[0].split(",") if item.strip())

    return PrimitiveConstructorSpec(
        nargs=1,
        metavar=metavar,
        instance_from_str=from_text,
        is_instance=lambda value: isinstance(value, tuple),
        str_from_instance=lambda value: [
            ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)
        ],
    )


def at_least(low: int) -> PrimitiveConstructorSpec:
    """The constructor of an int field that must be ``>= low``: ``Annotated[int, at_least(2)]``."""
    return _bounded(int, low)


def choice_list(choices: Sequence[str]) -> Any:
    """The type of a comma-separated list of names from ``choices`` (``--families a,b``)."""

    def convert(text: str) -> str:
        if text not in choices:
            raise ValueError(f"expected one of {tuple(choices)}, got {text!r}")
        return text

    return Annotated[tuple[str, ...], _comma_separated(convert, "{" + ",".join(choices) + "},...")]


PositiveInt = Annotated[int, _bounded(int, 1)]
NonNegativeInt = Annotated[int, _bounded(int, 0)]
PositiveFloat = Annotated[float, _bounded(float, 0, strict=True)]
NonNegativeFloat = Annotated[float, _bounded(float, 0)]
FloatList = Annotated[
    tuple[float, ...], _comma_separated(lambda t: _convert(float, t), "FLOAT,...")
]
IntList = Annotated[tuple[int, ...], _comma_separated(lambda t: _convert(int, t), "INT,...")]
Switch = tyro.conf.FlagCreatePairsOff[bool]


def step_window(text: str) -> tuple[int, int] | None:
    """The steps ``(A, B)`` of a window written ``"A:B"`` (``1 <= A <= B``); None for ``""``.

    Raises:
      ValueError: ``text`` is not of that form (the message says what was expected).
    """
    if text == "":
        return None
    first, colon, last = text.partition(":")
    try:
        window = (int(first), int(last)) if colon else None
    except ValueError:
        window = None
    if window is None or not 1 <= window[0] <= window[1]:
        raise ValueError(
            f"expected A:B, the first and the last step of the window (integers, 1 <= A <= B), "
            f"got {text!r}"
        )
    return window


def _window_from_text(args: list[str]) -> str:
    window = step_window(args[0].strip())
    return "" if window is None else f"{window[0]}:{window[1]}"


StepWindow = Annotated[
    str,
    PrimitiveConstructorSpec(
        nargs=1,
        metavar="A:B",
        instance_from_str=_window_from_text,
        is_instance=lambda value: isinstance(value, str),
        str_from_instance=lambda value: [value],
    ),
]
