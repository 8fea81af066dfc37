"""A follower that is not at its best response in the bi-level LQR game: the K-step learner
(``games.lqr.follower_models``), the two exact references (``games.lqr.follower_references``)
and the trainer's ``follower=FollowerModel("k_step", steps=K)``.

The leader pairs the learner's policy with V^g, the value of that fixed policy: checked against
its definition (Monte Carlo of one soft Bellman backup, and policy evaluation by iteration), at
the best response against Proposition 2. The K-step reference matches finite differences, both
references are the exact hypergradient at the best response, and Theorem 2's / 3's estimate
with exact critics under the learner's policy is unbiased for the as-if-optimal reference and
not for the one through the learner's update (slow)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.core.buffers import buffer_add, buffer_init, sample_discounted
from bchg_jax.core.follower_model import FollowerModel
from bchg_jax.core.maxent_lqr import response_from_value
from bchg_jax.games import lqr
from bchg_jax.games.lqr.follower_models import k_step_response, policy_view
from bchg_jax.games.lqr.follower_references import (
    as_if_optimal_hypergradient,
    fixed_policy_value,
    k_step_hypergradient,
)
from bchg_jax.problems.lqr_game import gain_metrics, lqr_game

BETA = 0.1


def _game(**kw):
    """A 3-d game with a 2-d leader and a 1-d follower: no piece is 1 x 1 but Rbar."""
    rng = np.random.default_rng(7)
    n, k, m = 3, 2, 1
    settings = dict(gamma_F=0.8, gamma_L=0.9, horizon=30)
    settings.update(kw)
    return lqr.LQRGame(
        A=0.5 * rng.normal(size=(n, n)),
        B=rng.normal(size=(n, m)),
        C=0.3 * rng.normal(size=(n, k)),
        Qbar=np.diag([1.0, 0.5, 2.0]),
        Rbar=np.array([[0.7]]),
        s0=np.array([1.0, -0.5, 0.3]),
        s_star=np.array([-0.5, 0.2, 0.0]),
        Sigma=np.eye(n),
        U=np.array([[0.4, 0.0], [0.1, 0.3]]),
        **settings,
    )


THETA = np.array([0.3, -0.2, 0.1, 0.05, 0.2, -0.1])


@pytest.mark.parametrize("stochastic", [True, False])
def test_view_at_the_best_response_is_proposition_2(x64, stochastic):
    """V^g of the best response's own policy is Proposition 2's value: P, M, v, c_next."""
    game, th = _game(), jnp.asarray(THETA)
    br = lqr.best_response(game, th, BETA, stochastic=stochastic, tol=1e-13, max_iters=10_000)
    A, B, C, _, R = game.arrays(th.dtype)
    CU = C @ jnp.asarray(game.U) * (1.0 if stochastic else 0.0)
    Acl = A + C @ th.reshape(2, 3)
    own = response_from_value(br.P, Acl, B, R, CU, game.gamma_F, BETA, observable=True)
    view = policy_view(game, th, own.K_w, own.cov, BETA, stochastic)
    for name in ("K_s", "K_a", "cov", "P", "M", "v", "c_next"):
        np.testing.assert_allclose(getattr(view, name), getattr(br, name), rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(fixed_policy_value(game, th, br), br.P, rtol=1e-9)


def test_view_is_the_value_of_the_fixed_policy(x64):
    """Off the best response (one Riccati step from P = 0): V^g(s, a) equals one soft Bellman
    backup of itself by Monte Carlo (b ~ g, a' ~ f, within 4 SE at 5 (s, a) pairs), and P_g is
    the limit of policy evaluation by iteration."""
    game, th = _game(), jnp.asarray(THETA)
    played, _ = k_step_response(game, th, BETA, jnp.zeros((3, 3)), 1)
    br = lqr.best_response(game, th, BETA)
    assert float(jnp.max(jnp.abs(played.K_s - br.K_s))) > 0.05  # far from the best response
    key = jax.random.PRNGKey(0)
    ks, ka, kb, kn = jax.random.split(key, 4)
    s = jax.random.normal(ks, (5, 3), jnp.float64)
    a = jax.random.normal(ka, (5, 2), jnp.float64)
    N = 200_000
    b = jax.vmap(lambda kk: played.sample(kk, s, a))(jax.random.split(kb, N))  # [N, 5, 1]
    s2 = lqr.transition(game, s, a, b)
    K = lqr.leader_gain(game, th)
    a2 = s2 @ K.T + jax.random.normal(kn, s2.shape[:-1] + (2,)) @ jnp.asarray(game.U).T
    r = -(jnp.einsum("...i,ij,...j", s, game.Qbar, s) + 0.7 * b[..., 0] ** 2)
    sample = (
        r
        - BETA * played.log_prob(s, a, b)
        + game.gamma_F * lqr.follower_value(game, played, s2, a2)
    )
    mean, se = sample.mean(0), sample.std(0) / np.sqrt(N)
    z = (mean - lqr.follower_value(game, played, s, a)) / se
    assert np.all(np.abs(z) < 4), z
    # P_g by iterating its Lyapunov map from 0 (the Kronecker solve is not used)
    L = played.K_s + played.K_a @ K
    A, B, C, Q, R = game.arrays(th.dtype)
    F = A + C @ K - B @ L
    P = jnp.zeros((3, 3))
    for _ in range(400):
        P = Q + L.T @ R @ L + game.gamma_F * F.T @ P @ F
    np.testing.assert_allclose(played.P, P, rtol=1e-9)
    np.testing.assert_allclose(fixed_policy_value(game, th, played), P, rtol=1e-9)


def test_many_steps_reach_the_best_response(x64):
    """K = 400 Riccati steps from P = 0: the best response's gains and Riccati solution."""
    game, th = _game(), jnp.asarray(THETA)
    br = lqr.best_response(game, th, BETA, tol=1e-13, max_iters=10_000)
    played, own = k_step_response(game, th, BETA, jnp.zeros((3, 3)), 400)
    np.testing.assert_allclose(played.K_s, br.K_s, atol=1e-10)
    np.testing.assert_allclose(played.K_a, br.K_a, atol=1e-10)
    np.testing.assert_allclose(own, br.P, rtol=1e-9)


@pytest.mark.parametrize("stochastic", [True, False])
def test_k_step_reference_matches_finite_differences(x64, stochastic):
    """d/dtheta J_L(theta, g_K(theta)) through 3 Riccati steps = central differences."""
    game, th = _game(), jnp.asarray(THETA)
    P_prev = 0.5 * jnp.eye(3)
    grad = k_step_hypergradient(game, th, P_prev, BETA, 3, stochastic=stochastic)

    def J(t):
        played, _ = k_step_response(game, t, BETA, P_prev, 3, stochastic=stochastic)
        kw = dict(gamma=game.gamma_L, stochastic=stochastic, resp=played)
        return lqr.leader_objective(game, t, BETA, **kw)

    eps = 1e-6
    fd = np.array([(J(th + eps * e) - J(th - eps * e)) / (2 * eps) for e in np.eye(6)])
    np.testing.assert_allclose(grad, fd, rtol=1e-5, atol=1e-9)
    # the through-update reference is not the best response's: a check that can fail
    exact = lqr.exact_hypergradient(game, th, BETA, stochastic=stochastic)
    assert np.max(np.abs(grad - exact)) > 1e-3 * np.max(np.abs(exact))


@pytest.mark.parametrize("stochastic", [True, False])
def test_references_are_the_exact_hypergradient_at_the_best_response(x64, stochastic):
    """As-if-optimal at the best response, and K-step from its Riccati solution with K large,
    are the exact hypergradient (implicit differentiation)."""
    game, th = _game(), jnp.asarray(THETA)
    kw = dict(stochastic=stochastic)
    br = lqr.best_response(game, th, BETA, tol=1e-13, max_iters=10_000, **kw)
    exact = lqr.exact_hypergradient(game, th, BETA, tol=1e-13, max_iters=10_000, **kw)
    np.testing.assert_allclose(as_if_optimal_hypergradient(game, th, br, BETA, **kw), exact, 1e-7)
    through = k_step_hypergradient(game, th, br.P, BETA, 300, **kw)
    np.testing.assert_allclose(through, exact, rtol=1e-6, atol=1e-12)


def br_P(game, th):
    """The best response's value matrix at th (a valid P_prev)."""
    return lqr.best_response(game, th, BETA).P


def test_learner_inputs_are_refused_by_name(x64):
    """K = 0, an indefinite P_prev, a policy of the wrong shape, a track_reference that is not a
    bool and the tabular families' follower models are refused with errors that name them."""
    game, th = _game(), jnp.asarray(THETA)
    with pytest.raises(ValueError, match="K"):
        k_step_response(game, th, BETA, jnp.zeros((3, 3)), 0)
    with pytest.raises(ValueError, match="positive semi-definite"):
        k_step_response(game, th, BETA, -jnp.eye(3), 1)
    with pytest.raises(ValueError, match="P_prev"):
        k_step_hypergradient(game, th, jnp.zeros((2, 2)), BETA, 1)
    # the order before 2026-12-07 (beta, P_prev), named rather than read as a matrix beta
    with pytest.raises(ValueError, match=r"takes \(game, theta, P_prev, beta, K\)"):
        k_step_hypergradient(game, th, BETA, br_P(game, th), 1)
    br = lqr.best_response(game, th, BETA)
    with pytest.raises(ValueError, match="K_a"):
        as_if_optimal_hypergradient(game, th, br._replace(K_a=br.K_a[:, :1]), BETA)
    with pytest.raises(ValueError, match="cov"):
        as_if_optimal_hypergradient(game, th, br._replace(cov=-br.cov), BETA)
    with pytest.raises(ValueError, match="track_reference"):
        lqr.TrainConfig(track_reference=1).validate()
    with pytest.raises(ValueError, match="lag"):
        lqr.TrainConfig(follower=FollowerModel("lag")).validate()


def _train(method, follower, iterations=15, config=None):
    game = lqr_game()
    base = lqr.TrainConfig() if config is None else config
    config = dataclasses.replace(base, iterations=iterations, follower=follower)
    config = dataclasses.replace(
        config, exploration=dataclasses.replace(config.exploration, warmup_steps=0)
    )
    tr = lqr.make_train(game, method, config, metrics_fn=gain_metrics)
    hp = jax.tree.map(lambda x: x[0], tr.hparams({}))
    state, m = jax.jit(tr.train)(jax.random.PRNGKey(3), hp)
    return game, state, {k: np.asarray(v) for k, v in m.items()}


@pytest.mark.slow
def test_trainer_with_many_steps_follows_the_best_response_run():
    """BC-HG (learned critic; the estimator reads the learner's V^g) against a 300-step learner
    is the best-response run (to float32 rounding: K_1 moves 0.38 over the run), its gap 0;
    the exact leader against a 1-step learner: the gap is positive and J is the return against
    the policy the learner plays."""
    _, _, best = _train("bchg", FollowerModel())
    _, _, many = _train("bchg", FollowerModel("k_step", steps=300))
    assert "follower_gap" not in best
    np.testing.assert_allclose(many["J"], best["J"], rtol=1e-4)
    np.testing.assert_allclose(many["K1"], best["K1"], rtol=1e-4)
    assert np.max(many["follower_gap"]) < 1e-4
    game, state, one = _train("exact", FollowerModel("k_step", steps=1))
    assert np.all(one["update_skipped"] == 0) and np.all(one["solve_capped"] == 0)
    assert np.min(one["follower_gap"][1:]) > 1e-4
    played = state.follower.played
    J = lqr.leader_objective(game, state.actor, 0.1, resp=played)
    np.testing.assert_allclose(one["J"][-1], J, rtol=1e-5)
    J_best = lqr.leader_objective(game, state.actor, 0.1)
    assert abs(float(J_best) - float(J)) > 1e-7  # J is not the best response's return


@pytest.mark.slow
def test_estimate_under_a_learner_is_unbiased_for_the_as_if_optimal_reference():
    """Theorem 2 (Gaussian leader) with exact critics, sampled under a 1-step learner's policy
    with V^g: the mean of 80 batches of 100 episodes is within 4 SE of the as-if-optimal
    reference and more than 4 SE from the reference through the learner's update (in some
    coordinate). (Theorem 3's deterministic form is not: the next test.)"""
    stochastic = True
    BETA_, GL, GF, T, L = 0.1, 0.8, 0.7, 20, 40
    game = lqr_game(U=np.array([[0.3]]), gamma_L=GL, gamma_F=GF)
    th = jnp.array([-3.0, 0.5])
    P0 = jnp.zeros((2, 2))
    played, _ = k_step_response(game, th, BETA_, P0, 1, stochastic=stochastic)
    opts = dict(episodes=100, leader_steps=T, extra_steps=L, stochastic=stochastic)

    @jax.jit
    def estimates(keys):
        one = lambda kk: lqr.exact_critic_estimate(game, th, BETA_, kk, resp=played, **opts)  # noqa: E731
        return jax.lax.map(one, keys, batch_size=8)

    e = np.asarray(estimates(jax.random.split(jax.random.PRNGKey(0), 80)), np.float64)
    mean, se = e.mean(0), e.std(0, ddof=1) / np.sqrt(len(e))
    kw = dict(horizon=T, gamma=GL, stochastic=stochastic)
    target = as_if_optimal_hypergradient(game, th, played, BETA_, **kw)
    through = k_step_hypergradient(game, th, P0, BETA_, 1, **kw)
    assert np.all(np.abs((mean - target) / se) < 4), (mean, target, se)
    assert np.max(np.abs((mean - through) / se)) > 4, (mean, through, se)


def test_track_reference_metrics_in_the_trainer():
    """track_reference adds cos / proj against both references, finite every iteration; for the
    best response the two references are one (the exact hypergradient), for the learner not.
    BC-HG with its learned critic against a 1-step learner: every update applied, the gap
    positive, the learner's memory finite and the last gap metric its last reaction's."""
    cfg = dict(track_reference=True)
    _, _, best = _train("bchg", FollowerModel(), iterations=4, config=lqr.TrainConfig(**cfg))
    _, state, one = _train(
        "bchg", FollowerModel("k_step", steps=1), iterations=6, config=lqr.TrainConfig(**cfg)
    )
    for m in (best, one):
        for name in ("cos_target", "proj_target", "cos_through", "proj_through"):
            assert np.all(np.isfinite(m[name])), name
    np.testing.assert_array_equal(best["proj_target"], best["proj_through"])
    assert np.any(one["proj_target"] != one["proj_through"])
    assert np.all(one["update_skipped"] == 0) and np.all(np.isfinite(one["J"]))
    assert np.all(one["follower_gap"][1:] > 0)
    assert np.all(np.isfinite(np.asarray(state.follower.own)))
    assert float(one["follower_gap"][-1]) == float(state.follower.gap)


@pytest.mark.slow
@pytest.mark.parametrize(
    "method, reaction",
    [("bchg", "q_gradient"), ("bchg_det", "q_gradient"), ("bchg_det", "policy_score")],
)
def test_tracked_estimate_with_exact_critics_projects_to_one(method, reaction):
    """The trainer's tracked estimate (Z times the surrogate's gradient on one minibatch) with an
    exact leader critic on a game whose episodes cut nothing (gamma_L = gamma_F = 0.5, 30
    steps): proj_target averages to 1 within 4 SE over 200 batches of 64 episodes, so the
    metric's scale is the gradient's (the explore preset's unbiased estimator). Under a 1-step
    learner's policy: the Gaussian leader, and the deterministic one with the white-box
    reaction (EstimatorConfig.reaction="policy_score"); Theorem 3's own form ("q_gradient")
    under the best response (off it, it is biased:
    test_deterministic_estimate_needs_the_best_response)."""
    stochastic = method == "bchg"
    learner = reaction == "policy_score" or stochastic
    game, th, H = _game(gamma_F=0.5, gamma_L=0.5, horizon=30), jnp.asarray(THETA), 60
    follower = FollowerModel("k_step", steps=1) if learner else FollowerModel()
    base = lqr.presets.explore().config
    config = dataclasses.replace(
        base,
        follower=follower,
        track_reference=True,
        estimator=dataclasses.replace(base.estimator, reaction=reaction),
    )
    tr = lqr.make_train(game, method, config)
    best = lqr.best_response(game, th, BETA, stochastic=stochastic)
    if learner:
        played, own = k_step_response(game, th, BETA, jnp.zeros((3, 3)), 1, stochastic=stochastic)
        resp = lqr.LearnerResponse(played, own, best, lqr.gain_gap(played, best))
    else:
        played = resp = best
    E = 64

    def one(key):
        k1, k2 = jax.random.split(key)
        ep = lqr.rollout(k1, game, th, played, E, 30, stochastic=stochastic)
        buf = buffer_add(buffer_init(E, 30, jnp.float32, (3, 2, 1)), ep.s, ep.a, ep.b, "on")

        def Q_L(s, a, b):  # ~ the infinite-horizon exact critic (0.5^60 left out)
            rem = jnp.full(s.shape[:-1], H)
            return lqr.leader_q(game, th, played, s, a, b, rem, game.gamma_L, H, stochastic)

        return tr.steps["reference_metrics"](k2, th, Q_L, resp, BETA, buf)

    keys = jax.random.split(jax.random.PRNGKey(0), 200)
    m = jax.jit(lambda ks: jax.lax.map(one, ks, batch_size=8))(keys)
    proj = np.asarray(m["proj_target"], np.float64)
    z = (proj.mean() - 1.0) / (proj.std(ddof=1) / np.sqrt(len(proj)))
    assert abs(z) < 4, (proj.mean(), z)


def _deterministic_estimates(game, th, resp, key, T, L, batches):
    """[batches, d] Theorem 3's estimate with exact critics under the follower policy ``resp``
    (``V^g`` values), as ``exact_critic_estimate`` computes it ("plain"), and the same batches
    with the follower's own score at each segment's step, ``grad_a log g(b|s, a)``, in place
    of ``(1/beta) grad_a Q_F(s, a, b)``, and ``grad_a V^g(s_k, a_k)`` at the later steps
    ("white box": Theorem 3's derivation without the envelope theorem)."""
    from bchg_jax.games.estimators import deterministic_hypergradient as det_hg

    gL, E = game.gamma_L, 100
    policy = lambda t_, s_: s_ @ lqr.leader_gain(game, t_).T  # noqa: E731

    def one(k):
        k1, k2 = jax.random.split(k)
        tr = lqr.rollout(k1, game, th, resp, E, T + L, stochastic=False)
        s, a, b = tr.s[:, :-1], tr.a, tr.b
        rem = jnp.broadcast_to(jnp.maximum(T - jnp.arange(T + L), 1), s.shape[:2])

        def Q_L(s_, a_, b_):
            return lqr.leader_q(game, th, resp, s_, a_, b_, rem, gL, T, False)

        bj = jax.vmap(lambda kk: resp.sample(kk, s, a))(jax.random.split(k2, 16))
        ben = Q_L(s, a, b) - jax.vmap(lambda bb: Q_L(s, a, bb))(bj).mean(0)
        dQL = jax.grad(lambda x: Q_L(s, x, b).sum())(a)
        dQF = jax.grad(lambda x: lqr.follower_q(game, resp, th, s, x, b).sum())(a)
        dVF = jax.grad(lambda x: lqr.follower_value(game, resp, s, x).sum())(a)
        score = jax.grad(lambda x: resp.log_prob(s, x, b).sum())(a)
        args = (BETA, gL, game.gamma_F)
        plain = det_hg(policy, th, s, dQL, ben, dQF, *args, "benefit", leader_steps=T)
        later = det_hg(policy, th, s, dQL, ben, dVF, *args, "benefit", leader_steps=T)
        own = ben[..., None] * (score - dVF / BETA)  # the own step's term, as a direct term
        own = det_hg(policy, th, s, own, ben, 0 * dQF, *args, "none", leader_steps=T)
        return plain, later + own

    keys = jax.random.split(key, batches)
    return jax.jit(lambda ks: jax.lax.map(one, ks, batch_size=4))(keys)


@pytest.mark.slow
def test_deterministic_estimate_needs_the_best_response(x64):
    """Theorem 3 (deterministic leader) leans on the best response twice: the follower's
    reaction to the leader's action at the segment's own step enters as (1/beta) grad_a Q_F
    (= grad_a log g + grad_a V_F / beta only for a Boltzmann policy of Q_F), and the later steps
    as grad_a Q_F (whose mean is grad_a V_F by the envelope theorem). Under a 1-step learner
    (gain gap 0.14) on the 3-d game, 40 batches of 100 episodes with exact critics: the plain
    estimate is more than 8 SE from the as-if-optimal reference in some coordinate (the library's
    exact_critic_estimate gives the same numbers); with the follower's own score and grad_a V^g
    it is within 4 SE in every coordinate, and so is the library's form of it
    (exact_critic_estimate(..., reaction="policy_score"))."""
    game, th = _game(gamma_F=0.5, gamma_L=0.5, horizon=30), jnp.asarray(THETA)
    T, L = 30, 20
    played, _ = k_step_response(game, th, BETA, jnp.zeros((3, 3)), 1, stochastic=False)
    best = lqr.best_response(game, th, BETA, stochastic=False)
    assert float(lqr.gain_gap(played, best)) > 0.1
    plain, white = _deterministic_estimates(game, th, played, jax.random.PRNGKey(0), T, L, 40)
    target = as_if_optimal_hypergradient(
        game, th, played, BETA, horizon=T, gamma=game.gamma_L, stochastic=False
    )
    library = lqr.exact_critic_estimate(
        game,
        th,
        BETA,
        jax.random.PRNGKey(5),
        episodes=100,
        leader_steps=T,
        extra_steps=L,
        stochastic=False,
        resp=played,
    )
    for est, off in ((plain, True), (white, False)):
        est = np.asarray(est)
        z = (est.mean(0) - target) / (est.std(0, ddof=1) / np.sqrt(len(est)))
        if off:
            assert np.max(np.abs(z)) > 8, z
            # the library's estimate is this plain one (one batch: within 5 of its spread)
            assert np.all(np.abs(library - est.mean(0)) < 5 * est.std(0, ddof=1)), library
        else:
            assert np.all(np.abs(z) < 4), z
    opts = dict(episodes=100, leader_steps=T, extra_steps=L, stochastic=False, resp=played)

    @jax.jit
    def library_white(keys):
        def one(kk):
            return lqr.exact_critic_estimate(game, th, BETA, kk, reaction="policy_score", **opts)

        return jax.lax.map(one, keys, batch_size=4)

    est = np.asarray(library_white(jax.random.split(jax.random.PRNGKey(9), 40)))
    z = (est.mean(0) - target) / (est.std(0, ddof=1) / np.sqrt(len(est)))
    assert np.all(np.abs(z) < 4), z


@pytest.mark.parametrize("K", [1, 2])
def test_k_steps_written_out(x64, K):
    """K steps from P_prev: the learner plays the Boltzmann policy of P_{K-1} =
    riccati_map^{K-1}(P_prev) on (A + C K_theta, B) (K = 1: of P_prev itself) and keeps
    P_K = riccati_map(P_{K-1}); by hand with core.maxent_lqr."""
    from bchg_jax.core.maxent_lqr import riccati_map

    game, th = _game(), jnp.asarray(THETA)
    A, B, C, Q, R = game.arrays(th.dtype)
    Acl = A + C @ th.reshape(2, 3)
    P = 0.3 * jnp.eye(3)
    played, own = k_step_response(game, th, BETA, P, K)
    for _ in range(K - 1):
        P = riccati_map(P, Acl, B, Q, R, game.gamma_F)
    S = R + game.gamma_F * B.T @ P @ B
    K_w = game.gamma_F * jnp.linalg.solve(S, B.T @ P)
    np.testing.assert_allclose(played.K_s, K_w @ A, rtol=1e-10)
    np.testing.assert_allclose(played.K_a, K_w @ C, rtol=1e-10)
    np.testing.assert_allclose(played.cov, 0.5 * BETA * jnp.linalg.inv(S), rtol=1e-10)
    np.testing.assert_allclose(own, riccati_map(P, Acl, B, Q, R, game.gamma_F), rtol=1e-10)


def test_a_diverging_learner_is_flagged_and_its_update_refused(x64):
    """A played policy whose closed loop (I - B K_w)(A + C K) diverges under gamma_F: V^g is NaN
    and flagged unconverged, and the trainer's acceptance rule refuses the update that led to
    it (the best response's solve converged)."""
    game, th = _game(), jnp.asarray(THETA)
    best = lqr.best_response(game, th, BETA)
    A, B, C, _, _ = game.arrays(th.dtype)
    Acl = A + C @ th.reshape(2, 3)
    K_w = -50.0 * B.T / (B.T @ B)  # (I - B K_w) Acl ~ 50 B B^T Acl / |B|^2: rho > 1
    rho = np.max(np.abs(np.linalg.eigvals(np.asarray((jnp.eye(3) - B @ K_w) @ Acl))))
    assert rho**2 * game.gamma_F > 1, rho
    view = policy_view(game, th, K_w, jnp.eye(1), BETA)
    assert not bool(view.converged) and not np.isfinite(float(view.v))
    ok = policy_view(game, th, 0.0 * K_w, jnp.eye(1), BETA)
    assert bool(ok.converged) and np.isfinite(float(ok.v))
    tr = lqr.make_train(lqr_game(), "bchg", lqr.TrainConfig(follower=FollowerModel("k_step")))
    accepted = tr.steps["accepted"]
    gap = jnp.zeros(())
    assert not bool(accepted(lqr.LearnerResponse(view, best.P, best, gap)))
    assert bool(accepted(lqr.LearnerResponse(ok, best.P, best, gap)))
    unsolved = best._replace(info=best.info._replace(converged=jnp.zeros((), bool)))
    assert not bool(accepted(lqr.LearnerResponse(ok, best.P, unsolved, gap)))


def test_white_box_reaction_pieces_written_out(x64):
    """policy_score_reaction: grad_a V^g along the episode and, at the sample's step,
    grad_a log g - grad_a V^g / beta; q_gradient_reaction: grad_a Q_F, nothing more. And
    deterministic_hypergradient's own_step adds gL^k ben_k own_step_k to each step's
    cotangent (the VJP of the actions written out)."""
    from bchg_jax.games.estimators import deterministic_hypergradient
    from bchg_jax.games.lqr.estimator import policy_score_reaction, q_gradient_reaction

    game, th = _game(), jnp.asarray(THETA)
    played, _ = k_step_response(game, th, BETA, jnp.zeros((3, 3)), 1, stochastic=False)
    ks = jax.random.split(jax.random.PRNGKey(1), 6)
    s, a, b = (jax.random.normal(k, (4, d)) for k, d in zip(ks[:3], (3, 2, 1), strict=True))
    se, ae, be = (jax.random.normal(k, (4, 5, d)) for k, d in zip(ks[3:], (3, 2, 1), strict=True))
    args = (game, played, th, s, a, b, se, ae, be, BETA)
    dF, own = policy_score_reaction(*args)
    dV_seg = jax.vmap(jax.vmap(jax.grad(lambda x, y: lqr.follower_value(game, played, x, y), 1)))
    np.testing.assert_allclose(dF, dV_seg(se, ae), rtol=1e-10)
    dV = jax.vmap(jax.grad(lambda x, y: lqr.follower_value(game, played, x, y), 1))(s, a)
    score = jax.vmap(jax.grad(lambda x, y, z: played.log_prob(x, y, z), 1))(s, a, b)
    np.testing.assert_allclose(own, score - dV / BETA, rtol=1e-10)
    dQ, none = q_gradient_reaction(*args)
    dQ_seg = jax.vmap(
        jax.vmap(jax.grad(lambda x, y, z: lqr.follower_q(game, played, th, x, y, z), 1))
    )
    assert none is None
    np.testing.assert_allclose(dQ, dQ_seg(se, ae, be), rtol=1e-10)

    E, T, gL = 4, 5, 0.7
    s3, dQL, dQF, extra = (
        jax.random.normal(k, (E, T, d))
        for k, d in zip(jax.random.split(ks[0], 4), (3, 2, 2, 2), strict=True)
    )
    ben = jax.random.normal(ks[1], (E, T))
    policy = lambda t_, x: x @ lqr.leader_gain(game, t_).T  # noqa: E731
    base = deterministic_hypergradient(policy, th, s3, dQL, ben, dQF, BETA, gL, 0.5)
    more = deterministic_hypergradient(policy, th, s3, dQL, ben, dQF, BETA, gL, 0.5, own_step=extra)
    disc = gL ** jnp.arange(T)
    ct = (disc * ben)[..., None] * extra  # [E, T, k]: d/dK of sum ct . (K s) is ct^T s
    by_hand = jnp.einsum("etk,etn->kn", ct, s3).reshape(-1) / E
    np.testing.assert_allclose(more - base, by_hand, rtol=1e-9, atol=1e-12)


def _det_surrogate_grads(game, th, resp, configs, key, E, M, H, pieces=None):
    """The trainer's deterministic surrogate gradient [d] for each (method, TrainConfig) of
    ``configs`` on one batch of E episodes under ``resp`` (minibatch M ~ gamma_L^t), with the
    exact leader critic of horizon H (``pieces``: the first method's Estimator, if given)."""
    T = game.horizon
    k1, k2, k3 = jax.random.split(key, 3)
    ep = lqr.rollout(k1, game, th, resp, E, T, stochastic=False)
    dims = (game.A.shape[0], game.C.shape[1], game.B.shape[1])
    buf = buffer_add(buffer_init(E, T, th.dtype, dims), ep.s, ep.a, ep.b, "on")
    e, t = sample_discounted(k2, buf, M, game.gamma_L)

    def Q_L(s, a, b):
        rem = jnp.full(s.shape[:-1], H)
        return lqr.leader_q(game, th, resp, s, a, b, rem, game.gamma_L, H, False)

    grads = []
    for i, (method, config) in enumerate(configs):
        extra = dict(estimator_pieces=pieces) if (i == 0 and pieces is not None) else {}
        surrogate = lqr.make_train(game, method, config, **extra).steps["surrogate"]
        grads.append(jax.grad(surrogate)(th, Q_L, resp, BETA, k3, e, t, buf))
    return grads


def _reaction_config(reaction, **estimator):
    base = lqr.presets.explore().config
    est = dataclasses.replace(base.estimator, reaction=reaction, **estimator)
    return dataclasses.replace(base, estimator=est)


def test_guide_pieces_act_on_the_white_box_own_step(x64):
    """With the white-box reaction the own-step term ``Ben f(s) . own`` belongs to the guiding
    term that the guide pieces see: clipping every sample's guiding gradient to ~0 removes all
    of it, so BC-HG det. then equals Naive-PGD det. on the same batch (the own-step term once
    bypassed the pieces and survived such a clip)."""
    from bchg_jax.games.guide import clip
    from bchg_jax.games.lqr.estimator import estimator

    game, th = _game(gamma_F=0.5, gamma_L=0.5, horizon=30), jnp.asarray(THETA)
    played, _ = k_step_response(game, th, BETA, jnp.zeros((3, 3)), 1, stochastic=False)
    config = _reaction_config("policy_score")
    pieces = estimator(config.estimator)._replace(guide=(clip(1e-30),))
    runs = [("bchg_det", config), ("naive_det", config), ("bchg_det", config)]
    key = jax.random.PRNGKey(3)
    clipped, naive, full = _det_surrogate_grads(game, th, played, runs, key, 4, 64, 60, pieces)
    np.testing.assert_allclose(clipped, naive, rtol=1e-9, atol=1e-12)
    assert float(jnp.max(jnp.abs(full - naive))) > 1e-3 * float(jnp.max(jnp.abs(naive)))


@pytest.mark.slow
def test_control_variate_does_not_inflate_the_white_box_form():
    """The control variate predicts the whole guiding term from the sample's state, the
    white-box own-step term included, so ``grad_a V_F`` at the sample's step cancels in it. On
    the paper's game at K = (-5, 1.5) (best response, exact critic, the explore preset's batch:
    2 episodes, minibatch 64), 400 batches: with the control variate the white-box form's
    per-batch std along K_1 is 0.94x Theorem 3's (0.223 against 0.238 in units of the gradient
    times Z); with the own-step term outside the pieces it was 1.40x (0.333). Both forms stay
    unbiased (within 4 SE of the exact hypergradient)."""
    game, th = lqr_game(), jnp.asarray([-5.0, 1.5])
    best = lqr.best_response(game, th, BETA, stochastic=False)
    exact = np.asarray(lqr.exact_hypergradient(game, th, BETA, stochastic=False), np.float64)
    runs = [("bchg_det", _reaction_config(r)) for r in ("q_gradient", "policy_score")]

    def one(key):
        return jnp.stack(_det_surrogate_grads(game, th, best, runs, key, 2, 64, 300))

    keys = jax.random.split(jax.random.PRNGKey(0), 400)
    g = np.asarray(jax.jit(lambda ks: jax.lax.map(one, ks, batch_size=16))(keys), np.float64)
    g = g * np.sum(game.gamma_L ** np.arange(game.horizon))  # the minibatch mean over Z
    mean, sd = g.mean(0), g.std(0, ddof=1)  # [2, d]
    z = (mean - exact) / (sd / np.sqrt(len(g)))
    assert np.all(np.abs(z) < 4), z
    assert sd[1, 0] < 1.15 * sd[0, 0], sd


def test_a_diverging_learner_in_the_trainer_is_skipped_not_capped():
    """A learner whose value matrix is reset to 0 on an open-loop unstable game plays b = 0 plus
    noise after one step (gamma_F rho(A + C K)^2 > 1): its V^g diverges, so the update is undone
    (update_skipped 1) and said (diverging 1), and it is not a capped solve (solve_capped 0:
    the best response's Riccati iteration converged)."""
    game = lqr.LQRGame(
        A=1.5 * np.eye(2),
        B=np.eye(2),
        C=np.array([[0.1], [0.0]]),
        Qbar=np.eye(2),
        Rbar=np.eye(2),
        s0=np.array([1.0, 0.0]),
        s_star=np.array([-0.8, 0.0]),
        Sigma=np.eye(2),
        U=np.array([[0.1]]),
        gamma_F=0.95,
        gamma_L=0.9,
        horizon=20,
    )
    config = lqr.TrainConfig(
        follower=FollowerModel("k_step", steps=1),
        exploration=lqr.ExplorationConfig(warmup_steps=0),
        actor=lqr.ActorConfig(theta0_std=0.0),
    )
    tr = lqr.make_train(game, "exact", config)
    hp = jax.tree.map(lambda x: x[0], tr.hparams({}))
    state = tr.init(jax.random.PRNGKey(0), hp)
    _, m = jax.jit(tr.steps["step"])(state, hp)
    assert int(m["update_skipped"]) == 0 and int(m["diverging"]) == 0
    reset = state._replace(follower=state.follower._replace(own=jnp.zeros((2, 2))))
    new, m = jax.jit(tr.steps["step"])(reset, hp)
    assert int(m["update_skipped"]) == 1 and int(m["diverging"]) == 1
    assert int(m["solve_capped"]) == 0
    np.testing.assert_array_equal(new.actor, reset.actor)  # undone
    # one step from P = 0 diverges at the theta that stays too: the learner keeps its state
    # and says so (its clock stopped), where it would otherwise look like one that learns
    assert int(m["follower_stalled"]) == 1
    np.testing.assert_array_equal(new.follower.own, reset.follower.own)


def test_a_learner_refused_an_update_learns_at_the_theta_that_stays():
    """An update undone (here: a diverged, NaN critic gives a non-finite gradient) leaves the
    leader where it was, and the learner takes its K steps there from its memory (the
    skeleton's keeps_learning): its value matrix moves on, as at every other iteration."""
    game = _game()
    config = lqr.TrainConfig(
        follower=FollowerModel("k_step", steps=2),
        exploration=lqr.ExplorationConfig(warmup_steps=0),
    )
    tr = lqr.make_train(game, "bchg_det", config)
    hp = jax.tree.map(lambda x: x[0], tr.hparams({}))
    state = tr.init(jax.random.PRNGKey(0), hp)
    nan = jax.tree.map(lambda x: jnp.full_like(x, jnp.nan), state.critic.params)
    behind = state.follower._replace(own=0.5 * state.follower.own)  # away from its fixed point
    state = state._replace(critic=state.critic._replace(params=nan), follower=behind)
    new, m = jax.jit(tr.steps["step"])(state, hp)
    assert int(m["update_skipped"]) == 1 and int(m["diverging"]) == 0
    assert int(m["follower_stalled"]) == 0
    np.testing.assert_array_equal(new.actor, state.actor)
    _, own = k_step_response(game, state.actor, hp.beta, state.follower.own, 2, stochastic=False)
    np.testing.assert_allclose(new.follower.own, own, rtol=1e-5, atol=1e-6)
    assert not np.allclose(new.follower.own, state.follower.own, rtol=1e-2)


def test_as_if_optimal_is_the_derivative_through_the_tilt(x64):
    """Off the best response: the as-if-optimal reference (autodiff through the stop-gradient
    tilt) equals central differences of J_L(theta, g tilted by Q^g_theta - Q^g_theta0), the
    tilt written out as a Gaussian (precision cov^-1 + (2/beta) dH_bb, gains
    cov_theta (cov^-1 K + (2/beta) dH_bx A or C))."""
    game, th = _game(), jnp.asarray(THETA)
    g, _ = k_step_response(game, th, BETA, jnp.zeros((3, 3)), 1)
    A, B, C, _, R = game.arrays(th.dtype)
    prec = jnp.linalg.inv(g.cov)

    def H(t):
        P = fixed_policy_value(game, t, g)
        return R + game.gamma_F * B.T @ P @ B, game.gamma_F * B.T @ P

    H0 = H(th)

    def J(t):
        d_bb, d_bx = (x - y for x, y in zip(H(t), H0, strict=True))
        cov = jnp.linalg.inv(prec + (2 / BETA) * d_bb)
        K_s = cov @ (prec @ g.K_s + (2 / BETA) * d_bx @ A)
        K_a = cov @ (prec @ g.K_a + (2 / BETA) * d_bx @ C)
        moved = g._replace(K_s=K_s, K_a=K_a, cov=cov, chol=jnp.linalg.cholesky(cov))
        return lqr.leader_objective(game, t, BETA, gamma=game.gamma_L, resp=moved)

    eps = 1e-6
    fd = np.array([(J(th + eps * e) - J(th - eps * e)) / (2 * eps) for e in np.eye(6)])
    grad = as_if_optimal_hypergradient(game, th, g, BETA)
    np.testing.assert_allclose(grad, fd, rtol=1e-5, atol=1e-9)
    # and it is not the direct part alone (the policy held): the tilt moves J
    direct = jax.grad(lambda t: lqr.leader_objective(game, t, BETA, gamma=game.gamma_L, resp=g))(th)
    assert np.max(np.abs(grad - direct)) > 1e-2 * np.max(np.abs(grad))
