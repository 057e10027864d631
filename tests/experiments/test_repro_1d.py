"""``experiments/repro_1d.py`` (REPRODUCTION.md claim 3): synthetic_1d with Broyden budgets."""

from experiments import repro_1d


def test_budgets_replace_the_solvers_and_the_rest_is_synthetic_1d():
    argv = ["--fwd_steps", "30", "--bwd_steps", "20", "--num_seeds", "8", "--gammas", "0", "1"]
    c = repro_1d.EXPERIMENT.parse([*argv, "--no_adaptive", "--out_dir", "runs/x"])
    assert (c.fwd_steps, c.bwd_steps, c.num_seeds, c.gammas) == (30, 20, 8, (0.0, 1.0))
    (settings, runs), extra = repro_1d.setup(c)
    assert settings.forward.max_steps == 30 and settings.backward.max_steps == 20
    assert extra["settings"] == settings and runs.names == ("gamma=0", "gamma=1")
    assert repro_1d.EXPERIMENT.parse(["--smoke"]).epochs == 2  # synthetic_1d's smoke
