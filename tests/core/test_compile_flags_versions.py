"""``core.compile_options.configure_xla_cpu``, in-process: the flags are appended only for the
jaxlib releases that need them (0.10.x) and only when safe, a user's own value of an option wins,
other flags are kept, and the return value says whether anything was appended.

The environment, ``jaxlib.__version__`` and the backend test are patched, so nothing here starts
or reconfigures a backend (XLA_FLAGS is read only when a backend starts)."""

import jaxlib
import pytest

from bchg_jax.core import compile_options as co

SCHED = "--xla_cpu_enable_concurrency_optimized_scheduler=false"
EMIT = "--xla_cpu_use_fusion_emitters=false"
YNN = "--xla_cpu_experimental_ynn_fusion_type=-LIBRARY_FUSION_TYPE_REDUCE"


@pytest.fixture
def env(monkeypatch):
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    monkeypatch.delenv("BCHG_JAX_KEEP_XLA_FLAGS", raising=False)
    monkeypatch.setattr(co, "_backends_started", lambda: False)
    monkeypatch.setattr(jaxlib, "__version__", "0.10.2")
    return monkeypatch


def test_flags_are_appended_on_0_10_and_reported(env):
    """An empty XLA_FLAGS gets the three flags, space-separated, and the call returns True;
    a second call has nothing left to add and returns False."""
    import os

    assert co.configure_xla_cpu() is True
    assert os.environ["XLA_FLAGS"] == f"{SCHED} {EMIT} {YNN}" == co.FLAG
    assert co.configure_xla_cpu() is False
    assert os.environ["XLA_FLAGS"] == co.FLAG


@pytest.mark.parametrize("version", ["0.11.2", "0.12.0.1", "0.1.75", "1.10.0"])
def test_other_jaxlib_releases_are_left_alone(env, version):
    """Only 0.10.x stalls / mis-compiles (and has a checked flag list): on 0.11.2 and later an
    unknown or unneeded flag is not appended."""
    import os

    env.setattr(jaxlib, "__version__", version)
    assert co.configure_xla_cpu() is False
    assert "XLA_FLAGS" not in os.environ


def test_users_value_wins_and_other_flags_are_kept(env):
    """The user's own value of one option is kept (not overridden by a second flag for it),
    unrelated flags come first, and only the missing options are appended."""
    import os

    env.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false --xla_cpu_use_fusion_emitters=true")
    assert co.configure_xla_cpu() is True
    assert os.environ["XLA_FLAGS"] == (
        f"--xla_cpu_enable_fast_math=false --xla_cpu_use_fusion_emitters=true {SCHED} {YNN}"
    )


def test_opt_out_and_started_backend_leave_the_environment(env):
    """BCHG_JAX_KEEP_XLA_FLAGS set, or a backend already started: nothing appended, False."""
    import os

    env.setenv("BCHG_JAX_KEEP_XLA_FLAGS", "1")
    assert co.configure_xla_cpu() is False and "XLA_FLAGS" not in os.environ
    env.delenv("BCHG_JAX_KEEP_XLA_FLAGS")
    env.setattr(co, "_backends_started", lambda: True)
    assert co.configure_xla_cpu() is False and "XLA_FLAGS" not in os.environ


def test_a_failing_backend_probe_counts_as_started(monkeypatch):
    """``_backends_started`` reads a private JAX API: when it fails, the backends are taken as
    started (appending XLA_FLAGS then would do nothing and claim it had); when it answers, its
    answer is returned."""
    from jax._src import xla_bridge

    def broken():
        raise AttributeError("moved")

    monkeypatch.setattr(xla_bridge, "backends_are_initialized", broken)
    assert co._backends_started() is True
    monkeypatch.setattr(xla_bridge, "backends_are_initialized", lambda: False)
    assert co._backends_started() is False
