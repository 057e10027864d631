"""Which code a function key takes as it is (deqjax._src.library_code)."""

import importlib.util
import sys
import types

import haiku  # noqa: F401  (an installed package, loaded)

from deqjax._src.library_code import is_library_module


def test_standard_library_installed_packages_and_deqjax_are_library_code():
    for name in ("builtins", "functools", "os.path", "jax", "jax.numpy", "numpy", "haiku"):
        assert is_library_module(name), name
    assert is_library_module("deqjax._src.compiled")  # wherever deqjax is loaded from


def test_the_users_modules_are_not(tmp_path, monkeypatch):
    assert not is_library_module(__name__)  # a test module
    assert not is_library_module(None)  # a function made by exec without a module
    made = types.ModuleType("deqjax_tests_made_in_memory")
    monkeypatch.setitem(sys.modules, made.__name__, made)
    assert not is_library_module(made.__name__)
    path = tmp_path / "deqjax_tests_from_a_file.py"
    path.write_text("X = 1\n")
    spec = importlib.util.spec_from_file_location("deqjax_tests_from_a_file", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    assert not is_library_module(spec.name)


def test_a_module_being_imported_is_decided_later():
    name = "deqjax_tests_not_imported_yet"
    assert not is_library_module(name)
    sys.modules[name] = types.ModuleType(name)
    try:
        assert not is_library_module(name)  # decided now, not remembered from before
    finally:
        del sys.modules[name]
