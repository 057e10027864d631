"""setup.cfg's floors, as .ci/floors.py pins them for the lowest lanes, for each Python allowed:
none may meet a JAX it does not import on (CI's lanes install them: .ci/lowest_jax, .ci/py313)."""

import importlib.util
import pathlib

import pytest
from packaging.version import Version

ROOT = pathlib.Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("ci_floors", ROOT / ".ci" / "floors.py")
ci_floors = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ci_floors)

PYTHONS = ["3.11", "3.12", "3.13"]
# The newest JAX that installs on each Python (JAX 0.11 and 0.12 need Python 3.12).
NEWEST_JAX = {"3.11": Version("0.10.2"), "3.12": Version("0.12"), "3.13": Version("0.12")}


def pins(python, extras=("equinox", "nnx")):
    return ci_floors.floors(list(extras), set(), python)


@pytest.mark.parametrize("python", PYTHONS)
def test_dm_haiku_floor_imports_on_jax_0_11(python):
    """dm-haiku 0.0.16 and older read jax.core.DropVar when imported; JAX 0.11 removed it."""
    if NEWEST_JAX[python] >= Version("0.11"):
        assert pins(python, extras=())["dm-haiku"] >= Version("0.0.17")


@pytest.mark.parametrize("python", PYTHONS)
def test_flax_floor_imports_on_the_newest_jax_and_gets_the_jax_it_needs(python):
    """Flax 0.12.7-0.12.9 subclass jax.experimental.hijax.HiPrimitive, which JAX 0.12 lacks;
    Flax 0.12.7 needs JAX 0.10.0 and 0.12.10 needs 0.11.1 (their own floors)."""
    got = pins(python)
    if NEWEST_JAX[python] >= Version("0.12"):
        assert got["flax"] >= Version("0.12.10")
    needs = Version("0.11.1") if got["flax"] >= Version("0.12.10") else Version("0.10.0")
    assert got["jax"] >= needs and got["jaxlib"] == got["jax"]


@pytest.mark.parametrize("python", PYTHONS)
def test_numpy_floor_has_wheels_and_meets_jax(python):
    """numpy 2.0 has no wheels for Python 3.13 (2.1.0 is the first); JAX 0.8 needs 2.0, 0.11 2.1."""
    for extras in [(), ("equinox", "nnx")]:
        got = pins(python, extras)
        assert got["numpy"] >= Version("2.1.0" if python == "3.13" else "2.0.0")
        if got["jax"] >= Version("0.11"):
            assert got["numpy"] >= Version("2.1.0")


@pytest.mark.parametrize("python", PYTHONS)
def test_every_dependency_and_front_end_has_a_floor(python):
    """.ci/floors.py refuses a requirement without '>=' (the lowest lane could not install it);
    Equinox 0.13.7 is the first that works on JAX >= 0.9.2."""
    core = {"jax", "jaxlib", "dm-haiku", "jmp", "optax", "numpy"}
    assert set(pins(python, ())) == core
    assert set(pins(python)) == core | {"equinox", "flax"}
    assert pins(python)["equinox"] >= Version("0.13.7")
