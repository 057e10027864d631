"""Training infrastructure (public API: :mod:`deqjax.training`)."""
