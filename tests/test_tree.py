"""Pytree arithmetic: values against numpy, mixed dtypes under strict promotion, history buffers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from deqjax._src import tree


def mixed():
    x = {"a": jnp.asarray([1.0, 2.0, 3.0], jnp.float32), "b": (jnp.arange(8.0).reshape(2, 4),)}
    y = {"a": jnp.asarray([0.5, -1.0, 2.0], jnp.float32), "b": (jnp.ones((2, 4)),)}
    return x, y


def test_vdot_norm_mixed_dtypes():
    x, y = mixed()
    assert tree.reduction_dtype(x) == jnp.float64
    assert tree.reduction_dtype(x["a"]) == jnp.float32
    assert tree.reduction_dtype(jnp.ones(2, jnp.bfloat16)) == jnp.float32
    v = tree.tree_vdot(x, y)
    assert v.dtype == jnp.float64
    np.testing.assert_allclose(v, 0.5 - 2 + 6 + 28)
    np.testing.assert_allclose(tree.tree_norm(x), np.sqrt(14 + 140))


def test_axpy_where_keep_leaf_dtypes():
    x, y = mixed()
    out = tree.tree_axpy(jnp.asarray(2.0, jnp.float64), x, y)
    assert out["a"].dtype == jnp.float32 and out["b"][0].dtype == jnp.float64
    np.testing.assert_allclose(out["a"], [2.5, 3.0, 8.0])
    np.testing.assert_allclose(tree.tree_where(jnp.asarray(False), x, y)["b"][0], np.ones((2, 4)))
    assert bool(tree.tree_all_finite(x))
    assert not bool(tree.tree_all_finite({"a": jnp.asarray([1.0, jnp.nan])}))


def test_history_rows():
    x, y = mixed()
    stack = tree.tree_stack_zeros(x, 3)
    assert stack["b"][0].shape == (3, 2, 4)
    stack = tree.tree_set_row(stack, 1, x)
    stack = tree.tree_set_row(stack, 2, y)
    stack = tree.tree_set_row(stack, -1, y)  # out of range: writes nothing
    np.testing.assert_array_equal(stack["a"][0], 0.0)
    np.testing.assert_allclose(tree.tree_rows_vdot(stack, x), [0, 14 + 140, 4.5 + 28])
    comb = tree.tree_combine_rows(jnp.asarray([5.0, 2.0, -1.0]), stack)
    np.testing.assert_allclose(comb["a"], 2 * np.asarray(x["a"]) - np.asarray(y["a"]))
    assert comb["a"].dtype == jnp.float32


def test_check_state_tree_of_real_leaves_and_tree_size():
    tree.check_state_tree({"a": jnp.zeros(2, jnp.float32)}, "z0")
    with pytest.raises(ValueError, match="z0"):
        tree.check_state_tree({"a": jnp.zeros(2, jnp.int32)}, "z0")
    with pytest.raises(ValueError, match="state"):
        tree.check_state_tree((), "state")
    assert tree.tree_size(mixed()[0]) == 11


def test_batched_helpers_equal_per_problem_loops():
    """batch_ndim versions of vdot/norm/scale/where and the batch-major history buffers."""
    rng = np.random.default_rng(0)
    x = {
        "a": jnp.asarray(rng.normal(size=(2, 3, 4)), jnp.float32),
        "b": jnp.asarray(rng.normal(size=(2, 3))),
    }
    y = jax.tree_util.tree_map(lambda a: a + 1, x)
    v = tree.tree_vdot(x, y, 1)
    assert v.shape == (2,) and v.dtype == jnp.float64
    for i in range(2):
        xi = jax.tree_util.tree_map(lambda a, i=i: a[i], x)
        yi = jax.tree_util.tree_map(lambda a, i=i: a[i], y)
        np.testing.assert_allclose(v[i], tree.tree_vdot(xi, yi), rtol=1e-6)
    np.testing.assert_allclose(tree.tree_norm(x, 1) ** 2, tree.tree_vdot(x, x, 1), rtol=1e-6)
    scaled = tree.tree_scale(jnp.asarray([2.0, -1.0]), x, 1)
    np.testing.assert_allclose(scaled["a"][1], -np.asarray(x["a"][1]))
    picked = tree.tree_where(jnp.asarray([True, False]), x, y, 1)
    np.testing.assert_allclose(picked["b"], np.stack([x["b"][0], y["b"][1]]))
    stack = tree.tree_stack_zeros(x, 3, 1)
    assert stack["a"].shape == (2, 3, 3, 4) and stack["b"].shape == (2, 3, 3)
    stack = tree.tree_put_row(stack, jnp.asarray(2), x, 1)  # shared row
    stack = tree.tree_set_row(stack, jnp.asarray([0, -1]), y, 1)  # per-problem rows; -1: none
    rows = tree.tree_rows_vdot(stack, x, 1)
    assert rows.shape == (2, 3)
    np.testing.assert_allclose(rows[:, 2], tree.tree_vdot(x, x, 1), rtol=1e-6)
    np.testing.assert_allclose(rows[0, 0], tree.tree_vdot(y, x, 1)[0], rtol=1e-6)
    np.testing.assert_allclose(rows[1, :2], 0.0)
    comb = tree.tree_combine_rows(jnp.asarray([[0.0, 0.0, 2.0], [1.0, 0.0, 0.0]]), stack, 1)
    np.testing.assert_allclose(comb["a"][0], 2 * np.asarray(x["a"][0]), rtol=1e-6)
    np.testing.assert_allclose(comb["a"][1], 0.0)


def _complex_pair(dtype=np.complex128):
    rng = np.random.default_rng(0)
    x = {"a": rng.normal(size=3) + 1j * rng.normal(size=3), "b": rng.normal(size=(2, 2)) + 0j}
    y = {"a": rng.normal(size=3) + 1j * rng.normal(size=3), "b": 1j * rng.normal(size=(2, 2))}
    as_jax = lambda t: jax.tree_util.tree_map(lambda a: jnp.asarray(a, dtype), t)  # noqa: E731
    return x, y, as_jax(x), as_jax(y)


def _flat(t):
    return np.concatenate([np.ravel(a) for a in jax.tree_util.tree_leaves(t)])


def test_complex_vdot_conjugates_its_first_argument_and_norms_are_real():
    x, y, xj, yj = _complex_pair()
    v = tree.tree_vdot(xj, yj)
    assert v.dtype == jnp.complex128
    np.testing.assert_allclose(v, np.vdot(_flat(x), _flat(y)))  # numpy's vdot conjugates x
    np.testing.assert_allclose(tree.tree_vdot(yj, xj), np.conj(v))
    sq = tree.tree_sq_norm(xj)
    assert sq.dtype == jnp.float64
    np.testing.assert_allclose(sq, np.sum(np.abs(_flat(x)) ** 2))
    np.testing.assert_allclose(tree.tree_norm(xj), np.linalg.norm(_flat(x)))
    assert tree.tree_norm(xj).dtype == jnp.float64


def test_complex_dtypes():
    c64, c128 = jnp.zeros(2, jnp.complex64), jnp.zeros(2, jnp.complex128)
    assert tree.reduction_dtype(c64) == jnp.float32 and tree.reduction_dtype(c128) == jnp.float64
    assert tree.scalar_dtype(c64) == jnp.complex64 and tree.scalar_dtype(c128) == jnp.complex128
    assert tree.scalar_dtype({"a": c64, "b": c128}) == jnp.complex128
    assert tree.scalar_dtype(jnp.zeros(2, jnp.bfloat16)) == jnp.float32
    assert tree.is_complex(c64) and not tree.is_complex(jnp.zeros(2))
    real = jnp.ones(2)
    assert tree.conj(real) is real  # no kernel on a real array


def test_complex_rows_and_combination():
    x, y, xj, yj = _complex_pair()
    stack = tree.tree_set_row(tree.tree_stack_zeros(xj, 2), 0, xj)
    stack = tree.tree_set_row(stack, 1, yj)
    rows = tree.tree_rows_vdot(stack, yj)
    assert rows.dtype == jnp.complex128
    np.testing.assert_allclose(rows, [np.vdot(_flat(x), _flat(y)), np.vdot(_flat(y), _flat(y))])
    coeffs = jnp.asarray([1 + 2j, -0.5j])
    comb = tree.tree_combine_rows(coeffs, stack)
    np.testing.assert_allclose(comb["a"], (1 + 2j) * x["a"] - 0.5j * y["a"])
    # Batched rows (batch_ndim=1): one product per problem, conjugated likewise.
    bx = jax.tree_util.tree_map(lambda a: jnp.stack([a, 2 * a]), xj)
    by = jax.tree_util.tree_map(lambda a: jnp.stack([a, a]), yj)
    bstack = tree.tree_set_row(tree.tree_stack_zeros(bx, 1, 1), jnp.asarray([0, 0]), bx, 1)
    got = tree.tree_rows_vdot(bstack, by, 1)
    want = np.vdot(_flat(x), _flat(y))
    np.testing.assert_allclose(got[:, 0], [want, 2 * want])
    np.testing.assert_allclose(tree.tree_vdot(bx, by, 1), [want, 2 * want])


def test_check_state_tree():
    tree.check_state_tree(
        {"a": jnp.zeros(2, jnp.complex64), "b": jnp.zeros(1, jnp.complex128)}, "z0"
    )
    tree.check_state_tree({"a": jnp.zeros(2, jnp.bfloat16), "b": jnp.zeros(1)}, "z0")
    with pytest.raises(ValueError, match="z0 must contain only floating-point or complex"):
        tree.check_state_tree(jnp.zeros(2, jnp.int32), "z0")
    with pytest.raises(ValueError, match="z0 mixes real and complex leaves"):
        tree.check_state_tree({"a": jnp.zeros(2), "b": jnp.zeros(2, jnp.complex64)}, "z0")
    with pytest.raises(ValueError, match="non-empty"):
        tree.check_state_tree({}, "z0")
    # The one state validator: the older real-only one is gone (the DEQ, the Jacobian tools and
    # Jacobian regularisation take complex states: tests/nn, tests/test_jacobian*.py).
    assert not hasattr(tree, "check_float_tree")
