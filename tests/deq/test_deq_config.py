"""A DEQ layer's settings, checked once: errors naming the argument, the defaults, the initial
state's sources; and what a front-end reads from its cell module (``ModuleCall``)."""

import functools

import jax.numpy as jnp
import pytest

import deqjax as dq
from deqjax._src.deq.deq_config import ANDERSON, checked_config
from deqjax._src.deq.phases import ModuleCall

SETTINGS = dict(
    solver=ANDERSON,
    adjoint=None,
    eval_solver=None,
    per_example=True,
    init_state=None,
    precision=None,
)


def config(**kw):
    return checked_config(lambda z, x: z, **{**SETTINGS, **kw})


@pytest.mark.parametrize(
    "kw, name",
    [
        (dict(solver=3), "solver"),
        (dict(eval_solver="fast"), "eval_solver"),
        (dict(adjoint="implicit"), "adjoint"),
        (dict(per_example=1), "per_example"),
        (dict(init_state=0), "init_state"),
        (dict(precision="fastest"), "precision"),
    ],
)
def test_bad_settings_raise_naming_the_argument(kw, name):
    with pytest.raises(ValueError, match=name):
        config(**kw)
    with pytest.raises(ValueError, match="cell"):
        checked_config(None, **SETTINGS)


def test_defaults_and_normalised_solvers():
    c = config(solver=functools.partial(dq.solvers.anderson, max_steps=7))
    assert c.solver == dq.solvers.Anderson(max_steps=7) and c.eval_solver == c.solver
    assert c.adjoint == dq.ImplicitAdjoint() and c.solver_for(False) is c.eval_solver
    hash(c)  # a static field / attribute of the front-ends


class WithInitialState:
    def initial_state(self, x):
        return jnp.ones((x.shape[0], 2))


def test_initial_state_sources_in_order():
    x = jnp.zeros((3, 4))
    assert config().start(object(), x, None).shape == (3, 4)  # zeros_like(x)
    assert config().start(WithInitialState(), x, None).shape == (3, 2)
    made = config(init_state=lambda x: jnp.zeros((x.shape[0], 5)))
    assert made.start(WithInitialState(), x, None).shape == (3, 5)
    assert made.start(WithInitialState(), x, jnp.zeros((3, 6))).shape == (3, 6)
    with pytest.raises(ValueError, match=r"z0 = init_state\(x\)"):
        config(init_state=lambda x: jnp.zeros(3, jnp.int32)).start(None, x, None)


class Phased:
    def prepare(self, x, *, key=None, inference=None):
        return x

    def step(self, z, ctx):
        return z


def test_module_call_reads_the_phases_and_keywords():
    assert ModuleCall.of(Phased(), "inference") == ModuleCall(True, True, "inference")
    assert ModuleCall.of(Phased(), "deterministic") == ModuleCall(True, True, None)
    assert ModuleCall.of(lambda z, x: z, "inference") == ModuleCall(False, False, None)
    cell = ModuleCall(True, True, "inference").cell(lambda p: Phased(), False, "highest")
    assert cell.flags == (("inference", False),) and cell.precision == "highest"
