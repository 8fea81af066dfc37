"""Followers that are not at their best response in the tabular game (issue 30): the follower
models' updates, the soft policy evaluation the leader pairs with them, the exact references
(as-if-optimal, through K backups, through the lag) and the trainer's follower settings."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.core.follower_model import FollowerModel, explore_mix
from bchg_jax.games import tabular as games
from bchg_jax.games.tabular import exact as ex
from bchg_jax.games.tabular.follower import soft_q_backups, soft_q_iteration
from bchg_jax.games.tabular.follower_models import follower_pieces, q_learning_update
from bchg_jax.games.tabular.rollout import rollout
from bchg_jax.problems import random_tabular_game
from bchg_jax.problems.toy_game import leader_policy_from_p, toy_game, toy_game_metrics

BACKUPS = ("reference", "paper")


def _softmax_leader(seed=1, S=4, A=2):
    theta = jnp.asarray(np.random.default_rng(seed).normal(size=(S, A)))
    return theta, (lambda th: jax.nn.softmax(th, -1))


def _central_differences(J, theta, h=1e-6):
    flat = np.asarray(theta).reshape(-1)
    out = np.zeros_like(flat)
    for i in range(flat.size):
        d = np.zeros_like(flat)
        d[i] = h
        out[i] = (J(theta + d.reshape(theta.shape)) - J(theta - d.reshape(theta.shape))) / (2 * h)
    return out.reshape(theta.shape)


@pytest.mark.parametrize("backup", BACKUPS)
def test_soft_policy_evaluation_at_the_best_response_is_the_soft_q_fixed_point(x64, backup):
    """V^g of g = g^dagger is Theorem 2's V_F (the leader sees what it saw before), and for any
    other g, Q^g solves g's own Bellman equation (written as an iteration here)."""
    game = random_tabular_game()
    theta, policy_fn = _softmax_leader()
    f = policy_fn(theta)
    br = ex.best_response(game, f, 0.5, backup)
    Q, V = ex.soft_policy_evaluation(game, f, br.policy, 0.5, backup)
    np.testing.assert_allclose(Q, br.Q, atol=1e-10)
    np.testing.assert_allclose(V, br.V, atol=1e-10)
    g = jax.nn.softmax(jnp.asarray(np.random.default_rng(3).normal(size=(4, 2, 3))), -1)
    Qg, Vg = ex.soft_policy_evaluation(game, f, g, 0.5, backup)
    if backup == "paper":  # the plain soft value of g: v(s') = sum_a' f V^g(s', a')
        nxt = jnp.sum(f * Vg, -1)
    else:  # the f-averaged Q under h = the f-geometric mean of g
        h = jax.nn.softmax(jnp.einsum("sa,sab->sb", f, jnp.log(g)), -1)
        nxt = jnp.sum(h * (jnp.einsum("sa,sab->sb", f, Qg) - 0.5 * jnp.log(h)), -1)
    bellman = game.follower_reward + game.gamma_F * jnp.einsum("sabt,t->sab", game.transition, nxt)
    np.testing.assert_allclose(Qg, bellman, atol=1e-10)
    np.testing.assert_allclose(Vg, jnp.sum(g * (Qg - 0.5 * jnp.log(g)), -1), atol=1e-12)


@pytest.mark.parametrize("backup", BACKUPS)
def test_as_if_optimal_hypergradient_is_the_exact_one_at_the_best_response(x64, backup):
    game = random_tabular_game()
    theta, policy_fn = _softmax_leader()

    @jax.jit
    def both(theta):
        g = ex.best_response(game, policy_fn(theta), 0.5, backup).policy
        exact = ex.exact_hypergradient(policy_fn, theta, game, 0.5, backup)
        got = ex.as_if_optimal_hypergradient(policy_fn, theta, game, g, 0.5, backup)
        # elsewhere it is Theorem 2's formula at g, not the exact hypergradient
        g2 = 0.5 * g + 0.5 / 3
        far = ex.as_if_optimal_hypergradient(policy_fn, theta, game, g2, 0.5, backup)
        return exact, got, far

    exact, got, far = both(theta)
    np.testing.assert_allclose(got, exact, atol=1e-10)
    assert np.abs(exact).max() > 1e-2  # not a vacuous comparison
    assert np.abs(far - exact).max() > 1e-3


