"""An eager call never serves a program traced with a value that has since changed
(deqjax._src.object_contents, through deqjax._src.compiled).

Each kind of value below is read by the cell z = s*z + p (fixed point p/(1-s)) and does not
compare by value: a plain object, a bound method's ``self``, a ``SimpleNamespace`` read as a
global, a class, a module, a helper function of another module reading its own global. After
``s`` moves from 0.5 to 0.8, an eager ``dq.fixed_point``, an eager solver call and an eager
``jax.grad`` of ``dq.fixed_point`` give the fresh answer (before: the first program's 2.0, not
5.0); an unchanged value reuses the program.
"""

import importlib.util
import sys
import types

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import deqjax as dq
from deqjax._src import compiled
from tests.helpers.lanes import default_first

SOLVER = dq.solvers.Anderson(tol=1e-12, max_steps=200)
Z0 = jnp.zeros(())
P = jnp.asarray(1.0)
BEFORE, AFTER = 0.5, 0.8


class _Scale:
    """A plain object (compares by identity)."""

    def __init__(self, s):
        self.s = s

    def cell(self, p, x, z):
        return self.s * z + p


class _ClassScale:
    """A class read for its attribute."""

    s = BEFORE


NAMESPACE = types.SimpleNamespace(s=BEFORE)


def _namespace_cell(p, x, z):
    return NAMESPACE.s * z + p  # the namespace is a global of this module


_scaled = None  # the helper function of another module (set by the fixture)


def _helper_cell(p, x, z):
    return _scaled(z) + p  # ``_scaled``: a global of this module, a function of another module


def _plain_object():
    obj = _Scale(BEFORE)
    return (lambda p, x, z: obj.s * z + p), lambda s: setattr(obj, "s", s)


def _bound_method():
    obj = _Scale(BEFORE)
    return obj.cell, lambda s: setattr(obj, "s", s)


def _simple_namespace():
    NAMESPACE.s = BEFORE
    return _namespace_cell, lambda s: setattr(NAMESPACE, "s", s)


def _class_attribute():
    _ClassScale.s = BEFORE
    cls = _ClassScale
    return (lambda p, x, z: cls.s * z + p), lambda s: setattr(_ClassScale, "s", s)


def _module_attribute():
    module = types.ModuleType("deqjax_tests_scale_module")
    module.s = BEFORE
    sys.modules[module.__name__] = module
    return (lambda p, x, z: module.s * z + p), lambda s: setattr(module, "s", s)


def _helper_of_another_module(tmp_path, monkeypatch):
    """A module loaded from a file (not an installed package: the user's code)."""
    source = tmp_path / "deqjax_tests_helper_module.py"
    source.write_text(f"S = {BEFORE}\n\n\ndef scaled(z):\n    return S * z\n")
    spec = importlib.util.spec_from_file_location("deqjax_tests_helper_module", source)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    monkeypatch.setitem(globals(), "_scaled", module.scaled)
    return _helper_cell, lambda s: setattr(module, "S", s)


KINDS = {
    "plain_object": _plain_object,
    "bound_method_self": _bound_method,
    "simple_namespace": _simple_namespace,
    "class_attribute": _class_attribute,
    "module_attribute": _module_attribute,
    "helper_of_another_module": _helper_of_another_module,
}


@pytest.fixture(params=sorted(KINDS))
def kind(request, tmp_path, monkeypatch):
    """(cell(p, x, z) reading s, set_s)."""
    make = KINDS[request.param]
    if make is _helper_of_another_module:
        return make(tmp_path, monkeypatch)
    return make()


def _fixed_point(cell):
    return dq.fixed_point(cell, P, None, Z0, solver=SOLVER)[0]


def _solver_call(cell):
    return SOLVER(lambda z: cell(P, None, z), Z0).value


def _gradient(cell):
    return jax.grad(lambda p: dq.fixed_point(cell, p, None, Z0, solver=SOLVER)[0])(P)


PATHS = {"fixed_point": _fixed_point, "solver_call": _solver_call, "grad": _gradient}


@pytest.mark.parametrize("path", default_first(["grad", "fixed_point", "solver_call"]))
def test_eager_call_after_a_change_is_fresh(kind, path):
    """z* = 1/(1-s) and dz*/dp = 1/(1-s): 2 then 5 (before: 2 then 2)."""
    cell, set_s = kind
    call = PATHS[path]
    compiled.clear()
    np.testing.assert_allclose(call(cell), 1 / (1 - BEFORE), rtol=1e-9)
    assert compiled.size() == 1
    np.testing.assert_allclose(call(cell), 1 / (1 - BEFORE), rtol=1e-9)
    assert compiled.size() == 1  # unchanged: the program is reused
    set_s(AFTER)
    np.testing.assert_allclose(call(cell), 1 / (1 - AFTER), rtol=1e-9)
    assert compiled.size() == 2
    set_s(BEFORE)  # back to the first value: the first program again
    np.testing.assert_allclose(call(cell), 1 / (1 - BEFORE), rtol=1e-9)
    assert compiled.size() == 2


class _ScaleCell(hk.Module):
    """A Haiku cell reading a class attribute and an attribute of a plain object it holds."""

    s = BEFORE

    def __init__(self, offset, name=None):
        super().__init__(name=name)
        self.offset = offset

    def __call__(self, z, x):
        return self.s * z + self.offset.s * x


@pytest.mark.parametrize("change", ["class_attribute", "held_object_attribute"])
def test_eager_deq_apply_after_a_change_is_fresh(change):
    """dq.nn.DEQ's eager ``apply`` (a new cell module every call): z* = x * offset / (1-s)."""
    offset = _Scale(1.0)

    def forward(x):
        return dq.nn.DEQ(_ScaleCell(offset), solver=SOLVER)(x, is_training=False)[0]

    model = hk.transform(forward)
    x = jnp.ones((1, 1))
    _ScaleCell.s = BEFORE
    try:
        params = model.init(jax.random.PRNGKey(0), x)
        compiled.clear()
        np.testing.assert_allclose(model.apply(params, None, x), [[2.0]], rtol=1e-9)
        np.testing.assert_allclose(model.apply(params, None, x), [[2.0]], rtol=1e-9)
        assert compiled.size() == 1  # unchanged: the program is reused
        if change == "class_attribute":
            _ScaleCell.s, want = AFTER, 1 / (1 - AFTER)
        else:
            offset.s, want = 3.0, 3.0 / (1 - BEFORE)
        np.testing.assert_allclose(model.apply(params, None, x), [[want]], rtol=1e-9)
        assert compiled.size() == 2
    finally:
        _ScaleCell.s = BEFORE
