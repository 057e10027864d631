"""Gradient strategies for :func:`deqjax.fixed_point`: how ``∂ℓ/∂θ`` reaches through ``z*``.

Every strategy returns the forward solver's fixed point unchanged; only the gradient differs. One
file per idea:

* ``base.py`` — the :class:`Adjoint` interface and what the strategies share.
* ``backward_stats.py`` — :class:`BackwardStats`, the gradient channel of the backward's statistics.
* ``implicit.py`` — :class:`ImplicitAdjoint`, the exact implicit-function-theorem gradient (DEQ
  paper, Thm. 1) with a VJP-only backward solve, its fallback and failure policy.
* ``forward_mode.py`` — ``ImplicitAdjoint(forward_mode=True)``: the same gradient as a
  ``jax.custom_jvp`` whose tangent is a linear solve, so ``jax.jvp``/``jacfwd``/``hessian`` work.
* ``phantom.py`` — :class:`PhantomAdjoint`, a few damped steps from ``z*`` (Geng et al. 2021).
* ``one_step.py`` — :class:`OneStepAdjoint`, Jacobian-free backprop (Fung et al. 2022).
* ``unrolled.py`` — :class:`UnrolledAdjoint`, backprop through every solver step (O(steps) memory).
* ``shine.py`` — :class:`ShineAdjoint`, the forward Broyden inverse estimate (Ramzi et al. 2022).
* ``reversible.py`` — :class:`ReversibleAdjoint`, the reversible solver's steps reversed
  (McCallum, Arora, Foster 2025).

Three of them need their own backward pass, hence three ``jax.custom_vjp`` sites: implicit, SHINE
and reversible; forward mode is the one ``jax.custom_jvp`` site. The strategies and
``BackwardStats`` are re-exported here (public as ``dq.*``).
"""

from deqjax._src.adjoints.backward_stats import BackwardStats as BackwardStats
from deqjax._src.adjoints.base import Adjoint as Adjoint
from deqjax._src.adjoints.implicit import ImplicitAdjoint as ImplicitAdjoint
from deqjax._src.adjoints.one_step import OneStepAdjoint as OneStepAdjoint
from deqjax._src.adjoints.phantom import PhantomAdjoint as PhantomAdjoint
from deqjax._src.adjoints.reversible import ReversibleAdjoint as ReversibleAdjoint
from deqjax._src.adjoints.shine import ShineAdjoint as ShineAdjoint
from deqjax._src.adjoints.unrolled import UnrolledAdjoint as UnrolledAdjoint