def _underflow_game():
    """A 3-state float32 game where the best response at beta = 1e-3 underflows to 0 in
    different actions b for different leader actions a (the reference backup's geometric mean
    of g over a then needs log g where g is 0), and a leader policy f."""
    rng = np.random.default_rng(2)
    S, A, B = 3, 2, 2
    P = rng.random((S, A, B, S)) ** 2
    P /= P.sum(-1, keepdims=True)
    game = games.TabularGame(
        jnp.asarray(P, jnp.float32),
        jnp.full((S,), 1 / S, jnp.float32),
        jnp.asarray(rng.normal(size=(S, A, B)), jnp.float32),
        jnp.asarray(rng.normal(size=(S, A, B)), jnp.float32),
        0.9,
        0.9,
        50,
    ).validate()
    return game, jax.nn.softmax(jnp.asarray(0.5 * rng.normal(size=(S, A)), jnp.float32), -1)


def test_soft_policy_evaluation_of_a_best_response_that_underflowed():
    """At beta = 1e-3 the float32 best response has exact zeros. With g alone (log g clipped
    at log(tiny)) the reference backup's Q^g missed Q_F by 1.59 (|Q_F| 6.6), silently; now that
    call warns, and with ``log_g`` (log space) Q^g and V^g are Q_F and V_F to rounding."""
    game, f = _underflow_game()
    beta = 1e-3
    br = ex.best_response(game, f, beta, "reference")
    assert float(br.policy.min()) == 0.0  # the case is reached
    with pytest.warns(UserWarning, match="underflowed to 0"):
        Q_clipped, _ = ex.soft_policy_evaluation(game, f, br.policy, beta, "reference")
    assert float(jnp.abs(Q_clipped - br.Q).max()) > 0.1  # what log_g is for
    log_g = jax.nn.log_softmax(br.Q / beta, -1)
    Q, V = ex.soft_policy_evaluation(game, f, br.policy, beta, "reference", log_g=log_g)
    np.testing.assert_allclose(Q, br.Q, atol=1e-4)
    np.testing.assert_allclose(V, br.V, atol=1e-4)
    with pytest.raises(ValueError, match="log_g"):
        ex.soft_policy_evaluation(game, f, br.policy, beta, "reference", log_g=log_g[0])


def test_a_log_g_with_minus_inf_entries_is_refused_not_nan():
    """``jnp.log(g)`` of a best response with exact zeros has -inf entries, and the entropy
    terms' ``0 * log 0`` made Q^g, V^g and the as-if-optimal hypergradient all NaN with no
    error; now both refuse it, naming log_softmax."""
    game, f = _underflow_game()
    beta = 1e-3
    br = ex.best_response(game, f, beta, "paper")
    assert float(br.policy.min()) == 0.0  # the case is reached
    log_g = jnp.log(br.policy)
    for backup in ("reference", "paper"):
        with pytest.raises(ValueError, match="log_g must be finite.*log_softmax"):
            ex.soft_policy_evaluation(game, f, br.policy, beta, backup, log_g=log_g)
        with pytest.raises(ValueError, match="log_g must be finite.*log_softmax"):
            ex.as_if_optimal_hypergradient(
                lambda th: jax.nn.softmax(th, -1),
                jnp.log(f),
                game,
                br.policy,
                beta,
                backup,
                log_g=log_g,
            )


def test_followers_log_policy_is_their_policy_in_log_space():
    """Every follower model hands the leader's soft policy evaluation its log policy: at the
    start (the best response) its Q^g is Q_F even where g underflowed (off by 1.59 before), and
    exp(log_policy) is the policy played, after a reaction too."""
    game, f0 = _underflow_game()
    f1 = jax.nn.softmax(jnp.log(f0) + 0.3, -1).at[0].set(jnp.array([0.8, 0.2]))
    beta = 1e-3
    best = ex.best_response(game, f0, beta, "reference")
    for kind, kw in [("k_step", dict(steps=2)), ("lag", dict(mix=0.3)), ("q_learning", {})]:
        pieces = follower_pieces(
            game, FollowerModel(kind, **kw).validate(), "reference", 1e-7, 10**4
        )
        start = pieces.follower(f0, beta)
        np.testing.assert_allclose(start.Q, best.Q, atol=1e-4, err_msg=kind)
        new = pieces.follower(f1, beta, start)
        for r in (start, new):
            np.testing.assert_allclose(jnp.exp(r.log_policy), r.policy, atol=1e-6, err_msg=kind)
            assert np.all(np.isfinite(np.asarray(r.log_policy))), kind
    explore = FollowerModel("q_learning", explore=0.1).validate()
    start = follower_pieces(game, explore, "reference", 1e-7, 10**4).follower(f0, beta)
    np.testing.assert_allclose(jnp.exp(start.log_policy), start.policy, atol=1e-6)


