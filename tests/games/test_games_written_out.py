"""The game families' shared pieces against their formulas written out in NumPy, at discounts
that differ and a leader horizon shorter than the episode: Theorem 2's per-step score weights and
the deterministic leader's cotangents, the cross-fitted ridge baseline at a ridge that matters,
the actor loop's non-finite flag, the target networks' Polyak step, the LQR game's follower Q,
and its estimator's baselines and sampled Benefit. A mutation audit found each of these
wrong-able without any other test failing (the statistical checks run at gamma_L = gamma_F,
tiny ridges, or weights gamma_L^20 ~ 0.01, and a baseline leaves the mean where it was)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bchg_jax.games import actor_critic as ac
from bchg_jax.games import lqr, tabular
from bchg_jax.games.control_variate import crossfit_baseline
from bchg_jax.games.estimators import deterministic_hypergradient, game_score_weights
from bchg_jax.games.lqr.estimator import (
    baselined_influence,
    leader_sample,
    same_noise_baseline,
    sampled_benefit,
)
from bchg_jax.games.lqr.game import follower_reward
from bchg_jax.problems.lqr_game import lqr_game
from bchg_jax.problems.toy_game import toy_game

E, T, LS, GL, GF, BETA = 3, 7, 5, 0.9, 0.6, 0.3


def _guide(ben, e, k):
    """sum_{t <= k, t < leader_steps} gamma_F^(k-t) gamma_L^t ben_t: the follower's forward sum
    of the leader's discounted benefits."""
    return sum(GF ** (k - t) * GL**t * ben[e, t] for t in range(min(k + 1, LS)))


def test_score_weights_written_out(x64):
    """w_k = gamma_L^k [k < L] (q_k - base_k) + adv_k / beta * guide_k (Theorem 2)."""
    rng = np.random.default_rng(0)
    q, base, ben, adv = (rng.normal(size=(E, T)) for _ in range(4))
    want = np.zeros((E, T))
    for e in range(E):
        for k in range(T):
            own = GL**k * (q[e, k] - base[e, k]) if k < LS else 0.0
            want[e, k] = own + _guide(ben, e, k) * adv[e, k] / BETA
    args = (jnp.asarray(x) for x in (q, base, ben, adv))
    got = game_score_weights(*args, BETA, GL, GF, leader_steps=LS)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12)


def test_deterministic_leader_cotangents_written_out(x64):
    """a = K s: the estimate is d/dK of sum_{e,k} c_k . K s_k / E with
    c_k = gamma_L^k [k < L] dQ_L/da + guide_k dQ_F/da / beta."""
    rng = np.random.default_rng(1)
    n, m = 2, 1
    s = rng.normal(size=(E, T, n))
    dQL, dQF = rng.normal(size=(E, T, m)), rng.normal(size=(E, T, m))
    ben = rng.normal(size=(E, T))
    ct = np.zeros((E, T, m))
    for e in range(E):
        for k in range(T):
            own = GL**k * dQL[e, k] if k < LS else 0.0
            ct[e, k] = own + _guide(ben, e, k) * dQF[e, k] / BETA
    want = np.einsum("etk,etn->kn", ct, s).reshape(-1) / E
    got = deterministic_hypergradient(
        lambda th, x: x @ th.reshape(m, n).T,
        jnp.zeros(m * n),
        *(jnp.asarray(x) for x in (s, dQL, ben, dQF)),
        BETA,
        GL,
        GF,
        leader_steps=LS,
    )
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12)


