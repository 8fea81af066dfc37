"""The examples/ scripts run and do what their docstrings say (user-defined problems)."""
import numpy as np


def test_custom_cmdp_example():
    from examples.custom_cmdp import main
    out = main(["--iterations", "800"])
    assert out["cosine"] > 0.95                    # BC-HG with an exact critic ~ exact gradient
    assert out["J_end"] > out["J_start"] + 1.0     # the trained leader pays for progress


def test_custom_game_example():
    from examples.custom_game import main
    out = main(["--iterations", "150"])
    assert out["cosine"] > 0.95
    assert np.linalg.norm(out["response_part"]) < np.linalg.norm(out["exact"])
    j0, j1 = out["finals"]["bchg"]
    assert j1 > j0 + 5.0
