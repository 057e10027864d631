"""The framework-free half of a front-end's DEQ module (``deqjax.nnx.DEQ``,
``deqjax.equinox.DEQ``): its checked settings, how it calls its cell module, and the pass.

Both front-ends hold their cell as a module whose arrays exist before the pass. Each pass splits
the cell into its arrays and a ``bind`` that rebuilds it around them (``nnx.merge``,
``eqx.combine``); :meth:`ModuleLayer.forward` runs the forward pass of
:mod:`~deqjax._src.deq.forward_pass` with the cell's phases (:class:`~.phases.ModuleCall`). A
front-end keeps only its framework: how the module is split, and where the pass's key comes from.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax

from deqjax._src import checks
from deqjax._src.deq import forward_pass
from deqjax._src.deq.deq_config import DEQConfig, checked_config
from deqjax._src.deq.deq_output import DEQOutput
from deqjax._src.deq.phases import ModuleCall

PyTree = Any


class ModuleLayer(NamedTuple):
    """A front-end DEQ's static part (hashable: an Equinox static field, an NNX attribute).

    Attributes:
      config: the layer's checked settings.
      call: how the layer calls its cell module.
      flag: the framework's train/eval keyword (``"deterministic"``, ``"inference"``).
      name: the layer's name in error messages (``"deqjax.nnx.DEQ"``).
    """

    config: DEQConfig
    call: ModuleCall
    flag: str
    name: str

    @classmethod
    def of(cls, cell: Any, flag: str, name: str, *settings: Any) -> ModuleLayer:
        """The layer of ``cell`` and the constructor's ``settings`` (``solver``, ``adjoint``,
        ``eval_solver``, ``per_example``, ``init_state``, ``precision``, in that order).

        Raises:
          ValueError: as :func:`~deqjax._src.deq.deq_config.checked_config`.
        """
        return cls(checked_config(cell, *settings), ModuleCall.of(cell, flag), flag, name)

    def eval_mode(self, attribute: Any, override: Any) -> bool:
        """The pass's train/eval flag: ``override`` when given, else the module's ``attribute``.

        Raises:
          ValueError: naming the flag, if the value is not a bool.
        """
        return checks.check_bool(attribute if override is None else override, self.flag)

    def forward(
        self,
        cell: Any,
        bind: Callable[[Any], Any],
        params: Any,
        x: PyTree,
        z0: PyTree | None,
        key: jax.Array | None,
        eval_mode: bool,
        backward_stats: Any,
    ) -> DEQOutput:
        """The pass of ``cell`` (the user's module, for its ``initial_state``) over its arrays
        ``params`` (``bind(params)`` rebuilds it): ``eval_solver`` and no key in eval mode."""
        begin = forward_pass.start(self.config, cell, x, z0, is_training=not eval_mode)
        phases = self.call.cell(bind, eval_mode, self.config.precision)
        key = None if eval_mode else key
        return forward_pass.solve(
            begin, phases, self.config.adjoint, params, x, key, backward_stats, layer=self.name
        )
