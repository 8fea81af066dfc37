import jax.numpy as jnp
import numpy as np
import pytest

from bchg_jax.games.tabular.game import TabularGame


def _backup_game(time_limit=100):
    """A random 5-state game (A = 3, B = 4; gamma_F 0.7, gamma_L 0.9) on which Theorem 2's
    estimator under the reference backup is 76% off that backup's hypergradient (beta 0.1)."""
    rng = np.random.default_rng(4)
    S, A, B = 5, 3, 4
    arrays = (
        rng.dirichlet(np.ones(S), size=(S, A, B)),
        rng.dirichlet(np.ones(S)),
        rng.normal(size=(S, A, B)),
        rng.normal(size=(S, A, B)),
    )
    return TabularGame(*map(jnp.asarray, arrays), 0.7, 0.9, time_limit).validate()


@pytest.fixture
def backup_game():
    """``backup_game(time_limit=100)``: the random game of :func:`_backup_game`."""
    return _backup_game
