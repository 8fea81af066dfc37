"""lq.rollout forms theta's matrices once, before its scan over time (``stepper``): the same
batch as stepping through ``problem.step`` at every step, without the matrices' construction
(thermal's A(theta): scatter-adds) inside the loop."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.lq.rollout import rollout
from bchg_jax.problems.thermal import thermal


class _StepOnly:
    """The generic interface without ``stepper``: ``step(key, theta, s, b)`` at every step."""

    def __init__(self, problem):
        self._p = problem

    def sample_init(self, key, theta, num):
        return self._p.sample_init(key, theta, num)

    def step(self, key, theta, s, b):
        return self._p.step(key, theta, s, b)


class _Linear:
    """A Gaussian linear policy ``b = -K s + 0.5 eps`` (only ``sample`` and ``K`` are used)."""

    def __init__(self, K):
        self.K = K

    def sample(self, key, s):
        eps = jax.random.normal(key, s.shape[:-1] + (self.K.shape[0],), s.dtype)
        return -s @ self.K.T + 0.5 * eps


def _policy(problem, dtype):
    n, m = problem.state_dim, problem.action_dim
    return _Linear(jnp.asarray(np.random.default_rng(0).normal(size=(m, n)) * 0.1, dtype))


def _prims(jaxpr):
    out = set()
    for eqn in jaxpr.eqns:
        out.add(eqn.primitive.name)
        for v in eqn.params.values():
            inner = getattr(v, "jaxpr", None)
            if inner is not None:
                out |= _prims(getattr(inner, "jaxpr", inner))
    return out


@pytest.mark.slow
def test_the_batch_is_the_one_of_stepping_through_step(x64):
    problem = thermal()
    for dtype in (jnp.float32, jnp.float64):
        theta = jnp.asarray(np.random.default_rng(1).normal(size=8), dtype)
        pol = _policy(problem, dtype)
        key = jax.random.PRNGKey(3)
        a = jax.jit(lambda k, th: rollout(k, problem, th, pol, 5, 30))(key, theta)
        b = jax.jit(lambda k, th: rollout(k, _StepOnly(problem), th, pol, 5, 30))(key, theta)
        assert a.s.dtype == dtype
        np.testing.assert_array_equal(np.asarray(a.s), np.asarray(b.s))
        np.testing.assert_array_equal(np.asarray(a.b), np.asarray(b.b))
        # and one step is the transition's formula, N(A s + B b, U U^T) from the key's draws
        s, bb = a.s[:, 0], a.b[:, 0]
        with jax.default_matmul_precision("highest"):
            w = jax.random.normal(key, s.shape, s.dtype) @ jnp.asarray(problem.U, dtype).T
            by_hand = problem.mean_next(theta, s, bb) + w
        np.testing.assert_allclose(
            np.asarray(problem.stepper(theta)(key, s, bb)), np.asarray(by_hand), rtol=1e-6
        )


def test_a_subclass_that_overrides_step_alone_is_stepped_through_it():
    import dataclasses

    from bchg_jax.lq.cmdp import LQConfigurableMDP

    @dataclasses.dataclass(frozen=True, eq=False)
    class Still(LQConfigurableMDP):
        def step(self, key, theta, s, b):  # the state never moves
            return s

    base = thermal()
    problem = Still(**{f.name: getattr(base, f.name) for f in dataclasses.fields(base)})
    pol = _policy(problem, jnp.float32)
    traj = rollout(jax.random.PRNGKey(0), problem, jnp.zeros(8), pol, 3, 5)
    np.testing.assert_array_equal(np.asarray(traj.s[:, 1:]), np.asarray(traj.s[:, :1]).repeat(5, 1))


def test_thermal_s_matrices_are_built_outside_the_scan():
    problem = thermal()
    theta = jnp.zeros(8, jnp.float32)
    pol = _policy(problem, jnp.float32)
    closed = jax.make_jaxpr(lambda k, th: rollout(k, problem, th, pol, 4, 10))(
        jax.random.PRNGKey(0), theta
    )
    scans = [e for e in closed.jaxpr.eqns if e.primitive.name == "scan"]
    assert len(scans) == 1
    body = _prims(scans[0].params["jaxpr"].jaxpr)
    assert "scatter-add" not in body and "scatter_add" not in body, sorted(body)
    # the construction is still there, before the scan
    assert {"scatter-add", "scatter_add"} & _prims(closed.jaxpr)


def test_transition_noise_and_next_action_noise_are_independent(x64, random_lq):
    """s_{k+1} ~ N(A s + B b, UU^T) and b_{k+1} ~ N(-K s_{k+1}, cov) draw independent noises,
    and so do s_0 and b_0: whitened, their cross-covariance is 0 (each entry within 4 SE,
    SE = 1/sqrt(N)). A rollout that drew both from one key (n = m = 2: the same normals) has
    cross-correlation ~1."""
    p = random_lq()
    th = jnp.array([0.3, -0.2])
    br = p.best_response(th, 0.7, tol=1e-12)
    tr = rollout(jax.random.PRNGKey(0), p, th, br, 2000, 10)
    s, b, s2, b2 = tr.s[:, :-1], tr.b[:, :-1], tr.s[:, 1:], tr.b[:, 1:]
    w = np.asarray(s2 - p.mean_next(th, s, b)).reshape(-1, 2)
    e = np.asarray(b2 - br.mean(s2)).reshape(-1, 2)
    w = np.linalg.solve(np.asarray(p.U), w.T).T  # N(0, I)
    e = np.linalg.solve(np.asarray(br.chol), e.T).T  # N(0, I)
    np.testing.assert_allclose(w.T @ w / len(w), np.eye(2), atol=4 * np.sqrt(2 / len(w)))
    np.testing.assert_allclose(e.T @ e / len(e), np.eye(2), atol=4 * np.sqrt(2 / len(e)))
    cross = w.T @ e / len(w)
    assert np.all(np.abs(cross) < 4 / np.sqrt(len(w))), cross
    # and the first action's noise is independent of s_0 ~ N(0, init_cov) (init_cov = I here)
    s0, e0 = np.asarray(tr.s[:, 0]), np.asarray(tr.b[:, 0] - br.mean(tr.s[:, 0]))
    e0 = np.linalg.solve(np.asarray(br.chol), e0.T).T
    assert np.all(np.abs(s0.T @ e0 / len(s0)) < 4 / np.sqrt(len(s0))), s0.T @ e0 / len(s0)
