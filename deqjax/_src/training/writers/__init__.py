"""Where a run's metric records go, one writer per module (public API: :mod:`deqjax.training`)."""
