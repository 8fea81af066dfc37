"""The fused MLP critic fit (``lq.fused_td``) on the device at hand: the same fit as XLA's, then
how long each takes.

    python -m benchmarks.fused_td_check [--rows 10000] [--steps 50] [--timing-steps 5000]
        [--interpret]

1. Agreement, at full float32 precision: (a) the first kernel's gradient, summed over its blocks,
   against ``jax.grad`` of ``td_fit``'s loss (the paper's critic shape: 6 inputs, 64-64 ReLU,
   one output; ``--rows`` random transitions, gamma 0.9): the largest difference over the
   largest gradient entry, limit ``GRAD_RTOL``; (b) the whole fit after ``--steps`` Adam steps
   (lr 1e-3) by ``critics.td_fit`` and by ``fused_td.td_fit_fused``: the largest parameter
   difference over the largest distance the fit moved them, limit ``FIT_RTOL``. The fit is
   sensitive to rounding (a 1e-7 relative change of the start moves it by ~1e-4 of its
   movement on this data: a ReLU that flips for some transition), hence (a) as the precise
   check and (b) as the wiring check. Either over its limit: exit status 3 (a kernel that
   computes something else, or products at reduced precision where full was asked).
2. Speed: each fit of ``--timing-steps`` steps at JAX's default precision (what the trainer
   runs: TF32 on an NVIDIA GPU), compiled first, then timed; ms per fit, us per Adam step, and
   each fit's final TD loss (near each other: the same fit up to rounding).

On a machine without a GPU the fused kernels need ``--interpret`` (Pallas' interpreter, slow:
use small ``--rows`` / ``--steps``).
"""

from __future__ import annotations

import argparse
import datetime
import time

import jax
import jax.numpy as jnp

from bchg_jax.lq import critics, fused_td

GRAD_RTOL = 1e-4  # kernel 1's gradient: max |fused - jax.grad| / max |jax.grad| (full precision)
FIT_RTOL = 1e-2  # the fit: max |fused - xla| / max |xla - start| (full precision; see above)
GAMMA, IN_DIM = 0.9, 6


def _data(rows: int):
    k = jax.random.split(jax.random.PRNGKey(0), 4)
    x = jax.random.normal(k[0], (rows, IN_DIM))
    xn = x + 0.1 * jax.random.normal(k[1], (rows, IN_DIM))
    r = -jnp.sum(x**2, 1) + 0.1 * jax.random.normal(k[2], (rows,))
    model, params = critics.init_mlp(k[3], IN_DIM)
    return model, params, x, xn, r


def _fits(model, steps: int, lr: float, precision, interpret: bool):
    """Jitted (xla, fused) fits: params, x, x', r -> params."""

    def xla(p, x, xn, r):
        if precision is None:
            return critics.td_fit(model, p, x, xn, r, GAMMA, steps, lr)
        with jax.default_matmul_precision("highest"):
            return critics.td_fit(model, p, x, xn, r, GAMMA, steps, lr)

    def fused(p, x, xn, r):
        return fused_td.td_fit_fused(
            p, x, xn, r, GAMMA, steps, lr, precision=precision, interpret=interpret
        )

    return jax.jit(xla), jax.jit(fused)


def td_loss(model, p, x, xn, r) -> float:
    """The fitted critic's TD(0) loss on the data (full precision)."""
    with jax.default_matmul_precision("highest"):
        q, qn = model.apply(p, x)[:, 0], model.apply(p, xn)[:, 0]
        return float(jnp.mean((r + GAMMA * qn - q) ** 2))


