"""``experiments/cifar10_mdeq.py`` (issue 8): inference-budget semantics and a smoke run.

The budget tests call the experiment's model builder directly on a tiny MDEQ (random parameters
of the right structure, from ``jax.eval_shape`` of ``init``: no init compile) and check the rule
of the module docstring against the cell applied by hand: budget 1 reads ``f(z0)``; budget ``b``
reads ``f(z_best)`` with ``z_best`` one of the ``≤ b`` iterates the solver evaluated; the reported
NFE never exceeds ``b``; a converged solve stops early. The smoke run is a subprocess
(``_run_experiment.run_smoke``); its outputs are checked for the data-source label and metrics.
"""

from __future__ import annotations

import sys

import haiku as hk
import jax
import numpy as np
import pytest
from _run_experiment import ROOT, run_smoke

sys.path.insert(0, str(ROOT / "experiments"))
import cifar10_mdeq as cm  # noqa: E402

BATCH = 3


@pytest.fixture(scope="module")
def setup():
    """A tiny config, random float32 parameters, images, and the cell applied by hand."""
    cfg = cm.parse_args(["--smoke"])  # channels (4, 8), 2 groups, expansion 1, stem stride 2
    rng = np.random.default_rng(0)
    images = rng.normal(size=(BATCH, 32, 32, 3)).astype(np.float32)
    init = cm.build(cfg, 1).init
    shapes = jax.eval_shape(lambda k, x: init(k, x, False, 0), jax.random.PRNGKey(0), images)
    params = jax.tree.map(
        lambda s: np.asarray(0.5 * rng.normal(size=s.shape), np.float32) + np.float32(0.5), shapes
    )

    def direct(images, n):  # stem, then the cell applied n times to z0, outside any DEQ
        x = cm.stem(images, channels=4, stride=cfg.stem_stride, num_groups=cfg.num_groups)
        cell = cm.make_cell(cfg)
        z = cell.initial_state(x)
        for _ in range(n):
            z = cell(z, x, is_training=False)
        return z

    direct_params = {k.replace("deq/lifted/", ""): v for k, v in params.items()}
    apply_direct = jax.jit(hk.transform(direct).apply, static_argnums=3)
    f1 = apply_direct(direct_params, None, images, 1)  # f(z0)
    f2 = apply_direct(direct_params, None, images, 2)  # f(f(z0))
    return cfg, params, images, f1, f2


def readout(params, images, budget, **overrides):
    cfg = cm.parse_args(["--smoke"] + [f"--{k}={v}" for k, v in overrides.items()])
    logits, aux = jax.jit(lambda p, x: cm.build(cfg, budget).apply(p, None, x, False, 0))(
        params, images
    )
    assert np.all(np.isfinite(np.asarray(logits)))
    return {k: np.asarray(v) if k != "readout" else v for k, v in aux.items()}


def assert_tree_close(a, b, rows=slice(None)):
    for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(np.asarray(u)[rows], np.asarray(v)[rows], rtol=2e-5, atol=2e-5)


def test_budget_one_is_one_cell_application_to_z0(setup):
    _, params, images, f1, _ = setup
    aux = readout(params, images, 1)
    assert_tree_close(aux["readout"], f1)
    np.testing.assert_array_equal(aux["nfe"], 1)
    np.testing.assert_array_equal(aux["executed"], 1)
    np.testing.assert_allclose(aux["residual"], 1.0, rtol=1e-6)  # z0 = 0: ||f(0) - 0|| / ||f(0)||


def test_budget_two_reads_the_best_of_two_evaluations(setup):
    # Anderson's first proposal is x1 = f(x0); budget 2 evaluates f(x0), f(x1) and reads f(x_best):
    # f(f(z0)) where x1 has the lower residual (< 1 = x0's), else f(z0). Not budget 1's value.
    _, params, images, f1, f2 = setup
    aux = readout(params, images, 2, tol=0.0)
    np.testing.assert_array_equal(aux["nfe"], 2)
    np.testing.assert_array_equal(aux["executed"], 3)
    took_x1 = aux["residual"] < 1.0
    assert took_x1.any()
    for i in range(BATCH):
        assert_tree_close(aux["readout"], f2 if took_x1[i] else f1, rows=i)


def test_nfe_never_exceeds_budget_and_converged_solves_stop_early(setup):
    _, params, images, f1, _ = setup
    aux = readout(params, images, 5, tol=0.0)  # never converges: uses the whole budget
    np.testing.assert_array_equal(aux["nfe"], 5)
    np.testing.assert_array_equal(aux["executed"], 6)
    # A loose tolerance: converged after the first evaluation, so NFE = 1 whatever the budget,
    # and the readout is f(z0) again (the only evaluated iterate is z0).
    aux = readout(params, images, 5, tol=10.0)
    np.testing.assert_array_equal(aux["nfe"], 1)
    np.testing.assert_array_equal(aux["executed"], 2)
    assert_tree_close(aux["readout"], f1)


def test_bad_budget_raises():
    with pytest.raises(ValueError, match="budget"):
        cm.eval_solver_for(0, tol=1e-3)


@pytest.mark.slow  # ~45 s alone (three XLA compiles of the MDEQ), more on a loaded machine
def test_cifar10_mdeq_smoke(tmp_path):
    summary = run_smoke("cifar10_mdeq.py", tmp_path, "--gammas", "1.0", "--budgets", "1,3")
    assert summary["is_standin"] == summary["data_source"].startswith("STAND-IN: ")
    (r,) = summary["results"]
    assert r["gamma"] == 1.0
    assert set(r["by_budget"]) == {"1", "3"}
    for budget, v in r["by_budget"].items():
        assert 0.0 <= v["test_accuracy"] <= 1.0
        assert 1 <= v["nfe_mean"] <= v["nfe_max"] <= int(budget)
        assert v["executed_mean"] <= int(budget) + 1
        assert v["images_per_s"] > 0
    assert r["by_budget"]["1"]["nfe_max"] == 1
    assert r["train_images_per_s"] > 0 and np.isfinite(r["train_jac_last"])
    table = (tmp_path / "table.md").read_text()
    assert summary["data_source"] in table and "b=3" in table
    assert (tmp_path / "accuracy_vs_budget.png").stat().st_size > 0
