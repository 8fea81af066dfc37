"""The statistics of an estimator check: the mean of many independent estimates vs an exact value.

Shared by the families' ``check_problem`` (:func:`bchg_jax.tabular.check.check_problem`,
:func:`bchg_jax.lq.check.check_problem`). For estimates ``x_1..x_N`` of a gradient ``g`` [D]:

* ``mean``, ``se`` (the standard error of the mean, per component) and ``z = (mean - g) / se``;
  a difference within float rounding (:data:`ROUNDING_EPS` x the largest |g| or |mean|) gives
  ``z = 0``, and a component with no spread at that resolution (e.g. a regulariser-only one,
  the same in every batch) that differs from ``g`` beyond rounding gives ``z = inf``: an exact
  mismatch, counted in ``exact_mismatches``;
* ``bias_se``: max |z| over the components; ``inf`` for an exact mismatch;
* ``p_value``: the chance that an unbiased estimator shows a ``bias_se`` at least this large:
  each z is Student's t with N - 1 degrees of freedom (the SE is estimated from the same N
  estimates), and the largest of D is judged with Sidak's correction ``1 - (1 - p)^D`` (exact
  for independent components, an upper bound for Gaussian ones that are correlated). Below
  ~1e-3 the estimator is biased at this resolution. With many batches that is ``bias_se``
  above ~4; with few it is not: an unbiased 6-component estimate shows ``bias_se`` > 4 in 64% of
  2-batch checks and 10% of 5-batch ones, which ``p_value`` accounts for;
* ``rel_error`` = ||mean - g|| / ||g|| and ``rel_se`` = ||se|| / ||g||, the resolution of that
  number: a relative error well above ``rel_se`` is bias, not noise;
* ``cosine`` = cos(mean, g). A cosine near 1 can hide a 10% bias in the norm, so the three
  numbers are reported together.

An exact value that is 0 to float rounding (every |g| within the rounding tolerance of ``z``, e.g.
a leader reward taken before the follower acts) has no relative error: ``rel_error``,
``rel_se`` and ``cosine`` are NaN (not a ratio to the smallest float) and ``zero_exact`` is
True; ``z`` and ``bias_se`` still judge the estimates.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np

# float rounding of a comparison, relative to the largest |exact| or |mean| entry: a few float32
# eps (estimates are often float32; a wider eps where the inputs' dtype is coarser)
ROUNDING_EPS = 8 * float(np.finfo(np.float32).eps)
# a comparison with a smaller p_value reads as biased
BIASED_P = 1e-3
# a pair through which theta acts, sampled fewer times than this in all of a check's batches, is
# too rare for the standard error to account for: the families' checks then also judge the part
# of the exact gradient the other pairs carry (``rare_share``, ``resolved_*``)
RARE_VISITS = 30
# a comparison whose standard error's norm is more than this share of the exact gradient's norm
# cannot see a bias of the gradient's own size: the checks warn that its pass says little
LOW_RESOLUTION = 0.5


def warn_if_unresolved(where: str, row: dict, batches: int, stacklevel: int = 3) -> bool:
    """Warns when a :func:`compare` row that does not read as biased has a resolution
    ``rel_se`` above :data:`LOW_RESOLUTION`: no bias below about twice that share of the
    gradient's norm could show, so the pass says little. Returns whether it warned."""
    if reads_biased(row) or not row["rel_se"] > LOW_RESOLUTION:  # NaN: an exact value of 0
        return False
    pct = lambda x: f"{100 * x:.3g}" if x < 10 else f"{100 * x:,.0f}"  # noqa: E731 - no 1e+03
    warnings.warn(
        f"{where}: the estimates' standard error is {pct(row['rel_se'])}% of the exact "
        f"gradient's norm ({batches} batches), so a bias of up to about "
        f"{pct(2 * row['rel_se'])}% of it would not show: this pass says little. Use more "
        "batches (the resolution falls as 1 / sqrt(batches)) or more episodes per batch",
        UserWarning,
        stacklevel=stacklevel,
    )
    return True


