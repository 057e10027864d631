"""Forward solvers: one file per solver over the shared driver in ``base``."""
