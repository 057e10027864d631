"""The compute dtype of an experiment's model (``--dtype``): a jmp mixed-precision policy.

``--dtype float32`` (default), ``bfloat16`` or ``float16``: the model's modules (the DEQ's cell
among them) compute in that dtype, with their parameters and the optimizer state kept in float32
(``jmp.Policy(param_dtype=float32, compute_dtype=dtype, output_dtype=float32)``, applied to the
model's Haiku class by :func:`haiku.mixed_precision.push_policy` while its functions are traced).
The DEQ's state is then a half-precision array and the solvers keep their bookkeeping (norms,
residuals, Anderson's Gram matrix, the GMRES workspace) in float32 (``tree.reduction_dtype``).
float16 gradients are computed on a loss scaled by :data:`FLOAT16_LOSS_SCALE`
(``jmp.StaticLossScale``; a step whose scaled gradient overflows is skipped by ``fit``'s
non-finite guard); bfloat16 has float32's exponent range and needs none.

A tolerance the dtype cannot resolve is refused (:meth:`DtypeConfig.check_tol`): a relative
residual of a state rounded to a dtype of machine epsilon ``eps`` stays near ``eps``, so a solve
to ``tol < eps`` could only stall. A tolerance flag left at a default the dtype cannot resolve
takes the round tolerance just above ``eps`` instead (:func:`dtype_tolerances`; bfloat16: 0.01):
``--dtype bfloat16`` alone is enough, and the run says so (:func:`tolerance_note`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from itertools import chain
from typing import Any, Literal

import haiku as hk
import jax.numpy as jnp
import jmp

from deqjax._src.harness.flat_config import declared, find_section, flat_dict

Dtype = Literal["float32", "bfloat16", "float16"]

FLOAT16_LOSS_SCALE = 2.0**10


@dataclasses.dataclass(frozen=True)
class DtypeConfig:
    """Compute dtype: the model's arithmetic; parameters, optimizer state and solver bookkeeping
    stay float32."""

    dtype: Dtype = "float32"
    """the model's compute dtype (bfloat16/float16: a jmp policy, float32 parameters)"""

    def policy(self) -> jmp.Policy:
        """The jmp policy: float32 parameters and outputs, ``dtype`` computation."""
        return jmp.Policy(
            param_dtype=jnp.float32, compute_dtype=jnp.dtype(self.dtype), output_dtype=jnp.float32
        )

    def eps(self) -> float:
        """The compute dtype's machine epsilon: the smallest relative residual it resolves."""
        return float(jnp.finfo(jnp.dtype(self.dtype)).eps)

    def resolvable(self, **tols: float) -> dict[str, float]:
        """``{flag: tolerance}`` for each of ``tols`` (``flag=value``) below what the compute
        dtype resolves: the round tolerance just above its machine epsilon (bfloat16: 0.01)."""
        eps = self.eps()
        return {flag: _above(eps) for flag, tol in tols.items() if tol < eps}

    def check_tol(self, **tols: float) -> str | None:
        """A message refusing the first tolerance (``flag=value``) below the compute dtype's
        resolution, or ``None``."""
        eps = self.eps()
        for flag, tol in tols.items():
            if tol < eps:
                return (
                    f"--{flag} {tol:g} is below what --dtype {self.dtype} resolves (machine "
                    f"epsilon {eps:.1e}): the DEQ's relative residual cannot go below about eps, "
                    f"so every solve would stall. Pass --{flag} {_above(eps):g} or larger with "
                    f"--dtype {self.dtype}, or a wider --dtype."
                )
        return None

    def loss_scale(self) -> jmp.LossScale:
        """The loss scale of the gradients: static ``2^10`` for float16, none otherwise."""
        if self.dtype == "float16":
            return jmp.StaticLossScale(jnp.float32(FLOAT16_LOSS_SCALE))
        return jmp.NoOpLossScale()

    def apply(self, module: type[hk.Module], fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` (a Haiku ``init`` or ``apply``) with the policy on ``module``'s class while it
        runs (it traces the model then), ``fn`` itself for float32."""
        if self.dtype == "float32":
            return fn
        policy = self.policy()

        def with_policy(*args: Any, **kwargs: Any) -> Any:
            with hk.mixed_precision.push_policy(module, policy):
                return fn(*args, **kwargs)

        return with_policy

    def apply_each(self, module: type[hk.Module], fns: Any) -> Any:
        """A NamedTuple of Haiku functions (e.g. ``dq.models.ClassifierFns``), each under
        :meth:`apply`."""
        return fns._replace(**{k: self.apply(module, f) for k, f in fns._asdict().items()})


FLOAT32 = DtypeConfig()  # the default: no policy


def dtype_tolerances(config: Any, defaults: Any) -> dict[str, float]:
    """The tolerances ``config``'s ``--dtype`` gives the flags it is not given: ``{flag:
    tolerance}`` for each tolerance flag (those its sections declare in ``TOLERANCES``) whose
    value in ``defaults`` the dtype cannot resolve (:meth:`DtypeConfig.resolvable`); ``{}``
    without a :class:`DtypeConfig` section."""
    compute = find_section(config, DtypeConfig)
    if compute is None:
        return {}
    values = flat_dict(defaults)
    return compute.resolvable(
        **{flag: values[flag] for flag in chain(*declared(config, "TOLERANCES"))}
    )


def tolerance_note(config: Any, picked: Mapping[str, float], defaults: Any) -> str | None:
    """The line a run prints when ``--dtype`` picked the tolerances ``picked`` (``{flag:
    tolerance}``) in place of ``defaults``' values, or ``None`` when it picked none."""
    compute = find_section(config, DtypeConfig)
    if not picked or compute is None:
        return None
    values = flat_dict(defaults)
    flags = " and ".join(f"--{f} {tol:g} (default {values[f]:g})" for f, tol in picked.items())
    return f"--dtype {compute.dtype} picks {flags}, above its machine epsilon {compute.eps():.1e}"


def _above(eps: float) -> float:
    """The round tolerance (1, 2 or 5 times a power of ten) just above ``eps``."""
    power = 10.0 ** math.floor(math.log10(eps))
    return next(m * power for m in (1.0, 2.0, 5.0, 10.0) if m * power >= eps)
