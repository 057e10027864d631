"""Theory of DEQs at initialization (init paper): linear second moment, mean-field variance,
Theorem 3.2 spectral radius and the predicted critical scale. Pure JAX, no Haiku. Their
Monte-Carlo counterparts on one random matrix: :func:`sample_matrix`, :func:`linear_trace`,
:func:`forward_iteration`, :func:`jacobian_radius`.

``ensemble`` is ``"gaussian"``, ``"orthogonal"`` or ``"goe"``; ``phi`` is one of ``"tanh"``,
``"relu"``, ``"hardtanh"``, ``"linear"`` or an elementwise callable (``jax.grad``; exact moments
when it is piecewise linear, see :func:`piecewise_linear`, Gauss–Hermite quadrature otherwise).
"""

from deqjax._src.theory import (
    ENSEMBLES,
    PHI_NAMES,
    PiecewiseLinear,
    activation,
    critical_scale,
    gaussian_expectation,
    linear_second_moment,
    mean_field_variance,
    phi_prime_second_moment,
    phi_second_moment,
    piecewise_linear,
    predicted_radius,
    spectral_radius,
)
from deqjax._src.theory_empirical import (
    forward_iteration,
    jacobian_radius,
    linear_trace,
    monte_carlo_rows,
    sample_matrix,
)

__all__ = [
    "ENSEMBLES",
    "PHI_NAMES",
    "PiecewiseLinear",
    "activation",
    "critical_scale",
    "forward_iteration",
    "gaussian_expectation",
    "jacobian_radius",
    "linear_second_moment",
    "linear_trace",
    "mean_field_variance",
    "monte_carlo_rows",
    "phi_prime_second_moment",
    "phi_second_moment",
    "piecewise_linear",
    "predicted_radius",
    "sample_matrix",
    "spectral_radius",
]
