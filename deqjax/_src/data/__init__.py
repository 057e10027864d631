"""Data sources and batching for training loops (public API: :mod:`deqjax.data`)."""
