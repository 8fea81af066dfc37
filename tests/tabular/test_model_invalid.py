"""An update that would take theta where the problem's tables are not distributions is dropped
and flagged (``model_invalid``, counted in ``update_skipped``). ``validate()`` checks theta0
only: a user's linear parametrisation ``P0 + theta D`` left the simplex during training, and
every solve and J stayed finite (J 9.8-16 on a 7-state problem) with nothing flagged until J
turned NaN 370 iterations later. On the chain below the old trainer ended at theta[0] = 2.01
(an entry of -1.41) with J = 21.2, above the 1 / (1 - gamma) = 10 any policy can earn."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax import tabular
from bchg_jax.tabular import TabularCMDP


def _linear_chain(sampler: bool = False):
    """3 states; action 1 moves to state 2 with probability 0.4 + theta[0] (else to state 0),
    action 0 stays; the leader is paid in state 2, so its ascent pushes theta[0] past 0.6,
    where p(0 | s, 1) = 0.6 - theta[0] turns negative."""
    S = 3
    stay = np.zeros((S, S), np.float32)
    stay[np.arange(S), np.arange(S)] = 1.0

    def P(th):
        move = jnp.zeros((S, S), th.dtype).at[:, 2].set(0.4 + th[0]).at[:, 0].set(0.6 - th[0])
        return jnp.stack([jnp.asarray(stay, th.dtype), move], 1)  # [S, B, S]

    return TabularCMDP(
        transition=P,
        init_dist=lambda th: jnp.asarray([1.0, 0.0, 0.0], th.dtype),
        follower_reward=lambda th: jnp.zeros((S, 2), th.dtype).at[:, 1].set(1.0 + th[1]),
        leader_reward=lambda th: jnp.zeros((S, 2), th.dtype).at[2].set(1.0),
        gamma_F=0.9,
        gamma_L=0.9,
        theta0=jnp.asarray([0.0, 0.0], jnp.float32),
        sample_transition=P if sampler else None,
        time_limit=30,
    ).validate()


@pytest.mark.parametrize("method", ["exact", "bchg"])
def test_updates_off_the_simplex_are_dropped_and_flagged(method):
    problem = _linear_chain(sampler=method == "bchg")
    config = tabular.TrainConfig(num_envs=4, num_steps=30, iterations=40)
    tr = tabular.make_train(problem, method, config)
    state, m = tr.train(jax.random.key(0), tabular.HParams(lr=0.05, sarsa_alpha=0.5, beta=0.1))
    invalid, skipped = np.asarray(m["model_invalid"]), np.asarray(m["update_skipped"])
    assert invalid.sum() >= 3, invalid  # the ascent reaches the edge
    assert np.all(skipped[invalid > 0] == 1)
    theta = np.asarray(state.theta)
    assert theta[0] <= 0.6 + problem.row_sum_tolerance(), theta  # never left the simplex
    problem.validate(jnp.asarray(theta))
    assert np.all(np.isfinite(np.asarray(m["J"])))
    assert float(m["J"][-1]) > float(m["J"][0]) + 1.0  # it learned up to the edge (3.7 -> 8.6)
