"""The bi-level LQR Markov game: Proposition 2 follower, exact evaluator, both estimators."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from small_problems import lqr_game_2d

from bchg_jax.games import lqr
from bchg_jax.games.lqr import (
    best_response,
    follower_q,
    follower_state_value,
    follower_value,
    leader_policy,
    leader_reward,
    rollout,
)
from bchg_jax.games.lqr.exact import (
    exact_hypergradient,
    leader_objective,
    leader_q,
)
from bchg_jax.problems.lqr_game import lqr_game


@pytest.fixture(autouse=True)
def x64():
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", False)


@pytest.mark.slow
def test_spec_instance_returns():
    """The reference numbers (docs/experiments.md): ~0.015 at the random start, 0.07 at
    K=(-4,0), 0.27 at (-6,0)."""
    game = lqr_game()
    J = lambda K: float(leader_objective(game, jnp.array(K), 0.1))  # noqa: E731
    assert abs(J([-4.0, 0.0]) - 0.07) < 0.005
    assert abs(J([-6.0, 0.0]) - 0.27) < 0.01
    ths = jax.random.normal(jax.random.PRNGKey(0), (500, 2), jnp.float64)
    start = jax.vmap(lambda th: leader_objective(game, th, 0.1))(ths)
    assert abs(float(start.mean()) - 0.015) < 0.002


def test_proposition2_soft_bellman():
    """Q_F(s,a,b) - beta log g(b|s,a) = V_F(s,a) for every b (soft Bellman optimality with the
    Boltzmann policy), E_a V_F(s,a) closed form = Monte Carlo, and the Riccati fixed point."""
    game = lqr_game(U=np.array([[0.3]]))
    th, beta = jnp.array([-3.0, 0.5]), 0.1
    resp = best_response(game, th, beta, tol=1e-13, max_iters=10_000)
    assert bool(resp.converged)
    k = jax.random.split(jax.random.PRNGKey(0), 4)
    s, a, b = (jax.random.normal(kk, (20, d)) for kk, d in zip(k[:3], (2, 1, 1), strict=False))
    lhs = follower_q(game, resp, th, s, a, b) - beta * resp.log_prob(s, a, b)
    np.testing.assert_allclose(lhs, follower_value(game, resp, s, a), atol=1e-10)
    # V_F(s, a) = beta log int exp(Q_F / beta) db by quadrature over b
    grid = jnp.linspace(-6.0, 6.0, 4001)[:, None, None]
    qq = follower_q(game, resp, th, s[:3], a[:3], jnp.broadcast_to(grid, (4001, 3, 1)))
    v = beta * jax.nn.logsumexp(qq / beta, 0) + beta * jnp.log(grid[1, 0, 0] - grid[0, 0, 0])
    np.testing.assert_allclose(v, follower_value(game, resp, s[:3], a[:3]), atol=1e-6)
    aa = leader_policy(game, th, s[:1]).sample(seed=k[3], sample_shape=(100_000,))
    vals = follower_value(game, resp, s[:1], aa)
    assert abs(float(vals.mean() - follower_state_value(game, resp, th, s[:1])[0])) < 4 * float(
        vals.std()
    ) / np.sqrt(vals.size)


def test_exact_return_matches_monte_carlo():
    game = lqr_game()
    for K in ([-6.0, 0.0], [-8.5, 0.4]):
        th = jnp.array(K)
        resp = best_response(game, th, 0.1)
        tr = rollout(jax.random.PRNGKey(1), game, th, resp, 20_000)
        R = leader_reward(game, tr.s[:, :100]).sum(1)
        se = float(R.std()) / np.sqrt(R.size)
        assert abs(float(R.mean()) - float(leader_objective(game, th, 0.1))) < 4 * se
        Rd = (leader_reward(game, tr.s[:, :100]) * 0.99 ** jnp.arange(100)).sum(1)
        assert abs(
            float(Rd.mean()) - float(leader_objective(game, th, 0.1, gamma=0.99))
        ) < 4 * float(Rd.std()) / np.sqrt(Rd.size)


def test_exact_critic_matches_monte_carlo():
    """leader_q(s, a, b) from arbitrary (s, a, b) = mean return of episodes started there."""
    game = lqr_game(U=np.array([[0.3]]))
    th = jnp.array([-5.0, 0.2])
    resp = best_response(game, th, 0.1)
    s, a, b = jnp.array([[0.3, -0.02]]), jnp.array([[0.4]]), jnp.array([[-0.1]])
    h, g = 15, 0.9
    exact = float(leader_q(game, th, resp, s, a, b, jnp.array([h]), g, h)[0])
    s1 = s @ jnp.asarray(game.A).T + b @ jnp.asarray(game.B).T + a @ jnp.asarray(game.C).T
    # episodes of h - 1 steps started from the next state s1 (the game's s0 overridden)
    game1 = lqr_game(U=np.array([[0.3]]), s0=np.asarray(s1[0]))
    tr = rollout(jax.random.PRNGKey(2), game1, th, resp, 50_000, h - 1)
    R = leader_reward(game, s)[0] + g * (
        leader_reward(game, tr.s[:, : h - 1]) * g ** jnp.arange(h - 1)
    ).sum(1)
    assert abs(float(R.mean()) - exact) < 4 * float(R.std()) / np.sqrt(R.size) + 1e-12


def test_exact_hypergradient_matches_finite_differences():
    game = lqr_game()
    for stochastic in (True, False):
        th = jnp.array([-6.5, 0.3])
        grad = jax.jit(lambda t: exact_hypergradient(game, t, 0.1, stochastic=stochastic))(th)
        f = jax.jit(
            lambda t: leader_objective(
                game,
                t,
                0.1,
                gamma=0.99,  # noqa: E731
                stochastic=stochastic,
            )
        )
        fd = jnp.array([(f(th + e) - f(th - e)) / 2e-5 for e in 1e-5 * jnp.eye(2)])
        np.testing.assert_allclose(grad, fd, rtol=1e-5, atol=1e-9)


# ---- the hypergradient estimators with exact critics on a small instance ---------------------
BETA, GL, GF, T, L = 0.1, 0.8, 0.7, 20, 40


def _estimates(stochastic: bool, guide: str, batches=40, E=100, leader_steps=T, **kw):
    """z-scores of the batch mean against the exact gradient (games.lqr.check_problem)."""
    from bchg_jax.games.lqr import check_problem

    game = lqr_game(U=np.array([[0.3]]), gamma_L=GL, gamma_F=GF)
    (row,) = check_problem(
        game,
        [jnp.array([-3.0, 0.5])],
        BETA,
        stochastic=stochastic,
        guide=guide,
        episodes=E,
        leader_steps=leader_steps,
        extra_steps=L,
        batches=batches,
        key=jax.random.PRNGKey(0),
        verbose=False,
        **kw,
    )
    return row["z"]


@pytest.mark.slow
@pytest.mark.parametrize("stochastic", [True, False])
def test_hypergradient_estimators_unbiased(stochastic):
    """Theorem 2 (Gaussian leader) and the appendix theorem (deterministic leader) with exact
    critics: within 4 SE of the exact gradient; without the guiding term (Naive-PGD) far off."""
    z = _estimates(stochastic, "benefit")
    assert np.all(np.abs(z) < 4), z
    z_naive = _estimates(stochastic, "none")
    assert np.max(np.abs(z_naive)) > 8, z_naive


@pytest.mark.slow
def test_hypergradient_estimator_unbiased_over_two_leader_steps():
    """Two leader steps: every step's remaining horizon carries weight (at 20 steps a leader Q
    one step short on the last steps moved the mean by gamma_L^19 ~ 0.01 of it, unseen)."""
    z = _estimates(True, "benefit", leader_steps=2)
    assert np.all(np.abs(z) < 4), z


@pytest.mark.slow
def test_same_noise_baseline_and_raw_influence_unbiased():
    """The trainer's options: the direct baseline that keeps the follower's noise and the raw
    V_F influence (the reference's) leave Theorem 2's estimate unbiased."""
    z = _estimates(True, "benefit", direct_baseline="same_noise", influence="raw")
    assert np.all(np.abs(z) < 4), z


def test_validation_errors():
    with pytest.raises(ValueError, match="gamma_F"):
        lqr_game(gamma_F=1.0)
    with pytest.raises(ValueError, match="shape"):
        lqr_game(C=np.zeros((3, 1)))
    with pytest.raises(ValueError, match="Rbar"):
        lqr_game(Rbar=np.array([[-1.0]]))
    with pytest.raises(ValueError, match="stabilisable"):
        lqr_game().validate(theta=np.array([-20.0, -10.0]))  # A + C K = [[-2, 0], [0, 0]]
    with pytest.raises(ValueError, match="theta"):
        lqr_game().validate(theta=np.zeros(3))


# ---- the actor-critic trainer ----------------------------------------------------------------
def _train(method, iterations, **kw):
    from bchg_jax.problems.lqr_game import gain_metrics

    jax.config.update("jax_enable_x64", False)
    config = lqr.TrainConfig(
        iterations=iterations, exploration=lqr.ExplorationConfig(warmup_steps=0), **kw
    )
    trainer = lqr.make_train(lqr_game(), method, config, metrics_fn=gain_metrics)
    hp = jax.tree.map(lambda x: x[0], trainer.hparams({"actor_steps": np.array([10])}))
    return jax.jit(trainer.train)(jax.random.PRNGKey(3), hp)


@pytest.mark.slow
def test_exact_method_climbs():
    """Adam on the exact hypergradient leaves the flat start (J ~ 0.015; at most 0.05 for any
    theta0 ~ N(0, I) in practice) and climbs above 1 within 60 iterations."""
    state, m = _train("exact", 60)
    J = np.asarray(m["J"])
    assert J[-1] > 1.0, J[-1]
    assert np.all(np.asarray(m["update_skipped"]) == 0)


@pytest.mark.slow
def test_unconverged_follower_skips_updates():
    """With too few Riccati iterations every actor update is skipped: theta never moves."""
    state, m = _train(
        "bchg",
        3,
        follower_max_iters=1,
        minibatch=8,
        estimator=lqr.EstimatorConfig(benefit_samples=4, baseline_samples=4),
    )
    assert np.all(np.asarray(m["update_skipped"]) == 1)
    assert np.all(np.asarray(m["K1"]) == np.asarray(m["K1"])[0])


@pytest.mark.slow
def test_an_overflowing_closed_loop_is_named_not_returned_as_nan():
    """A leader gain whose closed loop is unstable (spectral radius 1.3) but that the follower
    can still answer (gamma_F = 0.5) has a finite return, whose state moments overflow float32
    after ~170 steps: the exact return and gradient returned NaN with no error at a long
    horizon. A concrete call now names the overflow; a shorter horizon is computed."""
    from bchg_jax.games.lqr import exact_hypergradient, leader_objective

    def game(horizon):
        return lqr_game_2d(horizon=horizon)

    theta = jnp.asarray([0.0, 0.8], jnp.float32)  # closed-loop eigenvalue 0.5 + 0.8
    short = game(60)
    assert np.isfinite(leader_objective(short, theta, 0.5, gamma=0.95))
    assert np.all(np.isfinite(exact_hypergradient(short, theta, 0.5)))
    long = game(400)
    for fn in (
        lambda: leader_objective(long, theta, 0.5, gamma=0.95),
        lambda: exact_hypergradient(long, theta, 0.5),
    ):
        with pytest.raises(ValueError, match=r"overflow float32 within the horizon 400.*1\.3"):
            fn()


@pytest.mark.slow
def test_a_start_the_follower_cannot_answer_is_refused_or_flagged_capped():
    """At theta = 0 of this game the follower's problem is not stabilisable (the unstable mode 0
    is reached only through the gain K[0, 1]). With ``theta0_std=0`` every run started there,
    never moved (every update undone), and reported its NaN J as overflowing state moments with
    ``solve_capped`` 0; now ``make_train`` refuses it, and a run at such a theta flags the
    follower's failed solve."""
    game = lqr_game_2d(
        A=np.diag([1.5, 0.5]),
        B=np.array([[0.0], [1.0]]),
        C=np.array([[1.0], [0.0]]),
        gamma_F=0.9,
        gamma_L=0.9,
        horizon=20,
    )

    def config(std):
        return lqr.TrainConfig(
            iterations=2,
            episodes=2,
            actor=lqr.ActorConfig(theta0_std=std),
            exploration=lqr.ExplorationConfig(warmup_steps=0),
        )

    with pytest.raises(ValueError, match=r"theta0_std=0.*not stabilisable"):
        lqr.make_train(game, "exact", config(0.0))
    trainer = lqr.make_train(game, "exact", config(1.0))
    hp = jax.tree.map(lambda x: x[0], trainer.hparams({"beta": np.array([0.2])}))
    state = trainer.init(jax.random.key(0), hp)
    zero = jnp.zeros_like(state.actor)
    stuck = state._replace(actor=zero, actor_targ=zero)
    _, m = jax.jit(trainer.run, static_argnums=2)(stuck, hp, 2)
    assert np.all(np.asarray(m["update_skipped"]) == 1)
    assert np.all(np.asarray(m["solve_capped"]) == 1)  # was 0: blamed on the moments


