"""The LQ family's pieces against their formulas written out as loops in NumPy (no sampling,
or a Monte Carlo check beside the closed form): the hypergradient's double sum, the per-step
follower gradients, the quadratic critic's Gaussian expectation and the rewards, on a problem
whose two discounts differ. Statistical tests at z < 4 could not see a wrong gamma_F factor or a
dropped covariance term; these see them to 1e-10."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_thermal import W_TEST, _small_lq

from bchg_jax.core.maxent_lqr import soft_value
from bchg_jax.lq import critics as critics_quadratic
from bchg_jax.lq.estimators import (
    hypergradient,
    per_step_follower_grad,
    per_step_follower_grad_pathwise,
)
from bchg_jax.lq.rollout import rollout
from bchg_jax.lq.train import TrainConfig, make_train
from bchg_jax.problems.thermal import thermal


@pytest.mark.parametrize("pathwise", [False, True], ids=["score", "given_dQF"])
def test_hypergradient_is_the_double_sum_written_out(x64, pathwise):
    """hypergradient on a 3-episode, 6-step batch against Eq. (hg_configurable) written as
    loops, with gamma_L 0.9 != gamma_F 0.6 and arbitrary V_L, V_F, EV_L, EV_F, Ben (linear in
    them): (1/E) sum_e [sum_k gL^k dr_L + sum_k gL^(k+1) (V_L - EV_L)(s_k+1) dlogp_k
    + (1/beta) sum_t gL^t Ben_t (sum_{k>=t} gF^(k-t) (dr_F_k + gF (V_F - EV_F)(s_k+1) dlogp_k))]
    or, with given dQF, ... + (1/beta) sum_t gL^t Ben_t (dQF_t - dVF_t). No swapped sums, no
    sampling: exact to 1e-10. The statistical tests see a wrong gamma_F factor at z < 4."""
    p = dataclasses.replace(_small_lq(), gamma_L=0.9, gamma_F=0.6).validate()
    th = jnp.asarray(p.theta0)
    gL, gF, beta, E, T = 0.9, 0.6, 0.5, 3, 6
    br = p.best_response(th, beta, tol=1e-12)
    tr = rollout(jax.random.PRNGKey(1), p, th, br, E, T)
    rng = np.random.default_rng(0)
    VL, VF = rng.normal(size=(E, T + 1)), rng.normal(size=(E, T + 1))
    EVL, EVF, ben = rng.normal(size=(E, T)), rng.normal(size=(E, T)), rng.normal(size=(E, T))
    dQF, dVF = rng.normal(size=(E, T, 3)), rng.normal(size=(E, T, 3))
    S, B = np.asarray(tr.s), np.asarray(tr.b)
    dlogp = jax.jit(jax.grad(lambda t, s, b, s2: p.log_transition(t, s, b, s2)))
    drL = jax.jit(jax.grad(lambda t, s, b: p.leader_reward(t, s, b)))
    drF = jax.jit(jax.grad(lambda t, s, b: p.follower_reward(t, s, b)))
    ref = np.zeros(3)
    for e in range(E):
        g = [np.asarray(dlogp(th, S[e, k], B[e, k], S[e, k + 1])) for k in range(T)]
        for k in range(T):
            ref += gL**k * np.asarray(drL(th, S[e, k], B[e, k]))
            ref += gL ** (k + 1) * (VL[e, k + 1] - EVL[e, k]) * g[k]
        for t in range(T):
            if pathwise:
                dq = dQF[e, t] - dVF[e, t]
            else:
                dq = sum(
                    gF ** (k - t)
                    * (
                        np.asarray(drF(th, S[e, k], B[e, k]))
                        + gF * (VF[e, k + 1] - EVF[e, k]) * g[k]
                    )
                    for k in range(t, T)
                )
            ref += gL**t * ben[e, t] / beta * dq
    ref /= E
    kw = dict(dQF=jnp.asarray(dQF), dVF=jnp.asarray(dVF)) if pathwise else {}
    got = hypergradient(
        p,
        th,
        tr,
        beta,
        jnp.asarray(VL),
        jnp.asarray(VF),
        "benefit",
        benefit=jnp.asarray(ben),
        EV_L=jnp.asarray(EVL),
        EV_F=jnp.asarray(EVF),
        **kw,
    )
    np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-10, atol=1e-12)


def test_per_step_follower_grads_written_out(x64):
    """Both forms of Eq. (nablaQF)'s per-step terms, gamma_L 0.9 != gamma_F 0.6, against one
    jax.grad per step: score y_k = dr_F + gF V(s_k+1) dlogp_k; pathwise
    y_k = dr_F + gF d/dtheta V(A(theta) s_k + B(theta) b_k + w_k). per_step_follower_grad is
    only used by the trainer (a gamma_L there passed every non-training test)."""
    p = dataclasses.replace(_small_lq(), gamma_L=0.9, gamma_F=0.6).validate()
    th = jnp.asarray(p.theta0)
    br = p.best_response(th, 0.5, tol=1e-12)
    tr = rollout(jax.random.PRNGKey(2), p, th, br, 3, 5)
    V = np.random.default_rng(1).normal(size=(3, 5))
    score = np.asarray(per_step_follower_grad(p, th, tr, jnp.asarray(V)))
    path = np.asarray(per_step_follower_grad_pathwise(p, th, tr, lambda x: soft_value(br, x)))
    dlogp = jax.jit(jax.grad(p.log_transition))
    drF = jax.jit(jax.grad(p.follower_reward))
    dVnext = jax.jit(jax.grad(lambda t, s, b, w: soft_value(br, p.mean_next(t, s, b) + w)))
    S, B = tr.s, tr.b
    for e in range(3):
        for k in range(5):
            s, b, s2 = S[e, k], B[e, k], S[e, k + 1]
            r = np.asarray(drF(th, s, b))
            want = r + 0.6 * V[e, k] * np.asarray(dlogp(th, s, b, s2))
            np.testing.assert_allclose(score[e, k], want, rtol=1e-10, atol=1e-12)
            w = s2 - p.mean_next(th, s, b)
            want = r + 0.6 * np.asarray(dVnext(th, s, b, w))
            np.testing.assert_allclose(path[e, k], want, rtol=1e-10, atol=1e-12)


def test_quadratic_q_value_is_the_gaussian_expectation(x64):
    """QuadraticQ.value(s, mu, cov) = E_{b ~ N(mu, cov)} Q(s, b): against mu_z^T H mu_z
    + tr(H Cov_z) + h0 written out in numpy, and a Monte Carlo mean (4 SE). At thermal's
    beta 0.1 the covariance term is under the 2% tolerance of the critic-recovery test, so a
    value without tr(H_bb cov) passed."""
    rng = np.random.default_rng(0)
    n, m = 2, 2
    G = rng.normal(size=(n + m, n + m))
    H = G + G.T
    q = critics_quadratic.QuadraticQ(jnp.asarray(H), jnp.asarray(0.7), n)
    s = rng.normal(size=(3, n))
    mu = rng.normal(size=(3, m))
    L = rng.normal(size=(m, m))
    cov = L @ L.T + 0.5 * np.eye(m)
    got = np.asarray(q.value(jnp.asarray(s), jnp.asarray(mu), jnp.asarray(cov)))
    Cz = np.zeros((n + m, n + m))
    Cz[n:, n:] = cov
    for i in range(3):
        z = np.concatenate([s[i], mu[i]])
        np.testing.assert_allclose(got[i], z @ H @ z + np.trace(H @ Cz) + 0.7, rtol=1e-12)
    b = mu + rng.normal(size=(200_000, 3, m)) @ np.linalg.cholesky(cov).T
    qs = np.asarray(q.q(jnp.broadcast_to(jnp.asarray(s), b.shape[:2] + (n,)), jnp.asarray(b)))
    se = qs.std(0) / np.sqrt(len(qs))
    assert np.all(np.abs(qs.mean(0) - got) < 4 * se), (qs.mean(0) - got) / se


def test_rewards_are_the_documented_quadratics(x64):
    """r_L = -s^T Ms s - b^T Mb b + c and r_F = -(s^T Qbar s + b^T Rbar b), written out per
    sample, on thermal (its c is -0.1 config_cost(w), under the Monte Carlo SE of the
    objective test: a leader reward with -c passed every test but the slow score-form one) and
    on the small problem (c = -0.1 |theta|^2)."""
    rng = np.random.default_rng(0)
    for p, th in ((thermal(jnp.float64), jnp.asarray(W_TEST)), (_small_lq(), None)):
        th = jnp.asarray(p.theta0) if th is None else th
        Ms, Mb, c = (np.asarray(x) for x in p.leader_quadratic(th))
        assert abs(float(c)) > 1e-3
        n, m = p.state_dim, p.action_dim
        s, b = rng.normal(size=(5, n)), rng.normal(size=(5, m))
        rL = np.asarray(p.leader_reward(th, jnp.asarray(s), jnp.asarray(b)))
        rF = np.asarray(p.follower_reward(th, jnp.asarray(s), jnp.asarray(b)))
        Q, R = np.asarray(p.Qbar), np.asarray(p.Rbar)
        for i in range(5):
            np.testing.assert_allclose(rL[i], -s[i] @ Ms @ s[i] - b[i] @ Mb @ b[i] + c, rtol=1e-12)
            np.testing.assert_allclose(rF[i], -(s[i] @ Q @ s[i] + b[i] @ R @ b[i]), rtol=1e-12)


def test_trainer_follower_terms_written_out(x64):
    """The trainer's follower-side inputs (the default pathwise FollowerQGrad), gamma_L 0.9 !=
    gamma_F 0.6: dQF_t = sum_{k >= t} gamma_F^(k-t) y_k; the LSTD fits of grad V_F under gamma_F
    (BC-HG's leave-one-out baseline, HPGD's dVF; tests/lq/test_state_baseline.py checks the fit
    against grad V_F); the control variate E[V_F(s') | s, b] = V_F(mu) + tr(U U^T Hess V_F) / 2
    (V_F is quadratic, mu = A s + B b, U the noise's Cholesky factor). The thermal problem's
    discounts are equal, so any of these with gamma_L passed every test there."""
    p = dataclasses.replace(_small_lq(), gamma_L=0.9, gamma_F=0.6, horizon=80).validate()
    th = jnp.asarray(p.theta0)
    br = p.best_response(th, 0.5, tol=1e-12)
    E, T = 3, 6
    traj = rollout(jax.random.PRNGKey(8), p, th, br, E, T)
    terms = make_train(p, "bchg", TrainConfig(num_episodes=E, critic="exact")).steps
    _, EV_F, kw, _ = jax.jit(terms["follower_terms"])(jax.random.PRNGKey(4), th, br, traj, ())
    y = np.asarray(per_step_follower_grad_pathwise(p, th, traj, lambda x: soft_value(br, x)))
    want = np.zeros_like(y)
    for e in range(E):
        for t in range(T):
            want[e, t] = sum(0.6 ** (k - t) * y[e, k] for k in range(t, T))
    np.testing.assert_allclose(np.asarray(kw["dQF"]), want, rtol=1e-10, atol=1e-12)
    # the state baseline h ~ grad V_F: LSTD under gamma_F, each episode's on the others
    h = critics_quadratic.leave_one_out_vector_value(traj.s, jnp.asarray(y), 0.6)
    np.testing.assert_allclose(np.asarray(kw["dVF"]), np.asarray(h), rtol=1e-8, atol=1e-10)
    # HPGD's dVF: the same LSTD under gamma_F on the whole batch
    hpgd = make_train(p, "hpgd_td", TrainConfig(num_episodes=E, critic="exact")).steps
    _, _, kw, _ = jax.jit(hpgd["follower_terms"])(jax.random.PRNGKey(4), th, br, traj, ())
    f = critics_quadratic.fit_quadratic_vector_value(traj.s, jnp.asarray(y), 0.6)
    np.testing.assert_allclose(np.asarray(kw["dVF"]), np.asarray(f(traj.s[:, :-1])), rtol=1e-8)
    hess = np.asarray(jax.hessian(lambda x: soft_value(br, x))(jnp.zeros(2)))
    U = np.asarray(p.U)
    mu = p.mean_next(th, traj.s[:, :-1], traj.b[:, :-1])  # [E, T, n]
    ev = np.asarray(soft_value(br, mu)) + 0.5 * np.trace(U @ U.T @ hess)
    np.testing.assert_allclose(np.asarray(EV_F), ev, rtol=1e-10, atol=1e-10)


def test_mlp_critic_scales_written_out():
    """``critics.scales``: inputs over their RMS per column (+1e-6), outputs times RMS(r) / (1 -
    gamma) per output column (+1e-6), ones without ``normalize`` (the paper's MLP); no
    gradient flows through them. A wrong output scale only slows the TD fit, which the critic
    tests' R^2 thresholds did not see."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(50, 3)) * np.array([0.1, 2.0, 30.0])
    r = rng.normal(size=(50, 2)) * np.array([1.0, 5.0]) + 0.5
    xs, ys = critics_quadratic.scales(jnp.asarray(x), jnp.asarray(r), 0.8, True)
    np.testing.assert_allclose(xs, np.sqrt(np.mean(x**2, 0)) + 1e-6, rtol=1e-6)
    np.testing.assert_allclose(ys, np.sqrt(np.mean(r**2, 0)) / 0.2 + 1e-6, rtol=1e-6)
    _, ys1 = critics_quadratic.scales(jnp.asarray(x), jnp.asarray(r[:, 1]), 0.8, True)
    np.testing.assert_allclose(ys1, [np.sqrt(np.mean(r[:, 1] ** 2)) / 0.2 + 1e-6], rtol=1e-6)
    xs, ys = critics_quadratic.scales(jnp.asarray(x), jnp.asarray(r), 0.8, False)
    np.testing.assert_array_equal(xs, np.ones(3))
    np.testing.assert_array_equal(ys, np.ones(2))
    grad = jax.grad(lambda x: jnp.sum(critics_quadratic.scales(x, x[:, 0], 0.8, True)[1]))
    np.testing.assert_array_equal(grad(jnp.asarray(x)), 0.0)
