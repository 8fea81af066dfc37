"""Estimator quality on Four-Rooms: bias, error and cosine to the exact hypergradient.

``python -m benchmarks.fourrooms_estimator_quality [--estimates 100] [--batches 100 200 500 1000]
[--betas 0.001 0.003 0.005]``

The paper's sample-efficiency claim measured directly. At the initial leader parameter, for each
beta and batch size (environment steps per estimate, drawn as one episode stream of that length;
training runs a batch above 200 as 200-step streams, experiments.fourrooms.batch_shape), every
method's hypergradient estimate is drawn ``--estimates`` times with the *exact* leader critic
Q_L (so only the hypergradient estimator differs; with exact critics HPGD (MC) and HPGD (SA)
coincide; ``--critic batch`` gives the baselines the Monte Carlo critic of their batch, as in
training) and compared with the exact hypergradient (implicit differentiation):
relative bias |mean - g| / |g| (with its standard error), relative RMSE sqrt(E|est - g|^2) / |g|
and the mean cosine between one estimate and g. Methods: BC-HG (Benefit, every-visit grouping as
in training), HPGD (its guide from the same batch's segments), HPGD (oracle: 50 x 200 extra steps
from uniformly random states), SoBiRL and Naive-PGD (partial derivative only).
"""

from __future__ import annotations

import argparse
import datetime
import platform

import jax
import jax.numpy as jnp
import numpy as np

from bchg_jax.problems.fourrooms import fourrooms
from bchg_jax.tabular import exact
from bchg_jax.tabular.critics import monte_carlo_critic
from bchg_jax.tabular.estimators import hypergradient
from bchg_jax.tabular.rollout import rollout

METHODS = {
    "BC-HG": ("benefit", False),
    "HPGD (MC/SA)": ("hpgd", False),
    "HPGD (oracle)": ("hpgd", True),
    "SoBiRL": ("sobirl", False),
    "Naive-PGD": ("none", False),
}


def estimates(
    problem, theta, beta, batch: int, guide: str, oracle: bool, num: int, critic: str = "exact"
):
    br = exact.best_response(problem, theta, beta)
    _, Q_exact = exact.leader_values(problem, theta, br.policy)
    rL = problem.leader_reward(theta)
    P = problem.sampler_transition(theta)
    S = problem.num_states

    def one(key):
        k1, k2 = jax.random.split(key)
        b = rollout(
            k1,
            br.policy,
            P,
            problem.init_dist(theta),
            problem.terminal,
            problem.time_limit,
            1,
            batch,
        )
        seg = None
        if oracle:
            seg = rollout(
                k2,
                br.policy,
                P,
                jnp.full((S,), 1.0 / S, P.dtype),
                problem.terminal,
                problem.time_limit,
                50,
                200,
            )
        Q_L, V_L = Q_exact, None
        if critic == "batch" and guide != "benefit":  # Monte Carlo critic, as in training
            Q_L, V_L = monte_carlo_critic(b if seg is None else seg, rL, problem.gamma_L)
        return hypergradient(
            problem, theta, b, br, Q_L, beta, guide=guide, guide_batch=seg, V_L=V_L
        )

    keys = jax.random.split(jax.random.key(0), num)
    return np.asarray(jax.jit(lambda ks: jax.lax.map(one, ks))(keys))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--estimates", type=int, default=100)
    p.add_argument("--batches", type=int, nargs="+", default=[100, 200, 500, 1000])
    p.add_argument("--betas", type=float, nargs="+", default=[1e-3, 3e-3, 5e-3])
    p.add_argument(
        "--critic",
        choices=["exact", "batch"],
        default="exact",
        help="'batch': HPGD, SoBiRL and Naive-PGD use the Monte Carlo critic of the "
        "batch (oracle: of its segments) as in training; BC-HG keeps the exact "
        "critic (its SARSA critic accumulates over iterations)",
    )
    a = p.parse_args(argv)
    problem = fourrooms()
    theta = problem.theta0
    print(
        f"# {platform.processor() or platform.machine()}, jax {jax.__version__}, "
        f"{datetime.date.today()}, {a.estimates} estimates per cell, critic {a.critic}, "
        f"theta = theta0"
    )
    print("| beta | batch | method | bias / norm (SE) | RMSE / norm | mean cosine |")
    print("|---|---|---|---|---|---|")
    for beta in a.betas:
        g = np.asarray(exact.exact_hypergradient(problem, theta, beta)).ravel()
        norm = np.linalg.norm(g)
        for batch in a.batches:
            for name, (guide, oracle) in METHODS.items():
                if a.critic == "batch" and name == "HPGD (MC/SA)":
                    name = "HPGD (MC)"  # the batch's Monte Carlo critic: HPGD (SA) trains SARSA
                est = estimates(problem, theta, beta, batch, guide, oracle, a.estimates, a.critic)
                est = est.reshape(est.shape[0], -1)
                bias = np.linalg.norm(est.mean(0) - g) / norm
                se = np.sqrt(np.sum(est.var(0, ddof=1)) / est.shape[0]) / norm
                rmse = np.sqrt(np.mean(np.sum((est - g) ** 2, -1))) / norm
                cos = np.mean(est @ g / (np.linalg.norm(est, axis=1) * norm + 1e-30))
                print(
                    f"| {beta:g} | {batch} | {name} | {bias:.3f} ({se:.3f}) | {rmse:.3f} | "
                    f"{cos:+.3f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
