"""n-zone building thermal control (paper Section 5.2 and the appendix "n-Zone Building Thermal
Control Task"; constants in ``docs/experiments.md``).

State s in R^4 (temperature deviations of 4 zones), follower action b in R^2 (2 HVAC units).
Leader weights ``w in R^8`` give ``theta = sigmoid(w) = (alpha, beta_air)``: insulation levels
alpha in [0,1]^4 and airflow levels beta_air in [0,1]^4. Dynamics ``s' = A_theta s + B b + w_t``
with A_theta from the appendix (Delta(alpha_i) = k_i (1 - alpha_i)), noise U = 0.02 I.

Rewards: r_F(s, b) = -(s^T Qbar s + b^T Rbar b), Qbar = diag(8,1,5,6), Rbar = 0.01 I;
r_L(s, b) = Stability(s) - 0.5 ||b||^2 - 0.1 (||alpha||^2 + ||beta_air||^2),
Stability(s) = -(1/n) sum_i (s_i - mean(s))^2 = -s^T ((I - 11^T/n)/n) s.
"""

from __future__ import annotations

from typing import Dict, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from bchg_jax.core.validate import check_float_dtype
from bchg_jax.lq.cmdp import LQConfigurableMDP

Array = jax.Array

K_EXT = (0.04, 0.03, 0.06, 0.05)  # k_i: exchange with the outside
# (row, column, airflow index, coefficient): heat exchange of zone `row` with zone `column`
# through the ventilation with level beta_air[index]
# (paper: h12, h41 | h23, h21 | h34, h32 | h41, h43)
H_LINKS = (
    (0, 1, 0, 0.05),
    (0, 3, 3, 0.05),
    (1, 2, 1, 0.04),
    (1, 0, 0, 0.03),
    (2, 3, 2, 0.06),
    (2, 1, 1, 0.04),
    (3, 0, 3, 0.05),
    (3, 2, 2, 0.03),
)
B_HVAC = ((0.10, 0.0), (0.6, 0.0), (0.0, 0.55), (0.0, 0.30))
Q_DIAG = (8.0, 1.0, 5.0, 6.0)
R_DIAG = (0.01, 0.01)
NOISE_STD = 0.02
INIT_STD = 5.0
ENERGY_WEIGHT = 0.5
CONFIG_WEIGHT = 0.1
N_ZONES = 4


def split_theta(w: Array) -> Tuple[Array, Array]:
    """Leader weights -> (alpha, beta_air) = sigmoid(w) split in halves.

    Args:
      w: [8] leader weights.
    Returns:
      (alpha, beta_air): [4] insulation levels and [4] airflow levels in (0, 1).
    Raises:
      ValueError: ``w`` not of shape [8] (a longer one would add its extra entries to the
        airflow levels' configuration cost while A_theta reads only the first 4 of them).
    """
    if jnp.shape(w) != (2 * N_ZONES,):
        raise ValueError(
            f"thermal: the leader weights w must have shape ({2 * N_ZONES},) (insulation "
            f"alpha [{N_ZONES}] then airflow beta_air [{N_ZONES}]), got {jnp.shape(w)}"
        )
    th = jax.nn.sigmoid(w)
    return th[:N_ZONES], th[N_ZONES:]


def thermal_A(w: Array) -> Array:
    """A_theta of the appendix for weights ``w`` (theta = sigmoid(w)).

    Args:
      w: [8] leader weights.
    Returns:
      [4, 4] state matrix A_theta.
    """
    alpha, air = split_theta(w)
    k = jnp.asarray(K_EXT, w.dtype)
    A = jnp.diag(1.0 + k * (1.0 - alpha))
    for i, j, link, h in H_LINKS:
        A = A.at[i, j].add(h * air[link]).at[i, i].add(-h * air[link])
    return A


def stability_matrix(n: int = N_ZONES, dtype=jnp.float32) -> Array:
    """Ms with Stability(s) = -s^T Ms s: Ms = (I - 11^T / n) / n.

    Args:
      n: number of zones.
      dtype: float dtype.
    Returns:
      [n, n] Ms.
    """
    return (jnp.eye(n, dtype=dtype) - jnp.full((n, n), 1.0 / n, dtype)) / n


