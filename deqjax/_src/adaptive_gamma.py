"""An adaptive controller for the Jacobian-regularization strength ``γ``.

The JR paper (App. B.3, Fig. 10c) observes that under a fixed ``γ`` the Jacobian norm still creeps
up during training, so the solver's convergence within its step budget slowly degrades, and calls
for adaptive ``γ`` scheduling (left to future work). :class:`AdaptiveGamma` closes that loop on a
*difficulty signal* measured every step from the forward solve, with a target:

* the forward solver's relative residual at its step budget (target: its tolerance ε), e.g.
  ``jnp.mean(sol.rel_residual)``;
* the NFE needed to reach the tolerance (target: the NFE you want to pay), e.g.
  ``jnp.mean(sol.num_steps)`` of a solve whose budget is larger than the target;
* the fraction of examples that did not converge (target: the fraction you tolerate).

The rule (a multiplicative controller with a dead band, bounded; one call per step)::

    s̄ ← s                          on the first update
    s̄ ← β s̄ + (1 − β) s            afterwards (EMA smoothing, β = smoothing)
    γ ← min(γ · increase, γ_max)   if s̄ > target                 (struggling: regularize more)
    γ ← max(γ · decrease, γ_min)   if s̄ < lower_ratio · target   (comfortably below: relax)
    γ unchanged                     otherwise

A non-finite signal (a diverged or NaN solve) raises ``γ`` and leaves ``s̄`` unchanged. Because the
update is multiplicative, ``γ`` moves on a log scale: ``n`` consecutive raises multiply it by
``increaseⁿ``; an ``increase`` above ``1 / decrease`` reacts to trouble faster than it relaxes.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from deqjax._src import checks


class AdaptiveGammaState(NamedTuple):
    """State of :class:`AdaptiveGamma`; pass it in and out of the jitted training step."""

    gamma: jax.Array  # float32 []: the current γ
    signal: jax.Array  # float32 []: EMA of the difficulty signal (NaN before the first update)
    count: jax.Array  # int32 []: number of updates so far


def _check_positive(value, name: str) -> None:
    if not (np.isfinite(checks.check_real(value, name)) and value > 0):
        raise ValueError(f"{name} must be finite and > 0, got {value}.")


@dataclasses.dataclass(frozen=True)
class AdaptiveGamma:
    """Adaptive ``γ``: raised while the forward solve misses its target, lowered when well within.

    See the module docstring for the update rule. ``init`` and ``update`` are pure and
    jit-friendly; feed ``state.gamma`` to ``JacobianRegularizer.penalty(..., gamma=state.gamma)``.

    Args:
      init_gamma: the starting ``γ``, in ``[min_gamma, max_gamma]``.
      target: the signal's target (e.g. the forward tolerance ε, or a target NFE); ``> 0``.
      lower_ratio: ``γ`` decreases only when the smoothed signal is below ``lower_ratio · target``;
        in ``(0, 1]`` (1 disables the dead band).
      increase: multiplicative raise per step, ``> 1``.
      decrease: multiplicative decay per step, in ``(0, 1)``.
      min_gamma: lower bound, ``> 0`` (a multiplicative rule cannot leave 0).
      max_gamma: upper bound, ``>= min_gamma``.
      smoothing: EMA coefficient ``β`` of the signal, in ``[0, 1)`` (0: no smoothing).

    Raises:
      ValueError: naming the first invalid argument.

    Example:
      >>> ctrl = AdaptiveGamma(init_gamma=1.0, target=1e-3)   # forward tolerance ε = 1e-3
      >>> state = ctrl.init()
      >>> # inside the jitted step, after the forward solve with budget 6:
      >>> jr, m = reg.penalty(f_z, z_star, key, gamma=state.gamma)
      >>> state = ctrl.update(state, jnp.mean(sol.rel_residual))
    """

    init_gamma: float
    target: float
    lower_ratio: float = 0.5
    increase: float = 1.05
    decrease: float = 0.99
    min_gamma: float = 1e-3
    max_gamma: float = 100.0
    smoothing: float = 0.9

    def __post_init__(self):
        for name in ("init_gamma", "target", "lower_ratio", "increase", "decrease", "min_gamma"):
            _check_positive(getattr(self, name), name)
        _check_positive(self.max_gamma, "max_gamma")
        if self.lower_ratio > 1.0:
            raise ValueError(f"lower_ratio must be in (0, 1], got {self.lower_ratio}.")
        if self.increase <= 1.0:
            raise ValueError(f"increase must be > 1, got {self.increase}.")
        if self.decrease >= 1.0:
            raise ValueError(f"decrease must be in (0, 1), got {self.decrease}.")
        if self.max_gamma < self.min_gamma:
            raise ValueError(
                f"max_gamma must be >= min_gamma, got max_gamma={self.max_gamma}, "
                f"min_gamma={self.min_gamma}."
            )
        if not self.min_gamma <= self.init_gamma <= self.max_gamma:
            raise ValueError(
                f"init_gamma must be in [min_gamma, max_gamma] = [{self.min_gamma}, "
                f"{self.max_gamma}], got {self.init_gamma}."
            )
        if not 0.0 <= checks.check_real(self.smoothing, "smoothing") < 1.0:
            raise ValueError(f"smoothing must be in [0, 1), got {self.smoothing!r}.")

    def init(self) -> AdaptiveGammaState:
        """The initial state: ``γ = init_gamma``, no signal seen yet."""
        return AdaptiveGammaState(
            gamma=jnp.asarray(self.init_gamma, jnp.float32),
            signal=jnp.asarray(jnp.nan, jnp.float32),
            count=jnp.zeros((), jnp.int32),
        )

    def update(self, state: AdaptiveGammaState, signal: jax.typing.ArrayLike) -> AdaptiveGammaState:
        """One controller step from this step's difficulty signal.

        Args:
          state: the current state.
          signal: the measured signal, a scalar or an array (averaged), e.g. the batch's
            ``sol.rel_residual`` or ``sol.num_steps``; treated as a float, no gradient.

        Returns:
          The next state.
        """
        s = jnp.mean(jnp.asarray(jax.lax.stop_gradient(signal)).astype(jnp.float32))
        finite = jnp.isfinite(s)
        beta = jnp.asarray(self.smoothing, jnp.float32)
        smoothed = jnp.where(state.count == 0, s, beta * state.signal + (1 - beta) * s)
        ema = jnp.where(finite, smoothed, state.signal)
        target = jnp.asarray(self.target, jnp.float32)
        raise_ = ~finite | (ema > target)
        lower = finite & (ema < self.lower_ratio * target)
        factor = jnp.where(raise_, self.increase, jnp.where(lower, self.decrease, 1.0))
        gamma = jnp.clip(state.gamma * factor.astype(jnp.float32), self.min_gamma, self.max_gamma)
        return AdaptiveGammaState(
            gamma=gamma.astype(jnp.float32),
            signal=ema,
            count=jnp.where(finite, state.count + 1, state.count).astype(jnp.int32),
        )
