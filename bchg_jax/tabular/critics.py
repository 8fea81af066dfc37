"""Leader critics for the Benefit B_L = Q_L - V_L: SARSA and Monte Carlo.

SARSA is Algorithm 2 (CriticUpdate with SARSA) / Algorithm 10 (EstimateValueBySARSA); Monte Carlo
is Algorithm 9 (EstimateValueByMonteCarlo). Shapes: S states, B follower actions, a batch of E
streams x T steps (:class:`~bchg_jax.tabular.rollout.Batch`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from bchg_jax.core.segments import discounted_suffix_sum
from bchg_jax.core.unroll import scan_unroll
from bchg_jax.core.validate import check_discount, check_if_concrete, check_unit_interval
from bchg_jax.tabular.rollout import Batch

Array = jax.Array


def init_tabular_critic(
    key: Array, num_states: int, num_actions: int, std: float = 1.0, dtype=jnp.float32
) -> Array:
    """Q_L table initialised N(0, std^2) (the reference's random critic initialisation).

    The random initial critic Q_L^0 of Algorithm 1 line 1 / Algorithm 8 line 2.

    Args:
      key: PRNG key.
      num_states: S.
      num_actions: B, the follower's number of actions.
      std: standard deviation of the entries (0 gives a zero table).
      dtype: the table's dtype.
    Returns:
      [S, B] Q_L(s, b).
    """
    return std * jax.random.normal(key, (num_states, num_actions), dtype)


def sarsa_update(
    key: Array,
    Q: Array,
    batch: Batch,
    leader_reward: Array,
    gamma_L,
    alpha,
    parallel: bool = False,
) -> Array:
    """One SARSA pass over the batch in a random order (Algorithm 2 (CriticUpdate with SARSA)).

    Q(s,b) += alpha (r_L(s,b) + gamma_L Q(s',b') - Q(s,b)); (s', b') is the next step of the same
    stream, and the bootstrap is 0 at an episode end or at the end of the batch. The same update
    is the Q_L step of Algorithm 10 (EstimateValueBySARSA). The E*T transitions are visited
    sequentially (``lax.scan``) in one random permutation, so later updates see earlier ones.
    An episode end by time limit also zeroes the bootstrap (treated like a terminal step).

    ``parallel=True`` computes the same pass as one triangular solve (:func:`_sarsa_solve`):
    the same critic up to float rounding, in a few dependent steps instead of E*T, at the cost
    of an (E*T) x (E*T) matrix per run.

    Args:
      key: PRNG key of the visiting order.
      Q: [S, B] current critic Q_L^i.
      batch: :class:`~bchg_jax.tabular.rollout.Batch`, fields [E, T] (uses ``s``, ``b``,
        ``done``).
      leader_reward: [S, B] r_L^theta(s, b).
      gamma_L: leader discount (scalar).
      alpha: SARSA step size alpha_SA (scalar, may be traced).
      parallel: the pass as one triangular solve instead of a scan (same critic up to
        rounding).
    Returns:
      [S, B] the updated critic Q_L^{i+1}.
    Raises:
      ValueError: a concrete ``gamma_L`` outside [0, 1], or a concrete ``alpha`` outside
        (0, 1] (a step above 1 overshoots every target and the critic diverges).
    """
    check_if_concrete(check_discount, "gamma_L", gamma_L, True)
    check_if_concrete(check_unit_interval, "alpha (SARSA step size)", alpha)
    E, T = batch.s.shape
    nxt_s = jnp.concatenate([batch.s[:, 1:], batch.s[:, -1:]], axis=1)
    nxt_b = jnp.concatenate([batch.b[:, 1:], batch.b[:, -1:]], axis=1)
    last = jnp.zeros((E, T), bool).at[:, -1].set(True)
    boot = (~(batch.done | last)).astype(Q.dtype)
    s, b, s2, b2, bt = (x.reshape(-1) for x in (batch.s, batch.b, nxt_s, nxt_b, boot))
    r = leader_reward[s, b].astype(Q.dtype)  # a wider reward is rounded into the critic's dtype
    order = jax.random.permutation(key, E * T)
    if parallel:
        B = Q.shape[-1]
        x, y = (s * B + b)[order], (s2 * B + b2)[order]
        return _sarsa_solve(Q.reshape(-1), x, y, r[order], bt[order], gamma_L, alpha).reshape(
            Q.shape
        )

    def body(Q, i):
        target = r[i] + gamma_L * bt[i] * Q[s2[i], b2[i]]
        return Q.at[s[i], b[i]].add(alpha * (target - Q[s[i], b[i]])), None

    Q, _ = jax.lax.scan(body, Q, order, unroll=scan_unroll())  # as the rollout's scan
    return Q


def _sarsa_solve(q0: Array, x: Array, y: Array, r: Array, bt: Array, gamma_L, alpha) -> Array:
    """A sequential SARSA pass over n updates as one unit lower-triangular solve.

    Update i (in visiting order) adds d_i to entry x_i of the flat critic, where
    d_i = alpha (r_i + gamma_L bt_i Q_i[y_i] - Q_i[x_i]) and Q_i = q0 + sum_{j<i} d_j e_{x_j} is
    the critic it sees. Writing Q_i out gives (I + alpha L_x - alpha gamma_L diag(bt) L_y) d = c,
    with L_x[i, j] = [j < i, x_j = x_i], L_y[i, j] = [j < i, x_j = y_i] and
    c = alpha (r + gamma_L bt q0[y] - q0[x]): forward substitution on it is the scan, and
    ``lax.linalg.triangular_solve`` does it as one operation.

    Args:
      q0: [S * B] the flat critic before the pass.
      x, y: [n] flat indices of each update's (s, b) and of its bootstrap's (s', b').
      r: [n] rewards; bt: [n] 1 where the update bootstraps, 0 where it does not.
      gamma_L, alpha: the discount and the step size (scalars, may be traced).
    Returns:
      [S * B] the critic after the pass.
    """
    n = x.shape[0]
    earlier = jnp.arange(n)[None, :] < jnp.arange(n)[:, None]
    same_x = (earlier & (x[None, :] == x[:, None])).astype(q0.dtype)
    same_y = (earlier & (x[None, :] == y[:, None])).astype(q0.dtype)
    A = jnp.eye(n, dtype=q0.dtype) + alpha * same_x - (alpha * gamma_L * bt)[:, None] * same_y
    c = (alpha * (r + gamma_L * bt * q0[y] - q0[x])).astype(q0.dtype)
    d = jax.lax.linalg.triangular_solve(
        A, c[:, None], left_side=True, lower=True, unit_diagonal=True
    )
    return q0.at[x].add(d[:, 0])


def _check_q_policy(Q: Array, policy: Array) -> None:
    """``Q`` [..., B] and ``policy`` [S, B]: the same B, broadcasting shapes (ValueError)."""
    qs, ps = tuple(np.shape(Q)), tuple(np.shape(policy))
    try:
        ok = len(qs) >= 1 and len(ps) >= 1 and qs[-1] == ps[-1]
        np.broadcast_shapes(qs, ps)
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(
            f"Q [..., B] and policy [S, B] must have the same number of actions B "
            f"and broadcasting shapes, got Q {qs} and policy {ps}"
        )


def benefit(Q: Array, policy: Array) -> Array:
    """B_L(s, b) = Q_L(s, b) - sum_b' g(b'|s) Q_L(s, b') (the paper's Benefit).

    The Benefit B_L^{theta dagger} defined before Theorem 1; Algorithm 1 line 11.

    Args:
      Q: [S, B] leader critic Q_L(s, b) (any leading shape [..., B] broadcasting with
        ``policy``).
      policy: [S, B] follower policy g(b|s).
    Returns:
      [S, B] B_L(s, b).
    Raises:
      ValueError: ``Q`` and ``policy`` with different numbers of actions or shapes that do not
        broadcast.
    """
    _check_q_policy(Q, policy)
    return Q - jnp.sum(policy * Q, axis=-1, keepdims=True)


def state_value(Q: Array, policy: Array) -> Array:
    """V_L(s) = sum_b g(b|s) Q_L(s, b) (Algorithm 1 line 10).

    Also the V_L step of Algorithm 10 (EstimateValueBySARSA).

    Args:
      Q: [S, B] leader critic Q_L(s, b).
      policy: [S, B] follower policy g(b|s).
    Returns:
      [S] V_L(s).
    Raises:
      ValueError: as :func:`benefit`.
    """
    _check_q_policy(Q, policy)
    return jnp.sum(policy * Q, axis=-1)


def monte_carlo_critic(batch: Batch, leader_reward: Array, gamma_L):
    """(Q_L [S,B], V_L [S]) by every-visit Monte Carlo of leader returns (Algorithm 9).

    Algorithm 9 (EstimateValueByMonteCarlo): Q_L(s, b) (V_L(s)) is the mean discounted leader
    return of all trajectory segments starting at (s, b) (at s).
    Segment returns stop at episode ends and at the batch end; unvisited entries are 0.

    Args:
      batch: :class:`~bchg_jax.tabular.rollout.Batch`, fields [E, T] (the main batch, or the
        oracle batch for HPGD (oracle)); uses ``s``, ``b``, ``done``.
      leader_reward: [S, B] r_L^theta(s, b).
      gamma_L: leader discount (scalar).
    Returns:
      (Q_L, V_L): [S, B] and [S] Monte Carlo estimates.
    Raises:
      ValueError: a concrete ``gamma_L`` outside [0, 1].
    """
    check_if_concrete(check_discount, "gamma_L", gamma_L, True)
    S, B = leader_reward.shape
    G = discounted_suffix_sum(leader_reward[batch.s, batch.b], gamma_L, batch.done)
    ones = jnp.ones(G.size, G.dtype)
    sb = (batch.s * B + batch.b).reshape(-1)
    q = jax.ops.segment_sum(G.reshape(-1), sb, S * B) / jnp.maximum(
        jax.ops.segment_sum(ones, sb, S * B), 1.0
    )
    v = jax.ops.segment_sum(G.reshape(-1), batch.s.reshape(-1), S) / jnp.maximum(
        jax.ops.segment_sum(ones, batch.s.reshape(-1), S), 1.0
    )
    return q.reshape(S, B), v
