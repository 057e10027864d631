"""deqjax: deep equilibrium models in JAX and Haiku.

>>> import deqjax as dq
>>> sol = dq.solvers.anderson(f, z0)
>>> z_star, sol = dq.fixed_point(f, params, x, z0)
"""

from deqjax import solvers

__version__ = "0.1.0"

__all__ = ["solvers"]
