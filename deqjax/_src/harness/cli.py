"""The command line of a configuration dataclass, built by tyro.

Every field of the configuration is a flag named as the field, with underscores
(``--train_size``); nested sections add no prefix (``--max_steps``, not ``--solver.max_steps``),
so the flags read as the experiments' flags always have. The help text is the description (an
experiment's module docstring) and, per flag, the comment or docstring beside its field; the
default shown is the one in effect (``--smoke --help`` shows the smoke defaults). A boolean shows
its default as the flag in effect: ``--jr, --no_jr  ... (default: --jr)``; a one-way switch
(:data:`~deqjax._src.harness.flag_types.Switch`: ``--smoke``, ``--no_progress``) shows none, its
help saying what the flag does. A bad flag or value prints tyro's message naming the flag and
exits with status 2.
"""

from __future__ import annotations

import contextvars
import dataclasses
import os
import sys
from collections.abc import Sequence
from typing import Annotated, Any, TypeVar, get_args, get_origin

import tyro
from tyro.constructors import (
    ConstructorRegistry,
    StructConstructorSpec,
    StructFieldSpec,
    StructTypeInfo,
)

from deqjax._src.harness.flat_config import flat_paths

Config = TypeVar("Config")

# No prefix for the fields of nested sections: ``--max_steps``, not ``--solver.max_steps``.
MARKERS = (tyro.conf.OmitArgPrefixes,)


def _flag_hint(field: StructFieldSpec, markers: tuple[Any, ...]) -> StructFieldSpec:
    """``field`` with its default said as a flag when it is a boolean flag: ``(default: --jr)``
    or ``(default: --no_jr)`` for a pair, nothing for a one-way switch (tyro's
    ``(default: True)`` beside ``--no_progress`` reads as if the bar were off). A hint the field
    sets itself (``tyro.conf.arg(help_behavior_hint=...)``) wins: it comes later."""
    kind, *meta = get_args(field.type) if get_origin(field.type) is Annotated else (field.type,)
    every = (*meta, *markers)
    if kind is not bool or not isinstance(field.default, bool):
        return field
    if tyro.conf.FlagConversionOff in every:  # ``--name {True,False}``: tyro's hint is right
        return field
    if tyro.conf.FlagCreatePairsOff in every:
        hint = ""
    else:
        hint = f"(default: --{'' if field.default else 'no_'}{field.name})"
    kind = Annotated[(kind, tyro.conf.arg(help_behavior_hint=hint), *meta)]
    return dataclasses.replace(field, type=kind)


_inner_call = contextvars.ContextVar("_inner_call", default=False)


def _dataclass_with_flag_hints(info: StructTypeInfo) -> StructConstructorSpec | Any:
    """tyro's own rule for a dataclass, its boolean fields given :func:`_flag_hint`."""
    if _inner_call.get() or not dataclasses.is_dataclass(info.type):
        return None
    token = _inner_call.set(True)
    try:
        spec = ConstructorRegistry.get_struct_spec(info)  # the rules after this one
    finally:
        _inner_call.reset(token)
    if not isinstance(spec, StructConstructorSpec):
        return spec
    fields = tuple(_flag_hint(f, tuple(info.markers)) for f in spec.fields)
    return dataclasses.replace(spec, fields=fields)


REGISTRY = ConstructorRegistry()
REGISTRY.struct_rule(_dataclass_with_flag_hints)


def paragraphs(doc: str) -> str:
    """``doc`` with each paragraph on one line (the terminal wraps it), indented lines (usage
    examples) kept as they are: a docstring as ``--help`` shows it."""
    out = []
    for block in doc.strip().split("\n\n"):
        lines = block.split("\n")
        if any(line.startswith(" ") for line in lines[1:]):
            out.append(block)
        else:
            out.append(" ".join(line.strip() for line in lines))
    return "\n\n".join(out)


def parse_config(
    default: Config | type[Config],
    argv: Sequence[str] | None = None,
    *,
    description: str | None = None,
    prog: str | None = None,
) -> Config:
    """Reads the command line into a configuration (a frozen dataclass).

    Args:
      default: the configuration whose fields become flags, with the defaults they show; or its
        class, when a field has no default (a required positional argument).
      argv: the arguments (default ``sys.argv[1:]``).
      description: the ``--help`` text above the flags (default: the dataclass's docstring).
      prog: the program name in the usage line (default: the script's file name).

    Returns:
      The configuration the command line describes.

    Raises:
      SystemExit: status 0 after ``--help``, 2 for a bad flag or value.
      ValueError: if two sections hold settings of the same name.
    """
    kind = default if isinstance(default, type) else type(default)
    if not isinstance(default, type):
        flat_paths(default)  # settings must have unique flat names before they become flags
    return tyro.cli(
        kind,
        args=argv,
        default=tyro.MISSING_NONPROP if isinstance(default, type) else default,
        description=None if description is None else paragraphs(description),
        prog=os.path.basename(sys.argv[0]) if prog is None else prog,
        use_underscores=True,
        config=MARKERS,
        registry=REGISTRY,
    )
