"""Every point of the init paper's Figs. 1-4: one row per figure, ensemble, scale and seed."""

from deqjax import theory


def test_rows_of_a_small_run():
    kw = dict(n=16, phi="tanh", steps=20, batch=2, sigma_x=1.0, scales=[0.3, 2.0])
    rows = theory.monte_carlo_rows(**kw, linear_scales=[0.2], num_seeds=2, seed=0)
    assert len(rows) == 3 * 2 * (1 + 3 * 2)  # ensembles x seeds x (fig1 + figs 2-4 per scale)
    keys = ["figure", "quantity", "ensemble", "scale", "seed", "n", "empirical", "theory"]
    assert all(list(r) == keys for r in rows)
    quantities = {r["figure"]: r["quantity"] for r in rows}
    assert quantities == {
        "fig1": "linear_trace",
        "fig2": "q",
        "fig3": "jacobian_radius",
        "fig4": "residual_after_20",
    }
    for r in rows:
        if r["figure"] == "fig4":  # the predicted critical scale of the row's ensemble
            assert r["theory"] == float(theory.critical_scale(r["ensemble"], "tanh"))
        if r["figure"] == "fig2":  # q >= sigma_x^2 = 1 in theory; a mean of squares measured
            assert r["theory"] >= 1.0 and r["empirical"] > 0
    again = theory.monte_carlo_rows(**kw, linear_scales=[0.2], num_seeds=1, seed=0)
    first_seed = [r for r in rows if r["seed"] == 0]
    assert again == first_seed  # a point does not depend on the other points
