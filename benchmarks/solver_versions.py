"""One solver class from two versions of its module, timed interleaved in one process.

    git show a920e0c:deqjax/_src/solvers/broyden.py > /tmp/broyden_old.py
    python -m benchmarks.solver_versions --old /tmp/broyden_old.py --d 512
    python -m benchmarks.solver_versions --old /tmp/broyden_old.py --d 128 --cls Broyden

A solver whose algorithm lives in several modules (Broyden since issue 41: ``broyden.py`` picks a
form from ``broyden_steps.py`` or ``broyden_line_search.py``, both on ``broyden_inverse.py``) is
compared by giving the old versions of those modules after the class's own, dependencies first:
they stand in for the installed ones while the old class's module loads::

    for m in broyden broyden_inverse broyden_steps broyden_line_search; do
      git show REV:deqjax/_src/solvers/$m.py > /tmp/old/$m.py; done
    python -m benchmarks.solver_versions --old /tmp/old/broyden.py /tmp/old/broyden_inverse.py \
      /tmp/old/broyden_steps.py /tmp/old/broyden_line_search.py

A change to a solver's loop moves its time by a few percent, less than the spread between fresh
processes on a 2-core machine (the process-wide slow mode of BENCHMARKS.md, "Loop cost"). Here
the old module (a file, e.g. from ``git show``) is loaded beside the installed one and both
solvers run on the loop-cost problem of ``benchmarks.solvers`` (``f(z) = tanh(z Wᵀ + x Uᵀ + b)``,
``ρ(W) = 1``, batch ``--batch``, batch-native, per-example relative ``--tol``, at most 100
evaluations), with the floor (24 evaluations of f in a ``fori_loop``) and fixed-point iteration
alongside, their calls alternated ``--calls`` times; printed: the largest difference of the two
solutions, and the median ms of each row.
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import statistics
import sys
import time

import jax
import jax.numpy as jnp

import deqjax as dq
from benchmarks import common, peers
from deqjax._src.solvers import registry


def _exec(path: str, name: str):
    """The module in the file ``path``, under ``name``."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def load(paths: str | list[str], name: str = "solver_module_old"):
    """The module in the file ``paths[0]`` (or ``paths``), under ``name``.

    ``paths[1:]`` are old versions of modules of ``deqjax._src.solvers`` (by file name) that it
    imports, dependencies first: each stands in for the installed one while the next ones and
    the old module load. The installed modules, and the solver registry (which an old module's
    function form registers itself in), are as they were afterwards.
    """
    paths = [paths] if isinstance(paths, str) else list(paths)
    package = importlib.import_module("deqjax._src.solvers")
    by_function, by_name = dict(registry.BY_FUNCTION), dict(registry.BY_NAME)
    saved = {}
    try:
        for path in paths[1:]:
            stem = pathlib.Path(path).stem
            full = f"{package.__name__}.{stem}"
            saved[stem] = (sys.modules.get(full), getattr(package, stem, None))
            module = _exec(path, f"{name}_{stem}")
            sys.modules[full] = module
            setattr(package, stem, module)
        return _exec(paths[0], name)
    finally:
        for stem, (module, attribute) in saved.items():
            full = f"{package.__name__}.{stem}"
            if module is None:
                sys.modules.pop(full, None)
            else:
                sys.modules[full] = module
            if attribute is not None:
                setattr(package, stem, attribute)
        registry.BY_FUNCTION.clear()
        registry.BY_FUNCTION.update(by_function)
        registry.BY_NAME.clear()
        registry.BY_NAME.update(by_name)


def main(argv=None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--old",
        required=True,
        nargs="+",
        help="the old version of the solver's module, then of the modules it imports",
    )
    parser.add_argument("--cls", default="Broyden", help="the solver class in both modules")
    parser.add_argument("--options", default="memory=10", help="the solver's fields, k=v,...")
    parser.add_argument("--d", type=int, default=512)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--tol", type=float, default=1e-4)
    parser.add_argument("--calls", type=int, default=40)
    args = parser.parse_args(argv)
    options = {k: int(v) for k, v in (kv.split("=") for kv in args.options.split(",") if kv)}
    old = load(args.old)
    new = getattr(dq.solvers, args.cls)
    p, x = common.tanh_layer(args.d, args.batch, 1.0)

    def make(cls, **kw):
        s = cls(max_steps=100, tol=args.tol, batch_ndim=1, **kw)
        # _run: the solve itself, past the compiled entry's cache (keyed by the class name).
        return jax.jit(
            lambda p, x: s._run(lambda z: peers.batch_cell(p, x, z), jnp.zeros_like(x)).value
        )

    def floor(p, x):
        return jax.lax.fori_loop(0, 24, lambda _, z: peers.batch_cell(p, x, z), jnp.zeros_like(x))

    rows = {
        "floor (24 evaluations)": jax.jit(floor),
        "FixedPointIteration": make(dq.solvers.FixedPointIteration),
        f"old {args.cls}": make(getattr(old, args.cls), **options),
        f"new {args.cls}": make(new, **options),
    }
    outs = {k: jax.block_until_ready(f(p, x)) for k, f in rows.items()}
    diff = float(jnp.max(jnp.abs(outs[f"old {args.cls}"] - outs[f"new {args.cls}"])))
    print(f"{common.machine()}; d {args.d}, batch {args.batch}; max |old - new| = {diff:.3g}")
    times: dict[str, list[float]] = {k: [] for k in rows}
    for _ in range(args.calls):
        for k, f in rows.items():
            t0 = time.perf_counter()
            jax.block_until_ready(f(p, x))
            times[k].append(time.perf_counter() - t0)
    medians = {k: 1e3 * statistics.median(v) for k, v in times.items()}
    for k, ms in medians.items():
        print(f"{k:28s} {ms:9.3f} ms")
    return medians


if __name__ == "__main__":
    main()
