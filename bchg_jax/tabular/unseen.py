"""The part of the exact hypergradient that no sampled estimate can see: probabilities that are 0
at theta but move with it.

Every sampled estimator of Theorem 1 reaches theta's effect on the transition and initial
distributions through likelihood ratios: a step (s, b) -> s' contributes ``grad log p(s'|s, b)``
and its expectation is ``sum_s' p grad log p = sum_s' grad p`` only over the successors with
``p > 0``. An entry that is 0 at theta is never sampled, so its derivative is lost, while
:func:`~bchg_jax.tabular.exact.exact_hypergradient` (``jax.grad`` through the tables) keeps it.

A probability that is 0 at theta and differentiable there has a zero derivative (0 is its
minimum), so the lost part is non-zero only at a kink of the model: a ``clip`` or ``relu`` at
its bound, a probability linear in theta at 0 (whose other side is not a distribution). There
the hypergradient is a one-sided derivative, or JAX's mean of the two sides (``jnp.clip`` at a
bound), and the estimators target neither side: they lose the zero entry's derivative but keep
those of its row's other entries (which sum to its negative). A 12-state problem whose
transition puts ``q = clip(theta_2, 0, 0.9)`` on one successor and ``1 - q`` on another, at
theta_2 = 0: the exact component -0.082 (JAX's mean of the sides), finite differences 0 on the
left and -0.164 on the right, the estimators' target -0.223 (:func:`score_visible`'s exact
hypergradient, equal to the truncated target at a cut of 1000 steps); ``check_problem`` had
reported the whole gap as the time limit's cut (``cut_bias`` 0.25 where the discount weight
beyond the cut was 0.037).

* :func:`score_visible` is the problem with those derivatives removed (the same values): its
  exact hypergradient is what the sampled estimators target (their truncated target, the
  cut's; ``tabular.check.truncated_hypergradient`` computes it at a cut).
* :func:`unseen_hypergradient` is the difference; ``tabular.check_problem`` reports its share
  (``unseen_share``) and warns about it, and compares the cut with the visible part.

Training is not harmed the way a check is: ``TrainConfig.theta_init_std`` (0.01 by default)
starts a run off theta0, and on either side of such a kink the entry's derivative is seen (it
is positive) or zero (it stays 0), so only a theta exactly at the kink is affected.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from bchg_jax.tabular.cmdp import TabularCMDP
from bchg_jax.tabular.exact import exact_hypergradient

Array = jax.Array


def _seen_only(fn):
    """``fn`` with its derivative kept only where its value is positive (the same values)."""

    def seen(theta):
        p = fn(theta)
        fixed = jax.lax.stop_gradient(p)
        return jnp.where(fixed > 0, p, fixed)

    return seen


def score_visible(problem: TabularCMDP) -> TabularCMDP:
    """``problem`` with the derivatives of its zero transition and initial probabilities removed
    (module docstring): the same tables at every theta; its exact hypergradient is what the
    likelihood-ratio estimates target."""
    return dataclasses.replace(
        problem,
        transition=_seen_only(problem.transition),
        init_dist=_seen_only(problem.init_dist),
        name=f"{problem.name} (score-visible)",
    )


def unseen_hypergradient(problem: TabularCMDP, theta: Array, beta, **solve) -> Array:
    """The part of :func:`~bchg_jax.tabular.exact.exact_hypergradient` at ``theta`` through
    transition and initial probabilities that are 0 there (module docstring): exact minus the
    exact hypergradient of :func:`score_visible`. 0 (to rounding) unless ``theta`` sits at a
    kink of the model.

    Args:
      problem, theta, beta, **solve: as :func:`~bchg_jax.tabular.exact.exact_hypergradient`.
    Returns:
      the lost part, shaped like ``theta``.
    Raises:
      ValueError: as :func:`~bchg_jax.tabular.exact.exact_hypergradient`.
    """
    full = exact_hypergradient(problem, theta, beta, **solve)
    return full - exact_hypergradient(score_visible(problem), theta, beta, **solve)
