import jax
import pytest


@pytest.fixture
def x64():
    """Runs a test with float64 enabled (exact-gradient checks)."""
    with jax.enable_x64(True):
        yield
