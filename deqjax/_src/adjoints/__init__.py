"""Gradient strategies for :func:`deqjax.fixed_point`: how ``∂ℓ/∂θ`` reaches through ``z*``.

Every strategy returns the forward solver's fixed point unchanged; only the gradient differs.
Each is a subclass of :class:`~deqjax._src.adjoints.base.Adjoint` in a file of its own (the
implicit gradient, its forward-mode form, the phantom gradient, Jacobian-free backprop,
unrolled backprop, SHINE, the reversible adjoint), imported from there: this package re-exports
nothing, so a new strategy is its file, its test and its line in ``deqjax/__init__.py``. The
strategies with their own derivative rule share the robust backward solve
(``backward_solve.py``), the primal scaffold (``primal.py``) and the refusal of forward mode on
the reverse-mode layers (``reverse_only.py``); ``backward_stats.py`` is the gradient channel of
the backward's statistics.
"""