def test_crossfit_baseline_is_ridge_regression_on_the_other_groups(x64):
    """Each group's prediction from ridge regression on the other groups: standardised
    features and an intercept, (Z^T Z + ridge n I) c = Z^T Y with n the samples fitted. Every
    other test ran at ridge 1e-10, where the ridge's scale did not show."""
    rng = np.random.default_rng(0)
    M, G, ridge = 60, 3, 0.3
    groups = np.repeat(np.arange(G), M // G)
    X = rng.normal(size=(M, 2))
    Y = rng.normal(size=(M, 2)) + X @ rng.normal(size=(2, 2))
    got = np.asarray(
        crossfit_baseline(jnp.asarray(X), jnp.asarray(Y), jnp.asarray(groups), G, ridge)
    )
    want = np.zeros_like(Y)
    for j in range(G):
        fit = groups != j
        Z = np.c_[np.ones(M), (X - X[fit].mean(0)) / X[fit].std(0)]
        coef = np.linalg.solve(Z[fit].T @ Z[fit] + ridge * fit.sum() * np.eye(3), Z[fit].T @ Y[fit])
        want[~fit] = (Z @ coef)[~fit]
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def test_actor_steps_keep_a_non_finite_gradient_norm():
    """An infinite gradient at step 0 and a finite one at step 1: the returned norm stays
    non-finite (the trainers skip such an update; the last step's norm alone hid it)."""
    key = jax.random.key(0)
    first = jax.random.key_data(jax.random.fold_in(key, 0))
    draw = lambda k: jnp.where(jnp.all(jax.random.key_data(k) == first), 0, 1)  # noqa: E731
    objective = lambda p, batch, k: jnp.sum(p) * jnp.where(batch == 0, jnp.inf, 1.0)  # noqa: E731
    opt, p0 = optax.sgd(0.1), jnp.zeros(2)
    _, _, norm = ac.actor_steps(opt, objective, draw, key, p0, opt.init(p0), 2, 2)
    assert not np.isfinite(float(norm)), norm
    _, _, norm = ac.actor_steps(opt, objective, draw, key, p0, opt.init(p0), 1, 2)
    assert not np.isfinite(float(norm)), norm  # step 0 alone: inf, as its gradient


def test_target_networks_follow_polyak_with_tau_one():
    """tau = 1: after one iteration the target actor and critic are the new actor and critic
    (a Polyak step from the old actor passed every other test)."""
    tr = tabular.make_train(
        toy_game(), "bchg", tabular.TrainConfig(episodes=2, minibatch=8, iterations=1, tau=1.0)
    )
    hp = jax.tree.map(lambda x: x[0], tr.hparams({"actor_steps": [1], "beta": [0.05]}))
    state = tr.init(jax.random.key(0), hp)
    new, _ = tr.run(state, hp, 1)
    flat = lambda t: np.concatenate([np.ravel(x) for x in jax.tree.leaves(t)])  # noqa: E731
    assert not np.allclose(flat(new.actor), flat(state.actor))  # the actor moved
    np.testing.assert_allclose(flat(new.actor_targ), flat(new.actor), rtol=1e-6)
    np.testing.assert_allclose(flat(new.critic_targ), flat(new.critic.params), rtol=1e-6)


def test_lqr_game_follower_q_is_reward_plus_gamma_f_next_value(x64):
    """Q_F(s, a, b) = r_F(s, b) + gamma_F E[V_F(s', a')], a' = K s' + U eps: V_F is quadratic
    in a', so the expectation is V_F at the mean plus tr(U U^T Hess_a' V_F) / 2, at
    gamma_L 0.8 != gamma_F 0.7 (the deterministic-episodes reference called follower_q itself)."""
    game = lqr_game(U=np.array([[0.3]]), gamma_L=0.8, gamma_F=0.7)
    theta = jnp.array([-3.0, 0.5])
    resp = lqr.best_response(game, theta, 0.1)
    rng = np.random.default_rng(0)
    s, a, b = (jnp.asarray(rng.normal(size=(5, k))) for k in (2, 1, 1))
    s2 = lqr.transition(game, s, a, b)
    mean = s2 @ lqr.leader_gain(game, theta).T
    U = np.asarray(game.U, np.float64)

    def v_next(x, y):
        return lqr.follower_value(game, resp, x[None], y[None])[0]

    hess = jax.vmap(jax.hessian(v_next, argnums=1))(s2, mean)  # [5, 1, 1]
    ev = jax.vmap(v_next)(s2, mean) + 0.5 * np.einsum("ij,nji->n", U @ U.T, np.asarray(hess))
    want = np.asarray(follower_reward(game, s, b) + 0.7 * ev)
    got = np.asarray(lqr.follower_q(game, resp, theta, s, a, b))
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def test_tabular_game_hypergradient_written_out(x64):
    """The tabular game's estimate on fixed episodes: (1/E) sum_{e,k} w_k grad log f(a_k|s_k)
    with w_k = gamma_L^k (Q_L(s,a,b) - V_L(s)) + (V_F(s,a) - sum_a' f V_F(s,a')) / beta *
    sum_{t <= k} gamma_F^(k-t) gamma_L^t Ben_t, Ben = Q_L - sum_b g Q_L, one jax.grad per
    sample (any state baseline in place of the f-weighted one is unbiased, so the statistical
    checks could not tell them apart)."""
    rng = np.random.default_rng(3)
    S, A, B, n_ep, steps = 3, 2, 2, 2, 4
    theta = jnp.asarray(rng.normal(size=(S, A)))
    policy = lambda th: jax.nn.softmax(th, -1)  # noqa: E731
    g = jax.nn.softmax(jnp.asarray(rng.normal(size=(S, A, B))), -1)
    Q_L, V_F, V_L = (jnp.asarray(rng.normal(size=x)) for x in ((S, A, B), (S, A), (S,)))
    ep = tabular.GameEpisodes(
        *(jnp.asarray(rng.integers(0, k, size=(n_ep, steps))) for k in (S, A, B))
    )
    got = tabular.hypergradient(policy, theta, ep, g, Q_L, V_F, BETA, GL, GF, V_L=V_L)
    f = np.asarray(policy(theta))
    q_l, v_f, gg = np.asarray(Q_L), np.asarray(V_F), np.asarray(g)
    dlog = jax.jit(jax.grad(lambda th, s, a: jnp.log(policy(th)[s, a])))
    want = np.zeros((S, A))
    for e in range(n_ep):
        s, a, b = (np.asarray(x[e]) for x in ep)
        ben = [q_l[s[t], a[t], b[t]] - gg[s[t], a[t]] @ q_l[s[t], a[t]] for t in range(steps)]
        for k in range(steps):
            guide = sum(GF ** (k - t) * GL**t * ben[t] for t in range(k + 1))
            adv = v_f[s[k], a[k]] - f[s[k]] @ v_f[s[k]]
            w = GL**k * (q_l[s[k], a[k], b[k]] - float(V_L[s[k]])) + adv / BETA * guide
            want += w * np.asarray(dlog(theta, s[k], a[k])) / n_ep
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-10, atol=1e-12)