def test_follower_state_value_is_the_expectation_over_the_leaders_noise():
    """E_{a ~ N(K s, U U^T)} V_F(s, a) by Gauss-Hermite quadrature over the leader's noise (exact
    for a quadratic in a) = follower_state_value. The Monte Carlo check of
    test_proposition2_soft_bellman resolves ~1e-3; the noise term tr((CU)^T P CU) in place of
    tr((CU)^T M CU) was 5e-5 off at U = 0.3 and passed it."""
    from bchg_jax.games.lqr import leader_gain

    for U in (0.3, 1.0):
        game = lqr_game(U=np.array([[U]]))
        th, beta = jnp.array([-3.0, 0.5]), 0.1
        resp = best_response(game, th, beta, tol=1e-13, max_iters=10_000)
        assert bool(resp.converged)
        s = jax.random.normal(jax.random.PRNGKey(0), (7, 2), jnp.float64)
        z, w = np.polynomial.hermite_e.hermegauss(6)  # weight exp(-z^2 / 2)
        w = w / np.sqrt(2 * np.pi)
        mean_a = s @ leader_gain(game, th).T  # [7, 1]
        vals = jnp.stack([follower_value(game, resp, s, mean_a + U * zi) for zi in z])  # [6, 7]
        ref = jnp.einsum("q,qn->n", jnp.asarray(w), vals)
        np.testing.assert_allclose(
            follower_state_value(game, resp, th, s), ref, rtol=1e-11, atol=1e-12
        )