def reads_biased(row: dict) -> bool:
    """Whether a :func:`compare` row reads as biased: ``p_value`` below :data:`BIASED_P` or an
    exact mismatch."""
    return bool(row["p_value"] < BIASED_P or row["exact_mismatches"] > 0)


def resolved_entries(row: dict, rest=None, estimates=None) -> dict:
    """The ``rare_share`` / ``resolved_*`` entries of a check's row: ``estimates`` judged
    against ``rest``, the part of the exact value carried by the pairs sampled often enough;
    NaN entries when ``rest`` is None (not computed).

    Returns:
      dict: ``rare_share`` (||exact - rest|| / ||exact||) and ``rare_component_share`` (the
      largest |exact - rest| / |exact| of a component: the rare pairs often carry all of the
      small components, whose standard error is small too), ``resolved_target`` (``rest``),
      ``resolved_bias_se`` and ``resolved_p_value`` (:func:`compare` of ``estimates`` with it).
    """
    if rest is None:
        return {
            "rare_share": float("nan"),
            "rare_component_share": float("nan"),
            "resolved_target": np.full_like(row["exact"], np.nan),
            "resolved_bias_se": float("nan"),
            "resolved_p_value": float("nan"),
        }
    rest = np.ravel(np.asarray(rest, np.float64))
    g = row["exact"]
    tiny = np.finfo(np.float64).tiny
    norm_g = max(float(np.linalg.norm(g)), tiny)
    resolved = compare(rest, estimates)
    part = np.abs(g - rest)
    return {
        "rare_share": float(np.linalg.norm(g - rest) / norm_g),
        "rare_component_share": float(np.max(part / np.maximum(np.abs(g), tiny), initial=0.0)),
        "resolved_target": rest,
        "resolved_bias_se": resolved["bias_se"],
        "resolved_p_value": resolved["p_value"],
    }


def resolved_clause(row: dict, pairs: str) -> str:
    """The checks' printed clause on the part of the exact value the rare ``pairs`` carry and
    the mean against the rest; empty when that part was not computed or is 0."""
    if not row["rare_share"] > 0:  # NaN: not computed
        return ""
    return (
        f"; {100 * row['rare_share']:.3g}% of the exact value carried by {pairs} sampled < "
        f"{RARE_VISITS} times: against the rest, bias {row['resolved_bias_se']:.1f} SE "
        f"(p = {row['resolved_p_value']:.2g})"
    )


def not_resolved_message(i: int, row: dict, pairs: str, batches: int, advice: str) -> str:
    """The warning of a check whose comparison reads as biased while the part it resolves
    agrees (``row["resolved_p_value"] >= BIASED_P``)."""
    return (
        f"theta {i}: the estimates read as biased ({describe(row)}), but "
        f"{100 * row['rare_share']:.3g}% of the exact gradient's norm (up to "
        f"{100 * row['rare_component_share']:.3g}% of one component) is carried by "
        f"{pairs} sampled fewer than {RARE_VISITS} times in all {batches} batches, which the "
        "estimates see only when they visit them; against the rest they agree (bias "
        f"{row['resolved_bias_se']:.1f} SE, p = {row['resolved_p_value']:.2g}): not resolved "
        f"rather than biased. {advice}"
    )


def check_best_response_config(config) -> None:
    """``check_problem`` samples under the best response and compares with its exact
    hypergradient: a ``config.follower`` off the best response would be silently ignored, so it
    is refused.

    Raises:
      ValueError: ``config.follower`` is not the best response, with what to use instead.
    """
    follower = getattr(config, "follower", None)
    if follower is not None and not follower.best_response:
        raise ValueError(
            f"check_problem judges the estimators under the follower's best response, not "
            f"follower={follower.kind!r} (that setting would be ignored): pass a config with "
            "the default FollowerModel(); for a follower off its best response, sample under "
            "its policy and compare with follower_references.as_if_optimal_hypergradient "
            "(what the estimators target there, docs/followers.md), or train with "
            "track_reference=True"
        )


