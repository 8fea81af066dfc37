"""Small hand-made problems shared by the bad-input and message tests (imported, not collected):
``cmdp(**over)`` a uniform 3-state, 2-action TabularCMDP and ``lq(**over)`` a 2-d
LQConfigurableMDP, each with its fields replaceable by keyword and not validated,
``lqr_game_2d(**over)`` a validated 2-state LQR game of one leader and one follower input, and
``tied_cmdp(scale, beta, dtype)`` (validated) whose two actions are nearly tied (float32
rounding of the follower's logits)."""

import jax
import jax.numpy as jnp
import numpy as np

from bchg_jax.games.lqr.game import LQRGame
from bchg_jax.lq.cmdp import LQConfigurableMDP
from bchg_jax.tabular.cmdp import TabularCMDP

S, B = 3, 2


def cmdp(**over) -> TabularCMDP:
    kw = dict(
        transition=lambda th: jnp.full((S, B, S), 1.0 / S),
        init_dist=lambda th: jnp.full(S, 1.0 / S),
        follower_reward=lambda th: jnp.zeros((S, B)) + th[0],
        leader_reward=lambda th: jnp.ones((S, B)),
        gamma_F=0.9,
        gamma_L=0.9,
        theta0=jnp.zeros(1),
    )
    kw.update(over)
    return TabularCMDP(**kw)


def lq(**over) -> LQConfigurableMDP:
    kw = dict(
        A_fn=lambda th: jnp.eye(2) * 0.5,
        B_fn=lambda th: jnp.ones((2, 1)),
        U=np.eye(2) * 0.1,
        Qbar=np.eye(2),
        Rbar=np.eye(1),
        leader_quadratic=lambda th: (jnp.eye(2), jnp.eye(1), jnp.zeros(())),
        init_cov=np.eye(2),
        gamma_F=0.9,
        gamma_L=0.9,
        theta0=jnp.zeros(1),
    )
    kw.update(over)
    return LQConfigurableMDP(**kw)


def lqr_game_2d(**over) -> LQRGame:
    """A 2-d LQR game (A diag(0.5, 0.5), follower input on state 0, leader input on state 1,
    identity costs and start noise, U 0.3), validated; fields replaceable by keyword."""
    kw = dict(
        A=np.diag([0.5, 0.5]),
        B=np.array([[1.0], [0.0]]),
        C=np.array([[0.0], [1.0]]),
        Qbar=np.eye(2),
        Rbar=np.eye(1),
        s0=np.array([1.0, 1.0]),
        s_star=np.zeros(2),
        Sigma=np.eye(2),
        U=0.3 * np.eye(1),
        gamma_F=0.5,
        gamma_L=0.95,
        horizon=400,
    )
    kw.update(over)
    return LQRGame(**kw).validate()


def tied_cmdp(scale, beta, dtype):
    """3 states, two actions with the same transitions whose follower rewards differ by
    beta (0.7 + theta[1]) on top of ``scale``: g(1|s) = sigmoid(0.7 + theta[1]) exactly."""
    L0 = jnp.asarray([[0.2, -0.3, 0.5], [1.0, 0.0, -1.0], [-0.5, 0.4, 0.1]], dtype)
    D = jnp.asarray([[1.0, -1.0, 0.0], [0.0, 1.0, -1.0], [-1.0, 0.0, 1.0]], dtype)
    c = scale * jnp.asarray([1.0, 0.5, -0.3], dtype)

    def transition(th):
        p = jax.nn.softmax(L0 + th[0] * D, -1)
        return jnp.stack([p, p], 1)

    return TabularCMDP(
        transition=transition,
        init_dist=lambda th: jnp.ones(3, dtype) / 3,
        follower_reward=lambda th: jnp.stack([c, c + beta * (0.7 + th[1])], -1),
        leader_reward=lambda th: jnp.asarray([[0.0, 1.0]] * 3, dtype),
        gamma_F=0.9,
        gamma_L=0.9,
        theta0=np.zeros(2, dtype),
    ).validate()
