"""Theory of DEQs at initialization (init paper: Agarwala & Schoenholz, "Deep equilibrium networks
are sensitive to initialization statistics"), one idea per module. Pure JAX/numpy, no Haiku.

* :mod:`.ensembles` and :mod:`.activations`: the names the theory accepts (``ensemble``, ``phi``).
* :mod:`.gaussian_moments`: ``E[phi(h)^2]`` and ``E[phi'(h)^2]`` for ``h ~ N(0, q)``.
* :mod:`.piecewise_linear`: exact moments of piecewise-linear callables.
* :mod:`.linear_second_moment`: the linear DEQ (Eq. 8-11).
* :mod:`.mean_field_variance`: the non-linear DEQ's variance (Theorem 3.1, Eq. 25).
* :mod:`.spectral_radius`: the Jacobian's spectral radius (Theorem 3.2, Eq. 30; GOE, App. C.1).
* :mod:`.critical_scale`: where that radius reaches 1 (Fig. 4).
* :mod:`.monte_carlo`: the same quantities measured on one random matrix (Figs. 1-4);
  :mod:`.monte_carlo_rows`: every point of those figures.

Argument order, in every function of this package (and of :mod:`deqjax.initializers` and
:mod:`deqjax.jacobian`): what is predicted or measured comes first (a ``scale`` for predictions,
a matrix ``w`` for measurements on one draw), then ``ensemble``, then the state (the
pre-activation variance ``q`` for predictions, the pre-activations ``h`` or inputs ``x`` for
measurements), then ``phi``; every option is keyword-only. A function takes the subset of these it
needs, in this order. Random draws take their key first, as ``jax.random`` does, then the size, then
the law (``sample_matrix(key, n, scale, ensemble)``).
"""
