"""The periodic actions of :func:`~deqjax.training.train_loop`, one per module (public API:
:mod:`deqjax.training`)."""
