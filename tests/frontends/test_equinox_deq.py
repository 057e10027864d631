"""deqjax.equinox.DEQ as an Equinox module: inference (``eqx.nn.inference_mode``, the call
argument), the dropout key per pass, the cell map for the Jacobian regulariser, ``eqx.filter_jit``/
``eqx.filter_vmap``/``eqx.filter_grad``, an eager call after a weight changed, a short training run
with optax and ``eqx.filter_value_and_grad``, and its errors."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import deqjax as dq
from deqjax._src import compiled

B, DX, D = 3, 5, 4
SOLVER = dq.solvers.Anderson(tol=1e-10, max_steps=40)
EVAL_SOLVER = dq.solvers.FixedPointIteration(tol=1e-3, max_steps=7)


def make_deq(dropout_rate=0.0, seed=0, d=D, **kw):
    cell = dq.equinox.MLPCell(
        DX,
        d,
        form="single",  # phi(W z + u): a contraction for this W, with or without the mask
        w_init=dq.initializers.HaarOrthogonal(0.5),
        dropout_rate=dropout_rate,
        dtype=jnp.float64,
        key=jax.random.key(seed),
    )
    return dq.equinox.DEQ(cell, solver=SOLVER, eval_solver=EVAL_SOLVER, **kw)


def inputs(seed=1):
    return jax.random.normal(jax.random.PRNGKey(seed), (B, DX), jnp.float64)


def test_inference_mode_and_the_call_argument_pick_the_solver():
    deq, x = make_deq(), inputs()
    assert deq(x)[1].trace.shape == (B, 40)
    inference = eqx.nn.inference_mode(deq)
    assert inference.inference and inference.cell.inference
    assert inference(x)[1].trace.shape == (B, 7)
    assert inference(x, inference=False)[1].trace.shape == (B, 40)
    assert deq(x, inference=True)[1].trace.shape == (B, 7)


def test_dropout_key_per_pass_fixed_within_the_pass_none_in_inference():
    deq, x = make_deq(dropout_rate=0.2, d=16), inputs()

    @eqx.filter_jit
    def forward(m, x, key):
        out = m.solve(x, key=key)
        return out.z_star, out.cell_fn(out.z_star)

    z1, fz1 = forward(deq, x, jax.random.key(1))
    z2, _ = forward(deq, x, jax.random.key(2))
    np.testing.assert_allclose(fz1, z1, atol=1e-9)  # one mask for every step of the pass
    assert not np.allclose(z1, z2)
    np.testing.assert_array_equal(forward(deq, x, jax.random.key(1))[0], z1)
    plain = make_deq(d=16)  # inference: no dropout, the same equilibrium as the cell without it
    np.testing.assert_allclose(deq(x, inference=True)[0], plain(x, inference=True)[0], atol=1e-12)
    with pytest.raises(ValueError, match="needs a key"):
        deq(x)


def test_jacobian_regulariser_through_the_cell_map_reaches_the_parameters():
    deq, x, key = make_deq(), inputs(), jax.random.key(4)
    reg = dq.regularization.JacobianRegularizer(1.0)

    def penalty(m):
        out = m.solve(x)
        return reg.penalty(out.cell_fn, out.z_star, key)[0]

    value, grads = eqx.filter_jit(eqx.filter_value_and_grad(penalty))(deq)
    z_star = deq(x)[0]
    want = dq.jacobian.frobenius_sq(lambda z: deq.cell(z, x), z_star, jax.random.split(key)[1])
    np.testing.assert_allclose(value, want, rtol=1e-10)
    assert float(jnp.abs(grads.cell.params["W"]).max()) > 0


def test_filter_jit_vmap_and_grad_agree_with_eager_calls():
    deq, xs = make_deq(), jax.random.normal(jax.random.PRNGKey(2), (2, B, DX), jnp.float64)
    mapped = eqx.filter_vmap(lambda m, x: m(x)[0], in_axes=(None, 0))(deq, xs)
    for i in range(2):
        np.testing.assert_allclose(mapped[i], deq(xs[i])[0], atol=1e-10)
    loss = lambda m: jnp.sum(jnp.sin(m(xs[0])[0]))  # noqa: E731
    eager = eqx.filter_grad(loss)(deq)
    jitted = eqx.filter_jit(eqx.filter_grad(loss))(deq)
    for a, b in zip(jax.tree_util.tree_leaves(eager), jax.tree_util.tree_leaves(jitted)):
        np.testing.assert_allclose(a, b, atol=1e-10)


def test_an_eager_call_with_a_changed_weight_runs_the_cached_program_on_the_new_weight():
    deq, x = make_deq(), inputs()
    z_before, _ = deq(x)
    entries = len(compiled._cache)
    deq = eqx.tree_at(lambda m: m.cell.params["U"], deq, deq.cell.params["U"] * 2.0)
    z_after, _ = deq(x)
    assert len(compiled._cache) == entries  # no new program: the weight is an operand
    z_want, _ = eqx.filter_jit(lambda m, x: m(x))(deq, x)
    np.testing.assert_allclose(z_after, z_want, atol=1e-12)
    assert not np.allclose(z_after, z_before)


def test_optax_training_with_filter_value_and_grad_lowers_the_loss():
    key = jax.random.PRNGKey(0)
    images = jax.random.normal(key, (32, 4, 4), jnp.float32)
    labels = (images.reshape(32, -1) @ jax.random.normal(key, (16, 3), jnp.float32)).argmax(-1)
    model = dq.equinox.MLPClassifier(
        16, 8, 3, solver=dq.solvers.Anderson(tol=1e-4, max_steps=20), key=jax.random.key(0)
    )
    optimizer = optax.adam(3e-2)
    opt_state = optimizer.init(eqx.filter(model, eqx.is_inexact_array))

    def loss_fn(m):
        logits, _ = m(images)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    @eqx.filter_jit
    def train_step(m, opt_state):
        loss, grads = eqx.filter_value_and_grad(loss_fn)(m)
        updates, opt_state = optimizer.update(grads, opt_state, eqx.filter(m, eqx.is_inexact_array))
        return eqx.apply_updates(m, updates), opt_state, loss

    losses = []
    with jax.numpy_dtype_promotion("standard"):  # optax's own arithmetic mixes dtypes
        for _ in range(15):
            model, opt_state, loss = train_step(model, opt_state)
            losses.append(float(loss))
    assert losses[-1] < 0.7 * losses[0], losses


def test_bad_settings_raise_naming_the_argument():
    cell = dq.equinox.MLPCell(DX, D, key=jax.random.key(0))
    for kw, name in [
        (dict(inference="no"), "inference"),
        (dict(solver=3), "solver"),
        (dict(per_example=1), "per_example"),
        (dict(init_state=3), "init_state"),
    ]:
        with pytest.raises(ValueError, match=name):
            dq.equinox.DEQ(cell, **kw)
    with pytest.raises(ValueError, match="d_model"):
        dq.equinox.TransformerCell(DX, 5, num_heads=1, key=jax.random.key(0))
