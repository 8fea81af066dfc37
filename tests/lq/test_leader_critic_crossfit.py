"""The cross-fitted leader critic (``critic="quadratic_loo"``): each episode's Q_L / V_L is the
SARSA-LSTD fit on the other episodes, so BC-HG's Benefit does not depend on the episode's own
actions; the estimate keeps only the fit's own finite-sample bias, far below the in-sample fit's
at few episodes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.lq import critics
from bchg_jax.lq import exact as exact_lq
from bchg_jax.lq.rollout import rollout
from bchg_jax.lq.train import TrainConfig, make_train


def _batch(E=5, T=7, n=2, m=3, dtype=jnp.float64):
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
    s = jax.random.normal(k1, (E, T + 1, n), dtype)
    b = jax.random.normal(k2, (E, T + 1, m), dtype)
    r = jax.random.normal(k3, (E, T), dtype)
    return s, b, r


def _others(x, e):
    return x[jnp.array([i for i in range(x.shape[0]) if i != e])]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_leave_one_out_q_is_the_fit_on_the_other_episodes(dtype):
    """Episode e's Q_L and V_L = E_{b ~ N(mu(s), Sigma)} Q_L(s, b) are fit_quadratic_q's on the
    other E - 1 episodes (same LSTD system, scaling and ridge)."""
    with jax.enable_x64(dtype == "float64"):
        s, b, r = _batch(dtype=jnp.dtype(dtype))
        E, m = s.shape[0], b.shape[-1]
        mean_b = 0.3 * b + 0.1
        cov = 0.2 * jnp.eye(m, dtype=s.dtype) + 0.05
        qf = critics.leave_one_out_quadratic_q(s, b, r, 0.9, 1e-6)
        assert qf.H.shape == (E, 1, s.shape[-1] + m, s.shape[-1] + m) and qf.h0.shape == (E, 1)
        Q = np.asarray(qf.q(s[:, :-1], b[:, :-1]))
        V = np.asarray(qf.value(s, mean_b, cov))
        assert Q.dtype == np.dtype(dtype) and Q.shape == r.shape and V.shape == s.shape[:2]
        tol = dict(rtol=1e-8, atol=1e-9) if dtype == "float64" else dict(rtol=2e-3, atol=2e-3)

        @jax.jit
        def refit(e):  # fit_quadratic_q on the other episodes, at episode e
            keep = jnp.arange(E - 1) + (jnp.arange(E - 1) >= e)
            fit = critics.fit_quadratic_q(s[keep], b[keep], r[keep], 0.9, 1e-6)
            return fit.q(s[e, :-1], b[e, :-1]), fit.value(s[e], mean_b[e], cov)

        for e in range(E):
            q_ref, v_ref = refit(e)
            np.testing.assert_allclose(Q[e], np.asarray(q_ref), **tol)
            np.testing.assert_allclose(V[e], np.asarray(v_ref), **tol)
        with pytest.raises(ValueError, match="at least 2 episodes"):
            critics.leave_one_out_quadratic_q(s[:1], b[:1], r[:1], 0.9)


def test_leave_one_out_lstd_vector_rewards(x64):
    """The shared helper with vector rewards: row e is lstd on the other episodes' transitions."""
    s, b, r = _batch()
    y = jnp.stack([r, r**2 - 1.0], -1)
    phi = critics.quadratic_features(s)
    W = np.asarray(critics.leave_one_out_lstd(phi[:, :-1], phi[:, 1:], y, 0.8, 1e-6))
    F = phi.shape[-1]
    for e in range(s.shape[0]):
        p = _others(phi, e)
        ref = critics.lstd(
            p[:, :-1].reshape(-1, F), p[:, 1:].reshape(-1, F), _others(y, e).reshape(-1, 2), 0.8
        )
        np.testing.assert_allclose(W[e], np.asarray(ref), rtol=1e-8, atol=1e-9)