def gradient_agreement(rows: int, interpret: bool) -> float:
    """max |kernel 1's gradient - jax.grad| / max |jax.grad| at full precision."""
    model, params, x, xn, r = _data(rows)
    xs, ys = jnp.ones(IN_DIM), jnp.ones(1)

    def loss(p):
        target = r[:, None] + GAMMA * jax.lax.stop_gradient(model.apply(p, xn))
        return jnp.mean((target - model.apply(p, x)) ** 2)

    with jax.default_matmul_precision("highest"):
        want = jax.jit(jax.grad(loss))(params)
    H = params["params"]["Dense_1"]["kernel"].shape[0]
    L = fused_td.layout(IN_DIM, H)

    @jax.jit
    def fused(p):
        xa, xna = fused_td.pack_inputs(x, xn, r, L, xs, ys)
        g = fused_td.block_grads(
            xa, xna, fused_td.pack(p, IN_DIM), GAMMA, rows, L, jax.lax.Precision.HIGHEST, interpret
        )
        return fused_td.unpack(g.sum(0), p, IN_DIM)

    got = fused(params)
    diff = max(
        float(jnp.max(jnp.abs(u - v)))
        for u, v in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True)
    )
    return diff / max(float(jnp.max(jnp.abs(v))) for v in jax.tree.leaves(want))


def fit_agreement(rows: int, steps: int, interpret: bool) -> float:
    """max |fused - xla| / max |xla - start| after ``steps`` full-precision steps."""
    model, params, x, xn, r = _data(rows)
    xla, fused = _fits(model, steps, 1e-3, jax.lax.Precision.HIGHEST, interpret)
    a, b = xla(params, x, xn, r), fused(params, x, xn, r)
    diff = max(
        float(jnp.max(jnp.abs(u - v)))
        for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )
    moved = max(
        float(jnp.max(jnp.abs(u - v)))
        for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(params), strict=True)
    )
    return diff / moved


def timing(rows: int, steps: int, interpret: bool):
    """{form: (compile s, ms per fit, TD loss)} of ``steps``-step fits at default precision."""
    model, params, x, xn, r = _data(rows)
    out = {}
    for name, fn in zip(("xla", "fused"), _fits(model, steps, 1e-4, None, interpret), strict=True):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(params, x, xn, r))
        comp = time.perf_counter() - t0
        t0 = time.perf_counter()
        p = jax.block_until_ready(fn(params, x, xn, r))
        out[name] = (comp, 1e3 * (time.perf_counter() - t0), td_loss(model, p, x, xn, r))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.fused_td_check",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--rows", type=int, default=10_000, help="transitions (10,000: E=100 x T=100)")
    p.add_argument("--steps", type=int, default=50, help="Adam steps of the fit's agreement check")
    p.add_argument("--timing-steps", type=int, default=5000, help="Adam steps of a timed fit")
    p.add_argument("--interpret", action="store_true", help="the fused kernels interpreted")
    a = p.parse_args(argv)
    for flag in ("rows", "steps", "timing_steps"):
        if getattr(a, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be >= 1")
    print(
        f"# fused TD fit check; {jax.devices()[0].device_kind}, jax {jax.__version__}, "
        f"{datetime.date.today()}; {a.rows} transitions"
    )
    grad = gradient_agreement(a.rows, a.interpret)
    fit = fit_agreement(a.rows, a.steps, a.interpret)
    ok = grad <= GRAD_RTOL and fit <= FIT_RTOL
    for what, rel, limit in (
        ("gradient (kernel 1), max |fused - jax.grad| / max |grad|", grad, GRAD_RTOL),
        (f"fit after {a.steps} steps, max |fused - xla| / max |moved|", fit, FIT_RTOL),
    ):
        verdict = "ok" if rel <= limit else "FAILED"
        print(f"{what} = {rel:.2e} ({verdict}, limit {limit:g}; full precision)", flush=True)
    print(f"\n| fit ({a.timing_steps} Adam steps) | compile (s) | ms / fit | us / step | TD loss |")
    print("|---|---:|---:|---:|---:|")
    for name, (comp, ms, loss) in timing(a.rows, a.timing_steps, a.interpret).items():
        print(f"| {name} | {comp:.1f} | {ms:.1f} | {1e3 * ms / a.timing_steps:.1f} | {loss:.4g} |")
    if not ok:
        raise SystemExit(3)


if __name__ == "__main__":
    main()