@pytest.mark.parametrize("K", [1, 3])
@pytest.mark.parametrize("backup", BACKUPS)
def test_k_step_hypergradient_matches_central_differences(x64, K, backup):
    game = random_tabular_game()
    theta, policy_fn = _softmax_leader()
    Q_prev = jnp.asarray(np.random.default_rng(2).normal(size=(4, 2, 3)))
    P, r = game.transition, game.follower_reward

    @jax.jit
    def J(th):
        f = policy_fn(th)
        Q = soft_q_backups(P, r, Q_prev, f, 0.5, game.gamma_F, backup, K)
        return ex.leader_objective_at(game, f, jax.nn.softmax(Q / 0.5, -1))

    got = ex.k_step_hypergradient(policy_fn, theta, game, Q_prev, 0.5, K, backup)
    np.testing.assert_allclose(got, _central_differences(J, theta), atol=1e-8)


def test_k_step_hypergradient_tends_to_the_exact_one_and_lag_with_mix_1_is_it(x64):
    game = random_tabular_game()
    theta, policy_fn = _softmax_leader()
    exact = ex.exact_hypergradient(policy_fn, theta, game, 0.5)
    Q_prev = jnp.zeros((4, 2, 3))
    far = ex.k_step_hypergradient(policy_fn, theta, game, Q_prev, 0.5, 200, "reference")
    np.testing.assert_allclose(far, exact, atol=1e-10)
    g_prev = jnp.full((4, 2, 3), 1.0 / 3)
    np.testing.assert_allclose(
        ex.lag_hypergradient(policy_fn, theta, game, g_prev, 0.5, 1.0), exact, atol=1e-12
    )


def test_lag_hypergradient_matches_central_differences(x64):
    game = random_tabular_game()
    theta, policy_fn = _softmax_leader()
    g_prev = jax.nn.softmax(jnp.asarray(np.random.default_rng(2).normal(size=(4, 2, 3))), -1)

    @jax.jit
    def J(th):
        f = policy_fn(th)
        best = ex.best_response(game, f, 0.5).policy
        return ex.leader_objective_at(game, f, 0.7 * g_prev + 0.3 * best)

    got = ex.lag_hypergradient(policy_fn, theta, game, g_prev, 0.5, 0.3)
    np.testing.assert_allclose(got, _central_differences(J, theta), atol=1e-8)


def _pieces(kind, **kw):
    model = FollowerModel(kind, **kw).validate()
    return follower_pieces(toy_game(dtype=jnp.float64), model, "reference", 1e-10, 100_000)


@pytest.mark.slow
def test_k_step_follower_with_many_backups_is_at_the_best_response(x64):
    """From the best response to one leader, K backups against another: K = 3000 lands on the
    new best response, K = 1 does not; ``lag`` mixes its last policy with it."""
    f0, f1 = leader_policy_from_p(0.3, jnp.float64), leader_policy_from_p(0.6, jnp.float64)
    for kind, kw, near in [
        ("k_step", dict(steps=3000), True),
        ("k_step", dict(steps=1), False),
        ("lag", dict(mix=0.25), False),
    ]:
        pieces = _pieces(kind, **kw)
        start = pieces.follower(f0, 0.05)
        assert float(start.gap) < 1e-8  # every model starts at the best response
        new = pieces.follower(f1, 0.05, start)
        best = soft_q_iteration(toy_game(dtype=jnp.float64), f1, 0.05, tol=1e-10, max_sweeps=10**5)
        np.testing.assert_allclose(new.best, best.Q, atol=1e-8)
        assert (float(new.gap) < 1e-6) == near, (kind, float(new.gap))
        np.testing.assert_allclose(new.gap, np.abs(new.policy - best.policy).max(), atol=1e-12)
        if kind == "lag":
            np.testing.assert_allclose(new.policy, 0.75 * start.policy + 0.25 * best.policy)
        # the leader's view: the soft value of the played policy, not the private table
        Q, V = ex.soft_policy_evaluation(toy_game(dtype=jnp.float64), f1, new.policy, 0.05)
        np.testing.assert_allclose(new.V, V, atol=1e-9)


