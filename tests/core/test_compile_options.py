"""The XLA:CPU flag that avoids the stall of large vmapped programs is set on import only when it
is safe (bchg_jax/core/compile_options.py)."""

import os
import subprocess
import sys

import jaxlib
import pytest

from bchg_jax.core import compile_options

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHOW = "import os, bchg_jax; print(os.environ.get('XLA_FLAGS', ''))"


def _flags_after_import(extra_env, code=SHOW):
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "BCHG_JAX_KEEP_XLA_FLAGS")}
    env.update(extra_env)
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""


@pytest.mark.slow
def test_import_sets_the_flag_only_when_safe():
    checked = jaxlib.__version__.startswith(compile_options.CHECKED_JAXLIB_PREFIXES)
    assert (_flags_after_import({}) == compile_options.FLAG) == checked
    # a user's own value of the option wins; other flags are kept
    mine = "--xla_cpu_enable_concurrency_optimized_scheduler=true"
    emitters = "--xla_cpu_use_fusion_emitters=false"
    ynn = "--xla_cpu_experimental_ynn_fusion_type=-LIBRARY_FUSION_TYPE_REDUCE"
    want = f"{mine} {emitters} {ynn}" if checked else mine
    assert _flags_after_import({"XLA_FLAGS": mine}) == want
    all_mine = f"{mine} --xla_cpu_use_fusion_emitters=true --xla_cpu_experimental_ynn_fusion_type="
    assert _flags_after_import({"XLA_FLAGS": all_mine}) == all_mine
    kept = _flags_after_import({"XLA_FLAGS": "--xla_cpu_enable_fast_math=false"})
    assert kept.startswith("--xla_cpu_enable_fast_math=false")
    assert (compile_options.FLAG in kept) == checked
    # opted out, or JAX already started: the environment is left alone
    assert _flags_after_import({"BCHG_JAX_KEEP_XLA_FLAGS": "1"}) == ""
    started = "import os, jax; jax.numpy.zeros(1); " + SHOW.replace("import os, ", "import ")
    assert _flags_after_import({}, started) == ""


# jaxlib 0.10.2's YNNPACK reduce fusion summed this broadcast product wrongly for a leading axis
# of length 1 (bchg_jax/core/compile_options.py): the grid axis of a one-point trainer grid
BROADCAST_SUM = """
import numpy as np, bchg_jax, jax, jax.numpy as jnp
w = np.array([1.0, 0.99])[:, None] ** np.arange(100)
r = jax.random.uniform(jax.random.PRNGKey(0), (1, 64, 100))
ref = np.einsum("...t,gt->...g", np.asarray(r, np.float64), w)
out = jax.jit(lambda r, w: jnp.sum(r[..., None, :] * w, -1))(r, jnp.asarray(w, jnp.float32))
print(float(np.max(np.abs(np.asarray(out) - ref) / np.abs(ref))))
"""


def test_a_broadcast_product_summed_over_a_one_point_grid_is_right():
    assert float(_flags_after_import({}, BROADCAST_SUM)) < 1e-5
