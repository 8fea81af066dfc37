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


def test_a_second_grid_of_the_same_size_traces_nothing(capsys):
    """``run_grid`` keeps its vmapped functions on the trainer: a second call with new values
    (same grid size and seeds) traces nothing (it traced and compiled both programs again), and
    its progress line does not call the chunk compiling (a new grid size does)."""
    from bchg_jax.core.sweep import run_grid

    traced = []

    def init(key, hp):
        return jnp.zeros((), jnp.float32)

    def step(state, hp):
        traced.append(1)
        new = state + hp.lr
        return new, {"J": new}

    config = types.SimpleNamespace(iterations=4)
    tr = build_trainer(None, "toy", config, init, step, HParams, jnp.float32)
    _, m = run_grid(tr, {"lr": [0.5, 0.25]}, seeds=2, iterations=3)
    first = len(traced)
    assert "compil" in capsys.readouterr().out
    _, m2 = run_grid(tr, {"lr": [1.0, 2.0]}, seeds=2, iterations=3)
    assert len(traced) == first, "the second grid traced again"
    assert "compil" not in capsys.readouterr().out
    np.testing.assert_allclose(m2["J"][:, :, -1], [[3.0, 3.0], [6.0, 6.0]])
    run_grid(tr, {"lr": [1.0, 2.0, 3.0]}, seeds=2, iterations=3)  # a new size compiles
    assert "compil" in capsys.readouterr().out


def test_an_empty_grid_axis_is_named():
    """``{"beta": []}`` was reported as a bad value of another field (lr)."""
    import pytest

    with pytest.raises(ValueError, match=r"grid axis \['beta'\] is empty"):
        HParams.from_grid({"beta": []})
