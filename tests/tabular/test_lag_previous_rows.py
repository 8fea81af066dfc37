"""``tabular.follower_references.lag_hypergradient`` refuses a concrete ``previous`` policy
whose rows are not distributions: nothing downstream of the reference's own check reads
``previous`` as a policy (it only enters the mixture ``(1 - mix) previous + mix g^dagger``), so
rows summing to 2 would otherwise give a finite gradient of no policy."""

import jax
import jax.numpy as jnp
import pytest

from bchg_jax.problems import random_tabular_cmdp
from bchg_jax.tabular import follower_references as refs


def test_lag_refuses_previous_rows_not_summing_to_one(x64):
    """Rows summing to 2, or with a negative entry, are refused by name; a valid previous
    policy of the same shape is accepted (finite gradient)."""
    prob = random_tabular_cmdp(
        jax.random.key(3), num_states=5, num_actions=3, dim=4, dtype=jnp.float64
    )
    theta = prob.theta0
    uniform = jnp.full((5, 3), 1.0 / 3)
    with pytest.raises(ValueError, match="previous must hold probability rows"):
        refs.lag_hypergradient(prob, theta, 2 * uniform, 0.5, 0.5)
    skewed = uniform.at[0].set(jnp.array([1.5, -0.25, -0.25]))  # sums to 1, negative entries
    with pytest.raises(ValueError, match="previous must hold probability rows"):
        refs.lag_hypergradient(prob, theta, skewed, 0.5, 0.5)
    ok = refs.lag_hypergradient(prob, theta, uniform, 0.5, 0.5)
    assert jnp.all(jnp.isfinite(ok))
