"""The experiment harness behind ``deqjax.harness``: configuration dataclasses, the command line,
run folders, plots and sweeps. No library module (solvers, nn, models, training, data) imports it.
"""