def test_closed_loop_noise_is_the_one_step_covariance_of_the_simulator():
    """closed_loop (F, N) against one simulated step from a fixed s0: E s1 = F s0 and each entry
    of E (s1 - F s0)(s1 - F s0)^T = N within 4 SE (200k episodes). The follower's reaction to
    the leader's noise, -B K_a U, is what correlates the two state components (N_01 3e-4 at
    U = 3); G = C U without it passed the exact-return tests (the default U = 0.001 hides it)."""
    from bchg_jax.games.lqr.exact import closed_loop

    game = lqr_game(U=np.array([[3.0]]), s0=np.array([0.5, -0.3]))
    th = jnp.array([-3.0, 0.5])
    resp = best_response(game, th, 0.1, tol=1e-13, max_iters=10_000)
    F, N = closed_loop(game, th, resp)
    s1 = rollout(jax.random.PRNGKey(0), game, th, resp, 200_000, 1).s[:, 1]
    d = s1 - F @ jnp.asarray(game.s0)
    z_mean = d.mean(0) / (d.std(0) / np.sqrt(d.shape[0]))
    assert np.all(np.abs(z_mean) < 4), z_mean
    prod = d[:, :, None] * d[:, None, :]
    z_cov = (prod.mean(0) - N) / (prod.std(0) / np.sqrt(d.shape[0]))
    assert np.all(np.abs(z_cov) < 4), z_cov


@pytest.mark.slow
def test_exact_method_ascends_the_leaders_discounted_objective(x64):
    """The trainer's exact method on a game with gamma_L 0.8 != gamma_F 0.7: its first gradient
    is that of J_L discounted by gamma_L (with gamma_F: norm 2.22e-4 against 2.54e-4)."""
    from bchg_jax.games import lqr as game_lqr

    game = lqr_game(U=np.array([[0.3]]), gamma_L=0.8, gamma_F=0.7)
    config = game_lqr.TrainConfig(
        iterations=1,
        dtype="float64",
        actor=game_lqr.ActorConfig(theta0_std=0.0),
        exploration=game_lqr.ExplorationConfig(warmup_steps=0),
    )
    tr = game_lqr.make_train(game, "exact", config)
    hp = jax.tree.map(lambda x: x[0], tr.hparams({"actor_steps": np.array([1])}))
    theta0 = tr.init(jax.random.PRNGKey(0), hp).actor
    _, m = tr.train(jax.random.PRNGKey(0), hp)
    ref = jax.grad(lambda th: leader_objective(game, th, float(hp.beta), gamma=0.8))(theta0)
    np.testing.assert_allclose(float(m["grad_norm"][0]), np.linalg.norm(ref), rtol=1e-5)
