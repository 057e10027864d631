"""A user's function as a cache key and its arrays as operands (``deqjax._src.function_key``)."""

import functools

import jax.numpy as jnp
import numpy as np
import pytest

from deqjax._src.function_key import Unkeyed, rebuild, split_callable
from deqjax._src.object_contents import haiku_own_attributes

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
    unkeyed = split_callable(lambda z: holder.w @ z)
    assert isinstance(unkeyed, Unkeyed) and "holder.w" in unkeyed.what
    unhashable = {1, 2}
    assert not isinstance(split_callable(lambda z: z * len(unhashable)), Unkeyed)  # a set is frozen
    assert not isinstance(split_callable(lambda z: z + [z][0]), Unkeyed)


def test_haiku_modules_are_keyed_by_class_name_and_their_own_attributes():
    """A new module per ``apply`` of the same model is the same key (Haiku's bookkeeping, new on
    every ``transform`` call, is left out); its class's attributes and its name are in the key;
    an array attribute is an operand."""
    hk = pytest.importorskip("haiku")

    class Scale(hk.Module):
        def __init__(self, k, w, name=None):
            super().__init__(name=name)
            self.k, self.w = k, w

        def __call__(self, z):
            return self.k * (self.w @ z)

    def split(k=2.0, w=None, name=None):
        w = jnp.eye(3) if w is None else w
        return hk.transform(lambda: split_callable(Scale(k, w, name=name))).apply({}, None)

    own = haiku_own_attributes(hk)
    assert "module_name" in own and not {"k", "w"} & own
    key, (again, ops_again) = split()[0], split(w=2.0 * jnp.eye(3))
    assert key == again and hash(key) == hash(again)
    assert len(ops_again) == 1 and float(ops_again[0][0, 0]) == 2.0
    assert split(k=3.0)[0] != key
    assert split(name="other")[0] != key
    z = jnp.arange(3.0)
    out = hk.transform(lambda: rebuild(key, ops_again)(z)).apply({}, None)
    np.testing.assert_allclose(out, 4.0 * z)
