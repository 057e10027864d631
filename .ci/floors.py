"""Prints setup.cfg's floors as pip constraints, ``name==floor`` one a line, for this Python.

Reads ``install_requires`` and the extras named by ``--extras``, keeps the requirements whose
environment markers hold for the interpreter running this (``python_version``), and pins each
name to the highest ``>=`` bound it has there: a name floored twice (JAX by ``install_requires``
and by the ``nnx`` extra, whose Flax needs a newer one) gets the higher. ``--except`` leaves names
unpinned (the 3.13 lane: the newest JAX with every other floor). A requirement without a ``>=``
bound is an error: a floor that is not written cannot be tested.

Usage (in the lane's virtual environment, which has ``packaging``):
    python .ci/floors.py --extras equinox,nnx --except jax,jaxlib,numpy > constraints.txt
"""

import argparse
import configparser
import pathlib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

SETUP_CFG = pathlib.Path(__file__).resolve().parent.parent / "setup.cfg"


def requirement_lines(value: str) -> list[str]:
    """The requirements of a setup.cfg list, without comments and blank lines."""
    lines = (line.split("#")[0].strip() for line in value.splitlines())
    return [line for line in lines if line]


def floors(extras: list[str], skip: set[str], python: str | None = None) -> dict[str, Version]:
    """Each name's floor for Python ``python`` ("3.13"; None: the one running this)."""
    environment = None if python is None else {"python_version": python}
    cfg = configparser.ConfigParser()
    cfg.read(SETUP_CFG)
    lines = requirement_lines(cfg["options"]["install_requires"])
    for extra in extras:
        lines += requirement_lines(cfg["options.extras_require"][extra])
    result: dict[str, Version] = {}
    for line in lines:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate(environment):
            continue
        bounds = [Version(s.version) for s in req.specifier if s.operator == ">="]
        if not bounds:
            raise SystemExit(f"setup.cfg: {line!r} has no '>=' floor for a lane to install")
        name = canonicalize_name(req.name)
        if name not in skip:
            result[name] = max([*bounds, result.get(name, bounds[0])])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--extras", default="", help="comma-separated extras of setup.cfg")
    parser.add_argument("--except", dest="skip", default="", help="comma-separated names to omit")
    args = parser.parse_args()
    extras = [e for e in args.extras.split(",") if e]
    skip = {canonicalize_name(n) for n in args.skip.split(",") if n}
    for name, version in sorted(floors(extras, skip).items()):
        print(f"{name}=={version}")


if __name__ == "__main__":
    main()
