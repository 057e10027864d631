"""A user's function as a cache key and its arrays as operands (``deqjax._src.function_key``)."""

import functools

import jax.numpy as jnp
import numpy as np

from deqjax._src.function_key import rebuild, split_callable

GLOBAL_SHIFT = jnp.ones(3)


def _closure(w, scale):
    return lambda z: jnp.tanh(scale * (w @ z)) + GLOBAL_SHIFT


def test_split_callable_keys_code_and_values_and_lifts_arrays():
    w1, w2 = jnp.eye(3), 2.0 * jnp.eye(3)
    key1, ops1 = split_callable(_closure(w1, 0.5))
    key2, ops2 = split_callable(_closure(w2, 0.5))
    assert key1 == key2 and hash(key1) == hash(key2)  # new arrays, same program
    assert ops2[0] is w2 and any(o is GLOBAL_SHIFT for o in ops2)  # the global array is read too
    assert split_callable(_closure(w1, 0.25))[0] != key1  # a Python value is part of the key
    z = jnp.arange(3.0)
    np.testing.assert_allclose(rebuild(key1, ops2)(z), _closure(w2, 0.5)(z))


def test_split_callable_partials_and_unkeyable_values():
    f = functools.partial(lambda a, b, z: a * z + b, 2.0, jnp.ones(3))
    key, ops = split_callable(f)
    assert len(ops) == 1
    assert rebuild(key, [jnp.zeros(3)])(jnp.ones(3)).tolist() == [2.0, 2.0, 2.0]

    class Holder:  # a plain object holding arrays may change between calls: not keyed
        w = None

    holder = Holder()
    holder.w = jnp.eye(3)
    assert split_callable(lambda z: holder.w @ z) is None
    unhashable = {1, 2}
    assert split_callable(lambda z: z * len(unhashable)) is not None  # a set is frozen
    assert split_callable(lambda z: z + [z][0]) is not None
