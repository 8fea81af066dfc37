"""No LAPACK call batched over samples in the per-sample densities and estimates.

jaxlib 0.10.x (the CPU release CI runs) executes a batched LAPACK kernel (triangular solve, LU,
Cholesky, ...) by splitting its batch over XLA:CPU's intra-op thread pool and blocking until the
pieces are done; when the executor runs as many such kernels at once as the pool has threads,
each waits for work queued behind the others and the process hangs with no CPU use (found:
``games.lqr.check_problem`` with 100 episodes x 200 batches never returned on 2 cores; native
stacks in ``jax::ParallelBatchMap`` under ``lapack_strsm_ffi``). The per-sample code therefore
factors or inverts once per distribution and applies the result as a product
(:func:`bchg_jax.core.maxent_lqr.whiten`). These tests keep it so: the LAPACK calls of each
function have the same shapes whatever the number of samples. Tracing only: nothing compiles.
"""

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax import lq
from bchg_jax.core.maxent_lqr import whiten
from bchg_jax.core.precision import jaxpr_eqns
from bchg_jax.games import lqr
from bchg_jax.games.lqr.exact import expected_bump
from bchg_jax.problems.lqr_game import lqr_game
from bchg_jax.problems.thermal import thermal

LAPACK = ("triangular_solve", "lu", "cholesky", "qr", "eigh", "svd", "schur", "eig")


def _lapack_shapes(fn, *args) -> collections.Counter:
    """The LAPACK equations of ``fn``'s jaxpr as (primitive, operand shapes), counted."""
    eqns = jaxpr_eqns(jax.make_jaxpr(fn)(*args), LAPACK)
    return collections.Counter(
        (e.primitive.name, tuple(tuple(v.aval.shape) for v in e.invars)) for e in eqns
    )


def test_whiten_matches_a_triangular_solve_and_its_gradient():
    rng = np.random.default_rng(0)
    L = np.tril(rng.normal(size=(3, 3))) + 3 * np.eye(3)
    d = rng.normal(size=(5, 3))
    want = np.linalg.solve(L, d.T).T
    np.testing.assert_allclose(whiten(jnp.asarray(L), jnp.asarray(d)), want, rtol=1e-5, atol=1e-6)

    def by_solve(L, d):
        return jax.scipy.linalg.solve_triangular(L, d[..., None], lower=True)[..., 0]

    g = jax.grad(lambda L: jnp.sum(whiten(L, jnp.asarray(d)) ** 2))(jnp.asarray(L))
    g_ref = jax.grad(lambda L: jnp.sum(by_solve(L, jnp.asarray(d)) ** 2))(jnp.asarray(L))
    np.testing.assert_allclose(np.tril(g), np.tril(g_ref), rtol=1e-4, atol=1e-5)


def _game():
    return lqr_game(U=np.array([[0.3]]))


TH_GAME = jnp.array([-3.0, 0.5])


def _thermal_case(N):
    p = thermal()
    theta = jnp.asarray(p.theta0)
    br = lq.best_response(p, theta, 0.5)
    s = jnp.ones((N, p.state_dim))
    b = jnp.ones((N, p.action_dim))
    return p, theta, br, s, b


CASES = {
    "lq best response log_prob": lambda N: (
        lambda s, b: _thermal_case(N)[2].log_prob(s, b),
        *_thermal_case(N)[3:],
    ),
    "lq log_transition": lambda N: (
        lambda s, b: _thermal_case(N)[0].log_transition(_thermal_case(N)[1], s, b, s),
        *_thermal_case(N)[3:],
    ),
    "games.lqr follower log_prob": lambda N: (
        lambda s, a, b: lqr.best_response(_game(), TH_GAME, 0.1).log_prob(s, a, b),
        jnp.ones((N, 2)),
        jnp.ones((N, 1)),
        jnp.ones((N, 1)),
    ),
    "games.lqr leader_log_prob": lambda N: (
        lambda t, s, a: lqr.leader_log_prob(_game(), t, s, a),
        TH_GAME,
        jnp.ones((N, 2)),
        jnp.ones((N, 1)),
    ),
    "games.lqr expected_bump": lambda N: (
        lambda mu: expected_bump(_game(), mu, jnp.eye(2)),
        jnp.ones((N, 2)),
    ),
    "games.lqr exact_critic_estimate (Gaussian leader)": lambda N: (
        lambda t: lqr.exact_critic_estimate(
            _game(), t, 0.1, jax.random.key(0), episodes=N, leader_steps=4, extra_steps=4
        ),
        TH_GAME,
    ),
    "games.lqr exact_critic_estimate (deterministic leader)": lambda N: (
        lambda t: lqr.exact_critic_estimate(
            _game(),
            t,
            0.1,
            jax.random.key(0),
            episodes=N,
            leader_steps=4,
            extra_steps=4,
            stochastic=False,
        ),
        TH_GAME,
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_no_lapack_call_is_batched_over_samples(case):
    """Before: every log-density solved one triangular system per sample (a batched
    ``triangular_solve`` of the samples' shape), and the expected bump one LU per mean."""
    few, many = (_lapack_shapes(*CASES[case](N)) for N in (3, 40))
    assert few == many, f"LAPACK calls that grow with the samples: {many - few}"
