"""The matmul precision of a DEQ's cell: ``precision=`` of ``dq.fixed_point`` and ``dq.nn.DEQ``.

On GPUs and TPUs JAX's default precision for float32 matrix products is reduced (TF32-class on
NVIDIA GPUs: about 10 mantissa bits, a relative error near 1e-3 per product). A fixed-point solve
whose tolerance is below that error can report convergence that a float64 recomputation of the
residual does not confirm (measured on an H100: a reported 1e-4 was 3.5e-4 in float64). Choosing
``precision="highest"`` makes every product in the cell full float32. CPUs compute float32
products in full precision whatever the setting.

:func:`with_precision` wraps the cell ``f(params, x, z)`` so that each of its evaluations is
traced under :func:`jax.default_matmul_precision`: the forward solve, the backward solve's VJPs and
the final VJP (a VJP's products inherit the precision of the products they transpose), whatever
transformation later traces them.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax

PRECISIONS = ("default", "high", "highest", "bfloat16", "tensorfloat32", "float32")


def check_precision(precision: Any, name: str = "precision") -> str | None:
    """``precision`` if :func:`jax.default_matmul_precision` accepts it, else ``ValueError``.

    Args:
      precision: ``None`` (JAX's default), one of :data:`PRECISIONS`, or the name of a
        ``jax.lax.DotAlgorithmPreset`` (e.g. ``"F32_F32_F32"``).
      name: the argument's name for the error message.
    """
    if precision is None:
        return None
    try:
        with jax.default_matmul_precision(precision):
            pass
    except (ValueError, TypeError):
        raise ValueError(
            f"{name} must be None or a matmul precision jax.default_matmul_precision accepts "
            f"({', '.join(map(repr, PRECISIONS))}, or a DotAlgorithmPreset name), got "
            f"{precision!r}."
        ) from None
    return precision


def with_precision(f: Callable[..., Any], precision: str | None) -> Callable[..., Any]:
    """``f`` evaluated under ``jax.default_matmul_precision(precision)`` (``f`` itself for
    ``None``)."""
    if precision is None:
        return f

    @functools.wraps(f)
    def f_at_precision(*args: Any) -> Any:
        with jax.default_matmul_precision(precision):
            return f(*args)

    return f_at_precision
