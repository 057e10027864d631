"""Weight normalisation ``w = g · v / ‖v‖`` (Salimans & Kingma 2016, Eq. 2), once per forward pass.

The JR paper (Table 4) and the DEQ/MDEQ models it builds on use weight norm in every cell. Inside a
:class:`~deqjax.nn.DEQ` the normalised weight is computed with :func:`~deqjax.nn.per_forward`, i.e.
once per forward pass outside the solver loop, not once per solver step; gradients reach ``v`` and
``g`` through it (no hooks, no reset calls).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import haiku as hk
import jax
import jax.numpy as jnp

from deqjax._src.cells import layers
from deqjax._src.nn.per_forward import per_forward


def _check_shape(shape: Sequence[int]) -> tuple[int, ...]:
    try:
        shape = tuple(int(s) for s in shape)
    except TypeError as e:
        raise ValueError(f"shape must be a sequence of ints, got {shape!r}.") from e
    if not shape or any(s < 1 for s in shape):
        raise ValueError(f"shape must be a non-empty sequence of positive ints, got {shape!r}.")
    return shape


class WeightNorm(hk.Module):
    """A weight-normalised parameter ``w = g · v / ‖v‖`` (Salimans & Kingma 2016, Eq. 2).

    Creates parameters ``v`` (shape ``shape``, drawn from ``w_init``) and ``g`` (one gain per
    slice along the axes not normalised; initialised to ``‖v‖`` so that ``w = v`` at init, like
    PyTorch's ``weight_norm``). The norm is over ``axes``: by default every axis but the last,
    i.e. one gain per output unit of a ``[in, out]`` dense or ``[kh, kw, in, out]`` conv kernel.
    ``w`` is invariant to rescaling ``v``.

    Args:
      shape: shape of ``w``.
      axes: axes the norm runs over (``None``: all but the last).
      w_init: initializer of ``v`` (any Haiku initializer or ``dq.initializers`` family;
        ``None``: ``hk.initializers.VarianceScaling(1.0, "fan_in", "truncated_normal")``, the
        ``hk.Linear`` default).
      name: module name.

    Raises:
      ValueError: for a bad ``shape`` or ``axes``, or a non-callable ``w_init``.

    Example:
      >>> w = dq.nn.WeightNorm([64, 64])(jnp.float32)   # [in, out]
      >>> y = x @ w
    """

    def __init__(
        self,
        shape: Sequence[int],
        *,
        axes: Sequence[int] | None = None,
        w_init: hk.initializers.Initializer | None = None,
        name: str | None = None,
    ):
        super().__init__(name=name)
        self.shape = _check_shape(shape)
        ndim = len(self.shape)
        if axes is None:
            axes = tuple(range(ndim - 1)) if ndim > 1 else (0,)
        try:
            axes = tuple(sorted({int(a) % ndim for a in axes}))
        except (TypeError, ValueError) as e:
            raise ValueError(f"axes must be a sequence of ints or None, got {axes!r}.") from e
        if not axes:
            raise ValueError("axes must name at least one axis.")
        self.axes = axes
        if w_init is not None and not callable(w_init):
            raise ValueError(f"w_init must be an initializer (callable) or None, got {w_init!r}.")
        self.w_init = w_init

    def __call__(self, dtype: Any = jnp.float32) -> jax.Array:
        """Returns ``w`` (shape ``shape``), computed once per DEQ forward pass."""

        def compute():
            w_init = self.w_init or hk.initializers.VarianceScaling(
                1.0, "fan_in", "truncated_normal"
            )
            v = hk.get_parameter("v", self.shape, dtype, init=w_init)
            g_shape = [1 if i in self.axes else s for i, s in enumerate(self.shape)]
            norm = layers.weight_norm_gain(v, self.axes)
            # The init honours the dtype it is asked for (a mixed-precision policy creates the
            # parameters in float32 while v is read in the compute dtype).
            g = hk.get_parameter("g", g_shape, dtype, init=lambda _, d: norm.astype(d))
            return layers.weight_normalised(v, g, self.axes)

        return per_forward("w", compute)


def get_weight(
    name: str,
    shape: Sequence[int],
    dtype: Any,
    *,
    w_init: hk.initializers.Initializer | None,
    weight_norm: bool,
) -> jax.Array:
    """A cell's weight: a plain parameter ``name`` or, with ``weight_norm``, a :class:`WeightNorm`
    submodule ``name`` (parameters ``name/v``, ``name/g``). ``w_init=None``: the ``hk.Linear``
    default (truncated normal, variance ``1/fan_in``)."""
    if weight_norm:
        return WeightNorm(shape, w_init=w_init, name=name)(dtype)
    if w_init is None:
        w_init = hk.initializers.VarianceScaling(1.0, "fan_in", "truncated_normal")
    return hk.get_parameter(name, list(shape), dtype, init=w_init)
