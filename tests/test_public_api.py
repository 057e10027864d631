"""The public names of DESIGN.md's contract are importable from the package."""

import deqjax as dq


def test_solver_names():
    for name in ["fixed_point_iteration", "anderson", "broyden", "reversible", "Solution"]:
        assert callable(getattr(dq.solvers, name))
    codes = {dq.solvers.CONVERGED, dq.solvers.MAX_STEPS, dq.solvers.DIVERGED, dq.solvers.NONFINITE}
    assert len(codes) == 4


def test_package_modules_and_contract_names():
    for name in [
        "fixed_point",
        "ImplicitAdjoint",
        "PhantomAdjoint",
        "OneStepAdjoint",
        "UnrolledAdjoint",
        "ReversibleAdjoint",
    ]:
        assert hasattr(dq, name)
    assert callable(dq.jacobian.frobenius_sq) and callable(dq.jacobian.spectral_radius)
    for name in ["Gaussian", "HaarOrthogonal", "GOE"]:
        assert hasattr(dq.initializers, name)
    assert callable(dq.theory.linear_second_moment) and callable(dq.theory.spectral_radius)
    for name in ["DEQ", "MLPCell", "TransformerCell", "MultiscaleCell", "TrellisCell"]:
        assert hasattr(dq.nn, name)
    assert hasattr(dq.nn, "WeightNorm") and hasattr(dq.nn, "VariationalDropout")
    assert hasattr(dq.regularization, "JacobianRegularizer")
    assert hasattr(dq.regularization, "AdaptiveGamma")
    assert callable(dq.training.fit) and callable(dq.data.load_fashion_mnist)
    for name in dq.__all__:
        assert hasattr(dq, name)


def test_shine_and_fixed_point_correction_names():
    assert issubclass(dq.ShineAdjoint, dq.Adjoint)
    assert hasattr(dq.solvers, "BroydenInverse")
    for name in [
        "correction_states",
        "correction_loss",
        "correction_weights",
        "uniform_sample_steps",
    ]:
        assert callable(getattr(dq, name))
    assert {"samples", "inverse_estimate"} <= set(dq.solvers.Solution._fields)


def test_solver_objects_and_summary_names():
    for name in [
        "FixedPointIteration",
        "Anderson",
        "Broyden",
        "Reversible",
        "GMRES",
        "BiCGStab",
        "NormalCG",
    ]:
        assert issubclass(getattr(dq.solvers, name), dq.solvers.Solver)
    for name in ["summarize", "as_solver", "from_dict"]:
        assert callable(getattr(dq.solvers, name))
    for name in dq.solvers.__all__:
        assert hasattr(dq.solvers, name)