def check_batches(batches) -> int:
    """The number of batches of a ``check_problem``: at least 2 (a standard error needs two).

    Returns:
      ``int(batches)``.
    Raises:
      ValueError: fewer than 2.
    """
    if int(batches) < 2:
        raise ValueError(f"batches must be >= 2 (a standard error), got {batches}")
    return int(batches)


def check_theta_list(where: str, theta_list, theta_shape=None) -> list:
    """The thetas of a ``check_problem``: a non-empty sequence (a list, or an array stacked on a
    leading axis). One theta passed alone was iterated over its entries, each refused as a
    theta of the wrong shape.

    Args:
      where: the function named in the error.
      theta_list: the thetas.
      theta_shape: the shape of one theta (the problem's ``theta0``), or None (pytrees).
    Returns:
      the thetas as a list.
    Raises:
      ValueError: one theta of ``theta_shape`` given alone, or no theta.
    """
    if isinstance(theta_list, (jax.Array, np.ndarray)) and theta_shape is not None:
        if tuple(theta_list.shape) == tuple(theta_shape):  # (a list may be ragged: not shaped)
            raise ValueError(
                f"{where}: theta_list must be a sequence of thetas, got one theta of shape "
                f"{tuple(theta_shape)}: pass [theta]"
            )
    thetas = list(theta_list)
    if not thetas:
        raise ValueError(f"{where}: theta_list is empty (nothing to check)")
    return thetas


def compare(exact, estimates) -> dict:
    """The agreement of ``estimates`` [N, D] (N >= 2) with ``exact`` [D] (module docstring).

    Args:
      exact: the exact value, any array of D entries (flattened).
      estimates: N independent estimates, [N, ...] with D entries each.
    Returns:
      dict: ``exact``, ``mean``, ``se``, ``z`` (float64 [D]), ``bias_se``, ``p_value``,
      ``rel_error``, ``rel_se``, ``cosine`` (floats; NaN when ``exact`` is 0 to rounding),
      ``zero_exact`` (bool: that case) and ``exact_mismatches`` (int: the components with no
      spread that differ from ``exact`` beyond rounding, ``z = inf``).
      Non-finite estimates give NaN statistics (never a silently good verdict).
    """
    eps = max(ROUNDING_EPS, 8 * _eps(exact), 8 * _eps(estimates))
    g = np.ravel(np.asarray(exact, np.float64))
    est = np.asarray(estimates, np.float64).reshape(len(estimates), -1)
    tiny = np.finfo(np.float64).tiny
    mean = est.mean(0)
    se = est.std(0, ddof=1) / np.sqrt(est.shape[0])
    diff = mean - g
    # the resolution of float rounding, from the finite entries (NaNs are handled below)
    mags = np.abs(np.concatenate([g, mean]))
    tol = eps * float(mags[np.isfinite(mags)].max(initial=0.0))
    # |diff| <= tol: equal up to rounding (z = 0). se <= tol: no spread at that resolution (a
    # deterministic component), so a difference beyond rounding is an exact mismatch (z = inf);
    # dividing by such an se would overflow. Otherwise |z| <= ~2 / eps: no overflow.
    z = np.where(np.abs(diff) <= tol, 0.0, np.copysign(np.inf, diff))
    np.divide(diff, se, out=z, where=(se > tol) & (np.abs(diff) > tol))
    z[~(np.isfinite(diff) & np.isfinite(se))] = np.nan
    zero_exact = bool(np.all(np.abs(g) <= tol))  # no scale to be relative to
    norm_g = max(np.linalg.norm(g), tiny)
    nan_if_zero = np.nan if zero_exact else 1.0
    return {
        "exact": g,
        "mean": mean,
        "se": se,
        "z": z,
        "bias_se": float(np.abs(z).max()),
        "p_value": max_abs_t_p_value(np.abs(z).max(), est.shape[0] - 1, z.size),
        "exact_mismatches": int(np.isinf(z).sum()),
        "zero_exact": zero_exact,
        "rel_error": float(np.linalg.norm(mean - g) / norm_g * nan_if_zero),
        "rel_se": float(np.linalg.norm(se) / norm_g * nan_if_zero),
        "cosine": float(mean @ g / max(np.linalg.norm(mean) * norm_g, tiny) * nan_if_zero),
    }


