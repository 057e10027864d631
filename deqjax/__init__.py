"""deqjax: deep equilibrium models in JAX and Haiku.

>>> import deqjax as dq
>>> sol = dq.solvers.anderson(f, z0)                 # z = f(z), any pytree
>>> z_star, sol = dq.fixed_point(f, params, x, z0)  # differentiable in params and x
"""

from deqjax import (
    data,
    initializers,
    jacobian,
    models,
    nn,
    regularization,
    solvers,
    theory,
    training,
)
from deqjax._src.adjoints import (
    Adjoint,
    BackwardStats,
    ImplicitAdjoint,
    OneStepAdjoint,
    PhantomAdjoint,
    ReversibleAdjoint,
    ShineAdjoint,
    UnrolledAdjoint,
)
from deqjax._src.fixed_point import fixed_point
from deqjax._src.fixed_point_correction import (
    correction_loss,
    correction_states,
    correction_weights,
    uniform_sample_steps,
)

__version__ = "0.1.0"

__all__ = [
    "Adjoint",
    "BackwardStats",
    "ImplicitAdjoint",
    "OneStepAdjoint",
    "PhantomAdjoint",
    "ReversibleAdjoint",
    "ShineAdjoint",
    "UnrolledAdjoint",
    "correction_loss",
    "correction_states",
    "correction_weights",
    "data",
    "fixed_point",
    "initializers",
    "jacobian",
    "models",
    "nn",
    "regularization",
    "solvers",
    "theory",
    "training",
    "uniform_sample_steps",
]
