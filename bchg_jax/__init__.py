"""bchg-jax: Boltzmann Covariance HyperGradient (BC-HG) for decentralized bi-level RL in JAX.

The public API is organised by problem family; every family exposes the same names
(``best_response``, ``rollout``, ``hypergradient``, ``leader_objective``,
``exact_hypergradient``, ``make_train``, ``TrainConfig``, ``HParams``, ``METHODS``)::

    from bchg_jax import tabular, lq, games, problems
    trainer = tabular.make_train(problems.fourrooms(), "bchg", tabular.TrainConfig())

* :mod:`bchg_jax.tabular`: tabular configurable MDPs (Four-Rooms).
* :mod:`bchg_jax.lq`: linear-Gaussian configurable MDPs (building thermal control).
* :mod:`bchg_jax.games.tabular`, :mod:`bchg_jax.games.lqr`: 2-player Markov games (toy game,
  bi-level LQR game); :mod:`bchg_jax.games.estimators` is Theorem 2.
* :mod:`bchg_jax.problems`: the paper's instances. :mod:`bchg_jax.core`: the shared loop,
  sweeps (``run_grid``, ``product_grid``, ``seed_keys``), I/O, networks, buffers, validation.
"""

from bchg_jax.core.compile_options import configure_xla_cpu

configure_xla_cpu()  # avoids an XLA:CPU deadlock of large vmapped programs (see that module)

from bchg_jax import core, games, lq, problems, tabular  # noqa: E402
from bchg_jax.core.sweep import product_grid, run_grid, seed_keys  # noqa: E402

__version__ = "0.1.0"

__all__ = ["core", "games", "lq", "problems", "tabular", "product_grid", "run_grid", "seed_keys"]
