"""The flat view of a nested configuration: one name per setting, the name of its flag.

An experiment's configuration is a frozen dataclass whose fields are settings (``width``) or
sections: nested dataclasses shared between experiments (``solver: SolverConfig``). On the
command line the sections leave no prefix (``--max_steps``, not ``--solver.max_steps``), so
every setting has one flat name, unique in the configuration. :func:`flat_dict` gives
``{name: value}`` (what ``config.json`` holds), :func:`replace_flat` changes settings by name
(the ``--smoke`` and mode defaults), :func:`find_section` finds a shared section by type and
:func:`declared` collects what the sections declare (the settings safe to change on resume,
their ``--smoke`` values).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any, TypeVar

Config = TypeVar("Config")
Section = TypeVar("Section")


def _is_section(value: Any) -> bool:
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def _leaves(config: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if _is_section(value):
            yield from _leaves(value, (*path, field.name))
        else:
            yield (*path, field.name), value


def flat_paths(config: Any) -> dict[str, tuple[str, ...]]:
    """``{setting name: path of field names}`` of a configuration instance.

    Raises:
      ValueError: if two sections hold settings of the same name (their flags would clash).
    """
    paths: dict[str, tuple[str, ...]] = {}
    for path, _ in _leaves(config):
        if path[-1] in paths:
            clash = ".".join(paths[path[-1]]), ".".join(path)
            raise ValueError(f"settings {clash[0]} and {clash[1]} share the flag --{path[-1]}.")
        paths[path[-1]] = path
    return paths


def flat_dict(config: Any) -> dict[str, Any]:
    """``{setting name: value}`` over every section of ``config``."""
    return {path[-1]: value for path, value in _leaves(config)}


def _replace_path(config: Any, path: tuple[str, ...], value: Any) -> Any:
    if len(path) == 1:
        return dataclasses.replace(config, **{path[0]: value})
    inner = _replace_path(getattr(config, path[0]), path[1:], value)
    return dataclasses.replace(config, **{path[0]: inner})


def replace_flat(config: Config, **values: Any) -> Config:
    """A copy of ``config`` with the settings named in ``values`` changed.

    Raises:
      KeyError: if a name is not a setting of ``config``.
    """
    paths = flat_paths(config)
    unknown = sorted(set(values) - set(paths))
    if unknown:
        raise KeyError(f"not settings of {type(config).__name__}: {unknown}")
    for name, value in values.items():
        config = _replace_path(config, paths[name], value)
    return config


def find_section(config: Any, kind: type[Section]) -> Section | None:
    """The first section of ``config`` (depth first, ``config`` itself included) of type
    ``kind``, or None."""
    if isinstance(config, kind):
        return config
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        found = find_section(value, kind) if _is_section(value) else None
        if found is not None:
            return found
    return None


def declared(config: Any, name: str) -> list:
    """The class attribute ``name`` of every section of ``config`` that has one (``config``
    included, depth first): e.g. ``SAFE_ON_RESUME`` (the settings a resumed run may change) or
    ``SMOKE`` (``{setting: value}`` under ``--smoke``)."""
    found = [getattr(type(config), name)] if hasattr(type(config), name) else []
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if _is_section(value):
            found += declared(value, name)
    return found
