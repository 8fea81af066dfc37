"""Episodes of a continuous configurable MDP under a Gaussian follower (one lax.scan over time,
all episodes at once).

``Trajectories.s`` is [E, T+1, n] (s_0 .. s_T) and ``b`` is [E, T+1, m]: the action at s_T is
sampled too, so SARSA/TD targets of the last step (Q(s_T, b_T)) need no special case.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from bchg_jax.core.validate import check_count, check_shape, check_theta
from bchg_jax.lq.cmdp import LQConfigurableMDP

Array = jax.Array


class Trajectories(NamedTuple):
    """A batch of E episodes of T transitions in a continuous configurable MDP.

    Attributes:
      s: [E, T+1, n] states s_0..s_T.
      b: [E, T+1, m] follower actions b_0..b_T (b_T sampled at s_T for SARSA targets).
    """

    s: Array  # [E, T+1, n]
    b: Array  # [E, T+1, m]

    @property
    def num_episodes(self) -> int:
        """E, the number of episodes."""
        return self.s.shape[0]

    @property
    def horizon(self) -> int:
        """T, the number of transitions per episode."""
        return self.s.shape[1] - 1


def rollout(
    key: Array, problem, theta: Array, policy, num_episodes: int, horizon: int
) -> Trajectories:
    """Samples the batch B of Algorithm 1 (line 4): episodes under the follower's policy.

    ``num_episodes`` episodes of ``horizon`` transitions: s_0 ~ rho_0, b_t ~ policy(.|s_t),
    s_{t+1} ~ p_theta(.|s_t, b_t), one ``lax.scan`` over time. ``policy`` needs
    ``sample(key, s)`` (e.g. a :class:`~bchg_jax.core.maxent_lqr.GaussianBestResponse`). A
    problem with ``stepper(theta) -> step(key, s, b)`` (the same draws as ``step(key, theta, s,
    b)``) has its theta-dependent pieces formed once, before the scan; a subclass of
    :class:`~bchg_jax.lq.cmdp.LQConfigurableMDP` that overrides ``step`` alone is stepped
    through its ``step``.

    Args:
      key: PRNG key.
      problem: the configurable MDP (``sample_init``, ``step``; optionally ``stepper``).
      theta: [d] leader parameters.
      policy: the follower policy: ``sample(key, s [E, n]) -> [E, m]``.
      num_episodes: E.
      horizon: T.
    Returns:
      :class:`Trajectories` with ``s`` [E, T+1, n] and ``b`` [E, T+1, m].
    Raises:
      ValueError: ``num_episodes`` or ``horizon`` not a positive integer, or a ``policy`` with
        a gain ``K`` that does not fit the problem's sizes (a response of another problem).
    """
    check_count("num_episodes", num_episodes)
    check_count("horizon", horizon)
    check_theta(problem, theta)  # a short theta would be indexed past its end (JAX clamps)
    K = getattr(policy, "K", None)
    if K is not None and hasattr(problem, "state_dim") and hasattr(problem, "action_dim"):
        n, m = problem.state_dim, problem.action_dim
        check_shape(
            "policy.K (the follower's gain)",
            K,
            (m, n),
            f"n={n}, m={m} from {getattr(problem, 'name', 'the problem')}",
        )
    k0, kb0, kloop = jax.random.split(key, 3)
    s0 = problem.sample_init(k0, theta, num_episodes)
    b0 = policy.sample(kb0, s0)

    # theta's matrices formed once, outside the scan, where the problem can (``stepper``)
    stepper = _stepper(problem, theta)
    step = stepper if stepper is not None else (lambda k, s, b: problem.step(k, theta, s, b))

    def body(carry, k):
        s, b = carry
        ks, kb = jax.random.split(k)
        s2 = step(ks, s, b)
        b2 = policy.sample(kb, s2)
        return (s2, b2), (s2, b2)

    _, (ss, bs) = jax.lax.scan(body, (s0, b0), jax.random.split(kloop, horizon))
    s = jnp.concatenate([s0[None], ss], 0).swapaxes(0, 1)
    b = jnp.concatenate([b0[None], bs], 0).swapaxes(0, 1)
    return Trajectories(s, b)


def _stepper(problem, theta):
    """``problem.stepper(theta)``, or None: a problem without one, and a subclass of
    :class:`~bchg_jax.lq.cmdp.LQConfigurableMDP` that overrides ``step`` but not ``stepper``
    (its own ``step`` is what it samples with)."""
    stepper = getattr(problem, "stepper", None)
    if stepper is None:
        return None
    cls = type(problem)
    if (
        isinstance(problem, LQConfigurableMDP)
        and cls.step is not LQConfigurableMDP.step
        and cls.stepper is LQConfigurableMDP.stepper
    ):
        return None
    return stepper(theta)
