"""One Theorem 2: both game trainers' actor gradients are games/estimators.py's estimate.

On a fixed batch and minibatch, (a) the trainer's actor gradient equals the gradient of
``score_objective`` / ``deterministic_objective`` evaluated on the same quantities, and (b) both
equal Theorem 2 written out as a sum of explicit per-sample gradient vectors (float64)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.core.buffers import buffer_add, buffer_init, sample_discounted
from bchg_jax.games import lqr
from bchg_jax.games import tabular as tgame
from bchg_jax.games.estimators import deterministic_objective, influence_weights, score_objective
from bchg_jax.games.lqr.estimator import leader_sample
from bchg_jax.games.tabular.follower import response_from_q
from bchg_jax.problems import lqr_game, toy_game


def _tabular_setup(method):
    game = dataclasses.replace(toy_game(2.0), time_limit=40)  # short episodes: a fast test
    tr = tgame.make_train(game, method, tgame.TrainConfig(actor="tabular", dtype="float64"))
    st = tr.steps
    beta = jnp.asarray(0.05)
    state = jax.jit(tr.init)(jax.random.key(0), tgame.HParams(1, 1, 0.05))
    k1, k2, k3, k4 = jax.random.split(jax.random.key(1), 4)
    S, A, B = game.num_states, game.num_leader_actions, game.num_follower_actions
    params = 0.7 * jax.random.normal(k1, (S, A), jnp.float64)
    resp = response_from_q(state.follower, beta, 0, 0.0)  # g and V_F of the follower's Q
    g, V_F = resp.policy, resp.V
    state = state._replace(step=jnp.ones((), jnp.int32), actor=params)
    buf = jax.jit(st["collect"])(k2, state, resp)[0].buffer
    Q = jax.random.normal(k3, (S, A, B), jnp.float64)
    e, t = sample_discounted(k4, buf, 24, game.gamma_L)
    return game, st, params, g, V_F, beta, buf, Q, e, t


def test_tabular_game_actor_gradient_is_theorem2(x64):
    game, st, params, g, V_F, beta, buf, Q, e, t = _tabular_setup("bchg")
    got = jax.jit(st["actor_grad"])(params, Q, g, V_F, beta, e, t, buf)
    T = buf.a.shape[1]
    logf = st["log_policy"]

    @jax.jit
    def references(params):
        bs, ba, bb = (x.astype(jnp.int32) for x in (buf.s, buf.a, buf.b))
        s, a, b = bs[e, t], ba[e, t], bb[e, t]
        se, ae = bs[e, :T], ba[e, :T]
        f = st["policy"](params)
        q = Q[s, a, b]
        base = jnp.sum(f[s] * Q[s, :, b], -1)
        ben = q - jnp.sum(g[s, a] * Q[s, a], -1)
        adv_F = (V_F - jnp.sum(f * V_F, -1, keepdims=True))[se, ae]
        W = influence_weights(t, T, game.gamma_F, jnp.float64)
        # (a) the estimator module's objective on the same quantities
        ref = jax.grad(
            lambda p: score_objective(logf(p)[s, a], q - base, ben, logf(p)[se, ae], adv_F, W, beta)
        )(params)
        # (b) Theorem 2 as explicit per-sample gradient vectors
        glog = jax.vmap(jax.grad(lambda p, si, ai: logf(p)[si, ai]), (None, 0, 0))
        direct = jnp.einsum("m,mij->ij", q - base, glog(params, s, a))
        # the follower's discount from each sample's step on, written out here (W above is
        # the module's own: a wrong weight there agreed with itself in the check against (a))
        k = jnp.arange(T)[None, :]
        W_paper = jnp.where(k >= t[:, None], game.gamma_F ** (k - t[:, None]), 0.0)
        coef = (ben[:, None] * W_paper * adv_F).reshape(-1)
        guide = jnp.einsum("n,nij->ij", coef, glog(params, se.reshape(-1), ae.reshape(-1)))
        return ref, (direct + guide / beta) / s.shape[0], direct, guide

    ref, explicit, direct, guide = references(params)
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(got, explicit, rtol=1e-10, atol=1e-12)
    assert float(jnp.linalg.norm(guide)) > 1e-3 * float(jnp.linalg.norm(direct))  # not vacuous


def test_tabular_game_naive_has_no_guiding_term(x64):
    game, st, params, g, V_F, beta, buf, Q, e, t = _tabular_setup("naive")
    got = jax.jit(st["actor_grad"])(params, Q, g, V_F, beta, e, t, buf)
    bs, ba, bb = (x.astype(jnp.int32) for x in (buf.s, buf.a, buf.b))
    s, a, b = bs[e, t], ba[e, t], bb[e, t]
    f = st["policy"](params)
    adv = Q[s, a, b] - jnp.sum(f[s] * Q[s, :, b], -1)
    glog = jax.vmap(jax.grad(lambda p, si, ai: st["log_policy"](p)[si, ai]), (None, 0, 0))
    np.testing.assert_allclose(
        got, jnp.einsum("m,mij->ij", adv, glog(params, s, a)) / s.shape[0], rtol=1e-10, atol=1e-12
    )


def _lqr_setup(method):
    game = lqr_game(U=np.array([[0.3]]), horizon=30)
    tr = lqr.make_train(
        game,
        method,
        lqr.TrainConfig(
            dtype="float64",
            exploration=lqr.ExplorationConfig(warmup_steps=0),
            estimator=lqr.EstimatorConfig(benefit_samples=32, baseline_samples=8),
        ),
    )
    st = tr.steps
    beta = jnp.asarray(0.1)
    state = jax.jit(tr.init)(jax.random.key(0), lqr.HParams())
    theta = jnp.asarray([-0.5, -0.2])
    resp = jax.jit(st["follower"])(theta, beta)
    n, k, m = game.state_dim, game.leader_dim, game.follower_dim
    T = game.horizon
    trj = lqr.rollout(jax.random.key(2), game, theta, resp, 2, T, stochastic=method == "bchg")
    buf = buffer_add(buffer_init(2, T, jnp.float64, (n, k, m)), trj.s, trj.a, trj.b, "on")
    e, t = sample_discounted(jax.random.key(3), buf, 8, game.gamma_L)
    return game, st, state.critic, theta, resp, beta, buf, e, t


@pytest.mark.slow
def test_lqr_game_actor_gradient_is_theorem2(x64):
    game, st, critic, theta, resp, beta, buf, e, t = _lqr_setup("bchg")
    key = jax.random.key(4)
    got = jax.jit(st["actor_grad"])(theta, critic, resp, beta, key, e, t, buf)
    T = buf.a.shape[1]
    logf = lambda th, ss, aa: lqr.leader_log_prob(game, th, ss, aa)  # noqa: E731

    @jax.jit
    def references(theta):
        s, a, b = buf.s[e, t], buf.a[e, t], buf.b[e, t]
        se, ae = buf.s[e, :T], buf.a[e]
        kb, kj = jax.random.split(key)
        Q = lambda ss, aa, bb: st["Q"](critic, ss, aa, bb)  # noqa: E731
        q = Q(s, a, b)
        sample = lambda k, ss: leader_sample(game, theta, k, ss)  # noqa: E731
        base = st["estimator"].baseline(Q, resp, sample, kb, s, a, b)
        ben = st["estimator"].benefit(Q, resp, kj, s, a, b, q)
        adv = lqr.follower_value(game, resp, se, ae)
        W = influence_weights(t, T, game.gamma_F, jnp.float64)
        ref = jax.grad(
            lambda th: score_objective(
                logf(th, s, a), q - base, ben, logf(th, se, ae), adv, W, beta
            )
        )(theta)
        glog = jax.vmap(jax.grad(lambda th, ss, aa: logf(th, ss, aa)), (None, 0, 0))
        direct = jnp.einsum("m,mi->i", q - base, glog(theta, s, a))
        coef = (ben[:, None] * W * adv).reshape(-1)
        guide = jnp.einsum("n,ni->i", coef, glog(theta, se.reshape(-1, 2), ae.reshape(-1, 1)))
        return ref, (direct + guide / beta) / s.shape[0]

    ref, explicit = references(theta)
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(got, explicit, rtol=1e-9, atol=1e-12)


def test_lqr_game_deterministic_actor_gradient_is_the_appendix_theorem(x64):
    game, st, critic, theta, resp, beta, buf, e, t = _lqr_setup("bchg_det")
    key = jax.random.key(5)
    got = jax.jit(st["actor_grad"])(theta, critic, resp, beta, key, e, t, buf)
    T = buf.a.shape[1]

    @jax.jit
    def references(theta):
        K = lqr.leader_gain(game, theta)
        s, b = buf.s[e, t], buf.b[e, t]
        se, be = buf.s[e, :T], buf.b[e]
        a_pi = s @ K.T
        dQL = jax.vmap(jax.grad(lambda aa, ss, bb: st["Q"](critic, ss, aa, bb)))(a_pi, s, b)
        Q = lambda ss, aa, bb: st["Q"](critic, ss, aa, bb)  # noqa: E731
        ben = st["estimator"].benefit(Q, resp, key, s, a_pi, b, Q(s, a_pi, b))
        dQF = jax.grad(lambda aa: jnp.sum(lqr.follower_q(game, resp, theta, se, aa, be)))(se @ K.T)
        W = influence_weights(t, T, game.gamma_F, jnp.float64)
        ref = jax.grad(
            lambda th: deterministic_objective(
                s @ lqr.leader_gain(game, th).T,
                dQL,
                ben,
                se @ lqr.leader_gain(game, th).T,
                dQF,
                W,
                beta,
            )
        )(theta)
        # explicit: d(K s)/dK = (grad_a) s^T, row-major flattening of K [k, n]
        direct = jnp.einsum("mk,mn->kn", dQL, s).reshape(-1)
        guide = jnp.einsum("mt,mtk,mtn->kn", ben[:, None] * W, dQF, se).reshape(-1)
        return ref, (direct + guide / beta) / s.shape[0]

    ref, explicit = references(theta)
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(got, explicit, rtol=1e-9, atol=1e-12)


@pytest.mark.slow
def test_whole_episode_estimate_with_a_leader_action_of_probability_zero():
    """A float32 softmax leader with a logit gap of ~90 has f(a|s) = 0 exactly. The estimate was
    pulled back through log f: 0 / 0 = NaN in that row, and in every parameter a shared-parameter
    leader has. Now it is finite, and where every f > 0 it is the log-VJP's to rounding."""
    from bchg_jax.problems.random_tabular import random_tabular_game

    game = random_tabular_game(seed=0, S=4, A=2, B=3, gamma=0.8, time_limit=60)
    beta = 0.5
    Phi = jnp.asarray(np.random.default_rng(0).normal(size=(4, 3)), jnp.float32)
    shared = lambda W: jax.nn.softmax(Phi @ W, -1)  # noqa: E731
    table = lambda th: jax.nn.softmax(th, -1)  # noqa: E731

    def estimate(policy_fn, theta, key):
        f = policy_fn(theta)
        br = tgame.best_response(game, f, beta, "paper")
        V_L, Q_L = tgame.leader_values(game, f, br.policy)
        ep = tgame.rollout(key, game, f, br.policy, 16, 60)
        args = (ep, br.policy, Q_L, br.V, beta, game.gamma_L, game.gamma_F, "benefit", V_L)
        return tgame.hypergradient(policy_fn, theta, *args), args

    key = jax.random.key(0)
    for policy_fn, theta in (
        (table, jnp.zeros((4, 2)).at[0, 1].set(-110.0)),
        (shared, jnp.asarray([[40.0, -40.0], [0.0, 0.0], [0.0, 0.0]])),
    ):
        assert float(jnp.min(policy_fn(theta))) == 0.0  # the case: an exact zero
        est, _ = estimate(policy_fn, theta, key)
        assert np.all(np.isfinite(np.asarray(est)))
    # every f > 0: the same number as the VJP of log f (the form it replaced)
    theta = jnp.asarray(np.random.default_rng(1).normal(size=(3, 2)), jnp.float32)
    est, (ep, *rest) = estimate(shared, theta, key)
    f = shared(theta)
    # with theta = the table itself the estimate is ct / f, ct the [S, A] cotangent of log f
    # (under jit: eagerly a direct table is refused, its rows leaving the simplex)
    ct = jax.jit(lambda t: tgame.hypergradient(lambda x: x, t, ep, *rest))(f) * f
    _, vjp = jax.vjp(lambda th: jnp.log(shared(th)), theta)
    np.testing.assert_allclose(est, vjp(ct)[0], rtol=2e-4, atol=1e-6)


