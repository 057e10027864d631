"""The experiment harness behind ``deqjax.harness``: configuration dataclasses, the command line, run
folders, plots and sweeps. Nothing in the library (solvers, nn, models, training, data) imports it."""
