"""Tabular 2-player Markov games (paper Section "2-Player Markov Games (Discrete)", Theorem 2):
the leader acts with a policy f_theta(a|s), the follower observes (s, a) and answers with
b ~ g(b|s, a).

A :class:`TabularGame` holds fixed arrays (the leader's parameters are its policy's):
``transition [S, A, B, S]``, ``init_dist [S]``, ``follower_reward [S, A, B]``,
``leader_reward [S, A, B]``, the discounts and the episode length (a time-out, not a terminal).
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import jax
import numpy as np
from bchg_jax.core.validate import shape_property

Array = jax.Array


@dataclasses.dataclass(frozen=True, eq=False)
class TabularGame:
    """A finite 2-player Markov game (S, (A, B), p, rho_0, (r_L, r_F), (gamma_L, gamma_F)).

    Attributes:
      transition: [S, A, B, S] p(s'|s, a, b).
      init_dist: [S] rho_0.
      follower_reward: [S, A, B] r_F(s, a, b).
      leader_reward: [S, A, B] r_L(s, a, b).
      gamma_F: the follower's discount in [0, 1).
      gamma_L: the leader's discount in [0, 1).
      time_limit: episode length T (a time-out, not a terminal), or None.
      name: label used in error messages.
    """

    transition: Array        # [S, A, B, S]
    init_dist: Array         # [S]
    follower_reward: Array   # [S, A, B]
    leader_reward: Array     # [S, A, B]
    gamma_F: float
    gamma_L: float
    time_limit: Optional[int] = None
    name: str = "tabular_game"

    num_states = shape_property("transition", 0, "S, the number of states")
    num_leader_actions = shape_property("transition", 1, "A, the leader's number of actions")
    num_follower_actions = shape_property("transition", 2, "B, the follower's number of actions")

    def validate(self) -> "TabularGame":
        """Clear ValueErrors for bad shapes, probabilities or discounts (host side).

        Returns:
          ``self``.
        Raises:
          ValueError: a bad shape, a non-stochastic ``transition`` / ``init_dist``, a
            non-finite reward, a discount outside [0, 1) or a bad ``time_limit``.
        """
        P = np.asarray(self.transition, np.float64)
        if P.ndim != 4 or P.shape[0] != P.shape[3]:
            raise ValueError(f"{self.name}: transition must be [S, A, B, S], got {P.shape}")
        S, A, B, _ = P.shape
        if np.any(P < -1e-9) or not np.allclose(P.sum(-1), 1.0, atol=1e-6):
            raise ValueError(f"{self.name}: transition rows must be probability vectors")
        rho = np.asarray(self.init_dist, np.float64)
        if rho.shape != (S,) or np.any(rho < -1e-9) or not np.isclose(rho.sum(), 1.0, atol=1e-6):
            raise ValueError(f"{self.name}: init_dist must be a probability vector of length {S}")
        for name in ("follower_reward", "leader_reward"):
            r = np.asarray(getattr(self, name), np.float64)
            if r.shape != (S, A, B):
                raise ValueError(f"{self.name}: {name} must be [{S}, {A}, {B}], got {r.shape}")
            if not np.all(np.isfinite(r)):
                raise ValueError(f"{self.name}: {name} must be finite")
        for name in ("gamma_F", "gamma_L"):
            g = getattr(self, name)
            if not 0.0 <= float(g) < 1.0:
                raise ValueError(f"{self.name}: {name} must be in [0, 1), got {g!r}")
        if self.time_limit is not None and (not isinstance(self.time_limit, (int, np.integer))
                                            or self.time_limit < 1):
            raise ValueError(f"{self.name}: time_limit must be a positive integer or None")
        return self
