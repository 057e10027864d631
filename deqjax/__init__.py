"""deqjax: deep equilibrium models in JAX.

>>> import deqjax as dq
>>> sol = dq.solvers.anderson(f, z0)                 # z = f(z), any pytree
>>> z_star, sol = dq.fixed_point(f, params, x, z0)  # differentiable in params and x

``import deqjax`` loads only JAX and numpy: the solvers, ``fixed_point``, the adjoints,
``dq.jacobian``, ``dq.initializers``, ``dq.theory`` and ``dq.regularization``. The Haiku layer
``dq.nn``, ``dq.models``, ``dq.training``, ``dq.data`` and ``dq.harness`` (with Haiku, optax, orbax,
matplotlib), and the Flax NNX and Equinox layers ``dq.nnx`` and ``dq.equinox`` (with their
framework), are imported on first use: ``dq.nn.DEQ`` and ``from deqjax import nn`` both work.
"""

import importlib as _importlib

from deqjax import (
    initializers,
    jacobian,
    regularization,
    solvers,
    theory,
)
from deqjax._src.adjoints.backward_stats import BackwardStats
from deqjax._src.adjoints.base import Adjoint
from deqjax._src.adjoints.implicit import ImplicitAdjoint
from deqjax._src.adjoints.one_step import OneStepAdjoint
from deqjax._src.adjoints.phantom import PhantomAdjoint
from deqjax._src.adjoints.reversible import ReversibleAdjoint
from deqjax._src.adjoints.shine import ShineAdjoint
from deqjax._src.adjoints.unrolled import UnrolledAdjoint
from deqjax._src.fixed_point import fixed_point
from deqjax._src.fixed_point_correction import (
    correction_loss,
    correction_states,
    correction_weights,
    uniform_sample_steps,
)

__version__ = "0.2.0"

# Submodules that need Haiku, Flax, Equinox, optax, orbax or matplotlib: imported on first
# attribute access.
_LAZY_SUBMODULES = ("data", "equinox", "harness", "models", "nn", "nnx", "training")

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
    "equinox",
    "fixed_point",
    "harness",
    "initializers",
    "jacobian",
    "models",
    "nn",
    "nnx",
    "regularization",
    "solvers",
    "theory",
    "training",
    "uniform_sample_steps",
]


def __getattr__(name: str):
    """Imports a submodule of ``_LAZY_SUBMODULES`` on first access (PEP 562).

    Raises:
      AttributeError: for any other name, or a lazy submodule that is not installed.
    """
    if name not in _LAZY_SUBMODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        module = _importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{name}":
            raise  # the submodule exists but one of its own imports is missing
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from e
    globals()[name] = module
    return module


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY_SUBMODULES))
