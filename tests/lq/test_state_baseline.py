"""BC-HG's state baseline in the LQ trainer: each episode's h(s) ~ grad V_F(s) is fitted on the
other episodes (leave-one-out LSTD), so the estimate stays unbiased at few episodes; the LSTD
fit of grad V_F itself (HPGD's dVF) against autodiff of the closed-form best response."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_thermal import _small_lq

from bchg_jax.core.maxent_lqr import soft_value
from bchg_jax.lq import critics
from bchg_jax.lq import exact as exact_lq
from bchg_jax.lq.estimators import per_step_follower_grad_pathwise
from bchg_jax.lq.rollout import rollout
from bchg_jax.lq.train import TrainConfig, make_train
from bchg_jax.problems.thermal import thermal

W_BASE = np.array([0.3, -0.5, 0.1, 0.8, -0.2, 0.4, -0.7, 0.0])


@pytest.mark.slow
def test_leave_one_out_fit_is_the_fit_on_the_other_episodes(x64):
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    E, T, n, D = 5, 7, 3, 2
    s = jax.random.normal(k1, (E, T + 1, n))
    y = jax.random.normal(k2, (E, T, D))
    h = np.asarray(critics.leave_one_out_vector_value(s, y, 0.9, 1e-6))
    assert h.shape == (E, T, D)
    for e in range(E):
        rest = jnp.array([i for i in range(E) if i != e])
        fit = critics.fit_quadratic_vector_value(s[rest], y[rest], 0.9, 1e-6)
        np.testing.assert_allclose(h[e], np.asarray(fit(s[e, :-1])), rtol=1e-9, atol=1e-10)
    # one episode: no other episode to fit on, no baseline
    one = critics.leave_one_out_vector_value(s[:1], y[:1], 0.9)
    np.testing.assert_array_equal(np.asarray(one), 0.0)


def _follower_terms(E, redraw=False):
    """The trainer's dVF (BC-HG's baseline) on one thermal batch; ``redraw``: episode 0 after
    its first state (s_1.., b_0..) replaced by another draw."""
    p = thermal(jnp.float64)
    w = jnp.asarray(W_BASE)
    tr = make_train(p, "bchg", TrainConfig(num_episodes=E, critic="exact"))
    br = p.best_response(w, 0.1, tol=1e-12)
    traj = rollout(jax.random.PRNGKey(3), p, w, br, E, p.horizon)
    if redraw:
        other = rollout(jax.random.PRNGKey(5), p, w, br, 1, p.horizon)
        traj = traj._replace(s=traj.s.at[0, 1:].set(other.s[0, 1:]), b=traj.b.at[0].set(other.b[0]))
    _, _, kw, _ = tr.steps["follower_terms"](jax.random.PRNGKey(4), w, br, traj, ())
    return np.asarray(kw["dVF"])


@pytest.mark.slow
def test_trainer_baseline_ignores_its_own_episode(x64):
    """Episode 0's baseline at s_0 depends on s_0 and on the other episodes, not on the rest of
    episode 0 (its actions and what they lead to): an in-sample fit fails this."""
    h, h_redrawn = _follower_terms(6), _follower_terms(6, redraw=True)
    np.testing.assert_allclose(h_redrawn[0, 0], h[0, 0], rtol=1e-9, atol=1e-9)
    assert np.abs(h_redrawn[1:] - h[1:]).max() > 1e-6  # the others do see episode 0
    np.testing.assert_array_equal(_follower_terms(1), 0.0)  # E = 1: no baseline


@pytest.mark.slow
def test_bchg_with_fitted_baseline_unbiased_at_ten_episodes(x64):
    """Exact critic, LSTD baseline, 10 episodes per batch: the trainer's estimate is within 4 SE
    of the exact hypergradient (the in-sample fit was ~60% short, z ~ -10), and the baseline
    still cuts the per-batch standard deviation by far."""
    p = thermal(jnp.float64)
    w = jnp.asarray(W_BASE)
    beta = jnp.asarray(0.1)
    exact = np.asarray(exact_lq.exact_hypergradient(p, w, 0.1, tol=1e-13))
    br = p.best_response(w, 0.1, tol=1e-13)
    keys = jax.random.split(jax.random.PRNGKey(100), 400)
    sd = {}
    for baseline in (True, False):
        cfg = TrainConfig(num_episodes=10, critic="exact", state_baseline=baseline)
        est = make_train(p, "bchg", cfg).steps["estimate"]
        g = jax.jit(jax.vmap(lambda k: est(*jax.random.split(k), w, beta, br, ())[0]))(keys)
        g = np.asarray(g)
        sd[baseline] = g.std(0)
        if baseline:
            z = (g.mean(0) - exact) / (g.std(0) / np.sqrt(len(g)))
            assert np.all(np.abs(z) < 4), z
    assert np.linalg.norm(sd[True]) < 0.2 * np.linalg.norm(sd[False]), sd


@pytest.mark.slow
def test_vector_value_fit_recovers_grad_v_f(x64):
    """HPGD's dVF fit (LSTD on the pathwise per-step follower gradients) recovers
    grad_theta V_F(s) = E[sum_k gamma_F^k y_k | s_0 = s], against autodiff of the closed-form
    best response, at gamma_L 0.9 != gamma_F 0.6 (the class is exact: grad V_F is quadratic
    in s): 2.4% off at 400 episodes (statistical: 5.2% at 100,
    1.9% at 1000), 170% with gamma_L. Before, only the fit's algebra was checked."""
    p = dataclasses.replace(_small_lq(), gamma_L=0.9, gamma_F=0.6, horizon=40).validate()
    th = jnp.asarray(p.theta0)
    br = p.best_response(th, 0.5, tol=1e-12)
    traj = rollout(jax.random.PRNGKey(0), p, th, br, 400, p.horizon)
    y = per_step_follower_grad_pathwise(p, th, traj, lambda x: soft_value(br, x))
    s = jnp.asarray(np.random.default_rng(0).normal(size=(6, 2)))
    grad_vf = jax.vmap(
        jax.grad(lambda t, x: soft_value(p.best_response(t, 0.5, tol=1e-12), x)), (None, 0)
    )
    want = np.asarray(grad_vf(th, s))
    fit = np.asarray(critics.fit_quadratic_vector_value(traj.s, y, p.gamma_F)(s))
    scale = np.abs(want).max()
    assert np.abs(fit - want).max() < 0.08 * scale, (fit, want)
