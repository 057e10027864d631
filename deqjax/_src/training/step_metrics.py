"""A training step's metrics, left on the device until an action reads them on the host."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

PyTree = Any
Record = dict[str, Any]  # what an action returns: a flat dict with "split" and "step"


class StepMetrics:
    """One step's metrics: on the device until :meth:`host` reads them (once: a device sync).

    Attributes:
      on_device: the metrics as the step function returned them.
    """

    def __init__(self, on_device: PyTree, read: Callable[[PyTree], Mapping[str, Any]]):
        self.on_device = on_device
        self._read = read
        self._host: dict[str, float] | None = None

    @property
    def fetched(self) -> bool:
        """Whether :meth:`host` has read them already (reading them again costs nothing)."""
        return self._host is not None

    def host(self) -> dict[str, float]:
        """``{name: float}`` on the host, fetched on the first call (later calls reuse it)."""
        if self._host is None:
            self._host = {k: float(v) for k, v in self._read(self.on_device).items()}
        return self._host
