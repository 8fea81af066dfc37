"""``trainer.run`` is jitted: a user's Python loop of ``run(state, hp, 1)`` traces (and
compiles) the scan once. Un-jitted, every call traced and compiled it again (2.2 s and ~8 MB
each on a tabular problem, until the process ran out of memory maps after ~250 calls)."""

import types

import jax.numpy as jnp
import numpy as np

from bchg_jax.core.loop import build_trainer
from bchg_jax.tabular import HParams


def test_run_in_a_python_loop_traces_once():
    traced = []

    def init(key, hp):
        return jnp.zeros((), jnp.float32)

    def step(state, hp):
        traced.append(1)  # runs while tracing only
        new = state + hp.lr
        return new, {"J": new}

    config = types.SimpleNamespace(iterations=4)
    tr = build_trainer(None, "toy", config, init, step, HParams, jnp.float32)
    hp = HParams(lr=0.5, sarsa_alpha=0.5, beta=0.1)
    state = tr.init(jnp.zeros((2,), jnp.uint32), hp)
    for _ in range(5):
        state, m = tr.run(state, hp, 1)
    assert float(state) == 2.5 and np.asarray(m["J"]).shape == (1,)
    assert len(traced) == 1, f"run traced {len(traced)} times in 5 calls"
    tr.run(state, HParams(lr=0.25, sarsa_alpha=0.5, beta=0.1), 1)  # a new value: no retrace
    assert len(traced) == 1
    tr.run(state, hp, 3)  # a new static n traces again, once
    assert len(traced) == 2
