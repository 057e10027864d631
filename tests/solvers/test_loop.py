"""The bounded loop driver: the three kinds agree, max_steps bounds, scan is differentiable."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import deqjax as dq
from deqjax._src.solvers.loop import bounded_while_loop


def halve_until_small(x, loop, max_steps):
    def cond(c):
        return c[0] > 1.0

    def body(c):
        return c[0] / 2, c[1] + 1

    return bounded_while_loop(
        cond, body, (x, jnp.zeros((), jnp.int32)), max_steps=max_steps, loop=loop
    )


@pytest.mark.parametrize("loop", ["while", "scan", "python"])
def test_kinds_agree_and_respect_max_steps(loop):
    x, n = halve_until_small(jnp.asarray(100.0), loop, 20)
    assert int(n) == 7 and float(x) == 100.0 / 128
    x, n = halve_until_small(jnp.asarray(100.0), loop, 3)  # cut short
    assert int(n) == 3 and float(x) == 12.5


def test_while_and_scan_work_under_jit_and_vmap():
    xs = jnp.asarray([0.5, 3.0, 100.0])
    for loop in ("while", "scan"):
        _, n = jax.jit(jax.vmap(lambda x, loop=loop: halve_until_small(x, loop, 20)))(xs)
        np.testing.assert_array_equal(n, [0, 2, 7])


def test_scan_is_reverse_differentiable_while_is_not():
    grad = jax.grad(lambda x: halve_until_small(x, "scan", 20)[0])(jnp.asarray(100.0))
    np.testing.assert_allclose(grad, 1 / 128)
    with pytest.raises(ValueError, match="Reverse-mode"):
        jax.grad(lambda x: halve_until_small(x, "while", 20)[0])(jnp.asarray(100.0))


def test_python_loop_cannot_be_traced_and_bad_arguments_raise():
    with pytest.raises(jax.errors.ConcretizationTypeError):
        jax.jit(lambda x: halve_until_small(x, "python", 20))(jnp.asarray(100.0))
    # The loop's settings are a solver object's fields, validated once where it is made.
    with pytest.raises(ValueError, match="loop"):
        dq.solvers.FixedPointIteration(loop="for")
    with pytest.raises(ValueError, match="max_steps"):
        dq.solvers.FixedPointIteration(max_steps=0)
