"""Trajectory sampling: ``num_envs`` streams x ``num_steps`` steps, by ``lax.scan`` or in log depth.

All streams start from rho_0 at the beginning of a batch and auto-reset when an episode ends
(terminal state or time limit). Each step records the pre-transition state ``s``, the follower
action ``b``, the sampled next state ``s_next`` (before any reset), the in-episode time index
``t``, and the flags ``terminal`` (s is terminal: no transition of p happened) and ``done``
(the episode ends after this step: terminal or time limit).

Two forms draw the same batch, bit for bit, from the same key. The scan takes one step after
the other (``num_steps`` dependent steps). The parallel form (``parallel=True``) first draws,
for every step and every state, where a stream in that state would go (an [S] map per step and
stream, from the same uniform numbers), then composes the maps with
``lax.associative_scan`` (composition is associative: (m2 o m1)[s] = m2[m1[s]]), so the states
come out of about 2 log2(num_steps) dependent steps; the episode clock ``t`` is a running
maximum. It does S times the work (B + S comparisons per state and step, B + J with a
successor table), which an accelerator does side by side and a CPU does not
(docs/performance.md). Its only restriction: an episode must not hit its time limit before the
batch's last step (``time_limit`` None or >= ``num_steps``), since a time-limit reset depends on
the clock, not on the state alone.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from bchg_jax.core.unroll import scan_unroll
from bchg_jax.core.validate import (
    check_bool_mask_if_concrete,
    check_count,
    check_probability_rows_if_concrete,
    check_shape,
    transition_sizes,
)
from bchg_jax.tabular.sparse import check_holds_support, successor_probs

Array = jax.Array


class Batch(NamedTuple):
    """A batch of transitions, every field shaped [num_envs, num_steps].

    The sample batch B of Algorithm 1 line 4 (E = num_envs streams x T = num_steps steps).

    Attributes:
      s: [E, T] int state s_t before the step.
      b: [E, T] int follower action b_t ~ g(.|s_t).
      s_next: [E, T] int sampled next state (before any reset; meaningless when ``terminal``).
      t: [E, T] int time index within the episode (0 at an episode start).
      terminal: [E, T] bool, s_t is terminal (no transition of p happened).
      done: [E, T] bool, the episode ends after this step (terminal or time limit).
    """

    s: Array
    b: Array
    s_next: Array
    t: Array
    terminal: Array
    done: Array

    @property
    def num_episodes(self) -> Array:
        """Number of completed episodes in the batch, at least 1 (the estimators' normaliser).

        Returns:
          [] float32 ``max(sum(done), 1)``, the 1/|B| of Algorithms 1 and 4.
        """
        return jnp.maximum(jnp.sum(self.done), 1).astype(jnp.float32)

    def flat(self) -> "Batch":
        """The same transitions with every field flattened to [E * T] (stream-major)."""
        return Batch(*(x.reshape(-1) for x in self))


def _sample_cdf(cdf: Array, u: Array) -> Array:
    """Inverse-CDF sampling: the index of the first entry of ``cdf`` exceeding ``u cdf[-1]``.

    ``u`` in [0, 1) is scaled by the row's total, so a row whose float sum is a little off 1
    (a float32 Boltzmann policy, a transition row, a successor row) is drawn in proportion to
    its entries and never past its support: ``u cdf[-1] < cdf[-1]`` (JAX's u <= 1 - eps), so the
    first entry above it has a positive increment. Without the scale a row summing below 1
    drew its last entry, of probability 0 or not, for every u above the sum (Four-Rooms,
    beta 1e-3, the unnormalised float32 policy: 24 draws of an action of probability < 1e-6
    per 1e6 steps; normalised rows and this draw: 1). The clamp only serves an all-zero row.
    """
    x = u * cdf[..., -1:]
    return jnp.minimum(jnp.sum(cdf <= x, axis=-1, dtype=jnp.int32), cdf.shape[-1] - 1)


def check_parallel_limit(parallel: bool, time_limit: Optional[int], num_steps: int) -> None:
    """ValueError unless the parallel form can draw ``num_steps`` steps under ``time_limit``.

    The parallel form's states follow from the states alone, so no episode may reach its time
    limit before the batch's last step (where the reset is not part of the batch).
    """
    if parallel and time_limit is not None and int(time_limit) < num_steps:
        raise ValueError(
            f"the parallel rollout needs time_limit None or >= num_steps (an episode cut by its "
            f"time limit inside the batch), got time_limit {time_limit} < num_steps {num_steps}; "
            "use the scan form (parallel=False)"
        )


def _parallel_steps(s0, u, resets, pol_cdf, p_cdf, nxt, term_mask, limit):
    """The scan's step outputs, each [T, E], drawn in log depth (module docstring).

    Args: ``s0`` [E] start states; ``u`` [T, E, 3] the scan's uniform numbers; ``resets``
    [T, E] its reset states; the CDF tables, successor index (or None), terminal mask and time
    limit of :func:`rollout`.
    """
    T, E = resets.shape
    S = pol_cdf.shape[0]
    states = jnp.arange(S)
    # where a stream in each state would act and go at each step: [T, E, S], the scan's draws
    b_all = _sample_cdf(pol_cdf, u[:, :, None, :1])
    nx_all = _sample_cdf(p_cdf[states, b_all], u[:, :, None, 1:2])
    if nxt is not None:
        nx_all = nxt[states, nx_all]
    # a terminal state's stream resets; a time limit cannot end an episode before step T - 1
    step_map = jnp.where(term_mask, resets[..., None], nx_all).astype(s0.dtype)
    # prefix compositions m_k o ... o m_0, each [E, S], applied to the start states
    prefix = jax.lax.associative_scan(
        lambda earlier, later: jnp.take_along_axis(later, earlier, axis=-1), step_map, axis=0
    )
    after = jnp.take_along_axis(prefix, jnp.broadcast_to(s0[:, None], (T, E, 1)), axis=-1)
    s = jnp.concatenate([s0[None], after[:-1, :, 0]], axis=0)
    b = jnp.take_along_axis(b_all, s[..., None], axis=-1)[..., 0]
    s_next = jnp.take_along_axis(nx_all, s[..., None], axis=-1)[..., 0]
    term = term_mask[s]
    # the episode clock: steps since the last terminal step (a running maximum of its index)
    k = jnp.arange(T, dtype=jnp.int32)[:, None]
    start = jax.lax.cummax(jnp.where(term, k + 1, 0), axis=0)
    t = k - jnp.concatenate([jnp.zeros_like(start[:1]), start[:-1]], axis=0)
    done = term | (t + 1 >= limit)
    return s, b, s_next, t, term, done


def rollout(
    key: Array,
    policy: Array,
    transition: Array,
    init_dist: Array,
    terminal: Optional[Array],
    time_limit: Optional[int],
    num_envs: int,
    num_steps: int,
    successors=None,
    parallel: bool = False,
) -> Batch:
    """Samples ``num_envs`` x ``num_steps`` transitions under the follower's policy.

    SampleTrajectory of Algorithm 1 line 4 / Algorithm 8 lines 5 and 7: every stream starts
    from rho_0 and auto-resets from rho_0 after an episode ends.

    Args:
      key: PRNG key.
      policy: [S, B] g(b|s).
      transition: [S, B, S] p(s'|s, b).
      init_dist: [S] rho_0 (also the reset distribution).
      terminal: [S] bool mask or None.
      time_limit: episode length or None.
      num_envs: positive number of parallel streams E.
      num_steps: positive number of steps T per stream.
      successors: a :class:`~bchg_jax.tabular.sparse.Successors` table holding ``transition``'s
        support, or None. With it the next state is drawn among each state's J successors
        instead of all S states (the sparse solvers' table; ~S/J less work per step). The
        successors are in increasing state order, so the inverse-CDF draw picks the same
        state for the same uniform number as the full search.
      parallel: draw the batch in log depth (module docstring): the same batch bit for bit,
        ~2 log2(num_steps) dependent steps instead of ``num_steps``, S times the work.
    Returns:
      :class:`Batch`, every field [num_envs, num_steps] (time axis 1).
    Raises:
      ValueError: ``transition`` not [S, B, S]; ``policy``, ``init_dist`` or ``terminal`` not
        shaped by its S, B (the error names the array at fault); a concrete ``terminal`` that is
        not a bool (0 / 1) mask; a concrete ``policy``,
        ``transition`` or ``init_dist`` whose rows are not distributions (a negative entry, or a
        row sum off 1 by more than ``core.validate.POLICY_ROW_TOL``: logits or unnormalised
        weights would otherwise be drawn from, normalised, without a word); a ``time_limit``
        that is not a positive integer or None; ``num_envs`` or ``num_steps`` that is not a
        positive integer; ``parallel`` with a ``time_limit`` below ``num_steps``; a concrete
        ``transition`` with mass outside ``successors`` (beyond rounding).
    """
    S, B = transition_sizes("transition", transition)
    src = f"S={S}, B={B} from transition [S, B, S]"
    check_shape("policy", policy, (S, B), src)
    check_shape("init_dist", init_dist, (S,), src)
    if terminal is not None:
        check_shape("terminal", terminal, (S,), src)
        check_bool_mask_if_concrete("terminal", terminal)
    check_count("time_limit", time_limit, allow_none=True)
    for label, table in (("policy", policy), ("transition", transition), ("init_dist", init_dist)):
        check_probability_rows_if_concrete(label, table)  # logits or weights: no silent draw
    check_count("num_envs", num_envs)  # 2.5 failed in jnp.zeros with a shape error
    check_count("num_steps", num_steps)
    check_parallel_limit(parallel, time_limit, num_steps)
    term_mask = jnp.zeros((S,), bool) if terminal is None else jnp.asarray(terminal, bool)
    limit = jnp.iinfo(jnp.int32).max if time_limit is None else int(time_limit)
    pol_cdf = jnp.cumsum(policy, axis=-1)
    if successors is None:
        p_cdf, nxt = jnp.cumsum(transition, axis=-1), None
    else:
        successors.check(S, src)
        probs = successor_probs(transition, successors)
        check_holds_support(  # a truncated row would be drawn from renormalised, unsaid
            "transition",
            transition,
            successors,
            "a state the table does not list would never be drawn; pass this transition's "
            "table, or none",
        )
        p_cdf = jnp.cumsum(probs, axis=-1)  # [S, B, J]
        nxt = jnp.asarray(successors.index)
    rho_cdf = jnp.cumsum(init_dist)
    k0, k1 = jax.random.split(key)
    # uniforms in the run's dtype (the policy's), not JAX's default float: a float32 run draws
    # the same numbers with jax_enable_x64 on or off
    s0 = _sample_cdf(rho_cdf, jax.random.uniform(k0, (num_envs, 1), policy.dtype))
    u = jax.random.uniform(k1, (num_steps, num_envs, 3), policy.dtype)

    # every step's reset state, drawn up front by binary search (the same draws as the full
    # comparison of _sample_cdf: the first CDF entry above u rho_cdf[-1]); used where an
    # episode ends
    resets = jnp.searchsorted(rho_cdf, u[:, :, 2] * rho_cdf[-1], side="right")
    resets = jnp.minimum(resets, S - 1)

    if parallel:
        out = _parallel_steps(s0, u, resets.astype(s0.dtype), pol_cdf, p_cdf, nxt, term_mask, limit)
        return Batch(*(x.T for x in out))

    def step(carry, xs):
        s, t = carry
        u_t, s_reset = xs
        b = _sample_cdf(pol_cdf[s], u_t[:, :1])
        s_next = _sample_cdf(p_cdf[s, b], u_t[:, 1:2])
        if nxt is not None:
            s_next = nxt[s, s_next]
        term = term_mask[s]
        done = term | (t + 1 >= limit)
        new_s = jnp.where(done, s_reset, s_next)
        new_t = jnp.where(done, 0, t + 1)
        return (new_s, new_t), Batch(s, b, s_next, t, term, done)

    # several steps per loop trip (core.unroll: 4 unless BCHG_SCAN_UNROLL; the same results)
    _, out = jax.lax.scan(
        step,
        (s0, jnp.zeros((num_envs,), jnp.int32)),
        (u[:, :, :2], resets.astype(s0.dtype)),
        unroll=scan_unroll(),
    )
    return Batch(*(x.T for x in out))  # [num_envs, num_steps]
