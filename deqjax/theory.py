"""Theory of DEQs at initialization (init paper: "Deep equilibrium networks are sensitive to
initialization statistics"). Pure JAX, no Haiku.

Predictions in the large-width limit, for ``W`` from an ``ensemble`` (``ENSEMBLES``: ``"gaussian"``,
``"orthogonal"``, ``"goe"``) at ``scale`` (``E[(1/n) tr(W W^T)] = scale**2``):
:func:`linear_second_moment` (the linear DEQ, Eq. 8-11), :func:`mean_field_variance` (Theorem 3.1),
:func:`spectral_radius` (Theorem 3.2, at a given ``q``), :func:`predicted_radius` (at the mean-field
``q``) and :func:`critical_scale` (where that radius reaches 1). Their measurements on one random
matrix: :func:`sample_matrix`, :func:`linear_trace`, :func:`forward_iteration`,
:func:`jacobian_radius`, and :func:`monte_carlo_rows` for every point of the paper's Figs. 1-4.
``phi`` is a name in ``PHI_NAMES`` or an elementwise callable (exact moments when it is piecewise
linear, see :func:`piecewise_linear`; Gauss–Hermite quadrature otherwise, see
:func:`gaussian_expectation`, :func:`phi_second_moment`, :func:`phi_prime_second_moment`).

Argument order, in every function: what is predicted or measured (a ``scale``, or a matrix ``w``),
then ``ensemble``, then the state (the variance ``q``, or the pre-activations ``h`` / inputs ``x``),
then ``phi``; options are keyword-only. Random draws take the key first, as ``jax.random`` does.

>>> q = dq.theory.mean_field_variance(0.9, "goe", "tanh")
>>> dq.theory.spectral_radius(0.9, "goe", q, "tanh")           # the prediction
>>> w = dq.theory.sample_matrix(jax.random.key(0), 500, 0.9, "goe")
>>> _, _, h = dq.theory.forward_iteration(w, x, "tanh", steps=200)
>>> dq.theory.jacobian_radius(w, "goe", h[:, 0], "tanh")        # its measurement
"""

from deqjax._src.theory.activations import PHI_NAMES
from deqjax._src.theory.critical_scale import critical_scale
from deqjax._src.theory.ensembles import ENSEMBLES
from deqjax._src.theory.gaussian_moments import (
    gaussian_expectation,
    phi_prime_second_moment,
    phi_second_moment,
)
from deqjax._src.theory.linear_second_moment import linear_second_moment
from deqjax._src.theory.mean_field_variance import mean_field_variance
from deqjax._src.theory.monte_carlo import (
    forward_iteration,
    jacobian_radius,
    linear_trace,
    sample_matrix,
)
from deqjax._src.theory.monte_carlo_rows import monte_carlo_rows
from deqjax._src.theory.piecewise_linear import PiecewiseLinear, piecewise_linear
from deqjax._src.theory.spectral_radius import predicted_radius, spectral_radius

__all__ = [
    "ENSEMBLES",
    "PHI_NAMES",
    "PiecewiseLinear",
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
