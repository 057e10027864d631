"""Library code: the modules, classes and functions a function key takes as they are.

A function key (:mod:`deqjax._src.function_key`) describes what a user's function reads by its
contents, so that a value changed between two eager calls makes a new key. It cannot do that
for a library (``jnp`` alone reaches thousands of values) and need not: a library's code does not
change while a program runs. Library code is taken by identity, as ``jax.jit`` takes every
global; changing it between eager calls (monkeypatching JAX, editing an installed package) is
not seen.

Code is a library's when the module it belongs to is

* built into the interpreter (``sys.builtin_module_names``), or a standard library module
  without a file (``sys.stdlib_module_names``: frozen);
* loaded from a file in an installation directory: the standard library's, or a site-packages
  directory (``sysconfig``'s ``purelib``/``platlib``, ``site.getsitepackages()``, the user's
  site-packages): what ``pip install`` puts there. A package installed in editable mode
  (``pip install -e``) is loaded from its working copy and is the user's: its code may change;
* deqjax's own, wherever it is loaded from.

Everything else is the user's: ``__main__`` (a script, a notebook), a script's own modules, a test
module, a module made with ``types.ModuleType``. A module not yet in ``sys.modules`` (one whose
import is running) is the user's until it is there.
"""

from __future__ import annotations

import functools
import os
import site
import sys
import sysconfig

_OWN = __name__.partition(".")[0]  # deqjax
_known: dict[str, bool] = {}


@functools.lru_cache(maxsize=1)
def _install_directories() -> tuple[str, ...]:
    """The installation directories, each ending in a separator."""
    paths = sysconfig.get_paths()
    directories = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    directories.update(site.getsitepackages())
    directories.add(site.getusersitepackages())
    return tuple(os.path.join(os.path.realpath(d), "") for d in directories)


def is_library_module(name: object) -> bool:
    """Whether the module called ``name`` is library code (see the module docstring).

    Args:
      name: a module's ``__name__`` (a function's ``__globals__["__name__"]``, a class's
        ``__module__``); anything else (``None``: a function made by ``exec`` without one) is
        the user's.

    Returns:
      True for the standard library, an installed package or deqjax; False for the user's code.
    """
    if not isinstance(name, str):
        return False
    known = _known.get(name)
    if known is not None:
        return known
    top = name.partition(".")[0]
    module = sys.modules.get(name)
    if top == _OWN or name in sys.builtin_module_names:
        library = True
    elif module is None:
        return False  # not decided: its import is running
    else:
        file = getattr(module, "__file__", None)
        if isinstance(file, str):
            library = os.path.realpath(file).startswith(_install_directories())
        else:  # a frozen module of the standard library, or one made in memory
            library = top in sys.stdlib_module_names
    _known[name] = library
    return library
