"""The tabular game trainer's direct-term baselines in exact expectation: ``"state"`` (the
critic's V_L(s) = sum_{a', b'} f g Q) adds nothing, ``"reference"`` (sum_a' f(a'|s) Q(s, a', b)
with the sampled b, which depends on a) adds E[grad log f(a|s) sum_a' f(a'|s) Q(s, a', b)]."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.core.buffers import EpisodeBuffer
from bchg_jax.games import tabular as tgame
from bchg_jax.games.tabular.exact import best_response
from bchg_jax.problems import random_tabular_game


def _expected_direct_term(game, theta, g, Q, w, baseline):
    """sum_{s,a,b} w(s) f(a|s) g(b|s,a) x the gradient of Naive-PGD's surrogate (the direct term)
    on the one segment start (s, a, b): the exact expectation over a ~ f, b ~ g."""
    S, A, B = Q.shape
    config = tgame.TrainConfig(actor="tabular", dtype="float64", direct_baseline=baseline)
    grad = tgame.make_train(game, "naive", config).steps["actor_grad"]
    s, a, b = (x.ravel() for x in np.meshgrid(*map(np.arange, (S, A, B)), indexing="ij"))
    # every (s, a, b) as an episode of one step (its next state unused)
    s2 = np.stack([s, np.zeros_like(s)], 1)
    buf = EpisodeBuffer(*map(jnp.asarray, (s2, a[:, None], b[:, None], s.size)))
    V_F = jnp.zeros((S, A))
    per = jax.vmap(lambda n: grad(theta, Q, g, V_F, 1.0, n[None], jnp.zeros(1, int), buf))(
        jnp.arange(s.size)
    )
    f = jax.nn.softmax(theta, -1)
    weight = (w[:, None, None] * f[:, :, None] * g).ravel()
    return jnp.einsum("n,nij->ij", weight, per), f


@pytest.mark.slow
def test_state_baseline_is_unbiased_and_the_reference_one_is_not(x64):
    game = random_tabular_game()
    rng = np.random.default_rng(3)
    theta = jnp.asarray(rng.normal(size=(4, 2)))
    g = best_response(game, jax.nn.softmax(theta, -1), 0.5, "paper").policy
    Q = jnp.asarray(rng.normal(size=(4, 2, 3)))  # any critic: a baseline's bias does not need
    w = jnp.asarray(rng.dirichlet(np.ones(4)))  # the true Q_L nor a particular state weighting
    none, f = _expected_direct_term(game, theta, g, Q, w, "none")
    state, _ = _expected_direct_term(game, theta, g, Q, w, "state")
    reference, _ = _expected_direct_term(game, theta, g, Q, w, "reference")
    np.testing.assert_allclose(state, none, atol=1e-13)
    # the reference baseline's bias: E[grad log f(a|s) sum_a' f(a'|s) Q(s, a', b)]
    base = jnp.einsum("sa,sab->sb", f, Q)
    glog = jnp.eye(4)[:, None, :, None] * (jnp.eye(2)[None, :, None, :] - f[:, None, None, :])
    bias = jnp.einsum("s,sa,sab,sb,sauv->uv", w, f, g, base, glog)
    np.testing.assert_allclose(none - reference, bias, atol=1e-13)
    assert float(jnp.linalg.norm(bias)) > 0.05 * float(jnp.linalg.norm(none))