def _lqr_pieces():
    game = lqr_game(U=np.array([[0.3]]))
    theta, beta = jnp.array([-3.0, 0.5]), 0.1
    resp = lqr.best_response(game, theta, beta, tol=1e-13, max_iters=10_000)
    s = jax.random.normal(jax.random.PRNGKey(0), (7, 2), jnp.float64)
    return game, theta, resp, s


def test_lqr_influence_baseline_and_same_noise_baseline_written_out(x64):
    """baselined_influence(s, a) = V_F(s, a) - E_a' V_F(s, a'), its mean over the leader's
    noise 0 (Gauss-Hermite, exact for a quadratic); same_noise_baseline = mean_i Q(s, a'_i,
    mean_g(s, a'_i) + (b - mean_g(s, a))) over the same draws a'_i. Both were only ever used
    through the estimator, whose statistical check cannot see a wrong baseline."""
    game, theta, resp, s = _lqr_pieces()
    z, w = np.polynomial.hermite_e.hermegauss(6)
    w = jnp.asarray(w / np.sqrt(2 * np.pi))
    mean_a = s @ lqr.leader_gain(game, theta).T
    nodes = [mean_a + 0.3 * zi for zi in z]
    vals = jnp.stack([baselined_influence(game, resp, theta, s, x) for x in nodes])
    np.testing.assert_allclose(np.asarray(w @ vals), 0.0, atol=1e-9)
    a = mean_a + 0.2
    expected = w @ jnp.stack([lqr.follower_value(game, resp, s, x) for x in nodes])
    want = np.asarray(lqr.follower_value(game, resp, s, a) - expected)
    got = np.asarray(baselined_influence(game, resp, theta, s, a))
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)

    Q = lambda ss, aa, bb: jnp.sum(bb, -1) + 2.0 * jnp.sum(aa, -1) + jnp.sum(ss, -1)  # noqa: E731
    sampler = lambda k, x: leader_sample(game, theta, k, x)  # noqa: E731
    key = jax.random.PRNGKey(3)
    b = resp.mean(s, a) + 0.7
    got = np.asarray(same_noise_baseline(5)(Q, resp, sampler, key, s, a, b))
    alt = jax.vmap(lambda k: sampler(k, s))(jax.random.split(key, 5))
    want = np.mean([np.asarray(Q(s, x, resp.mean(s, x) + 0.7)) for x in alt], 0)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


def test_lqr_sampled_benefit_written_out(x64):
    """Ben = q - mean_j Q(s, a, b_j), b_j = resp.sample(k_j, s, a) on the split keys (a Q
    linear in b shows the sign)."""
    game, theta, resp, s = _lqr_pieces()
    a = s @ lqr.leader_gain(game, theta).T + 0.1
    Q = lambda ss, aa, bb: 3.0 * jnp.sum(bb, -1) + jnp.sum(aa, -1)  # noqa: E731
    b = resp.mean(s, a) + 0.5
    q = Q(s, a, b)
    key = jax.random.PRNGKey(4)
    got = np.asarray(sampled_benefit(6)(Q, resp, key, s, a, b, q))
    draws = [resp.sample(k, s, a) for k in jax.random.split(key, 6)]
    want = np.asarray(q) - np.mean([np.asarray(Q(s, a, x)) for x in draws], 0)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)
