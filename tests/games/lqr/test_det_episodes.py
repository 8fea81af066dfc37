"""The LQR-game trainer collects each method's episodes with its own leader: ``a = K s`` for the
deterministic methods (Theorem 3 is an on-policy estimate), ``N(K s, U U^T)`` for the others."""

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.core.buffers import sample_discounted
from bchg_jax.games import lqr
from bchg_jax.games.lqr.estimator import deterministic_surrogate
from bchg_jax.games.lqr.exact import leader_q
from bchg_jax.problems.lqr_game import lqr_game


def _collected(game, method, theta, beta, config, key):
    """The actor's buffer after one ``collect`` of ``method``'s trainer at leader ``theta``."""
    tr = lqr.make_train(game, method, config)
    hp = lqr.HParams(actor_steps=1, critic_steps=1, beta=beta)
    resp = tr.steps["follower"](theta, jnp.asarray(beta, theta.dtype))
    state = tr.init(jax.random.key(0), hp)._replace(actor=theta, actor_targ=theta)
    return tr, resp, state, tr.steps["collect"](key, state, resp)[0].buffer


@pytest.mark.slow
def test_each_method_collects_with_its_own_leader():
    game = dataclasses.replace(lqr_game(), U=np.array([[0.3]]))
    theta = jnp.array([-4.0, 0.5])
    config = lqr.TrainConfig(iterations=1, exploration=lqr.ExplorationConfig(warmup_steps=0))
    for method, std in (("bchg_det", 0.0), ("naive_det", 0.0), ("bchg", 0.3), ("naive", 0.3)):
        *_, buf = _collected(game, method, theta, 0.1, config, jax.random.key(1))
        dev = np.asarray(buf.a - buf.s[:, :-1] @ theta.reshape(1, 2).T)
        assert abs(dev.std() - std) < 0.02, (method, dev.std())


def test_a_deterministic_method_without_behaviour_episodes_warns():
    """With no behaviour episodes the deterministic methods' critic never sees the leader's
    action vary after the warm-up: make_train says so (and only then)."""
    with pytest.warns(UserWarning, match="do not identify grad_a Q_L"):
        lqr.make_train(lqr_game(), "naive_det", lqr.TrainConfig())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lqr.make_train(lqr_game(), "bchg_det", lqr.presets.explore().config)
        lqr.make_train(lqr_game(), "bchg", lqr.TrainConfig())


@pytest.mark.slow
def test_deterministic_estimate_on_the_trainers_episodes_is_unbiased(x64):
    """Theorem 3's estimate (BC-HG, exact critics) on the batches the ``bchg_det`` trainer
    collects, on a random 3-d game with a leader scale U ~ 0.3, matches the exact hypergradient
    of the deterministic leader: within 4 SE per coordinate and 10% of its norm over 300 batches
    of 16 episodes (measured 1.2 SE, 1.0%). Before, the trainer collected with the Gaussian
    leader: 11.4 SE and 15% of the norm over 400 batches."""
    rng = np.random.default_rng(5)
    n, k, m = 3, 2, 2
    A = rng.normal(size=(n, n))
    A *= 0.9 / np.max(np.abs(np.linalg.eigvals(A)))
    B, C = rng.normal(size=(n, m)) * 0.5, rng.normal(size=(n, k)) * 0.5
    U = np.array([[1.0, 0.0], [0.33, 0.67]]) * 0.3
    gF, gL, T, beta, horizon = 0.7, 0.8, 70, 0.4, 110
    game = lqr.LQRGame(
        A,
        B,
        C,
        np.diag([1.0, 0.5, 2.0]),
        np.array([[1.0, 0.2], [0.2, 0.7]]),
        np.array([1.0, -0.5, 0.3]),
        np.array([-0.3, 0.2, 0.1]),
        np.diag([2.0, 3.0, 1.5]),
        U,
        gF,
        gL,
        T,
    ).validate()
    theta = jnp.asarray(rng.normal(size=k * n) * 0.3)
    config = lqr.TrainConfig(
        iterations=1,
        episodes=16,
        dtype="float64",
        exploration=lqr.ExplorationConfig(warmup_steps=0),
        estimator=lqr.EstimatorConfig(benefit_samples=16),
    )
    tr = lqr.make_train(game, "bchg_det", config)
    hp = lqr.HParams(actor_steps=1, critic_steps=1, beta=beta)
    resp = lqr.best_response(game, theta, beta, stochastic=False, tol=1e-13)
    state = tr.init(jax.random.key(0), hp)._replace(actor=theta, actor_targ=theta)
    ref = np.asarray(
        lqr.exact_hypergradient(
            game, theta, beta, horizon=horizon, gamma=gL, stochastic=False, tol=1e-13
        )
    )
    Z = float(np.sum(gL ** np.arange(T)))

    def Q(s, a, b):  # the exact leader critic (infinite horizon in effect)
        h = jnp.full(s.shape[:-1], horizon)
        return leader_q(game, theta, resp, s, a, b, h, gL, horizon, False)

    def one(key):
        k1, k2, k3 = jax.random.split(key, 3)
        buf = tr.steps["collect"](k1, state, resp)[0].buffer
        e, t = sample_discounted(k2, buf, 256, gL)
        est = tr.steps["estimator"]
        sur = lambda th: deterministic_surrogate(est, game, th, Q, resp, beta, k3, e, t, buf, True)  # noqa: E731
        return Z * jax.grad(sur)(theta)

    nb = 300
    g = np.asarray(jax.jit(jax.vmap(one))(jax.random.split(jax.random.key(4), nb)))
    mean, se = g.mean(0), g.std(0, ddof=1) / np.sqrt(nb)
    assert np.all(np.abs(mean - ref) < 4 * se), ((mean - ref) / se, ref)
    assert np.linalg.norm(mean - ref) < 0.1 * np.linalg.norm(ref), (mean, ref)