@pytest.mark.slow
def test_trainer_leader_critic_uses_the_other_episodes(x64, random_lq):
    """The trainer's leader_critic step with critic='quadratic_loo': episode e's Q_L, V_L and
    control variate from fit_quadratic_q on the other episodes (in the played policy's gain
    basis); E = 1 is refused at make_train."""
    p = random_lq()
    theta, E = jnp.array([0.3, -0.2]), 4
    br = p.best_response(theta, 0.3)
    tr = make_train(p, "bchg", TrainConfig(num_episodes=E, critic="quadratic_loo"))
    traj = rollout(jax.random.PRNGKey(1), p, theta, br, E, p.horizon)
    rL = p.leader_reward(theta, traj.s[:, :-1], traj.b[:, :-1])
    V, Q, EV, _ = tr.steps["leader_critic"](jax.random.PRNGKey(2), theta, br, traj, rL, ())
    assert V.shape == (E, p.horizon + 1) and Q.shape == EV.shape == (E, p.horizon)

    @jax.jit
    def refit(e):  # fit_quadratic_q on the other episodes, at episode e
        keep = jnp.arange(E - 1) + (jnp.arange(E - 1) >= e)
        fit = critics.fit_quadratic_q(
            traj.s[keep], traj.b[keep], rL[keep], p.gamma_L, 1e-6, gain=br.K
        )
        s_e = traj.s[e]
        return fit.q(s_e[:-1], traj.b[e, :-1]), fit.value(s_e, br.mean(s_e), br.cov)

    for e in range(E):
        q_ref, v_ref = refit(e)
        np.testing.assert_allclose(Q[e], q_ref, rtol=1e-8, atol=1e-9)
        np.testing.assert_allclose(V[e], v_ref, rtol=1e-8, atol=1e-9)
    with pytest.raises(ValueError, match="num_episodes >= 2"):
        make_train(p, "bchg", TrainConfig(num_episodes=1, critic="quadratic_loo"))
    assert TrainConfig().critic == "quadratic_loo"  # the unbiased fit is the default


@pytest.mark.slow
def test_crossfit_critic_unbiased_at_two_episodes(x64, random_lq):
    """The trainer's estimate step at E = 2 episodes on the 2-d problem, 20000 batches: with the
    cross-fitted critic the mean agrees with the exact hypergradient (|z| < 4 per component);
    with the in-sample fit (``critic="quadratic"``) it does not (relative bias ~0.035-0.04,
    z ~ 15-20 on theta_0)."""
    p = random_lq()
    theta, beta = jnp.array([0.3, -0.2]), jnp.asarray(0.3)
    exact = np.asarray(exact_lq.exact_hypergradient(p, theta, 0.3, tol=1e-13, horizon=None))
    br = p.best_response(theta, 0.3, tol=1e-13)
    keys = jax.random.split(jax.random.PRNGKey(2), 20000)
    z = {}
    for critic in ("quadratic", "quadratic_loo"):
        est = make_train(p, "bchg", TrainConfig(num_episodes=2, critic=critic)).steps["estimate"]
        f = jax.jit(jax.vmap(lambda k: est(k, jax.random.fold_in(k, 7), theta, beta, br, ())[0]))
        g = np.concatenate([np.asarray(f(k)) for k in jnp.split(keys, 4)])
        z[critic] = (g.mean(0) - exact) / (g.std(0) / np.sqrt(len(g)))
    print({c: np.round(v, 1) for c, v in z.items()})
    assert np.all(np.abs(z["quadratic_loo"]) < 4), z
    assert np.abs(z["quadratic"]).max() > 8, z


def _thermal_batch(E, seed):
    from bchg_jax.lq import best_response
    from bchg_jax.problems.thermal import thermal

    p = thermal()
    th = p.theta0 + 0.01 * jax.random.normal(jax.random.key(3), p.theta0.shape, p.theta0.dtype)
    br = best_response(p, th, 0.1)
    tr = rollout(jax.random.key(seed), p, th, br, E, p.horizon)
    return p, br, tr.s, tr.b, p.leader_reward(th, tr.s[:, :-1], tr.b[:, :-1])


