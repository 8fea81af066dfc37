"""The learned-critic design of the LQR-game trainer: exploration episodes, the critic's replay
ring, sampled TD targets, input scales, the config checks, a guide piece, and the exact_direct
reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.core.buffers import buffer_add, buffer_init, sample_uniform
from bchg_jax.games import guide, lqr
from bchg_jax.games.lqr.exact import hypergradient_split, leader_q
from bchg_jax.games.lqr.train import input_scale
from bchg_jax.problems.lqr_game import lqr_game


def explore_config(iterations, replay=40, influence_cv=False, **kw):
    """The explore design with 2 behaviour episodes, no warm-up and fewer Monte Carlo samples."""
    return lqr.TrainConfig(
        iterations=iterations,
        episodes=2,
        tau=0.05,
        critic=lqr.CriticConfig(
            lr=1e-3, minibatch=256, replay=replay, target_samples=8, normalize=True, q_scale=10.0
        ),
        exploration=lqr.ExplorationConfig(warmup_steps=0, episodes=2, std=0.5),
        estimator=lqr.EstimatorConfig(
            direct_baseline="same_noise",
            influence="baseline",
            benefit_samples=16,
            baseline_samples=8,
            influence_cv=influence_cv,
        ),
        **kw,
    )


def test_ring_buffer_keeps_the_newest_episodes():
    buf = buffer_init(4, 3, jnp.float32, (1, 1, 1))
    for i in range(3):  # batches of 2 episodes filled with 0, 1, 2
        x = jnp.full((2, 4, 1), float(i))
        buf = buffer_add(buf, x, x[:, :3], x[:, :3], "ring")
    assert int(buf.count) == 6
    # slots 0-1 hold batch 2 (overwrote batch 0), slots 2-3 batch 1
    np.testing.assert_array_equal(np.asarray(buf.s[:, 0, 0]), [2, 2, 1, 1])
    e, _ = sample_uniform(jax.random.key(0), buf, 2000)
    assert set(np.asarray(e).tolist()) == {0, 1, 2, 3}
    with pytest.raises(ValueError, match="multiple"):
        buffer_add(buffer_init(5, 3, jnp.float32, (1, 1, 1)), x, x[:, :3], x[:, :3], "ring")


def test_input_scale_uses_the_filled_slots_only():
    buf = buffer_init(6, 5, jnp.float32, (2, 1, 1))
    k = jax.random.split(jax.random.key(1), 3)
    s = 3.0 + 2.0 * jax.random.normal(k[0], (2, 6, 2))
    a, b = jax.random.normal(k[1], (2, 5, 1)), jax.random.normal(k[2], (2, 5, 1)) - 1.0
    buf = buffer_add(buf, s, a, b, "ring")
    mean, std = input_scale(buf, floor=0.0)
    x = np.concatenate([np.asarray(s[:, :-1]), np.asarray(a), np.asarray(b)], -1).reshape(-1, 4)
    np.testing.assert_allclose(mean, x.mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(std, x.std(0), rtol=1e-4)


def test_config_checks():
    explore = lqr.ExplorationConfig(episodes=2)
    with pytest.raises(ValueError, match="replay ring"):
        lqr.TrainConfig(exploration=explore).validate()
    with pytest.raises(ValueError, match="multiple"):
        lqr.TrainConfig(
            episodes=2, exploration=explore, critic=lqr.CriticConfig(replay=10)
        ).validate()
    with pytest.raises(ValueError, match=r"ExplorationConfig\.std"):
        lqr.TrainConfig(exploration=lqr.ExplorationConfig(std=0.0)).validate()
    with pytest.raises(ValueError, match=r"CriticConfig\.q_scale"):
        lqr.TrainConfig(critic=lqr.CriticConfig(q_scale=0.0)).validate()
    # the control variate needs the newest batch as its groups, but only BC-HG has a guiding term
    off = lqr.TrainConfig(buffer="off", estimator=lqr.EstimatorConfig(influence_cv=True))
    with pytest.raises(ValueError, match="influence_cv needs TrainConfig.buffer='on'"):
        lqr.make_train(lqr_game(), "bchg", off)
    lqr.make_train(lqr_game(), "naive", off)


def _trained_at(theta, iterations, method="bchg_det", seed=0, **kw):
    """A trainer whose leader stays at ``theta`` (actor_steps = 0) for ``iterations``."""
    game = lqr_game()
    tr = lqr.make_train(game, method, explore_config(iterations, **kw))
    hp = lqr.HParams(actor_steps=0, critic_steps=10, beta=0.1)
    resp = tr.steps["follower"](theta, jnp.float32(0.1))
    s0 = tr.init(jax.random.key(seed), hp)._replace(actor=theta, actor_targ=theta, follower=resp.P)
    state, _ = jax.jit(tr.run, static_argnums=2)(s0, hp, iterations)
    return game, tr, state, resp


@pytest.mark.slow
def test_exploration_data_feed_the_critic_ring():
    """Every iteration adds the 2 target-policy episodes and 2 behaviour episodes
    ``a = K s + 0.5 eps``; the follower responds to the action it observes."""
    theta = jnp.array([-4.0, 0.0])
    game, tr, state, resp = _trained_at(theta, 3, replay=12)
    ring = state.replay
    assert int(ring.count) == 12
    s, a, b = ring.s[:, :-1], ring.a, ring.b
    dev = np.asarray(a - s @ theta.reshape(1, 2).T)[..., 0]  # [12, T]
    sd = dev.std(1)
    target, behaviour = sd[[0, 1, 4, 5, 8, 9]], sd[[2, 3, 6, 7, 10, 11]]
    assert np.all(target < 5e-3) and np.all(np.abs(behaviour - 0.5) < 0.1), sd
    eps_b = np.asarray(b - resp.mean(s, a))[..., 0] / float(resp.chol[0, 0])
    assert abs(eps_b.std() - 1.0) < 0.05 and abs(eps_b.mean()) < 0.05
    np.testing.assert_array_equal(np.asarray(state.buffer.s), np.asarray(ring.s[8:10]))


@pytest.mark.slow
@pytest.mark.parametrize("K", [(-4.0, 0.0), (-7.0, 0.0)])
def test_learned_critic_gives_theorem3_direct_term(K):
    """After 200 iterations of exploration data at a fixed leader K (replay 200 episodes), the
    direct term of Theorem 3, ``sum_t gamma_L^t grad_a Q_L(s_t, K s_t, b_t) s_t^T`` averaged over
    16 episodes of the target policy, computed with the learned critic is within 40% (relative
    norm) of the same sum with the exact (infinite-horizon discounted) grad_a Q_L. Measured
    over seeds 0-2: 3-32%."""
    theta = jnp.array(K)
    game, tr, state, resp = _trained_at(theta, 200, replay=200)
    E, T = 16, game.horizon
    tj = lqr.rollout(jax.random.key(7), game, theta, resp, E, T, stochastic=False)
    s, b = tj.s[:, :-1].reshape(-1, 2), tj.b.reshape(-1, 1)
    a = s @ theta.reshape(1, 2).T
    w = jnp.tile(game.gamma_L ** jnp.arange(T), E)[:, None]
    h = jnp.full(s.shape[:1], 400)

    def exact(aa):
        return leader_q(game, theta, resp, s, aa, b, h, game.gamma_L, 400, stochastic=False)

    def learned(aa):
        return tr.steps["Q"](state.critic, s, aa, b)

    ge = jax.grad(lambda aa: exact(aa).sum())(a)
    gl = jax.grad(lambda aa: learned(aa).sum())(a)
    de, dl = np.asarray((w * ge * s).sum(0) / E), np.asarray((w * gl * s).sum(0) / E)
    assert np.linalg.norm(dl - de) < 0.4 * np.linalg.norm(de), (de, dl)


@pytest.mark.slow
def test_exact_direct_ascends_the_direct_part_only():
    """The first Adam step of ``exact`` / ``exact_direct`` moves each coordinate by the actor
    learning rate along the sign of the full / direct exact hypergradient; at this K the two
    disagree on K1's sign."""
    jax.config.update("jax_enable_x64", True)
    try:
        theta = jnp.array([-9.36, -1.88])
        full, direct = hypergradient_split(lqr_game(), theta, 0.1, gamma=0.99)
        assert np.sign(full[0]) != np.sign(direct[0])
        for method, g in (("exact", full), ("exact_direct", direct)):
            tr = lqr.make_train(
                lqr_game(),
                method,
                lqr.TrainConfig(
                    iterations=1,
                    dtype="float64",
                    actor=lqr.ActorConfig(lr=0.01, clip=0.0),
                    exploration=lqr.ExplorationConfig(warmup_steps=0),
                ),
            )
            hp = lqr.HParams(actor_steps=1, critic_steps=1, beta=0.1)
            resp = tr.steps["follower"](theta, jnp.float64(0.1))
            s0 = tr.init(jax.random.key(0), hp)
            s0 = s0._replace(actor=theta, actor_targ=theta, follower=resp.P)
            state, _ = tr.run(s0, hp, 1)
            np.testing.assert_allclose(state.actor - theta, 0.01 * np.sign(g), rtol=1e-5)
    finally:
        jax.config.update("jax_enable_x64", False)


