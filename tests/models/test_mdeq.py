"""``dq.models.MDEQClassifier``: forward shapes, the inference-budget readout rule, JR entries;
and a smoke run of ``experiments/cifar10_mdeq.py``.

The budget tests run a tiny MDEQ (random float32 parameters of the right structure, from
``jax.eval_shape`` of ``init``: no init compile) and check the rule of the model's docstring
against the cell applied by hand: budget 1 reads ``f(z0)``; budget ``b`` reads ``f(z_best)`` with
``z_best`` one of the ``≤ b`` iterates the solver evaluated (the solver's own ``f_value``: no extra
cell application); the reported NFE never exceeds ``b``; a converged solve stops early. The smoke
run is a subprocess (``tests.helpers.run_experiment.run_smoke``).
"""

from __future__ import annotations

import haiku as hk
import jax
import numpy as np
import pytest

import deqjax as dq

BATCH, CHANNELS, GROUPS = 3, (4, 8), 2


def _model(budget: int, tol: float = 1e-3, regularizer=None) -> hk.Transformed:
    def forward(images, is_training):
        return dq.models.MDEQClassifier(
            CHANNELS,
            num_groups=GROUPS,
            expansion=1,
            deq=dq.models.DEQSettings(
                dq.solvers.Anderson(max_steps=3, tol=tol, m=5),
                eval_solver=dq.models.budget_solver(budget, tol=tol),
                regularizer=regularizer,
            ),
        )(images, is_training=is_training)

    return hk.transform(forward)


@pytest.fixture(scope="module")
def setup():
    """Random float32 parameters, images, and the cell applied by hand once and twice."""
    with jax.enable_x64(False):
        rng = np.random.default_rng(0)
        images = rng.normal(size=(BATCH, 32, 32, 3)).astype(np.float32)
        shapes = jax.eval_shape(
            lambda k, x: _model(1).init(k, x, False), jax.random.PRNGKey(0), images
        )
        params = jax.tree.map(
            lambda s: np.asarray(0.5 * rng.normal(size=s.shape), np.float32) + np.float32(0.5),
            shapes,
        )

        def direct(images, n):  # stem, then the cell applied n times to z0, outside any DEQ
            x = hk.Conv2D(CHANNELS[0], 3, stride=2, with_bias=False, name="stem_conv")(images)
            x = jax.nn.relu(dq.nn.GroupNorm(GROUPS, name="stem_gn")(x))
            cell = dq.nn.MultiscaleCell(CHANNELS, num_groups=GROUPS, expansion=1, name="cell")
            z = cell.initial_state(x)
            for _ in range(n):
                z = cell(z, x, is_training=False)
            return z

        rename = lambda k: (  # noqa: E731
            k.replace("mdeq_classifier/deq/lifted/mdeq_classifier/mdeq_cell", "cell").replace(
                "mdeq_classifier/~stem/", ""
            )
        )
        direct_params = {rename(k): v for k, v in params.items()}
        apply_direct = jax.jit(hk.transform(direct).apply, static_argnums=3)
        f1 = apply_direct(direct_params, None, images, 1)  # f(z0)
        f2 = apply_direct(direct_params, None, images, 2)  # f(f(z0))
    return params, images, f1, f2


def readout(params, images, budget, tol=1e-3):
    with jax.enable_x64(False):
        logits, aux = jax.jit(lambda p, x: _model(budget, tol).apply(p, None, x, False))(
            params, images
        )
    assert logits.shape == (BATCH, 10) and np.all(np.isfinite(np.asarray(logits)))
    assert float(aux["jr"]) == 0.0  # no regularizer at evaluation
    return {k: np.asarray(v) if k not in ("readout", "solver") else v for k, v in aux.items()}


def assert_tree_close(a, b, rows=slice(None)):
    for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(np.asarray(u)[rows], np.asarray(v)[rows], rtol=2e-5, atol=2e-5)


def test_budget_one_is_one_cell_application_to_z0(setup):
    params, images, f1, _ = setup
    aux = readout(params, images, 1)
    assert [r.shape for r in aux["readout"]] == [(BATCH, 16, 16, 4), (BATCH, 8, 8, 8)]
    assert_tree_close(aux["readout"], f1)
    np.testing.assert_array_equal(aux["nfe"], 1)
    np.testing.assert_allclose(aux["residual"], 1.0, rtol=1e-6)  # z0 = 0: ||f(0) - 0|| / ||f(0)||


def test_budget_two_reads_the_best_of_two_evaluations(setup):
    # Anderson's first proposal is x1 = f(x0); budget 2 evaluates f(x0), f(x1) and reads f(x_best):
    # f(f(z0)) where x1 has the lower residual (< 1 = x0's), else f(z0). Not budget 1's value.
    params, images, f1, f2 = setup
    aux = readout(params, images, 2, tol=0.0)
    np.testing.assert_array_equal(aux["nfe"], 2)
    took_x1 = aux["residual"] < 1.0
    assert took_x1.any()
    for i in range(BATCH):
        assert_tree_close(aux["readout"], f2 if took_x1[i] else f1, rows=i)


def test_nfe_never_exceeds_budget_and_converged_solves_stop_early(setup):
    params, images, f1, _ = setup
    aux = readout(params, images, 5, tol=0.0)  # never converges: uses the whole budget
    np.testing.assert_array_equal(aux["nfe"], 5)
    assert float(aux["solver"]["nfe"]) == 5.0
    # A loose tolerance: converged after the first evaluation, so NFE = 1 whatever the budget,
    # and the readout is f(z0) again (the only evaluated iterate is z0).
    aux = readout(params, images, 5, tol=10.0)
    np.testing.assert_array_equal(aux["nfe"], 1)
    assert_tree_close(aux["readout"], f1)


@pytest.mark.slow
def test_training_forward_adds_the_gated_jr_term(setup):
    params, images, _, _ = setup
    reg = dq.regularization.JacobianRegularizer(2.0, p=0.5)
    with jax.enable_x64(False):
        apply = jax.jit(lambda p, k, x: _model(3, regularizer=reg).apply(p, k, x, True))
        gates = []
        for seed in range(10):
            _, aux = apply(params, jax.random.PRNGKey(seed), images)
            applied, frob = float(aux["jr/applied"]), float(aux["jr/frobenius_sq"])
            np.testing.assert_allclose(float(aux["jr"]), 2.0 * applied * frob, rtol=1e-6)
            assert frob > 0 if applied else frob == 0
            gates.append(applied)
    assert 0 < sum(gates) < 10  # the in-graph Bernoulli gate: both outcomes, one compiled step


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="budget"):
        dq.models.budget_solver(0, tol=1e-3)
    with pytest.raises(ValueError, match="images"):
        _model(1).init(jax.random.PRNGKey(0), np.zeros((32, 32, 3), np.float32), False)
    with pytest.raises(ValueError, match="regularizer"):
        dq.models.DEQSettings(regularizer=0.5)
    # A solver where its settings are expected: named, with the type that replaces it.
    bad = hk.transform(
        lambda x: dq.models.MDEQClassifier(deq=dq.solvers.Anderson())(x, is_training=True)
    )
    with pytest.raises(ValueError, match=r"deq must be a dq\.models\.DEQSettings"):
        bad.init(jax.random.PRNGKey(0), np.zeros((1, 32, 32, 3), np.float32))
