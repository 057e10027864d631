"""Jacobian tools for DEQs (JR paper §4): the Hutchinson Frobenius estimate, the power-method
spectral radius and the backward-solve convergence monitor.

>>> f_z = lambda z: cell(params, x, z)
>>> dq.jacobian.frobenius_sq(f_z, z_star, key, num_samples=1)   # ‖J_f(z*)‖²_F / d, unbiased
>>> dq.jacobian.spectral_radius(f_z, z_star, key, num_steps=100) # ρ(J_f(z*)) estimate
>>> dq.jacobian.backward_convergence(cell, params, x, z_star, g, solver=bwd)  # a Solution
"""

from deqjax._src.jacobian import backward_convergence, frobenius_sq, spectral_radius

__all__ = ["backward_convergence", "frobenius_sq", "spectral_radius"]
