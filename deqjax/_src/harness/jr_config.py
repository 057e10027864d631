"""The Jacobian-regularisation section (JR paper Eq. 4, optionally with an adaptive γ).

Flags ``--jr/--no_jr --gamma --jr_p --jr_samples --adaptive_gamma --gamma_target --gamma_min
--gamma_max``; :meth:`JRConfig.build` gives the regulariser and the γ controller they describe.
"""

from __future__ import annotations

import dataclasses

from deqjax._src.adaptive_gamma import AdaptiveGamma
from deqjax._src.harness.flag_types import NonNegativeFloat, PositiveInt
from deqjax._src.jacobian_regularization import JacobianRegularizer


@dataclasses.dataclass(frozen=True)
class JRConfig:
    """Jacobian regularisation (JR paper Eq. 4): gamma E[||J_f(z*)||_F^2] / d, gated."""

    jr: bool = True  # Jacobian regularisation on (--no_jr: off)
    gamma: NonNegativeFloat = 1.0  # JR strength gamma
    jr_p: float = 0.5  # Bernoulli gate probability p
    jr_samples: PositiveInt = 1  # Hutchinson probes M
    adaptive_gamma: bool = False  # adapt gamma to the residual
    gamma_target: NonNegativeFloat = 0.0  # target residual (0: --tol)
    gamma_min: NonNegativeFloat = 1e-2  # adaptive floor
    gamma_max: NonNegativeFloat = 20.0  # adaptive ceiling

    def build(self, tol: float) -> tuple[JacobianRegularizer | None, AdaptiveGamma | None]:
        """``(regulariser or None, AdaptiveGamma controller or None)``; ``tol`` is the
        adaptive controller's target when ``--gamma_target`` is 0 (the forward tolerance)."""
        if not self.jr:
            return None, None
        reg = JacobianRegularizer(self.gamma, p=self.jr_p, num_samples=self.jr_samples)
        if not self.adaptive_gamma:
            return reg, None
        controller = AdaptiveGamma(
            init_gamma=self.gamma,
            target=self.gamma_target or tol,
            min_gamma=min(self.gamma_min, self.gamma),
            max_gamma=max(self.gamma_max, self.gamma),
        )
        return reg, controller
