"""lq.objective_and_components gives leader_objective's J and components' values from one
covariance sum (the LQ trainer's metrics)."""

import jax
import numpy as np

from bchg_jax import lq
from bchg_jax.problems.thermal import thermal


def test_the_same_values_as_the_two_functions():
    problem = thermal()
    beta = 0.5
    for theta in (problem.theta0, problem.theta0 + 0.05):
        br = lq.best_response(problem, theta, beta)
        quads = problem.components(theta)
        J, parts = jax.jit(lambda th, br: lq.objective_and_components(problem, th, br, quads))(
            theta, br
        )
        np.testing.assert_allclose(J, lq.leader_objective(problem, theta, beta, br=br), rtol=1e-6)
        want = lq.components(problem, theta, br, quads)
        assert set(parts) == set(want)
        for name in want:
            np.testing.assert_allclose(parts[name], want[name], rtol=1e-6)
