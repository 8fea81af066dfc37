"""Solver health of a run: how often a follower (or metric) solve hit its cap, how many updates
were dropped. Never silent: the progress line, the CLIs' summaries and a loud warning read it.

Every trainer records two per-iteration flags in its metrics (int32, 0 or 1 per run):

* ``solve_capped``: the follower's best response, or the exact metric's solve, stopped at its
  iteration cap (or diverged, or, for Riccati, stalled above its tolerance at the float
  rounding floor: ``RiccatiInfo.stalled``, or met it at a solution too ill-conditioned for the
  dtype: ``RiccatiInfo.ill_conditioned``) before meeting its tolerance (tabular solves: or
  the float rounding floor, :mod:`bchg_jax.core.rounding`). The answer used that iteration is
  then approximate (tabular families), or the update is undone (LQ families).
* ``update_skipped``: the iteration's update was dropped (a non-converged Riccati solve, a
  non-finite estimate, an LQ closed loop that diverges under the discounts: ``diverging``, a
  tabular update to a theta whose tables are not distributions: ``model_invalid``).
* ``support_lost`` (tabular trainers with the sparse solvers): ``transition(theta)`` (or the
  sampler's table) had a non-zero entry outside its successor table; that iteration's
  follower and metric were solved (or its rollouts drawn) on the whole table, so its results
  are right: only its speed was lost. It is reported, and warned about above 1% (the table
  does not hold the support: :func:`bchg_jax.tabular.sparse.probe_support` with wider
  scales, or ``solver="dense"``), but it is not an unconverged result (:func:`suspect`).
* ``metric_nonfinite`` (the LQR game's trainer): the exact return ``J`` (or ``J_discounted``)
  recorded that iteration is not finite (the state's moments overflowed the dtype: a closed loop
  with rho(F) > 1 that the follower still answers, over a horizon where rho(F)^t leaves the
  dtype's range). The curve has a NaN there; float64 or a shorter horizon computes it.
* ``logits_rounded`` (tabular trainers, float32): the follower's logits Q / beta were rounded by
  more than :data:`~bchg_jax.core.validate.FLOAT32_LOGIT_WARN` (beta small next to the
  follower's values, :func:`~bchg_jax.core.validate.logits_rounded`): every solve converged,
  but the policy, J and the estimates can be off by percent; float64 removes it.
* ``follower_stalled`` (the LQR game's K-step learner, ``Leader.keeps_learning``): the
  learner's answer to the iteration's update was refused and so was its answer to the leader
  that stayed (its next closed loop diverges under the discounts), so the learner kept its
  policy: its clock stopped that iteration. The iteration's update is also skipped (counted in
  ``update_skipped``); this flag says the follower did not learn either.

A share above :data:`WARN_SHARE` (1%) of all run-iterations is a sign that the run is not what it
claims to be (e.g. float32 matmuls at reduced precision on an accelerator, a tolerance below what
the dtype can reach, a cap too small for the problem): :func:`health_warning` says so.
"""

from __future__ import annotations

from typing import Dict, Mapping, Optional

import numpy as np

FLAGS = (
    "solve_capped",
    "update_skipped",
    "support_lost",
    "metric_nonfinite",
    "logits_rounded",
    "follower_stalled",
)
WARN_SHARE = 0.01


def solver_health(metrics: Mapping[str, np.ndarray]) -> Dict[str, float]:
    """Counts and shares of the :data:`FLAGS` over every run and iteration recorded so far.

    Args:
      metrics: name -> array (e.g. [G, N, t] from ``run_grid``); the flags may be missing (a
        trainer of a user's own that does not record them).
    Returns:
      ``{"run_iterations": n, "solve_capped": count, "capped_share": share,
      "update_skipped": count, "skipped_share": share, "support_lost": count,
      "lost_share": share, "metric_nonfinite": count, "nonfinite_share": share,
      "logits_rounded": count, "rounded_share": share, "follower_stalled": count,
      "stalled_share": share}`` for the flags present (an empty dict when none is).
    """
    out: Dict[str, float] = {}
    for flag, share in (
        ("solve_capped", "capped_share"),
        ("update_skipped", "skipped_share"),
        ("support_lost", "lost_share"),
        ("metric_nonfinite", "nonfinite_share"),
        ("logits_rounded", "rounded_share"),
        ("follower_stalled", "stalled_share"),
    ):
        if flag in metrics:
            x = np.asarray(metrics[flag])
            out["run_iterations"] = int(x.size)
            out[flag] = int(np.count_nonzero(x > 0))
            out[share] = out[flag] / max(x.size, 1)
    return out