def test_q_learning_follower_converges_to_the_best_response_under_a_fixed_leader():
    """Soft Q-learning from a zero table on its own transitions of 60 batches (3 episodes of 150
    steps, 20% random actions) against a fixed leader: its softmax policy ends within 1e-3 of
    the best response (the toy game's moves are deterministic, so the updates carry no noise)."""
    game, beta = toy_game(), 0.05
    f = leader_policy_from_p(0.45)
    best = soft_q_iteration(game, f, beta, tol=1e-6, max_sweeps=5000)
    P = game.transition

    def batch(Q, key):
        g = explore_mix(jax.nn.softmax(Q / beta, -1), 0.2)
        ep = rollout(key, game, f, g, 3, 150)
        keys = jax.random.split(jax.random.fold_in(key, 1), 3)
        last = jax.vmap(lambda k, s, a, b: jax.random.categorical(k, jnp.log(P[s, a, b])))(
            keys, ep.s[:, -1], ep.a[:, -1], ep.b[:, -1]
        )
        ep = ep._replace(s=jnp.concatenate([ep.s, last[:, None]], 1))
        Q = q_learning_update(game, Q, ep, f, beta, "reference", 0.5)
        return Q, jnp.max(jnp.abs(jax.nn.softmax(Q / beta, -1) - best.policy))

    keys = jax.random.split(jax.random.key(0), 60)
    _, gaps = jax.jit(lambda Q: jax.lax.scan(batch, Q, keys))(jnp.zeros_like(best.Q))
    gaps = np.asarray(gaps)
    assert gaps[0] > 0.5 and gaps[-1] < 1e-3


def test_q_learning_update_is_the_sequential_soft_q_learning_rule(x64):
    """Two transitions by hand: each moves its entry by lr towards r_F + gamma_F v(s') with the
    table as the step before left it (time-major order)."""
    game = toy_game(dtype=jnp.float64)
    f = leader_policy_from_p(0.4, jnp.float64)
    Q0 = jnp.asarray(np.random.default_rng(0).normal(size=(3, 2, 3)))
    ep = games.GameEpisodes(jnp.asarray([[0, 1, 0]]), jnp.asarray([[0, 1]]), jnp.asarray([[1, 2]]))
    got = q_learning_update(game, Q0, ep, f, 0.05, "paper", 0.3)

    def v(Q, s):
        return jnp.sum(f[s] * 0.05 * jax.nn.logsumexp(Q[s] / 0.05, -1))

    Q = Q0
    for s, a, b, s2 in [(0, 0, 1, 1), (1, 1, 2, 0)]:
        target = game.follower_reward[s, a, b] + game.gamma_F * v(Q, s2)
        Q = Q.at[s, a, b].add(0.3 * (target - Q[s, a, b]))
    np.testing.assert_allclose(got, Q, atol=1e-12)


def _train(method="bchg", iterations=3, **kw):
    config = games.TrainConfig(iterations=iterations, actor="tabular", **kw)
    trainer = games.make_train(toy_game(), method, config, metrics_fn=toy_game_metrics)
    hp = trainer.hparams({"actor_steps": [2], "critic_steps": [2], "beta": [0.05]})
    state, m = jax.jit(trainer.train)(jax.random.key(3), jax.tree.map(lambda x: x[0], hp))
    return state, jax.tree.map(np.asarray, m)


