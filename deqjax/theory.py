"""Theory of DEQs at initialization (init paper): linear second moment, mean-field variance,
Theorem 3.2 spectral radius and the predicted critical scale. Pure JAX, no Haiku.

``ensemble`` is ``"gaussian"``, ``"orthogonal"`` or ``"goe"``; ``phi`` is one of ``"tanh"``,
``"relu"``, ``"hardtanh"``, ``"linear"`` or an elementwise callable (quadrature + ``jax.grad``).
"""

from deqjax._src.theory import (
    ENSEMBLES,
    PHI_NAMES,
    activation,
    critical_scale,
    gaussian_expectation,
    linear_second_moment,
    mean_field_variance,
    phi_prime_second_moment,
    phi_second_moment,
    predicted_radius,
    spectral_radius,
)

__all__ = [
    "ENSEMBLES",
    "PHI_NAMES",
    "activation",
    "critical_scale",
    "gaussian_expectation",
    "linear_second_moment",
    "mean_field_variance",
    "phi_prime_second_moment",
    "phi_second_moment",
    "predicted_radius",
    "spectral_radius",
]
