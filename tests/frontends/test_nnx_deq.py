"""deqjax.nnx.DEQ as an NNX module: train/eval (``eval()``, ``nnx.view``, the call argument),
the dropout key per pass, the cell map for the Jacobian regulariser, precision, ``nnx.jit``,
``nnx.vmap`` and ``nnx.grad``, an eager call after a weight changed, a short training run with
``nnx.Optimizer``, and its errors."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import deqjax as dq
from deqjax._src import compiled

B, DX, D = 3, 5, 4
SOLVER = dq.solvers.Anderson(tol=1e-10, max_steps=40)
EVAL_SOLVER = dq.solvers.FixedPointIteration(tol=1e-3, max_steps=7)


def make_deq(dropout_rate=0.0, seed=0, d=D, **kw):
    cell = dq.nnx.MLPCell(
        DX,
        d,
        form="single",  # phi(W z + u): a contraction for this W, with or without the mask
        w_init=dq.initializers.HaarOrthogonal(0.5),
        dropout_rate=dropout_rate,
        param_dtype=jnp.float64,
        rngs=nnx.Rngs(seed),
    )
    return dq.nnx.DEQ(cell, solver=SOLVER, eval_solver=EVAL_SOLVER, **kw)


def inputs(seed=1):
    return jax.random.normal(jax.random.PRNGKey(seed), (B, DX), jnp.float64)


def test_eval_train_view_and_the_call_argument_pick_the_solver():
    deq, x = make_deq(), inputs()
    assert deq(x)[1].trace.shape == (B, 40)
    deq.eval()
    assert deq.deterministic and deq(x)[1].trace.shape == (B, 7)
    assert deq(x, deterministic=False)[1].trace.shape == (B, 40)
    deq.train()
    assert not deq.deterministic and deq(x)[1].trace.shape == (B, 40)
    assert nnx.view(deq, deterministic=True)(x)[1].trace.shape == (B, 7)
    assert deq(x, deterministic=True)[1].trace.shape == (B, 7)


def test_dropout_key_per_pass_fixed_within_the_pass_none_in_eval():
    deq, x = make_deq(dropout_rate=0.2, d=16, rngs=nnx.Rngs(dropout=3)), inputs()
    forward = nnx.jit(lambda m, x: (lambda out: (out.z_star, out.cell_fn(out.z_star)))(m.solve(x)))
    z1, fz1 = forward(deq, x)
    z2, _ = forward(deq, x)  # the stream advanced: a fresh mask
    np.testing.assert_allclose(fz1, z1, atol=1e-9)  # one mask for every step of the pass
    assert not np.allclose(z1, z2)
    z_key, _ = deq(x, rngs=jax.random.key(7))
    z_key_again, _ = deq(x, rngs=jax.random.key(7))
    np.testing.assert_array_equal(z_key, z_key_again)
    deq.eval()  # no dropout: the same equilibrium as the cell without it
    plain = make_deq(d=16)
    np.testing.assert_allclose(deq(x)[0], plain(x, deterministic=True)[0], atol=1e-12)


def test_a_training_pass_with_dropout_needs_a_key():
    deq = make_deq(dropout_rate=0.2)
    with pytest.raises(ValueError, match="needs a key"):
        deq(inputs())


def test_jacobian_regulariser_through_the_cell_map_reaches_the_parameters():
    deq, x, key = make_deq(), inputs(), jax.random.key(4)
    reg = dq.regularization.JacobianRegularizer(1.0)

    def penalty(m):
        out = m.solve(x)
        return reg.penalty(out.cell_fn, out.z_star, key)[0]

    value, grads = nnx.jit(nnx.value_and_grad(penalty))(deq)
    z_star = deq(x)[0]
    want = dq.jacobian.frobenius_sq(lambda z: deq.cell(z, x), z_star, jax.random.split(key)[1])
    np.testing.assert_allclose(value, want, rtol=1e-10)
    assert float(jnp.abs(grads["cell"]["params"]["W"][...]).max()) > 0


def test_precision_reaches_every_cell_product(users_default_precision):
    x = inputs().astype(jnp.float32)

    def dots(precision):
        cell = dq.nnx.MLPCell(DX, 7, form="single", rngs=nnx.Rngs(0))
        deq = dq.nnx.DEQ(cell, solver=SOLVER.replace(tol=1e-4), precision=precision)
        text = nnx.jit(lambda m, x: m(x)[0]).lower(deq, x).as_text()
        lines = [ln for ln in text.splitlines() if "dot_general" in ln and "7x7xf32" in ln]
        return [("HIGHEST" in ln) for ln in lines]

    assert all(dots("highest")) and dots("highest")
    assert not all(dots(None))


def test_jit_vmap_and_grad_agree_with_eager_calls():
    deq, xs = make_deq(), jax.random.normal(jax.random.PRNGKey(2), (2, B, DX), jnp.float64)
    mapped = nnx.vmap(lambda m, x: m(x)[0], in_axes=(None, 0))(deq, xs)
    for i in range(2):
        np.testing.assert_allclose(mapped[i], deq(xs[i])[0], atol=1e-10)
    loss = lambda m: jnp.sum(jnp.sin(m(xs[0])[0]))  # noqa: E731
    eager = nnx.grad(loss)(deq)
    jitted = nnx.jit(nnx.grad(loss))(deq)
    for a, b in zip(jax.tree_util.tree_leaves(eager), jax.tree_util.tree_leaves(jitted)):
        np.testing.assert_allclose(a, b, atol=1e-10)


def test_an_eager_call_after_a_weight_changed_runs_the_cached_program_on_the_new_weight():
    deq, x = make_deq(), inputs()
    z_before, _ = deq(x)  # eager: the compiled entry, keyed by the cell's graph
    entries = len(compiled._cache)
    u = deq.cell.params["U"]
    u[...] = u[...] * 2.0  # an in-place change of the module's weight
    z_after, _ = deq(x)
    assert len(compiled._cache) == entries  # no new program: the weight is an operand
    z_want, _ = nnx.jit(lambda m, x: m(x))(deq, x)
    np.testing.assert_allclose(z_after, z_want, atol=1e-12)
    assert not np.allclose(z_after, z_before)


def test_whole_batch_mode_and_a_user_solver_in_the_vmap_mode():
    x = inputs()
    whole = make_deq(per_example=False)
    z_whole, sol = whole(x)
    assert sol.num_steps.shape == ()
    user_solver = lambda f, z0: dq.solvers.anderson(f, z0, tol=1e-10, max_steps=40)  # noqa: E731
    z_vmap, sol_vmap = dq.nnx.DEQ(make_deq().cell, solver=user_solver)(x)
    assert sol_vmap.num_steps.shape == (B,)
    np.testing.assert_allclose(z_vmap, z_whole, atol=1e-8)


def test_nnx_optimizer_training_lowers_the_loss():
    key = jax.random.PRNGKey(0)
    images = jax.random.normal(key, (32, 4, 4), jnp.float32)
    labels = (images.reshape(32, -1) @ jax.random.normal(key, (16, 3), jnp.float32)).argmax(-1)
    model = dq.nnx.MLPClassifier(
        16, 8, 3, solver=dq.solvers.Anderson(tol=1e-4, max_steps=20), rngs=nnx.Rngs(0)
    )
    optimizer = nnx.Optimizer(model, optax.adam(3e-2), wrt=nnx.Param)

    def loss_fn(m):
        logits, _ = m(images)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    @nnx.jit
    def train_step(m, opt):
        loss, grads = nnx.value_and_grad(loss_fn)(m)
        opt.update(m, grads)
        return loss

    with jax.numpy_dtype_promotion("standard"):  # optax's own arithmetic mixes dtypes
        losses = [float(train_step(model, optimizer)) for _ in range(15)]
    assert losses[-1] < 0.7 * losses[0], losses


def test_bad_settings_raise_naming_the_argument():
    cell = dq.nnx.MLPCell(DX, D, rngs=nnx.Rngs(0))
    for kw, name in [
        (dict(rngs=3), "rngs"),
        (dict(deterministic="no"), "deterministic"),
        (dict(solver=3), "solver"),
        (dict(adjoint="implicit"), "adjoint"),
        (dict(precision="fastest"), "precision"),
    ]:
        with pytest.raises(ValueError, match=name):
            dq.nnx.DEQ(cell, **kw)
    with pytest.raises(ValueError, match="cell must be callable"):
        dq.nnx.DEQ("not a cell")
    with pytest.raises(ValueError, match="cell must be a flax.nnx.Module"):
        dq.nnx.DEQ(lambda z, x: z)
    with pytest.raises(ValueError, match="form"):
        dq.nnx.MLPCell(DX, D, form="deep", rngs=nnx.Rngs(0))
