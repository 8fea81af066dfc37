"""Tabular configurable MDPs as pure functions of the leader's parameter theta.

A :class:`TabularCMDP` is the tuple (S, B, p^theta, rho_0^theta, r_F^theta, gamma_F) of the
paper's Section "Configurable Markov Decision Process", plus the leader's reward r_L^theta,
discount gamma_L and regulariser Phi_L(theta) of Eq. (leader-utility). Every table is produced
by a user function of ``theta``; all gradients the estimators need (grad r_L, grad r_F, grad log p,
grad log rho_0) come from JAX autodiff of these functions, never hand-written per problem.

Terminal states: the step taken at a terminal state is recorded with its rewards and the episode
ends there, so in the model the continuation value after a terminal state is zero.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from bchg_jax.core.precision import full_precision_fields
from bchg_jax.core.validate import (
    check_bool_mask,
    check_dtype_available,
    check_floating,
    check_indexing_once,
    check_not_wider,
    check_problem_settings,
    check_theta,
    check_theta_array,
    probability_tolerance,
)

Array = jax.Array


@dataclasses.dataclass(frozen=True, eq=False)
class TabularCMDP:
    """A tabular configurable MDP whose tables are pure functions of ``theta``.

    The configurable MDP M_theta of the paper (Section "Configurable Markov Decision Process")
    with the leader's utility of Eq. (leader-utility). Shapes below: S states, B follower
    actions, theta of any floating shape (``theta0.shape``).

    Attributes:
      transition: ``theta -> [S, B, S]`` model p^theta(s' | s, b) (rows sum to 1). The follower's
        best response and the exact evaluator use this model.
      init_dist: ``theta -> [S]`` initial distribution rho_0^theta.
      follower_reward: ``theta -> [S, B]`` r_F^theta.
      leader_reward: ``theta -> [S, B]`` r_L^theta.
      gamma_F, gamma_L: discounts in [0, 1).
      theta0: an example parameter (shape and dtype of theta; also the default initial value).
      leader_regularizer: optional ``theta -> scalar`` Phi_L(theta), added to J_L.
      terminal: optional ``[S]`` bool mask of terminal states.
      sample_transition: optional ``theta -> [S, B, S]`` used only by the sampler (rollouts), for
        problems whose simulator differs from the follower's model (Four-Rooms' reference quirk).
        Defaults to ``transition``.
      time_limit: optional episode time limit of the sampler (``None``: none).
      name: a label for logs.
    """

    transition: Callable[[Array], Array]
    init_dist: Callable[[Array], Array]
    follower_reward: Callable[[Array], Array]
    leader_reward: Callable[[Array], Array]
    gamma_F: float
    gamma_L: float
    theta0: Array
    leader_regularizer: Optional[Callable[[Array], Array]] = None
    terminal: Optional[np.ndarray] = None
    sample_transition: Optional[Callable[[Array], Array]] = None
    time_limit: Optional[int] = None
    name: str = "tabular_cmdp"

    def __post_init__(self):
        full_precision_fields(
            self,
            (
                "transition",
                "init_dist",
                "follower_reward",
                "leader_reward",
                "leader_regularizer",
                "sample_transition",
            ),
        )

    # --- derived static facts -------------------------------------------------------------
    @property
    def num_states(self) -> int:
        """S, the number of states (from the shape of ``transition(theta0)`` [S, B, S])."""
        return int(jax.eval_shape(self.transition, self.theta0).shape[0])

    @property
    def num_actions(self) -> int:
        """B, the follower's number of actions (from ``transition(theta0)`` [S, B, S])."""
        return int(jax.eval_shape(self.transition, self.theta0).shape[1])

    @property
    def terminal_mask(self) -> Array:
        """[S] bool mask of terminal states (all False when ``terminal`` is None)."""
        if self.terminal is None:
            return jnp.zeros((self.num_states,), dtype=bool)
        return jnp.asarray(self.terminal, dtype=bool)

    def sampler_transition(self, theta: Array) -> Array:
        """The sampler's transition table (``sample_transition``, else ``transition``).

        Args:
          theta: leader parameters, shaped like ``theta0``.
        Returns:
          [S, B, S] p(s' | s, b) used by :func:`~bchg_jax.tabular.rollout.rollout`.
        """
        fn = self.sample_transition if self.sample_transition is not None else self.transition
        return fn(theta)

    def regularizer(self, theta: Array) -> Array:
        """Phi_L(theta), the leader's regulariser of Eq. (leader-utility) (0 when absent).

        Args:
          theta: leader parameters, shaped like ``theta0``.
        Returns:
          [] scalar.
        """
        if self.leader_regularizer is None:
            # theta's dtype, not JAX's default float (float64 under x64 for a float32 run)
            return jnp.zeros((), dtype=jnp.asarray(theta).dtype)
        return self.leader_regularizer(theta)

    # --- validation (eager, before any jit) ------------------------------------------------
    def row_sum_tolerance(self, dtype=None) -> float:
        """The default tolerance of :meth:`validate`'s probability checks:
        :func:`~bchg_jax.core.validate.probability_tolerance` of max(gamma_F, gamma_L), at most
        1e-4: ``max(min(1e-4, 1e-3 (1 - gamma)), 32 eps(dtype))``.

        A row summing to 1 - d loses mass d per step. The sampler draws from the row normalised
        while the solvers (the follower's best response, the leader's values, the metric J and
        the exact hypergradient) use it as given, so they describe an MDP that differs from the
        sampled one by ~ gamma d / (1 - gamma) of the values (measured on a random 10-state
        problem whose rows were rounded to 5 decimals, d = 2e-5: 0.01% / 0.10% / 1.1% of the
        exact hypergradient at gamma 0.9 / 0.99 / 0.999).

        Args:
          dtype: the tables' float dtype (None: theta0's).
        Returns:
          the tolerance (float).
        """
        dtype = np.asarray(self.theta0).dtype if dtype is None else dtype
        gamma = max(float(self.gamma_F), float(self.gamma_L))
        return probability_tolerance(gamma, dtype)

    def validate(
        self, theta: Optional[Array] = None, atol: Optional[float] = None
    ) -> "TabularCMDP":
        """Checks shapes, probabilities and discounts; raises ``ValueError`` with a clear message.

        Runs the user functions eagerly on ``theta`` (default ``theta0``), before any compilation.
        S and B are read from ``transition(theta)`` [S, B, S]; every other table is checked
        against them, and an error names the table at fault. Returns ``self`` so it can be
        chained.

        Args:
          theta: leader parameters to evaluate the tables at (shaped like ``theta0``); None:
            ``theta0``.
          atol: tolerance of the probability checks (|row sum - 1| of the [S, B, S] tables,
            |sum - 1| of rho_0, negative entries); None: :meth:`row_sum_tolerance`, which
            scales with 1 - gamma (the sampler draws from the rows normalised, the solvers use
            them as given, and the two differ by ~ gamma |row sum - 1| / (1 - gamma)).
        Returns:
          ``self`` (the same :class:`TabularCMDP`).
        Raises:
          ValueError: a discount outside [0, 1), a theta0 / theta that is not one finite
            floating array (a dict of arrays, an integer array), a bad ``time_limit``, a
            failing problem function, a table of a wider dtype than theta's, an integer or bool
            ``follower_reward(theta)``, wrong table shapes,
            non-probability rows, a non-scalar Phi_L, non-finite entries, or a ``terminal``
            mask not of shape [S].
        """
        check_problem_settings(self)
        check_theta_array(self.name, self.theta0, "theta0")
        # theta0's dtype is the run's (make_train): float64 only with jax_enable_x64
        check_dtype_available(f"{self.name}: theta0", np.asarray(self.theta0).dtype)
        if theta is not None:
            check_theta_array(self.name, theta, "theta")
            check_theta(self, theta)  # a function reading th[0] took any longer theta
        theta = jnp.asarray(self.theta0 if theta is None else theta)
        try:
            raw = {
                "transition": self.transition(theta),
                "init_dist": self.init_dist(theta),
                "follower_reward": self.follower_reward(theta),
                "leader_reward": self.leader_reward(theta),
                "sample_transition": self.sampler_transition(theta),
            }
            reg = np.asarray(self.regularizer(theta))
        except Exception as err:  # noqa: BLE001 - re-raised with context
            raise ValueError(
                f"{self.name}: a problem function failed on theta of shape {theta.shape}: {err}"
            ) from err
        check_indexing_once(
            self,
            {
                "transition(theta)": self.transition,
                "init_dist(theta)": self.init_dist,
                "follower_reward(theta)": self.follower_reward,
                "leader_reward(theta)": self.leader_reward,
                "sample_transition(theta)": self.sample_transition,
                "leader_regularizer(theta)": self.leader_regularizer,
            },
            theta,
        )
        # the solvers' loops carry theta's dtype: a table of a wider dtype (e.g. a float64
        # numpy constant under jax_enable_x64 with a float32 theta) would change the carry's
        # dtype and fail deep inside a while_loop; narrower tables are promoted and are fine
        for label, table in raw.items():
            check_not_wider(self.name, f"{label}(theta)", table, theta.dtype)
        # the follower's solvers carry its reward's dtype (the other tables are promoted)
        check_floating(self.name, "follower_reward(theta)", raw["follower_reward"])
        p, rho, rf, rl, ps = (
            np.asarray(raw[k], dtype=np.float64)
            for k in (
                "transition",
                "init_dist",
                "follower_reward",
                "leader_reward",
                "sample_transition",
            )
        )
        if p.ndim != 3 or p.shape[0] != p.shape[2] or p.size == 0:
            raise ValueError(
                f"{self.name}: transition(theta) must have shape [S, B, S], got {p.shape}"
            )
        S, B = p.shape[:2]
        for label, table, shape in (
            ("init_dist", rho, (S,)),
            ("follower_reward", rf, (S, B)),
            ("leader_reward", rl, (S, B)),
            ("sample_transition", ps, (S, B, S)),
        ):
            if table.shape != shape:
                raise ValueError(
                    f"{self.name}: {label}(theta) must have shape {shape} (S={S}, "
                    f"B={B} from transition(theta)), got {table.shape}"
                )
        if reg.shape != ():
            raise ValueError(
                f"{self.name}: leader_regularizer(theta) must be a scalar, got shape {reg.shape}"
            )
        # finite first: a NaN entry would otherwise be reported as a bad probability row
        for label, table in (
            ("init_dist", rho),
            ("follower_reward", rf),
            ("leader_reward", rl),
            ("transition", p),
            ("sample_transition", ps),
            ("leader_regularizer", reg),
        ):
            if not np.all(np.isfinite(table)):
                raise ValueError(f"{self.name}: {label}(theta) has non-finite entries")
        atol = self.row_sum_tolerance(theta.dtype) if atol is None else float(atol)
        for label, table in (("transition", p), ("sample_transition", ps)):
            if np.any(table < -atol):
                # named first: normalising would not fix a negative entry (its row may sum to 1)
                at = np.argwhere(table < -atol)[0].tolist()
                raise ValueError(
                    f"{self.name}: {label}(theta) rows must be probabilities (entries >= 0) "
                    f"summing to 1 within {atol:.2g}; first bad (s, b): {at[:2]} has the "
                    f"negative entry {table[tuple(at)]:.3g} at s' = {at[2]} (its row sums to "
                    f"{table[tuple(at[:2])].sum():.9g}; negative entries in all: "
                    f"{int(np.sum(table < -atol))}): return probabilities, e.g. a softmax of "
                    "logits"
                )
            off = np.abs(table.sum(-1) - 1.0)
            bad_rows = off > atol
            if np.any(bad_rows):
                first = tuple(np.argwhere(bad_rows)[0].tolist())
                raise ValueError(
                    f"{self.name}: {label}(theta) rows must be probabilities (entries >= 0) "
                    f"summing to 1 within {atol:.2g}; first bad (s, b): {list(first)}, its sum "
                    f"{table[first].sum():.9g}, min entry {table[first].min():.3g} (the sampler "
                    "draws from the rows normalised while the solvers use them as given, so J and "
                    "the exact hypergradient would not be those of the sampled MDP: normalise "
                    "the rows, e.g. P / P.sum(-1, keepdims=True))"
                )
        if np.any(rho < -atol):
            at = int(np.argmax(rho < -atol))
            raise ValueError(
                f"{self.name}: init_dist(theta) must be a probability vector (entries >= 0); "
                f"init_dist[{at}] = {rho[at]:.3g} is negative (sum {rho.sum():.9g})"
            )
        if abs(rho.sum() - 1.0) > atol:
            raise ValueError(
                f"{self.name}: init_dist(theta) must be a probability vector summing to 1 "
                f"within {atol:.2g}, got sum {rho.sum():.9g}, min entry {rho.min():.3g}"
            )
        if self.terminal is not None and np.shape(self.terminal) != (S,):
            raise ValueError(
                f"{self.name}: terminal must be a bool mask of shape ({S},), "
                f"got {np.shape(self.terminal)}"
            )
        if self.terminal is not None:
            check_bool_mask(f"{self.name}: terminal", self.terminal)
        return self
