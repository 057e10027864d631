"""The exact implicit gradient by dense linear algebra, a reference for gradient tests."""

import jax
import jax.numpy as jnp


def dense_implicit_grad(f, params, x, z_star, loss_of_z):
    """``dℓ/dparams`` at the fixed point ``z* = f(params, x, z*)`` (a vector ``z*``).

    DEQ paper Theorem 1: ``uᵀ ∂f/∂θ`` with ``(I − J_f(z*))ᵀ u = ∂ℓ/∂z*``, ``J_f`` formed densely.
    """
    jac = jax.jacobian(f, argnums=2)(params, x, z_star)
    u = jnp.linalg.solve((jnp.eye(z_star.size) - jac).T, jax.grad(loss_of_z)(z_star))
    _, vjp = jax.vjp(lambda p: f(p, x, z_star), params)
    return vjp(u)[0]
