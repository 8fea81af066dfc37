"""exact.py: implicit-differentiation hypergradient vs finite differences; Four-Rooms values."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.problems import fourrooms, random_tabular_cmdp
from bchg_jax.tabular import exact
from bchg_jax.tabular.follower import continuation


def test_exact_hypergradient_matches_central_differences(x64):
    prob = random_tabular_cmdp(
        jax.random.key(3), num_states=5, num_actions=3, dim=4, dtype=jnp.float64
    )
    theta, beta = prob.theta0, 0.3
    g = exact.exact_hypergradient(prob, theta, beta)
    eps = 1e-5
    fd = np.array(
        [
            (
                exact.leader_objective(prob, theta + eps * e, beta)
                - exact.leader_objective(prob, theta - eps * e, beta)
            )
            / (2 * eps)
            for e in jnp.eye(theta.shape[0])
        ]
    )
    assert np.all(np.abs(fd) > 1e-3), "test problem must have a non-trivial gradient"
    np.testing.assert_allclose(np.asarray(g), fd, rtol=1e-6, atol=1e-8)


@pytest.mark.slow
def test_exact_gradient_differs_from_fixed_follower_gradient(x64):
    """The hypergradient is not the gradient at a frozen follower (the best response moves)."""
    prob = random_tabular_cmdp(jax.random.key(4), dtype=jnp.float64)
    theta, beta = prob.theta0, 0.3
    br = exact.best_response(prob, theta, beta)
    pol = jax.lax.stop_gradient(br.policy)

    def frozen(th):
        V, _ = exact.leader_values(prob, th, pol)
        return jnp.dot(prob.init_dist(th), V) + prob.regularizer(th)

    diff = np.abs(
        np.asarray(exact.exact_hypergradient(prob, theta, beta) - jax.grad(frozen)(theta))
    )
    assert diff.max() > 1e-2


@pytest.mark.slow
def test_policy_evaluation_solve_matches_sweeps(x64):
    prob = random_tabular_cmdp(jax.random.key(5), dtype=jnp.float64)
    th = prob.theta0
    br = exact.best_response(prob, th, 0.5)
    P, rL = prob.transition(th), prob.leader_reward(th)
    cont = continuation(None, rL.shape[0], rL.dtype)
    V1 = exact.policy_evaluation(P, rL, br.policy, prob.gamma_L, cont)
    V2 = exact.policy_evaluation_sweeps(
        P, rL, br.policy, prob.gamma_L, cont, jnp.zeros_like(V1), 1e-13, 5000
    )
    np.testing.assert_allclose(V1, V2, atol=1e-10)


@pytest.mark.parametrize(
    "slip_model,expected",
    [
        ("reference", (-0.7406, -0.7258, -0.6674)),
        ("paper", (-0.804, -0.796, -0.761)),
    ],
)
def test_fourrooms_start_values_match_independent_implementation(x64, slip_model, expected):
    prob = fourrooms(slip_model, dtype=jnp.float64)
    x = 0.01 * jax.random.normal(jax.random.key(0), (105,), jnp.float64)
    got = [float(exact.leader_objective(prob, x, b)) for b in (1e-3, 3e-3, 5e-3)]
    np.testing.assert_allclose(got, expected, atol=6e-4)


@pytest.mark.slow
def test_a_best_response_that_missed_its_tolerance_is_an_error_or_nan():
    """A solve capped below convergence (no Newton step, 20 sweeps: residual ~0.2) raises when
    concrete, also under an eager grad, and is NaN under a trace (value and gradient);
    ``tol=None`` takes the capped solve as it is."""
    problem = random_tabular_cmdp(jax.random.key(3), num_states=3, num_actions=2, dim=2)
    theta, capped = problem.theta0, dict(newton_iters=0, polish_sweeps=20)
    with pytest.raises(ValueError, match="missed its tolerance.*polish_sweeps=20"):
        exact.best_response(problem, theta, 0.5, **capped)
    with pytest.raises(ValueError, match="missed its tolerance"):  # eager grad: still concrete
        exact.exact_hypergradient(problem, theta, 0.5, **capped)
    as_is = exact.best_response(problem, theta, 0.5, tol=None, **capped)
    assert float(as_is.residual) > 1e-2 and bool(jnp.all(jnp.isfinite(as_is.V)))
    traced = jax.jit(lambda th: exact.exact_hypergradient(problem, th, 0.5, **capped))(theta)
    assert bool(jnp.all(jnp.isnan(traced)))
    assert float(exact.best_response(problem, theta, 0.5).residual) <= 1e-6  # the defaults