def describe(row: dict) -> str:
    """One line of :func:`compare`'s numbers, e.g. ``bias 1.2 SE (max over 4 components),
    relative error 0.52% (resolution 0.40%), cosine 0.9999``."""
    n = row.get("exact_mismatches", 0)
    if n:
        bias = (
            f"bias: EXACT MISMATCH in {n} of {row['exact'].size} components (the same in "
            "every batch, so no standard error, and different from the exact value beyond "
            "float rounding)"
        )
        finite = np.abs(row["z"][np.isfinite(row["z"])])
        if finite.size:
            bias += f"; the others: bias {finite.max():.1f} SE"
    else:
        bias = f"bias {row['bias_se']:.1f} SE (max over {row['exact'].size} components"
        if "p_value" in row:
            bias += f", p = {row['p_value']:.2g}"
        bias += ")"
    if row.get("zero_exact", False):
        return (
            f"{bias}, the exact value is 0 to rounding (no relative error): |mean| "
            f"{np.linalg.norm(row['mean']):.3g}, resolution |SE| {np.linalg.norm(row['se']):.3g}"
        )
    return (
        f"{bias}, "
        f"relative error {100 * row['rel_error']:.2f}% "
        f"(resolution {100 * row['rel_se']:.2f}%), cosine {row['cosine']:.4f}"
    )