def health_text(health: Mapping[str, float]) -> str:
    """``"capped 0.00% skipped 0"`` (the progress line's and summary's short form)."""
    parts = []
    if "capped_share" in health:
        parts.append(f"capped {100 * health['capped_share']:.2f}%")
    if "update_skipped" in health:
        parts.append(f"skipped {health['update_skipped']}")
    if health.get("support_lost"):  # shown only when it happened
        parts.append(f"support lost {health['support_lost']}")
    if health.get("metric_nonfinite"):  # shown only when it happened
        parts.append(f"J not finite {health['metric_nonfinite']}")
    if health.get("logits_rounded"):  # shown only when it happened
        parts.append(f"float32 logits rounded {health['logits_rounded']}")
    if health.get("follower_stalled"):  # shown only when it happened
        parts.append(f"follower stalled {health['follower_stalled']}")
    return " ".join(parts)


def health_warning(health: Mapping[str, float], share: float = WARN_SHARE) -> Optional[str]:
    """A loud multi-line warning when any flag is set in more than ``share`` of the
    run-iterations, else None.

    Args:
      health: from :func:`solver_health`.
      share: the threshold (default 1%).
    Returns:
      the warning text, or None.
    """
    bad = [
        (name, health[key], health[flag], flag)
        for name, key, flag in (
            (
                "follower / metric solves hit their cap (or stalled, or were ill-conditioned: "
                "solve_capped)",
                "capped_share",
                "solve_capped",
            ),
            ("updates were skipped", "skipped_share", "update_skipped"),
            (
                "the model (or the sampler's table) put mass outside the sparse solvers' "
                "successor table (those iterations were solved, or sampled, on the whole table: "
                "their results are right, at the dense solvers' cost; solver='dense' avoids the "
                "check)",
                "lost_share",
                "support_lost",
            ),
        )
        if health.get(key, 0.0) > share
    ]
    rounded = health.get("rounded_share", 0.0) > share
    nonfinite = health.get("nonfinite_share", 0.0) > share
    stalled = health.get("stalled_share", 0.0) > share
    if not bad and not rounded and not nonfinite and not stalled:
        return None
    lines = [
        f"WARNING: in {100 * v:.1f}% of {health['run_iterations']} run-iterations "
        f"{what} ({n} times)"
        for what, v, n, _ in bad
    ]
    if nonfinite:
        lines.append(
            f"WARNING: in {100 * health['nonfinite_share']:.1f}% of {health['run_iterations']} "
            "run-iterations the exact return J was not finite (metric_nonfinite): the state's "
            "moments overflowed the dtype (a closed loop with spectral radius > 1 over the "
            "horizon, which the follower still answers). The curve has NaN there; float64 (--dtype "
            "float64) or a shorter horizon computes it."
        )
    if rounded:
        lines.append(
            f"WARNING: in {100 * health['rounded_share']:.1f}% of {health['run_iterations']} "
            "run-iterations float32 rounded the follower's logits Q / beta by more than 1e-2 "
            "(beta small next to the follower's values): the solves converged, but the policy, "
            "J and the estimates can be off by percent. Run in float64 (the experiment "
            "commands: --dtype float64; the library: jax_enable_x64 and a float64 problem or "
            "config dtype); the flags are in metrics.npz (logits_rounded)."
        )
    if stalled:
        lines.append(
            f"WARNING: in {100 * health['stalled_share']:.1f}% of {health['run_iterations']} "
            "run-iterations the learning follower could answer neither the update nor the "
            "leader that stayed (its next closed loop diverges under the discounts: "
            "follower_stalled), so it kept its policy: the leader trains against a follower "
            "that stopped learning there (often a leader past the ridge of its return). The "
            "flags are in metrics.npz (follower_stalled)."
        )
    if not any(flag in ("solve_capped", "update_skipped") for flag in _flags(bad)):
        return "\n".join(lines)
    lines.append(
        "WARNING: the results of this run are not converged solves. Likely causes: "
        "float32 matmuls at reduced precision on a GPU/TPU (a solver of your own should "
        "use bchg_jax.core.precision.full_precision), a tolerance below what the dtype "
        "reaches, or an iteration cap too small for the problem. The per-iteration "
        "flags are in metrics.npz (solve_capped, update_skipped)."
    )
    return "\n".join(lines)


def _flags(bad) -> list:
    return [flag for *_, flag in bad]


def suspect(health: Mapping[str, float], share: float = WARN_SHARE) -> bool:
    """Whether a run's results may not be what they claim (a table marks them): more than
    ``share`` of its run-iterations with a capped solve, a skipped update, a non-finite J or
    float32-rounded logits. ``support_lost`` alone is not (those iterations were solved on the
    whole table)."""
    return any(
        health.get(key, 0.0) > share
        for key in ("capped_share", "skipped_share", "nonfinite_share", "rounded_share")
    )
