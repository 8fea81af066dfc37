"""Follower references (``tabular.follower_references``) on a problem with terminal states: at
the best response the as-if-optimal hypergradient equals the exact one there too (its fixed-policy
soft values stop at terminal states)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.problems import random_tabular_cmdp
from bchg_jax.tabular import exact
from bchg_jax.tabular import follower_references as refs


@pytest.mark.slow
def test_as_if_optimal_with_terminal_states_is_exact_at_the_best_response(x64):
    """States 1 and 3 terminal: as_if_optimal_hypergradient at g^{theta dagger} equals
    exact_hypergradient (the fixed-policy values V^g use the continuation; ignoring it gives a
    different dQ^g and a different gradient)."""
    prob = random_tabular_cmdp(
        jax.random.key(3), num_states=5, num_actions=3, dim=4, dtype=jnp.float64
    )
    term = np.array([False, True, False, True, False])
    prob = dataclasses.replace(prob, terminal=term)
    theta = prob.theta0 + 0.3 * jax.random.normal(jax.random.key(1), prob.theta0.shape)
    beta = 0.5
    br = exact.best_response(prob, theta, beta)
    g = np.asarray(exact.exact_hypergradient(prob, theta, beta))
    as_if = np.asarray(refs.as_if_optimal_hypergradient(prob, theta, br.policy, beta))
    np.testing.assert_allclose(as_if, g, rtol=1e-8, atol=1e-12)
