"""What a metric writer is: where :func:`~deqjax.training.fit` sends each record of a run.

A record is a flat dict with ``"split"`` (``"train"``, ``"eval"``, ``"diagnostics"``...) and
``"step"``. A writer is opened once with what the run decided about the files an earlier run left
(:class:`~deqjax.training.RunPolicy`: a resumed run's restored step, or a fresh run's
``overwrite``), gets every record, and is closed (also on error). Only process 0 of a multi-host
run writes: every writer takes ``enabled`` (None: ``jax.process_index() == 0``).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from deqjax._src.training.run_policy import RunPolicy


@runtime_checkable
class MetricWriter(Protocol):
    """Where records go: :class:`~deqjax.training.JsonlWriter`,
    :class:`~deqjax.training.TensorBoardWriter`, :class:`~deqjax.training.WandbWriter`."""

    def open(self, restored_step: int | None, overwrite: bool) -> None:
        """Before the first record: ``restored_step`` is the step a resumed run continues from
        (None: a fresh run, which replaces an earlier run's files only with ``overwrite``)."""

    def write(self, record: Mapping[str, Any]) -> None:
        """One record, ``{"split", "step", name: value, ...}``."""

    def close(self) -> None:
        """After the last record (also on error); a closed writer may be opened again."""


def writes_here(enabled: bool | None) -> bool:
    """Whether this process writes: ``enabled``, or (None) whether it is JAX's process 0."""
    if enabled is not None:
        return bool(enabled)
    import jax

    return jax.process_index() == 0


def claim(found: Sequence[str], restored_step: int | None, overwrite: bool, what: str) -> None:
    """Applies the run's :class:`~deqjax.training.RunPolicy` to an earlier run's files ``found``.

    A resumed run (``restored_step`` set) keeps them; a fresh run deletes them with
    ``overwrite`` and is refused without it.

    Args:
      found: the earlier run's files this writer would write beside (empty: none).
      restored_step: the resumed run's step, or None for a fresh run.
      overwrite: a fresh run may delete ``found``.
      what: what they are, for the message (``"<folder> holds ..."``).

    Raises:
      FileExistsError: a fresh run finds files without ``overwrite``.
    """
    policy = RunPolicy(resume=restored_step is not None, overwrite=overwrite)
    refuse = lambda: FileExistsError(  # noqa: E731
        f"{what} of an earlier run; resume it, or pass overwrite=True (--overwrite) to replace "
        f"them."
    )
    for path in policy.to_delete(list(found), refuse):
        os.remove(path)


def require(module: str, package: str, who: str) -> None:
    """Raises a ``ModuleNotFoundError`` naming ``pip install <package>`` if ``module`` is absent.

    Raises:
      ModuleNotFoundError: ``module`` cannot be imported.
    """
    if importlib.util.find_spec(module) is None:
        raise ModuleNotFoundError(
            f"{who} needs the {package!r} package, which is not installed: pip install {package}",
            name=module,
        )


def scalars(record: Mapping[str, Any]) -> tuple[int, dict[str, float]]:
    """A record's step and its numeric fields as ``{"<split>/<name>": value}``.

    Every field but ``"split"`` and ``"step"`` whose value is a real scalar (Python, numpy or a
    0-d array; a bool as 0 or 1) is kept, non-finite values included; strings, arrays and None
    are left out. A record without ``"split"`` names its fields alone.

    Raises:
      ValueError: the record has no int ``"step"``.
    """
    step = record.get("step")
    if isinstance(step, (bool, np.bool_)) or not isinstance(step, (int, np.integer)):
        raise ValueError(f"a metric record needs an int 'step', got {step!r} in {dict(record)}.")
    prefix = f"{record['split']}/" if record.get("split") else ""
    out = {}
    for name, value in record.items():
        if name in ("split", "step") or isinstance(value, (str, bytes)) or value is None:
            continue
        try:
            arr = np.asarray(value)
        except (TypeError, ValueError):
            continue
        if arr.ndim == 0 and arr.dtype.kind in "biuf":
            out[f"{prefix}{name}"] = float(arr)
    return int(step), out


class ScalarWriter:
    """The life of a writer of scalars (TensorBoard, W&B): :meth:`open` closes what was open and
    starts the destination where this process writes, :meth:`write` sends a record's
    :func:`scalars` there (refused before ``open``), :meth:`close` stops it.

    A subclass sets ``label`` (for messages) and says how its destination starts, takes the
    scalars of one step and stops: :meth:`_start`, :meth:`_send`, :meth:`_stop`.
    """

    label: str

    def __init__(self, enabled: bool | None):
        self._enabled = enabled
        self._sink: Any = None
        self._opened = False

    def _start(self, restored_step: int | None, overwrite: bool) -> Any:
        """The open destination of a fresh run (``restored_step`` None) or a resumed one."""
        raise NotImplementedError

    def _send(self, step: int, values: dict[str, float]) -> None:
        """Sends one record's scalars ``{"<split>/<name>": value}`` at ``step``."""
        raise NotImplementedError

    def _stop(self) -> None:
        """Closes the open destination."""
        raise NotImplementedError

    def open(self, restored_step: int | None, overwrite: bool) -> None:
        """Starts the destination (claiming an earlier run's files, see :func:`claim`), where
        this process writes."""
        self.close()
        self._opened = True
        if writes_here(self._enabled):
            self._sink = self._start(restored_step, overwrite)

    def write(self, record: Mapping[str, Any]) -> None:
        """Sends the record's numeric fields (:func:`scalars`) at its step."""
        if not self._opened:
            raise RuntimeError(f"{type(self).__name__}({self.label!r}).write before open().")
        step, values = scalars(record)
        if self._sink is not None:
            self._send(step, values)

    def close(self) -> None:
        if self._sink is not None:
            self._stop()
            self._sink = None
        self._opened = False
