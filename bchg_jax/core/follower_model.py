"""Follower models: how far from its best response the follower plays (shared by the families).

The paper's method assumes a follower at its entropy-regularised best response g^{theta dagger}
at every outer iteration. :class:`FollowerModel` names the follower a trainer simulates instead
(a static setting; each family implements the update on its own tables):

* ``"best_response"`` (default): solved to tolerance every iteration (the paper's setting).
* ``"k_step"``: a model-based learner. It keeps its soft Q and, at iteration i, applies K soft
  Bellman backups of M_{theta_i} to its previous Q: ``Q_i = T_{theta_i}^K Q_{i-1}``, then plays
  ``g_i = softmax(Q_i / beta)``. K -> infinity is the best response.
* ``"lag"``: a slowly adapting follower: ``g_i = (1 - mix) g_{i-1} + mix g^{theta_i dagger}``
  (``mix = 1`` is the best response).
* ``"q_learning"``: a black box. It learns a soft Q-table only from its own transitions in the
  batch the leader collects (soft Q-learning, step size ``lr``; the target
  ``r_F + gamma_F beta logsumexp_b' Q(s', b') / beta``), acts with
  ``(1 - explore) softmax(Q / beta) + explore / B`` and is updated after each batch.

The leader's estimators see the follower as before (Assumption 1's white box reads the
policy; the families state what value they pair with it).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from bchg_jax.core.precision import full_precision
from bchg_jax.core.validate import check_config

Array = jax.Array
FOLLOWERS = ("best_response", "k_step", "lag", "q_learning")
MAX_STEPS = 2**31 - 1  # FollowerModel.steps: the compiled loops count in int32
# the kind that reads each setting; the others ignore it (and refuse a value off its default)
SETTING_OF = {"steps": "k_step", "mix": "lag", "lr": "q_learning", "explore": "q_learning"}


@dataclasses.dataclass(frozen=True)
class FollowerModel:
    """The simulated follower (static: a new value recompiles).

    Attributes:
      kind: one of :data:`FOLLOWERS` (module docstring).
      steps: K, the soft Bellman backups per outer iteration of ``k_step`` (1 to
        :data:`MAX_STEPS`).
      mix: ``lag``'s weight of the new best response, in (0, 1].
      lr: ``q_learning``'s step size, in (0, 1].
      explore: ``q_learning``'s probability of a uniformly random action, in [0, 1].

    A setting of another kind (:data:`SETTING_OF`) must stay at its default: ``validate``
    refuses e.g. ``FollowerModel("k_step", mix=0.5)``, which would ignore ``mix``.
    """

    kind: str = "best_response"
    steps: int = 1
    mix: float = 0.1
    lr: float = 0.1
    explore: float = 0.0

    def validate(self) -> "FollowerModel":
        """Host-side checks; returns ``self`` (``ValueError`` names the bad field)."""
        check_config(
            self,
            positive_ints=("steps",),
            nonneg=("explore",),
            unit=("mix", "lr"),
            choices={"kind": FOLLOWERS},
        )
        if not self.explore <= 1.0:
            raise ValueError(f"FollowerModel.explore must be in [0, 1], got {self.explore!r}")
        if self.steps > MAX_STEPS:  # a loop count the compiled program holds as int32
            raise ValueError(
                f"FollowerModel.steps must be at most {MAX_STEPS} (an int32 loop count), got "
                f"{self.steps}; for the limit K -> infinity use kind='best_response'"
            )
        # another kind's setting away from its default was ignored without a word (the CLI
        # refuses its flag the same way)
        defaults = FollowerModel()
        for name, owner in SETTING_OF.items():
            value = getattr(self, name)
            if owner != self.kind and value != getattr(defaults, name):
                raise ValueError(
                    f"FollowerModel.{name} = {value!r} is a setting of kind {owner!r}, and this "
                    f"model's kind is {self.kind!r}, which ignores it: set kind={owner!r}, or "
                    f"leave {name} at its default {getattr(defaults, name)!r}"
                )
        return self

    @property
    def best_response(self) -> bool:
        """True for the paper's follower (solved to tolerance every iteration)."""
        return self.kind == "best_response"

    @property
    def label(self) -> str:
        """A short name for tables and run folders, e.g. ``k_step3``, ``q_learning0.1``."""
        return {
            "best_response": "best_response",
            "k_step": f"k_step{self.steps}",
            "lag": f"lag{self.mix:g}",
            "q_learning": f"q_learning{self.lr:g}"
            + (f"_eps{self.explore:g}" if self.explore else ""),
        }[self.kind]


