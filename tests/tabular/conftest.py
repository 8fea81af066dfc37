"""Shared problems of the tabular tests."""

import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.tabular import TabularCMDP


def _teleport_chain(threshold=3.0, S=20, dtype=jnp.float32):
    """A chain: actions left / right move one state (clipped at the ends); when
    theta[0] > threshold, 'right' moves right with probability 0.5 and teleports to the far
    state S - 1 with probability 0.5. Start at state 0, the leader is paid 1 at S - 1, the
    follower theta[1] per 'right'. Its support depends on theta."""
    s = np.arange(S)
    base = np.zeros((S, 2, S), np.float32)
    base[s, 0, np.maximum(s - 1, 0)] = 1.0
    base[s, 1, np.minimum(s + 1, S - 1)] = 1.0
    tele = base.copy()
    tele[:, 1] *= 0.5
    tele[:, 1, S - 1] += 0.5
    base, tele = jnp.asarray(base, dtype), jnp.asarray(tele, dtype)
    rL = jnp.zeros((S, 2), dtype).at[S - 1].set(1.0)
    rho = jnp.zeros((S,), dtype).at[0].set(1.0)
    return TabularCMDP(
        transition=lambda th: jnp.where(th[0] > threshold, tele, base),
        init_dist=lambda th: rho,
        follower_reward=lambda th: jnp.zeros((S, 2), dtype).at[:, 1].set(th[1]),
        leader_reward=lambda th: rL,
        gamma_F=0.9,
        gamma_L=0.9,
        theta0=jnp.asarray([0.0, 0.5], dtype),
        name="teleport_chain",
    ).validate()


@pytest.fixture
def teleport_chain():
    """:func:`_teleport_chain`, a support that moves with theta (the sparse solvers' and
    ``check_problem``'s support checks): ``teleport_chain(threshold, S=20, dtype=float32)``."""
    return _teleport_chain
