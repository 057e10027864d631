"""Random-matrix initializers for DEQs (init paper): Haiku classes and their pure samplers.

Haiku: ``Gaussian``, ``HaarOrthogonal``, ``GOE``, ``Antisymmetric``, ``HaarNormal`` (pass as
``w_init=``). Pure functions of a key (no Haiku state): ``gaussian``, ``haar_orthogonal``, ``goe``,
``antisymmetric``, ``haar_normal``. Weights of shape ``[..., fan_out]`` are sampled as the matrix
``[prod(shape[:-1]), fan_out]``; every family satisfies ``E[(1/n) tr(W W^T)] = scale**2``.
"""

from deqjax._src.initializers import GOE, Antisymmetric, Gaussian, HaarNormal, HaarOrthogonal
from deqjax._src.random_matrices import (
    EigenvalueSampler,
    antisymmetric,
    gaussian,
    goe,
    haar_normal,
    haar_orthogonal,
    matrix_dims,
)

__all__ = [
    "GOE",
    "Antisymmetric",
    "EigenvalueSampler",
    "Gaussian",
    "HaarNormal",
    "HaarOrthogonal",
    "antisymmetric",
    "gaussian",
    "goe",
    "haar_normal",
    "haar_orthogonal",
    "matrix_dims",
]