@pytest.mark.slow
@pytest.mark.parametrize("fit", ["fit_quadratic_q", "leave_one_out_quadratic_q"])
def test_critic_in_the_follower_gain_basis(x64, fit):
    """gain=K fits the features of (s, b + K s): without the ridge the same fit as (s, b); the
    benefit Q - V of the thermal problem (b nearly -K s: the (s, b) system has cond ~1e6) then
    survives float32 (the plain basis lost 1.5e-3 to 6e-3 of it) and barely feels the ridge
    (the plain basis' ridge pull was 4-9%, in float64)."""
    f = getattr(critics, fit)
    p, br, s, b, r = _thermal_batch(20, 0)
    f64 = lambda x: jnp.asarray(x, jnp.float64)  # noqa: E731

    def benefit(s, b, r, gain, ridge=1e-6):
        q = f(s, b, r, p.gamma_L, ridge, gain=gain)
        K = jnp.asarray(br.K, s.dtype)
        return q.q(s[:, :-1], b[:, :-1]) - q.value(s[:, :-1], -s[:, :-1] @ K.T, f64(br.cov))

    def rel(x, y):
        return float(jnp.linalg.norm(x - y) / jnp.linalg.norm(y))

    s64, b64, r64, K64 = f64(s), f64(b), f64(r), f64(br.K)
    unregularised = benefit(s64, b64, r64, K64, 0.0)
    assert rel(unregularised, benefit(s64, b64, r64, None, 0.0)) < 1e-8
    # float32 statistics against float64 on the same samples
    assert rel(benefit(s, b, r, br.K), benefit(s64, b64, r64, K64)) < 5e-4
    assert rel(benefit(s, b, r, None), benefit(s64, b64, r64, None)) > 1e-3  # plain, for contrast
    # the ridge's pull (float64)
    assert rel(benefit(s64, b64, r64, K64), unregularised) < 3e-3
    assert rel(benefit(s64, b64, r64, None), unregularised) > 2e-2


def test_lstd_is_the_td_fixed_point_and_its_ridge_is_on_the_scaled_diagonal(x64):
    """lstd against the normal equations written out in numpy: ridge 0 is the TD(0) fixed point
    Phi^T (Phi - gamma Phi') W = Phi^T R (no scaling left in the answer); ridge 0.3 is
    (Ps^T (Ps - gamma Ps') / N + 0.3 I) Ws = Ps^T R / N on unit-RMS features Ps = Phi / scale,
    W = Ws / scale. (Every other lstd check compares lstd with itself.)"""
    rng = np.random.default_rng(3)
    N, F, g = 300, 5, 0.8
    phi = rng.normal(size=(N, F)) * np.array([0.1, 1.0, 3.0, 10.0, 0.5])
    phin = 0.6 * phi + 0.4 * rng.normal(size=(N, F))
    r = rng.normal(size=N)
    W0 = np.asarray(critics.lstd(jnp.asarray(phi), jnp.asarray(phin), jnp.asarray(r), g, 0.0))
    np.testing.assert_allclose(W0, np.linalg.solve(phi.T @ (phi - g * phin), phi.T @ r), 1e-9)
    sc = np.sqrt(np.mean(phi**2, 0)) + 1e-12
    ps, pns = phi / sc, phin / sc
    Ws = np.linalg.solve(ps.T @ (ps - g * pns) / N + 0.3 * np.eye(F), ps.T @ r / N)
    W = np.asarray(critics.lstd(jnp.asarray(phi), jnp.asarray(phin), jnp.asarray(r), g, 0.3))
    np.testing.assert_allclose(W, Ws / sc, rtol=1e-9)
