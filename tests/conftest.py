import hashlib
import os
import shutil
import tempfile

import jax
import pytest

# One persistent XLA compilation cache for the test session and the subprocesses it starts:
# many tests build the same trainers (smoke runs of every CLI, resumes, repeated configs), and
# identical programs then compile once. A cache the user configured is used as it is.
_OWN_CACHE = "JAX_COMPILATION_CACHE_DIR" not in os.environ
if _OWN_CACHE:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="bchg-jax-xla-cache-")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
    jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
    jax.config.update(
        "jax_persistent_cache_min_compile_time_secs",
        float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]),
    )


def pytest_sessionfinish(session, exitstatus):
    if _OWN_CACHE:
        shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)


@pytest.fixture
def x64():
    """Runs a test with float64 enabled (exact-gradient checks)."""
    with jax.enable_x64(True):
        yield


def _folder_digest(folder):
    """{relative path: sha256} of every file under ``folder``."""
    out = {}
    for root, _, files in os.walk(folder):
        for f in files:
            p = os.path.join(root, f)
            out[os.path.relpath(p, folder)] = hashlib.sha256(open(p, "rb").read()).hexdigest()
    return out


@pytest.fixture
def digest():
    """``digest(folder)``: {relative path: sha256} of every file (results never lost)."""
    return _folder_digest
