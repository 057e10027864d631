"""Forward solvers for ``z = f(z)``: the solution type, the one stopping rule, the driver, one file
per solver, the Krylov solvers, the settings they share and the objects that hold them."""