def t_two_sided_p(t, dof: int):
    """P(|T| >= t) for Student's t with an integer ``dof`` >= 1 degrees of freedom.

    The closed form for integer degrees of freedom (Abramowitz & Stegun 26.7.3-4): with
    ``u = atan(t / sqrt(dof))``, P(|T| < t) is ``sin u`` times a finite series in ``cos^2 u``
    (even ``dof``), or ``(2 / pi) (u + sin u cos u`` times such a series``)`` (odd ``dof``).
    Every term is positive, so the sum is stable; the result has float64's absolute accuracy.

    Args:
      t: float or array of t >= 0 (``inf`` gives 0).
      dof: the degrees of freedom.
    Returns:
      float64 array of the shape of ``t``.
    """
    dof = int(dof)
    if dof < 1:
        raise ValueError(f"dof must be >= 1, got {dof}")
    t = np.asarray(t, np.float64)
    u = np.arctan(t / np.sqrt(dof))
    c2 = np.cos(u) ** 2
    term, series = np.ones_like(t), np.ones_like(t)
    # even dof: 1 + (1/2) c2 + (1*3)/(2*4) c2^2 + ... up to c2^((dof-2)/2);
    # odd dof: 1 + (2/3) c2 + (2*4)/(3*5) c2^2 + ... up to c2^((dof-3)/2)
    first = 1 if dof % 2 == 0 else 2
    for k in range((dof - 2) // 2 if dof % 2 == 0 else (dof - 3) // 2):
        term = term * c2 * (first + 2 * k) / (first + 1 + 2 * k)
        series = series + term
    if dof % 2 == 0:
        inside = np.sin(u) * series
    elif dof == 1:
        inside = 2.0 * u / np.pi
    else:
        inside = 2.0 / np.pi * (u + np.sin(u) * np.cos(u) * series)
    return np.clip(1.0 - inside, 0.0, 1.0)


def max_abs_t_p_value(max_abs_z, dof: int, components: int) -> float:
    """``p_value`` of :func:`compare`: the chance that the largest of ``components`` |t| values
    (``dof`` degrees of freedom each) reaches ``max_abs_z``, Sidak-corrected; 0 for an exact
    mismatch (``inf``), NaN for NaN."""
    if np.isnan(max_abs_z):
        return float("nan")
    p = float(t_two_sided_p(max_abs_z, dof))
    return float(-np.expm1(components * np.log1p(-p))) if p < 1.0 else 1.0


def _eps(x) -> float:
    """The machine epsilon of ``x``'s dtype if it is a float (bfloat16 included), else 0."""
    dtype = getattr(x, "dtype", None)
    if dtype is None or not jnp.issubdtype(dtype, jnp.floating):
        return 0.0
    return float(jnp.finfo(dtype).eps)


# the discount weight beyond a cut (or a cut's shift of the target) above which the checks and
# the tabular trainer warn (:func:`discount_weight_beyond`)
CUT_WEIGHT_WARN = 1e-3
# the every-visit share (:func:`every_visit_share`) above which the tabular trainer names the
# every-visit forms' own bias: those forms are the reference convention, biased by design for
# their lower variance (the docs say so), so the trainer speaks when the bias can rival the
# gradient's size, not at every cut (measured biases: 3% at a share of 0.09, the chain of
# examples/custom_cmdp.py; 19% at 0.22, random_tabular_cmdp at time limit 40);
# tabular.check_problem measures it at any size
EVERY_VISIT_WARN = 0.1


def every_visit_share(gamma, horizon: int) -> float:
    """The share of an every-visit mean of discounted segment sums that a cut at ``horizon``
    removes when the visits spread evenly over the episode's steps 0..H-1: the mean over k < H
    of gamma^(H - k), ``gamma (1 - gamma^H) / ((1 - gamma) H)`` (about 1 / ((1 - gamma) H)).

    An every-visit mean (the tabular estimators' ``grouping="every_visit"``, ``partial=
    "every_visit"``: Algorithm 1 line 12 and Algorithm 8, the reference convention) averages the
    segments of all visits to a pair, whatever their time in the episode, and applies the mean
    to every visit, early ones included; the segment of a visit at step k of an episode cut at H
    stops H - k steps later and lacks about gamma^(H - k) of its sum. More episodes per stream
    do not reduce it when every episode is cut (a time limit and no terminal state); a gradient
    carried late in the segments loses more, one carried early less. Measured on a 12-state
    problem with no terminal state (gamma_L 0.9, time limit 40, 10 episodes per stream): the
    every-visit partial term's bias 17% of the gradient (this share: 0.22); at time limit 200,
    4% (0.045).

    Args:
      gamma: the discount of the segments (gamma_L: the partial term's; gamma_F: FollowerQGrad's
        of Eq. (nablaQF)), in [0, 1).
      horizon: the cut H >= 1.
    Returns:
      the share in [0, 1).
    """
    g, H = float(gamma), int(horizon)
    if H < 1:
        raise ValueError(f"horizon must be >= 1, got {horizon}")
    if g == 0.0:
        return 0.0
    return float(g * -np.expm1(H * np.log(g)) / ((1.0 - g) * H))


def discount_weight_beyond(gamma_L, gamma_F, horizon: int) -> float:
    """The discount weight of Theorem 1 (or 2) beyond a cut of the episodes at ``horizon``
    (derivation: :mod:`bchg_jax.tabular.check`).

    P(K + J >= H) for independent K, J on {0, 1, ...} with P(K >= n) = gamma_L^n and
    P(J >= n) = gamma_F^n: the share of the double sum ``sum_k gamma_L^k sum_j gamma_F^j`` of the
    guiding term (and, through K alone, of the partial term's ``sum_t gamma_L^t``) that lies past
    the cut, ``gamma_L^H + (1 - gamma_L) sum_{k<H} gamma_L^k gamma_F^(H-k)``; for equal discounts
    (1 + H (1 - gamma)) gamma^H. It is the relative bias of a cut when the per-step terms are of
    even size; a problem whose gradient comes late in the episode loses more
    (:func:`bchg_jax.tabular.check.truncated_hypergradient` and
    :func:`bchg_jax.games.tabular.check.truncated_hypergradient` give the exact figure in the
    tabular families).

    Args:
      gamma_L: leader discount in [0, 1).
      gamma_F: follower discount in [0, 1).
      horizon: the cut H >= 0 (steps 0..H-1 kept).
    Returns:
      the weight in [0, 1] (1 at H = 0).
    """
    gL, gF, H = float(gamma_L), float(gamma_F), int(horizon)
    k = np.arange(H, dtype=np.float64)
    return float(gL**H + (1.0 - gL) * np.sum(gL**k * gF ** (H - k)))
