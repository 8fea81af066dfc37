"""Each trainer's exact metrics walk the state's moments (or distribution) once per iteration
and policy: the LQR game's two returns (games.lqr.leader_returns), the LQ trainer's J with its
components (lq.objective_and_components) and the tabular game's two returns
(games.tabular.leader_returns), counted by benchmarks.loop_trips. XLA does not merge two such
scans inside a trainer's program, so two calls cost two horizons of sequential steps."""

import dataclasses
import inspect

import numpy as np
import pytest

from bchg_jax import lq
from bchg_jax.games import lqr
from bchg_jax.games import tabular as games
from bchg_jax.problems.lqr_game import lqr_game
from bchg_jax.problems.thermal import thermal
from bchg_jax.problems.toy_game import toy_game
from benchmarks.loop_trips import FIXED, count_trips


def _scan_steps(per_it, fn, path):
    """Fixed-length steps per iteration of the scan written in ``fn`` (at ``path``)."""
    lines, first = inspect.getsourcelines(inspect.unwrap(fn))
    line = first + next(i for i, text in enumerate(lines) if "jax.lax.scan(" in text)
    site = f"{path}:{line} "
    return sum(v for (s, kind), v in per_it.items() if kind == FIXED and s.startswith(site))


@pytest.mark.slow
def test_the_lqr_game_metrics_scan_the_moments_once():
    game = dataclasses.replace(lqr_game(), horizon=10)
    config = lqr.TrainConfig(
        iterations=4, episodes=2, exploration=lqr.ExplorationConfig(warmup_steps=0)
    )
    trainer = lqr.make_train(game, "naive", config)
    per_it, m = count_trips(trainer, {"actor_steps": np.array([1])}, runs=1, warmup=0, iterations=2)
    steps = _scan_steps(per_it, lqr.exact.state_factors, "games/lqr/exact.py")
    assert steps == 10  # one horizon, not two
    assert np.all(np.asarray(m["J_discounted"]) < np.asarray(m["J"]))  # two returns still


@pytest.mark.slow
def test_the_lq_metrics_scan_the_covariance_once():
    problem = thermal()
    trainer = lq.make_train(problem, "bchg", lq.TrainConfig(iterations=4))
    per_it, m = count_trips(trainer, {"lr": np.array([0.1])}, runs=1, warmup=0, iterations=2)
    steps = _scan_steps(per_it, lq.exact.discounted_state_covariance, "lq/exact.py")
    assert steps == problem.horizon
    assert {"J", "hvac_energy", "stability"} <= set(m)


@pytest.mark.slow
def test_the_game_metrics_scan_the_chain_once_per_policy():
    game = dataclasses.replace(toy_game(), time_limit=12)
    trainer = games.make_train(game, "naive", games.TrainConfig(iterations=4, episodes=2))
    grid = {"actor_steps": np.array([1]), "critic_steps": np.array([1])}
    per_it, m = count_trips(trainer, grid, runs=1, warmup=0, iterations=2)
    steps = _scan_steps(per_it, games.exact._returns, "games/tabular/exact.py")
    assert steps == 2 * 12  # J and J_discounted in one scan, J_target_actor in another
    assert np.all(np.asarray(m["J_discounted"]) != np.asarray(m["J"]))
