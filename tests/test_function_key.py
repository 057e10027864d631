"""A user's function as a cache key and its arrays as operands (``deqjax._src.function_key``)."""

import functools
import sys
import types

import jax
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


# --- Values that do not compare by value are keyed by their contents (issue 41) ---------------


class _Box:
    """A plain object."""

    def __init__(self, s):
        self.s = s

    def scaled(self, z):
        return self._factor() * z

    def _factor(self):  # read by a method: the class is described by the names its code spells
        return self.s * type(self).GAIN


_Box.GAIN = 1.0


class _Slotted:
    __slots__ = ("s",)

    def __init__(self, s):
        self.s = s


def _key(f):
    split = split_callable(f)
    assert not isinstance(split, Unkeyed), split
    return split[0]


def _changes_key(f, change):
    """Whether ``change()`` gives ``f`` another key (and an unchanged ``f`` keeps its key)."""
    before = _key(f)
    assert _key(f) == before and hash(_key(f)) == hash(before)
    change()
    return _key(f) != before


def test_objects_are_keyed_by_their_attributes():
    box, slotted = _Box(0.5), _Slotted(0.5)
    assert _changes_key(lambda z: box.s * z, lambda: setattr(box, "s", 0.8))
    assert _changes_key(box.scaled, lambda: setattr(box, "s", 0.9))  # a bound method's self
    assert _changes_key(lambda z: slotted.s * z, lambda: setattr(slotted, "s", 0.8))
    ns = types.SimpleNamespace(s=0.5)
    assert _changes_key(lambda z: ns.s * z, lambda: setattr(ns, "s", 0.8))
    assert _changes_key(lambda z: ns.s * z, lambda: setattr(ns, "t", 1))  # a new attribute

    # equal contents, another object: the same key (a new object per call reuses the program)
    def read(obj):
        return lambda z: obj.s * z

    assert _key(read(_Box(0.5))) == _key(read(_Box(0.5))) != _key(read(_Box(0.6)))


def test_classes_are_keyed_by_the_attributes_their_readers_spell():
    box = _Box(0.5)
    # GAIN is read by a method that another method calls through ``self``
    assert _changes_key(box.scaled, lambda: setattr(_Box, "GAIN", 2.0))
    cls = _Box
    by_string = lambda z: getattr(cls, "GAIN") * z  # noqa: B009, E731 (a name as a string)
    assert _changes_key(by_string, lambda: setattr(_Box, "GAIN", 3.0))
    _Box.GAIN = 1.0

    class Config:
        s = 0.5

        @staticmethod
        def shift():
            return Config.s

        @property
        def doubled(self):
            return 2 * self.s

    config = Config()
    assert _changes_key(lambda z: Config.s * z, lambda: setattr(Config, "s", 0.8))
    assert _changes_key(lambda z: Config.shift() * z, lambda: setattr(Config, "s", 0.9))
    assert _changes_key(lambda z: config.doubled * z, lambda: setattr(Config, "s", 0.7))
    # a special method runs without being named (``config(z)`` calls __call__)
    Config.__call__ = lambda self, z: z
    assert _changes_key(lambda z: config(z), lambda: setattr(Config, "__call__", lambda s, z: -z))


def test_modules_and_other_modules_functions_are_keyed_by_what_is_read():
    module = types.ModuleType("deqjax_tests_function_key_module")
    sys.modules[module.__name__] = module
    try:
        exec(
            "S = 0.5\nBIG = list(range(10_000))\n\ndef scaled(z):\n    return S * z\n", vars(module)
        )
        assert _changes_key(lambda z: module.S * z, lambda: setattr(module, "S", 0.8))
        scaled = module.scaled  # a function of another module: its own globals are read too
        assert _changes_key(lambda z: scaled(z), lambda: setattr(module, "S", 0.9))
        # what the code does not spell is not described (BIG is over the budget)
        assert not _changes_key(lambda z: module.S * z, lambda: setattr(module, "BIG", None))
    finally:
        del sys.modules[module.__name__]


def test_library_code_is_taken_as_it_is():
    """A library's module, class, function and object: by identity (its globals unread)."""
    key = _key(lambda z: jnp.tanh(z) + np.pi + functools.reduce(min, [z]))
    assert [type(d).__name__ for _, d in key.reads] == ["Identity"] * 3
    assert len(_key(lambda z: jax.nn.relu(z)).reads) == 1


def test_shared_and_cyclic_objects():
    box = _Box(0.5)
    box.me = box  # a cycle
    pair = (box, box)  # shared
    assert _changes_key(lambda z: pair[0].s * z, lambda: setattr(box, "s", 0.8))


def test_unkeyable_values_are_named():
    class Holder:
        pass

    holder = Holder()
    holder.w = jnp.eye(3)

    def f(z):
        return holder.w @ z

    unkeyed = split_callable(f)
    assert isinstance(unkeyed, Unkeyed)
    assert unkeyed.what.endswith("f -> holder.w") and "holding arrays" in unkeyed.why

    def fact(n):
        return 1 if n < 2 else n * fact(n - 1)

    assert "reaches itself" in split_callable(fact).why


@jax.tree_util.register_pytree_node_class
class _Affine:
    """A pytree class (as an Equinox module is): its structure names the class by identity."""

    s = 0.5

    def __init__(self, w):
        self.w = w

    def __call__(self, z):
        return self.s * (self.w @ z)

    def tree_flatten(self):
        return (self.w,), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)


def test_pytree_classes_are_described_like_classes():
    affine = _Affine(jnp.eye(2))
    key, ops = split_callable(affine)
    assert len(ops) == 1  # the array is an operand
    assert _changes_key(affine, lambda: setattr(_Affine, "s", 0.8))
    np.testing.assert_allclose(rebuild(_key(affine), [2 * jnp.eye(2)])(jnp.ones(2)), [1.6, 1.6])
