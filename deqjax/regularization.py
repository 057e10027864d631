"""Jacobian regularization for training DEQs (JR paper, Eq. 4 and App. A.4) and an adaptive γ.

``JacobianRegularizer(gamma, p=..., num_samples=...)`` gives the Bernoulli-gated Hutchinson penalty
to add to a loss; ``AdaptiveGamma`` (state ``AdaptiveGammaState``) adjusts ``γ`` from the forward
solver's convergence.

>>> reg = dq.regularization.JacobianRegularizer(2.0, p=0.4)
>>> ctrl = dq.regularization.AdaptiveGamma(init_gamma=1.0, target=1e-3)
>>> term, metrics = reg.penalty(lambda z: cell(params, x, z), z_star, key, gamma=state.gamma)
>>> state = ctrl.update(state, jnp.mean(sol.rel_residual))
"""

from deqjax._src.adaptive_gamma import AdaptiveGamma, AdaptiveGammaState
from deqjax._src.jacobian_regularization import JacobianRegularizer

__all__ = ["AdaptiveGamma", "AdaptiveGammaState", "JacobianRegularizer"]