@dataclasses.dataclass(frozen=True)
class FollowerSettings:
    """The follower settings every family's frozen ``TrainConfig`` inherits.

    Attributes:
      follower: the simulated :class:`FollowerModel` (default: the best response, the paper).
      track_reference: record, every iteration, the estimate's cosine and projection against the
        family's two exact references of a follower off its best response (:func:`agreement`).
    """

    follower: FollowerModel = FollowerModel()
    track_reference: bool = False

    # the follower models the family simulates (a subclass may restrict them)
    FOLLOWER_KINDS = FOLLOWERS

    def check_follower(self) -> None:
        """``ValueError`` naming the field for a bad ``follower`` / ``track_reference`` or a
        follower model the family does not simulate."""
        if not isinstance(self.follower, FollowerModel):
            raise ValueError(f"TrainConfig.follower must be a FollowerModel, got {self.follower!r}")
        if self.follower.validate().kind not in self.FOLLOWER_KINDS:
            raise ValueError(
                f"TrainConfig.follower: this family simulates {self.FOLLOWER_KINDS}, got "
                f"{self.follower.kind!r} (the tabular families simulate all of {FOLLOWERS})"
            )
        if not isinstance(self.track_reference, (bool, np.bool_)):
            raise ValueError(
                f"TrainConfig.track_reference must be True or False, got {self.track_reference!r}"
            )


def lag_mix(previous: Array, best: Array, mix) -> Array:
    """``(1 - mix) previous + mix best``: the lagging follower's policy (any shape)."""
    return (1.0 - mix) * previous + mix * best


def mix_in_range(mix) -> Array:
    """[] bool: ``0 < mix <= 1`` (works on traced values; the exact lag references return NaN
    where it is False, as a traced ``mix`` escapes the concrete check)."""
    mix = jnp.asarray(mix)
    return (mix > 0) & (mix <= 1)


def explore_mix(policy: Array, explore) -> Array:
    """``(1 - explore) policy + explore / B`` over the last axis (B actions)."""
    return (1.0 - explore) * policy + explore / policy.shape[-1]


def soft_q_learning(Q: Array, index, reward, next_value, cont, lr, gamma) -> Array:
    """Sequential soft Q-learning updates of a flat table ``Q`` [N] along the leading axis.

    Step j moves ``Q[index_j]`` towards ``reward_j + gamma cont_j next_value(Q)[j]`` by ``lr``
    (each step reads the table as the previous steps left it).

    Args:
      Q: [N] the table (flattened (s, b) or (s, a, b) pairs).
      index: [L] int, the visited entry of each step.
      reward: [L] the follower's reward of each step.
      next_value: ``next_value(Q, j)`` -> [] the soft value of step j's next state under ``Q``.
      cont: [L] 0 where the next state is not bootstrapped (terminal), else 1.
      lr: step size.
      gamma: the follower's discount.
    Returns:
      [N] the updated table.
    """

    def body(Q, j):
        target = reward[j] + gamma * cont[j] * next_value(Q, j)
        return Q.at[index[j]].add(lr * (target - Q[index[j]])), None

    Q, _ = jax.lax.scan(body, Q, jnp.arange(index.shape[0]))
    return Q


@full_precision
def agreement(estimate, reference, name: str) -> dict:
    """``cos_<name>``: the cosine of ``estimate`` and ``reference`` (pytrees of one structure);
    ``proj_<name>``: ``<estimate, reference> / |reference|^2`` (1 for an estimate whose mean
    along the reference is the reference). Both are 0, not NaN, where a vector is zero (its
    norm is clamped at the dtype's smallest normal); a ``reference`` of ``None`` (no reference
    tracked) gives NaN for both."""
    e = jnp.concatenate([jnp.ravel(x) for x in jax.tree.leaves(estimate)])
    if reference is None:
        nan = jnp.full((), jnp.nan, e.dtype)
        return {f"cos_{name}": nan, f"proj_{name}": nan}
    r = jnp.concatenate([jnp.ravel(x) for x in jax.tree.leaves(reference)]).astype(e.dtype)
    tiny = jnp.finfo(e.dtype).tiny
    dot, rr = jnp.dot(e, r), jnp.dot(r, r)
    return {
        f"cos_{name}": dot / jnp.maximum(jnp.sqrt(jnp.dot(e, e) * rr), tiny),
        f"proj_{name}": dot / jnp.maximum(rr, tiny),
    }
