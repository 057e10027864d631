"""Random-matrix initializers for DEQs (init paper §2, §5.3): Haiku initializers and pure samplers.

One naming rule. A CamelCase name is an initializer object, passed as ``w_init=`` to any Haiku
module and called by Haiku as ``(shape, dtype) -> array`` with a key from ``hk.next_rng_key()``,
or as ``kernel_init=`` to a Flax module, called as JAX's ``(key, shape, dtype) -> array``:
``Gaussian``, ``HaarOrthogonal``, ``GOE``, ``Antisymmetric``, ``HaarNormal``. The snake_case name
of the same family is its pure sampler, a function of a key with no Haiku state:
``gaussian(key, shape, *, scale=1.0, dtype=None)``, ``haar_orthogonal``, ``goe``,
``antisymmetric``, ``haar_normal(key, shape, eigenvalue_sampler, *, scale, normalize, dtype)``
(the key first, as in ``jax.random``). The object calls its sampler with Haiku's key.

Weights of shape ``[..., fan_out]`` are sampled as the matrix ``[prod(shape[:-1]), fan_out]``
(:func:`matrix_dims`); every family satisfies ``E[(1/n) tr(W W^T)] = scale**2``.

>>> linear = hk.Linear(256, w_init=dq.initializers.HaarOrthogonal(0.9))
>>> w = dq.initializers.haar_orthogonal(jax.random.key(0), (256, 256), scale=0.9)
"""

from deqjax._src.initializers import GOE, Antisymmetric, Gaussian, HaarNormal, HaarOrthogonal
from deqjax._src.random_matrices import (
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