@pytest.mark.slow
def test_best_response_follower_and_tracking_leave_the_training_bit_identical():
    """``follower=FollowerModel()`` is the default (the same program), and ``track_reference``
    only adds metrics: every metric of before is bit-identical, the state keeps one Q_F array
    (the layout of older checkpoints), and at the best response the two references agree."""
    assert games.TrainConfig(follower=FollowerModel()) == games.TrainConfig()
    _, base = _train()
    state, tracked = _train(follower=FollowerModel(), track_reference=True)
    for k in base:
        np.testing.assert_array_equal(tracked[k], base[k], err_msg=k)
    assert set(tracked) - set(base) == {"cos_target", "proj_target", "cos_through", "proj_through"}
    assert isinstance(state.follower, jax.Array) and state.follower.shape == (3, 2, 3)
    np.testing.assert_allclose(tracked["cos_target"], tracked["cos_through"], atol=1e-3)
    np.testing.assert_allclose(tracked["proj_target"], tracked["proj_through"], rtol=1e-2)


@pytest.mark.slow
@pytest.mark.parametrize(
    "model",
    [
        FollowerModel("k_step", steps=2),
        FollowerModel("lag", mix=0.5),
        FollowerModel("q_learning", lr=0.2, explore=0.1),
    ],
    ids=lambda m: m.label,
)
@pytest.mark.parametrize("method", ["bchg", "naive"])
def test_every_follower_model_trains_with_its_metrics(model, method):
    _, m = _train(method, iterations=4, follower=model, track_reference=True)
    for k in ("J", "follower_gap", "cos_target", "proj_target", "p", "g_S"):
        assert np.all(np.isfinite(m[k])), k
    assert np.all(m["solve_capped"] == 0) and np.all(m["follower_gap"] >= 0)
    through_nan = np.isnan(m["cos_through"]) & np.isnan(m["proj_through"])
    assert np.all(through_nan) == (model.kind == "q_learning")


@pytest.mark.slow
def test_k_step_trainer_runs_and_records_the_gap():
    """A short run of the k_step follower: its own metrics, finite references."""
    _, m = _train(follower=FollowerModel("k_step", steps=1), track_reference=True)
    assert {"follower_gap", "cos_through"} <= set(m)
    assert np.all(np.isfinite(m["cos_through"])) and np.all(m["follower_gap"] < 0.5)
    assert np.all(np.abs(m["cos_target"]) <= 1 + 1e-5)


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match=r"FollowerModel\.steps"):
        games.TrainConfig(follower=FollowerModel("k_step", steps=0)).validate()
    with pytest.raises(ValueError, match=r"FollowerModel\.kind"):
        games.TrainConfig(follower=FollowerModel("lazy")).validate()
    with pytest.raises(ValueError, match=r"FollowerModel\.explore"):
        games.TrainConfig(follower=FollowerModel("q_learning", explore=1.5)).validate()
    with pytest.raises(ValueError, match=r"TrainConfig\.follower must be a FollowerModel"):
        games.TrainConfig(follower="k_step").validate()
    with pytest.raises(ValueError, match=r"TrainConfig\.track_reference"):
        games.TrainConfig(track_reference="yes").validate()
    with pytest.raises(ValueError, match=r"FollowerModel\.mix"):
        games.make_train(
            toy_game(), "bchg", games.TrainConfig(follower=FollowerModel("lag", mix=0))
        )
    config = games.TrainConfig(follower=FollowerModel("lag", mix=0.5))
    assert dataclasses.asdict(config)["follower"] == dataclasses.asdict(config.follower)
    assert hash(config) == hash(games.TrainConfig(follower=FollowerModel("lag", mix=0.5)))


def test_track_reference_warns_when_episodes_cut_the_discount():
    """The exact references have no time limit: track_reference on episodes that leave a
    discount weight above TRUNCATION_WARN (the toy game: 0.55 beyond 150 steps) warns, a time limit
    long enough does not, and without track_reference nothing is said."""
    import dataclasses
    import warnings

    from bchg_jax.games.tabular.train import TRUNCATION_WARN

    game = toy_game()
    config = games.TrainConfig(iterations=2, actor="tabular", track_reference=True)
    with pytest.warns(UserWarning, match="truncat"):
        games.make_train(game, "bchg", config)
    from bchg_jax.core.bias_check import discount_weight_beyond

    T = next(
        t for t in range(150, 5000) if discount_weight_beyond(0.99, 0.99, t) <= TRUNCATION_WARN
    )
    long = dataclasses.replace(game, time_limit=T)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        games.make_train(long, "bchg", config)
        games.make_train(game, "bchg", dataclasses.replace(config, track_reference=False))