def config_cost(w: Array) -> Array:
    """||alpha||^2 + ||beta_air||^2 for weights ``w`` [8] -> [] (the leader's config cost)."""
    alpha, air = split_theta(w)
    return jnp.sum(alpha**2) + jnp.sum(air**2)


def leader_components(w: Array) -> Dict[str, Tuple[Array, Array, Array]]:
    """The four components of r_L as (Ms, Mb, c) quadratics (signs: each is a *reward* term
    ``-s^T Ms s - b^T Mb b + c``; costs are reported positive by ``exact_lq.components``).

    Args:
      w: [8] leader weights.
    Returns:
      name -> (Ms [4, 4], Mb [2, 2], c []) for "stability", "hvac_energy", "insulation",
      "airflow" (unweighted; see ``COMPONENT_WEIGHTS``).
    """
    dt = w.dtype
    n, m = N_ZONES, len(R_DIAG)
    zs, zb = jnp.zeros((n, n), dt), jnp.zeros((m, m), dt)
    alpha, air = split_theta(w)
    return {
        "stability": (stability_matrix(n, dt), zb, jnp.zeros((), dt)),
        "hvac_energy": (zs, jnp.eye(m, dtype=dt), jnp.zeros((), dt)),
        "insulation": (zs, zb, -jnp.sum(alpha**2)),
        "airflow": (zs, zb, -jnp.sum(air**2)),
    }


COMPONENT_WEIGHTS = {
    "stability": 1.0,
    "hvac_energy": ENERGY_WEIGHT,
    "insulation": CONFIG_WEIGHT,
    "airflow": CONFIG_WEIGHT,
}


def thermal_leader_quadratic(w: Array):
    """r_L(s, b) = -s^T Ms s - b^T Mb b + c as (Ms [4, 4], Mb [2, 2], c []) for ``w`` [8]."""
    dt = w.dtype
    m = len(R_DIAG)
    return (
        stability_matrix(N_ZONES, dt),
        ENERGY_WEIGHT * jnp.eye(m, dtype=dt),
        -CONFIG_WEIGHT * config_cost(w),
    )


def thermal(dtype=jnp.float32, horizon: int = 100, init_weights=None) -> LQConfigurableMDP:
    """The 4-zone, 2-HVAC building of the paper. ``init_weights`` defaults to zeros (theta = 0.5);
    training adds N(0, std^2) noise (std 0.01 as in the reference, 1.0 as the paper states).

    Section "Configurable MDPs (Continuous)"; appendix "n-Zone Building Thermal Control Task".

    Args:
      dtype: float dtype of theta and the jnp tables.
      horizon: episode length for sampling and for the metric.
      init_weights: [8] initial leader weights w, or None for zeros.
    Returns:
      :class:`~bchg_jax.lq.cmdp.LQConfigurableMDP` (n = 4 states, m = 2 actions, theta0 [8],
      gamma_F = gamma_L = 0.9, s_0 ~ N(0, 5^2 I)).
    Raises:
      ValueError: ``init_weights`` not of shape [8], or a ``dtype`` that is not float32 (or
        float64 with ``jax_enable_x64``).
    """
    check_float_dtype("thermal: dtype", dtype)
    if init_weights is not None and np.shape(init_weights) != (2 * N_ZONES,):
        raise ValueError(
            f"thermal: init_weights must have shape ({2 * N_ZONES},) (insulation alpha "
            f"[{N_ZONES}] then airflow beta_air [{N_ZONES}]), got {np.shape(init_weights)}"
        )
    B = jnp.asarray(B_HVAC, dtype)
    theta0 = (
        jnp.zeros((2 * N_ZONES,), dtype)
        if init_weights is None
        else jnp.asarray(init_weights, dtype)
    )
    return LQConfigurableMDP(
        A_fn=thermal_A,
        B_fn=lambda w: B.astype(w.dtype),
        U=NOISE_STD * np.eye(N_ZONES),
        Qbar=np.diag(Q_DIAG),
        Rbar=np.diag(R_DIAG),
        leader_quadratic=thermal_leader_quadratic,
        init_cov=INIT_STD**2 * np.eye(N_ZONES),
        gamma_F=0.9,
        gamma_L=0.9,
        theta0=theta0,
        horizon=horizon,
        name="thermal",
        components=leader_components,
    )
