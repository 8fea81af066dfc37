"""benchmarks.loop_trips counts what the solvers report: a dense follower solve of n sweeps is
n + 1 host tests per iteration at one step per test, ceil(n / 4) + 1 at four."""

import jax
import numpy as np
import pytest

from bchg_jax.core.host_tests import ENV_VAR
from bchg_jax.problems.random_tabular import random_tabular_cmdp
from bchg_jax.tabular.train import TrainConfig, make_train
from benchmarks.loop_trips import COND, FIXED, HOST_TEST, SELECT, count_trips, counting, host_tests


def _trainer():
    prob = random_tabular_cmdp(jax.random.key(0), num_states=5, num_actions=3, time_limit=10)
    config = TrainConfig(num_envs=2, num_steps=10, iterations=8, solver="dense")
    return make_train(prob, "naive", config), {"lr": [0.1], "sarsa_alpha": [0.5], "beta": [0.3]}


def _follower_tests(per_it):
    """Host tests per iteration of the follower's soft value iteration (tabular/follower.py)."""
    return sum(
        v
        for (site, kind), v in per_it.items()
        if kind == HOST_TEST and "tabular/follower.py" in site
    )


@pytest.mark.slow
@pytest.mark.parametrize("steps", [1, 4])
def test_host_tests_are_the_follower_sweeps_plus_one(steps, monkeypatch):
    monkeypatch.setenv(ENV_VAR, str(steps))
    trainer, grid = _trainer()
    per_it, m = count_trips(trainer, grid, runs=1, warmup=4, iterations=4)
    sweeps = np.asarray(m["sweeps"]).reshape(-1)  # the counted iterations' solves, one run
    assert sweeps.min() > 4  # the solves span several trips
    assert _follower_tests(per_it) == pytest.approx(np.mean(np.ceil(sweeps / steps) + 1))
    outer = [v for (site, kind), v in per_it.items() if kind == FIXED and "core/loop.py" in site]
    assert outer == [1.0]  # the outer loop: one step per iteration
    assert host_tests(per_it) >= _follower_tests(per_it)
    with pytest.raises(ValueError, match="traced before"):
        count_trips(trainer, grid, runs=1, warmup=0, iterations=4)  # compiled: nothing counted


def test_a_cond_with_a_batched_predicate_is_a_select_and_a_shared_one_a_host_test():
    """Under vmap a cond whose predicate differs by lane runs both branches (a select, no host
    test); one whose predicate the lanes share stays a conditional (it crashed the tool on jax
    0.10.2, which has no batching.not_mapped)."""
    import jax.numpy as jnp

    def f(x, shared):
        batched = jax.lax.cond(x > 0, lambda: x, lambda: -x)
        return batched + jax.lax.cond(shared > 0, lambda: 1.0, lambda: 2.0)

    with counting() as counts:
        out = jax.jit(jax.vmap(f, (0, None)))(jnp.arange(-2.0, 3.0), 1.0)
        jax.block_until_ready(out)
        jax.effects_barrier()
    assert sorted(kind for _, kind in counts) == sorted([COND, SELECT])
    assert np.allclose(out, [3.0, 2.0, 1.0, 2.0, 3.0])
