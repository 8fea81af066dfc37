"""The tabular game's exact best response near gamma_F = 1: soft Q-iteration hits its sweep cap
(it contracts by gamma_F per sweep along the constant direction of Q) and the Newton steps
after it bring Q to the fixed point; a solve capped short of it is an error, or NaN under a
trace."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.games import tabular as gt


def _game(gamma_F):
    rng = np.random.default_rng(1)
    S, A, B = 3, 2, 2
    P = rng.dirichlet(np.ones(S), size=(S, A, B))
    rho = rng.dirichlet(np.ones(S))
    rF, rL = rng.normal(size=(S, A, B)), rng.normal(size=(S, A, B))
    game = gt.TabularGame(P, rho, rF, rL, gamma_F, 0.9, 50).validate()
    logits = rng.normal(size=(S, A))
    f = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    return game, f, P, rF


def _soft_policy_iteration(P, rF, f, beta, gamma_F):
    """The paper backup's fixed point by soft policy iteration with exact linear solves (numpy,
    float64): Q = r_F + gamma_F P [sum_{a,b} f g (Q - beta log g)], g = softmax(Q / beta)."""
    S, A, B = rF.shape
    n = S * A * B
    g = np.full((S, A, B), 1.0 / B)
    for _ in range(200):
        w = f[:, :, None] * g
        entropy = -beta * (w * np.log(g)).sum((1, 2))  # [S]
        M = (P.reshape(n, S, 1) * w.reshape(1, S, A * B)).reshape(n, n)
        rhs = rF.reshape(n) + gamma_F * P.reshape(n, S) @ entropy
        Q = np.linalg.solve(np.eye(n) - gamma_F * M, rhs).reshape(S, A, B)
        z = Q / beta - (Q / beta).max(-1, keepdims=True)
        g_new = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
        if np.abs(g_new - g).max() < 1e-15:
            break
        g = g_new
    return Q, g_new


def test_newton_steps_reach_the_fixed_point_near_gamma_one(x64):
    """gamma_F = 0.9999, beta 0.5, float64: soft Q-iteration alone (the 100,000-sweep cap)
    leaves Q off by a constant of ~0.3 (the policy is right; the residual 6e-6 makes a best
    response without Newton steps an error); with the Newton steps Q is within
    1e-7 of the policy-iteration solution (measured 3.6e-10)."""
    beta = 0.5
    game, f, P, rF = _game(0.9999)
    Q_ref, g_ref = _soft_policy_iteration(P, rF, f, beta, 0.9999)
    br = gt.best_response(game, jnp.asarray(f), beta, "paper")
    assert np.abs(np.asarray(br.Q) - Q_ref).max() < 1e-7
    top = Q_ref.max(-1)
    V_ref = top + beta * np.log(np.exp((Q_ref - top[..., None]) / beta).sum(-1))
    assert np.abs(np.asarray(br.V) - V_ref).max() < 1e-7
    assert np.abs(np.asarray(br.policy) - g_ref).max() < 1e-10
    assert float(br.residual) < 1e-9
    vi_only = gt.soft_q_iteration(
        game, jnp.asarray(f), beta, "paper", tol=1e-12, max_sweeps=100_000
    )
    assert np.abs(np.asarray(vi_only.Q) - Q_ref).max() > 1e-2  # what the Newton steps fix
    assert np.abs(np.asarray(vi_only.policy) - g_ref).max() < 1e-10
    with pytest.raises(ValueError, match="missed its tolerance"):  # and no longer silently
        gt.best_response(game, jnp.asarray(f), beta, "paper", newton_iters=0)


@pytest.mark.slow
def test_a_capped_best_response_is_an_error_or_nan():
    """Five sweeps and no Newton step leave a fixed-point residual ~0.3: a concrete solve raises,
    a traced one is NaN (the exact hypergradient too); the defaults reach the rounding floor."""
    game, f, _, _ = _game(0.9)
    f = jnp.asarray(f, jnp.float32)
    capped = dict(max_sweeps=5, newton_iters=0)
    assert float(gt.best_response(game, f, 0.3).residual) < 1e-6
    with pytest.raises(ValueError, match="missed its tolerance.*max_sweeps=5"):
        gt.best_response(game, f, 0.3, **capped)
    traced = jax.jit(lambda f: gt.best_response(game, f, 0.3, **capped))(f)
    assert float(traced.residual) > 1e-2 and bool(jnp.all(jnp.isnan(traced.policy)))
    grad = jax.jit(jax.grad(lambda f: jnp.sum(gt.best_response(game, f, 0.3, **capped).V)))(f)
    assert bool(jnp.all(jnp.isnan(grad)))


@pytest.mark.slow
def test_a_given_q_star_that_is_not_the_fixed_point_is_refused():
    """exact_hypergradient / lag_hypergradient with a given Q_star: the solved one gives the
    same gradient as solving here; a Q_star off the fixed point by 0.05 (which shifts the
    policy and the gradient silently before) raises when concrete and is NaN under a trace;
    tol=None takes it as it is (the trainer, which flags its own solves)."""
    game, f, _, _ = _game(0.9)
    theta = jnp.log(jnp.asarray(f, jnp.float32))

    def policy(th):
        return jax.nn.softmax(th, -1)

    Q = gt.best_response(game, policy(theta), 0.3).Q
    exact = gt.exact_hypergradient(policy, theta, game, 0.3)
    given = gt.exact_hypergradient(policy, theta, game, 0.3, Q_star=Q)
    np.testing.assert_allclose(given, exact, atol=1e-5)
    wrong = Q + 0.05 * jax.random.normal(jax.random.key(0), Q.shape)
    as_is = gt.exact_hypergradient(policy, theta, game, 0.3, Q_star=wrong, tol=None)
    assert float(jnp.max(jnp.abs(as_is - exact))) > 1e-3  # what the check catches
    g_prev = gt.best_response(game, policy(theta), 1.0).policy
    for call in (
        lambda th, q: gt.exact_hypergradient(policy, th, game, 0.3, Q_star=q),
        lambda th, q: gt.lag_hypergradient(policy, th, game, g_prev, 0.3, 0.5, Q_star=q),
    ):
        assert bool(jnp.all(jnp.isfinite(call(theta, Q))))
        with pytest.raises(ValueError, match="missed its tolerance.*Q_star"):
            call(theta, wrong)
        assert bool(jnp.all(jnp.isnan(jax.jit(call)(theta, wrong))))