@pytest.mark.slow
def test_rollout_never_draws_an_entry_that_rounding_left_below_zero(x64):
    """1 - 0.8 - 0.2 is -5.6e-17: validate() accepts it (rounding), and the samplers must draw
    it with probability 0; its log was NaN, which jax.random.categorical picked every time."""
    S, A, B = 3, 2, 2
    P = np.zeros((S, A, B, S))
    P[..., 0], P[..., 1] = 0.8, 0.2
    P[..., 2] = 1.0 - P[..., 0] - P[..., 1]
    assert P.min() < 0
    rng = np.random.default_rng(0)
    rewards = [jnp.asarray(rng.normal(size=(S, A, B))) for _ in range(2)]
    game = tgame.TabularGame(jnp.asarray(P), jnp.asarray([1.0, 0.0, 0.0]), *rewards, 0.8, 0.8, 10)
    game = game.validate()
    f = jnp.asarray([[0.5, 0.5], [1.0, -1e-6], [0.5, 0.5]])  # a policy row within its tolerance
    g = jnp.full((S, A, B), 0.5)
    ep = tgame.rollout(jax.random.key(0), game, f, g, 500, 10)
    assert not np.any(np.asarray(ep.s) == 2)
    assert not np.any((np.asarray(ep.s) == 1) & (np.asarray(ep.a) == 1))
    frequency = np.mean(np.asarray(ep.s[:, 1:]) == 0)
    assert abs(frequency - 0.8) < 0.02, frequency
    # the trainer's batch: its last next states too
    config = tgame.TrainConfig(actor="tabular", dtype="float64", episodes=200)
    tr = tgame.make_train(game, "bchg", config)
    state = tr.init(jax.random.key(0), tgame.HParams(1, 1, 0.3))
    resp = response_from_q(state.follower, 0.3, 0, 0.0)
    _, full = tr.steps["collect"](jax.random.key(1), state, resp)
    assert not np.any(np.asarray(full.s) == 2)