@pytest.mark.slow
@pytest.mark.parametrize("cv", [False, True])
def test_a_clip_piece_changes_only_the_guiding_term(cv):
    """``guide.clip`` (the example piece of docs/architecture.md), after the control variate or
    alone: a bound far above every sample's guiding gradient changes nothing; a bound near 0
    removes the guiding term, leaving the direct term (= ``naive_det`` on the same minibatch)."""
    theta = jnp.array([-9.0, -6.0])
    game, tr, state, resp = _trained_at(theta, 3, influence_cv=cv)
    T, beta = game.horizon, jnp.float32(0.1)
    tj = lqr.rollout(jax.random.key(3), game, theta, resp, 2, T, stochastic=True)
    buf = buffer_add(state.buffer, tj.s, tj.a, tj.b, "on")
    e, t = sample_uniform(jax.random.key(4), buf, 64)
    config = explore_config(3, influence_cv=cv)

    def grad(method, *pieces):
        est = lqr.estimator(config.estimator)
        est = est._replace(guide=est.guide + pieces)
        step = lqr.make_train(game, method, config, estimator_pieces=est).steps["actor_grad"]
        return np.asarray(step(theta, state.critic, resp, beta, jax.random.key(5), e, t, buf))

    direct, full = grad("naive_det"), grad("bchg_det")
    guiding = full - direct
    assert np.linalg.norm(guiding) > 1e-3 * np.linalg.norm(direct)
    np.testing.assert_allclose(grad("bchg_det", guide.clip(1e9)), full, rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(
        grad("bchg_det", guide.clip(1e-9)), direct, rtol=1e-4, atol=1e-5 * np.linalg.norm(guiding)
    )


def _critic_task_at(tr, theta, beta=0.1):
    """(state, resp, (critic, loss, draw)): one collected batch of ``tr`` with the actor and
    its target at ``theta`` and the follower's answer to it, and the critic task's pieces."""
    hp = lqr.HParams(actor_steps=0, critic_steps=1, beta=beta)
    resp = tr.steps["follower"](theta, jnp.float32(beta))
    state = tr.init(jax.random.key(0), hp)._replace(actor=theta, actor_targ=theta)
    state, _ = tr.steps["collect"](jax.random.key(1), state, resp)
    return state, resp, tr.steps["critic_task"](state, resp)


@pytest.mark.slow
def test_td_targets_draw_with_a_key_of_their_own():
    """The critic's TD targets average follower actions b' ~ g(.|s', a') drawn with the key the
    actor-critic loop gives the loss (``fold_in(key, 10_000 + i)``), not with one derived from
    the minibatch's key: ``fold_in(k, 1)`` is ``split(k)[1]``, the key whose bits
    ``sample_uniform`` turns into the step indices, so the targets' noise repeated those bits.
    The same minibatch under two loss keys gives two losses."""
    game = lqr_game()
    tr = lqr.make_train(game, "bchg_det", explore_config(1))
    theta = jnp.array([-4.0, 0.0])
    state, resp, (critic, loss, draw) = _critic_task_at(tr, theta)
    batch = draw(jax.random.key(2))
    assert len(batch) == 4  # (s, a, b, s'): the minibatch carries no key
    losses = [float(loss(critic.params, batch, jax.random.key(k))) for k in (3, 4)]
    assert np.all(np.isfinite(losses)) and losses[0] != losses[1], losses


def test_td_loss_is_the_squared_error_to_the_leaders_discounted_target():
    """The critic's TD loss on a minibatch, written out with the mean follower action (0 target
    samples): mean (Q(s, a, b) - r_L(s) - gamma_L Q_targ(s', K_targ s', mean_b(s', K_targ s')))^2.
    gamma_F (0.95) in place of gamma_L (0.99) passed test_explore.py."""
    from bchg_jax.games.lqr import leader_reward

    game = lqr_game()
    config = lqr.TrainConfig(
        iterations=1,
        episodes=2,
        critic=lqr.CriticConfig(minibatch=64, target_samples=0, normalize=False),
        exploration=lqr.ExplorationConfig(warmup_steps=0),
    )
    tr = lqr.make_train(game, "bchg", config)
    theta = jnp.array([-4.0, 0.2])
    state, resp, (critic, loss, draw) = _critic_task_at(tr, theta)
    s, a, b, s2 = draw(jax.random.key(2))
    Q = tr.steps["Q"]
    targ = critic._replace(params=state.critic_targ)
    a2 = s2 @ lqr.leader_gain(game, state.actor_targ).T
    y = leader_reward(game, s) + game.gamma_L * Q(targ, s2, a2, resp.mean(s2, a2))
    ref = jnp.mean((Q(critic, s, a, b) - y) ** 2)
    got = loss(critic.params, (s, a, b, s2), jax.random.key(3))
    np.testing.assert_allclose(float(got), float(ref), rtol=1e-5)
